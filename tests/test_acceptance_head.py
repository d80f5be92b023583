"""The learned acceptance head: it learns, it lies in the artifact (and an artifact without it
loads as before, a broken one names the fix), every policy runs on it through
`LearnedAcceptance` without losing a token, and calibration reads it as a signal."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from conftest import greedy_reference, tiny_model
from head_helpers import build_head, fit, target_batch, training_ids
from safetensors.torch import load_file, save_file

from draftsmith.artifact import (
    load_acceptance_head,
    load_acceptance_model,
    load_drafter,
    save_artifact,
)
from draftsmith.calibration import PlattScaling
from draftsmith.calibration.collect import collect_from_decoding, collect_teacher_forced
from draftsmith.commands.cli import main
from draftsmith.core.signals import confidence_signals
from draftsmith.decoding import POLICIES, SpeculativeDecoder, build_policy
from draftsmith.decoding.profile import CostCurve
from draftsmith.heads import NgramDrafter, TreeShape
from draftsmith.heads.acceptance import (
    AcceptanceHead,
    AcceptanceHeadConfig,
    chain_outcomes,
    chain_signals,
)
from draftsmith.heads.learned_acceptance import LearnedAcceptance
from draftsmith.train.acceptance import acceptance_objective

PROMPTS = [[5, 6, 7], [40, 41], [100, 7, 3, 9]]


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="module", params=["eagle3-reduced", "dflash-reduced"])
def heads(target, request):
    """A drafter head (EAGLE-3; DFlash, whose block outputs are its states) fitted on the
    target's greedy paths, and an acceptance head fitted on it."""
    torch.manual_seed(0)
    head = fit(build_head(request.param, target), target, steps=30)
    acceptance = AcceptanceHead(head.state_size, AcceptanceHeadConfig(width=16))
    batch = target_batch(target, head, training_ids(target))
    with torch.no_grad():
        step_logits, states = head.forward_states(batch)
    optimizer = torch.optim.Adam(acceptance.parameters(), lr=1e-2)
    for _ in range(30):
        loss, _ = acceptance_objective(
            acceptance, step_logits, states, batch, head.draft_to_target()
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head, acceptance.eval()


@pytest.fixture(scope="module")
def saved(heads, target, tmp_path_factory):
    head, acceptance = heads
    path = tmp_path_factory.mktemp("acceptance") / "drafter"
    save_artifact(
        head,
        target,
        path,
        training={"steps": 30},
        target_name_or_path="tiny",
        acceptance=acceptance,
    )
    return path


@pytest.fixture
def artifact(saved, tmp_path):
    """A private copy of the artifact with an acceptance head, free to damage."""
    return shutil.copytree(saved, tmp_path / "artifact")


# -- the head -------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [0, 8])
def test_predictions_are_probabilities_of_the_states_shape(width):
    head = AcceptanceHead(12, AcceptanceHeadConfig(width=width))
    states = torch.randn(2, 5, 3, 12) * 100  # massive channels, as drafter states carry
    signals = chain_signals([torch.randn(2, 5, 40) for _ in range(3)])
    probs = head.predict(states, signals)
    assert probs.shape == (2, 5, 3) and probs.dtype == torch.float32
    assert bool(((probs > 0) & (probs < 1)).all())


def test_the_head_learns_a_learnable_synthetic_signal():
    """Accepted when the state's first channel and the top-1 probability say so together: a
    rule of both inputs the head must find, far below the base rate's loss."""
    gen = torch.Generator().manual_seed(0)
    states = torch.randn(512, 16, generator=gen)
    signals = chain_signals([torch.randn(512, 32, generator=gen) * 3])
    signals = {name: value[:, 0] for name, value in signals.items()}
    labels = ((states[:, 0] > 0) & (signals["top1_prob"] > signals["top1_prob"].median())).float()
    head = AcceptanceHead(16, AcceptanceHeadConfig(width=16))
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    losses = []
    for _ in range(300):
        loss = F.binary_cross_entropy_with_logits(head(states, signals), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    base_rate = F.binary_cross_entropy(labels.mean().expand_as(labels), labels)
    assert losses[-1] < 0.3 * float(base_rate)
    accuracy = ((head.predict(states, signals) > 0.5).float() == labels).float().mean()
    assert accuracy > 0.95


def test_chain_outcomes_count_the_steps_greedy_decoding_drafts():
    # The target's argmax after each position is the next token of the text (its own text).
    text = torch.tensor([1, 2, 3, 4, 5, 6])
    target_top1 = torch.tensor([2, 3, 4, 5, 6, 0])
    drafted = torch.tensor([[2, 3], [3, 9], [4, 5], [5, 6], [6, 7], [0, 0]])
    loss_mask = torch.tensor([1, 1, 1, 1, 0, 0], dtype=torch.bool)
    accepted, counted = chain_outcomes(drafted, text, target_top1, loss_mask)
    assert accepted[:4].tolist() == [[True, True], [True, False], [True, True], [True, True]]
    # step 1 after t scores position t + 1: masked from 4 on, outside the row for t >= 4
    assert counted.tolist() == [
        [True, True], [True, True], [True, True], [True, False], [False, False], [False, False]
    ]  # fmt: skip
    drafted[0, 0] = 7  # a rejected first step: the chain's second step is no decoding draft
    assert chain_outcomes(drafted, text, target_top1, loss_mask)[1][0].tolist() == [True, False]


def test_chain_signals_are_each_chains_confidence_signals():
    steps = [torch.randn(2, 4, 30, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    got = chain_signals(steps)
    expected = confidence_signals(torch.stack(steps, dim=2).flatten(0, 1))
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value.reshape(2, 4, 3))


# -- the artifact ---------------------------------------------------------------------------------


def test_the_head_round_trips_through_the_artifact(heads, artifact):
    head, acceptance = heads
    config = json.loads((artifact / "config.json").read_text())
    assert config["acceptance_head"]["file"] == "acceptance_head.safetensors"
    assert config["acceptance_head"]["config"] == {"width": 16, "seed": 0}
    assert (
        "learned acceptance head: `acceptance_head.safetensors`"
        in (artifact / "README.md").read_text()
    )
    loaded = load_acceptance_head(artifact, head.state_size)
    states = torch.randn(7, head.state_size)
    signals = chain_signals([torch.randn(7, 50)])
    signals = {name: value[:, 0] for name, value in signals.items()}
    torch.testing.assert_close(loaded.predict(states, signals), acceptance.predict(states, signals))


def test_an_artifact_without_the_head_loads_as_before(heads, target, tmp_path):
    head, _ = heads
    path = save_artifact(head, target, tmp_path / "plain", training={}, target_name_or_path="x")
    assert "acceptance_head" not in json.loads((path / "config.json").read_text())
    assert not (path / "acceptance_head.safetensors").exists()
    assert load_acceptance_head(path, head.state_size) is None
    assert load_acceptance_model(path) is None
    result = SpeculativeDecoder(target, load_drafter(path, target)).generate([5, 6], 6)
    assert len(result.tokens) == 6


def _edit_entry(artifact, **changes) -> None:
    file = artifact / "config.json"
    config = json.loads(file.read_text())
    config["acceptance_head"].update(changes)
    file.write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda a: (a / "acceptance_head.safetensors").unlink(), "which is missing"),
        (
            lambda a: (a / "acceptance_head.safetensors").write_bytes(b"\x00" * 9),
            "is corrupt or truncated",
        ),
        (lambda a: _edit_entry(a, config={"width": 8, "seed": 0}), "wrong shape"),
        (lambda a: _edit_entry(a, config={"depth": 2}), "unknown key 'acceptance_head.depth'"),
        (lambda a: _edit_entry(a, signals=["top1_prob"]), "reads signals"),
        (lambda a: _edit_entry(a, state_size=7), "width 7, the drafter's are 64"),
        (lambda a: _edit_entry(a, file="../elsewhere.safetensors"), "must name a file in"),
        (lambda a: _edit_entry(a, extra=1), "must be a mapping of exactly"),
    ],
)
def test_a_broken_head_is_a_clear_error(artifact, heads, damage, message):
    damage(artifact)
    with pytest.raises((ValueError, FileNotFoundError), match=message) as error:
        load_acceptance_head(artifact, heads[0].state_size)
    assert "acceptance" in str(error.value)


def test_a_head_with_missing_weights_names_them(artifact, heads):
    file = artifact / "acceptance_head.safetensors"
    tensors = load_file(str(file))
    tensors.pop("mlp.2.bias")
    save_file(tensors, str(file))
    with pytest.raises(ValueError, match=r"missing tensors \['mlp.2.bias'\].*retrain"):
        load_acceptance_head(artifact, heads[0].state_size)


def test_saving_a_head_for_other_states_is_refused(heads, target, tmp_path):
    other = AcceptanceHead(heads[0].state_size + 1, AcceptanceHeadConfig())
    with pytest.raises(ValueError, match="reads states of width 65"):
        save_artifact(
            heads[0], target, tmp_path / "x", training={}, target_name_or_path="x", acceptance=other
        )


# -- decoding ---------------------------------------------------------------------------------


CHAIN_AND_TREE = [(name, None) for name in sorted(POLICIES)] + [
    ("cost-aware", TreeShape(top_k=2, depth=3, total_tokens=5)),
    ("threshold", TreeShape(top_k=2, depth=3, total_tokens=5)),
]


@pytest.mark.parametrize(("name", "tree"), CHAIN_AND_TREE)
def test_every_policy_decodes_losslessly_on_the_learned_head(name, tree, heads, target):
    head, acceptance = heads
    drafter = head.as_drafter(target)
    model = LearnedAcceptance(acceptance, drafter)
    asked = []
    emitted = []
    record = model.record

    def spy_record(logits, states):
        emitted.append((logits.clone(), states.clone()))
        record(logits, states)

    def spy_predict(signals):
        probs = LearnedAcceptance.predict_signals(model, signals)
        asked.append(probs)
        return probs

    drafter.expose_states(spy_record)
    model.predict_signals = spy_predict
    # cost-aware on a flat curve: measured on a busy machine, a curve can say no draft pays.
    flat = {"cost": CostCurve(tokens=[1, 8], verify_s=[1.0, 1.0], context=8)}
    options = flat if name == "cost-aware" else {}
    policy = build_policy(name, acceptance=model, max_draft_tokens=4, tree=tree, **options)
    decoder = SpeculativeDecoder(target, drafter, policy=policy)
    for prompt in PROMPTS:
        result = decoder.generate(prompt, max_new_tokens=12)
        assert result.tokens == greedy_reference(target, torch.tensor(prompt), 12)
    if name != "fixed":  # the one policy that reads no acceptance
        assert asked and all(bool(((p > 0) & (p < 1)).all()) for p in asked)
    # the states found for every emitted row are the ones the drafter computed it from
    for logits, states in emitted:
        signals = confidence_signals(logits)
        torch.testing.assert_close(model.states_of(signals), states.float())
        expected = acceptance.predict(states, signals)
        torch.testing.assert_close(model.head_probability(signals), expected)


def test_rows_the_drafter_never_emitted_are_refused(heads, target):
    head, acceptance = heads
    model = LearnedAcceptance(acceptance, head.as_drafter(target))
    signals = confidence_signals(torch.randn(3, target.config.vocab_size))
    with pytest.raises(ValueError, match="has seen no draft yet"):
        model.predict_signals(signals)
    model.record(torch.randn(2, target.config.vocab_size), torch.randn(2, head.state_size))
    with pytest.raises(ValueError, match="did not emit recently"):
        model.predict_signals(signals)


def test_a_drafter_without_states_cannot_carry_the_head(heads):
    with pytest.raises(ValueError, match="NgramDrafter has no hidden states"):
        LearnedAcceptance(heads[1], NgramDrafter())


# -- calibration --------------------------------------------------------------------------------


def documents(target) -> list:
    ids = training_ids(target, length=24)
    return [(row, torch.ones_like(row, dtype=torch.int8)) for row in ids]


def test_teacher_forced_records_carry_the_head_as_a_signal(heads, target):
    head, acceptance = heads
    plain = collect_teacher_forced(head, target, documents(target))
    records = collect_teacher_forced(head, target, documents(target), acceptance=acceptance)
    assert records.column_names == [*plain.column_names, "acceptance_head"]
    for name in plain.column_names:
        assert records[name] == plain[name]
    probs = torch.tensor(records["acceptance_head"])
    assert bool(((probs > 0) & (probs < 1)).all())
    accepted = torch.tensor(records["accepted"]).bool()
    assert probs[accepted].mean() > probs[~accepted].mean()  # it tells them apart


def test_decoding_records_carry_the_head_as_a_signal(heads, target):
    head, acceptance = heads
    drafter = head.as_drafter(target)
    decoder = SpeculativeDecoder(target, drafter, policy=build_policy("fixed", max_draft_tokens=3))
    model = LearnedAcceptance(acceptance, drafter)
    records = collect_from_decoding(decoder, PROMPTS, max_new_tokens=10, acceptance=model)
    assert len(records["acceptance_head"]) == len(records) > 0


def test_a_calibrated_head_becomes_the_policy_acceptance_model(heads, target, artifact):
    head, acceptance = heads
    records = collect_teacher_forced(head, target, documents(target), acceptance=acceptance)
    platt = PlattScaling(signals=["acceptance_head"])
    platt.fit(records["acceptance_head"], records["accepted"])
    platt.save(artifact)
    bare = load_acceptance_model(artifact)
    assert bare.signals == ("acceptance_head",)
    logits = torch.randn(2, target.config.vocab_size)
    with pytest.raises(ValueError, match="load the acceptance model with its drafter"):
        bare.predict_signals(confidence_signals(logits))

    drafter = load_drafter(artifact, target)
    model = load_acceptance_model(artifact, drafter)
    assert isinstance(model, LearnedAcceptance)
    emitted = []
    drafter.expose_states(
        lambda logits, states: (emitted.append(logits), model.record(logits, states))
    )
    decoder = SpeculativeDecoder(
        target, drafter, policy=build_policy("specdec++", acceptance=model)
    )
    result = decoder.generate(PROMPTS[0], max_new_tokens=10)
    assert result.tokens == greedy_reference(target, torch.tensor(PROMPTS[0]), 10)
    signals = confidence_signals(emitted[-1])
    head_probability = model.head_probability(signals)
    expected = platt.predict_signals({**signals, "acceptance_head": head_probability})
    torch.testing.assert_close(model.predict_signals(signals), expected)


@pytest.fixture(scope="module")
def target_dir(target, byte_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("target")
    target.save_pretrained(folder)
    tokenizer = copy.deepcopy(byte_tokenizer)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(0)
    tokenizer.save_pretrained(folder)
    return folder


def calibrate_on_the_head(artifact, target_dir, tmp_path) -> None:
    """`draftsmith calibrate --method platt --signals acceptance_head` on a little code."""
    texts = [f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 3 for i in range(12)]
    data = tmp_path / "heldout.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    main(
        ["calibrate", str(artifact), "--target", str(target_dir), "--data", str(data)]
        + ["--method", "platt", "--signals", "acceptance_head", "--dtype", "float32"]
        + ["--seq-len", "64"]
    )


def test_draftsmith_calibrate_fits_platt_on_the_head(artifact, target_dir, tmp_path, capsys):
    calibrate_on_the_head(artifact, target_dir, tmp_path)
    saved = json.loads((artifact / "calibration.json").read_text())
    assert saved["signals"] == ["acceptance_head"] and saved["n_eval"] > 0
    assert "calibrator: platt on acceptance_head" in capsys.readouterr().out


def test_calibrating_the_head_of_an_artifact_without_one_names_the_fix(
    heads, target, tmp_path, capsys
):
    path = save_artifact(heads[0], target, tmp_path / "plain", training={}, target_name_or_path="x")
    with pytest.raises(SystemExit):
        main(["calibrate", str(path), "--target", "never-loaded", "--data", "x.jsonl"]
             + ["--signals", "acceptance_head"])  # fmt: skip
    assert "has no learned acceptance head: train one into it" in capsys.readouterr().err


# -- a head's own confidence head (DSpark) --------------------------------------------------------


@pytest.fixture(scope="module")
def dspark(target, tmp_path_factory):
    """A DFlash head with DSpark's Markov and confidence heads, fitted with its confidence loss,
    saved as an artifact (no separate acceptance head file)."""
    torch.manual_seed(0)
    head = fit(build_head("dspark", target), target, steps=40)
    path = tmp_path_factory.mktemp("dspark") / "drafter"
    save_artifact(head, target, path, training={"steps": 40}, target_name_or_path="tiny")
    return head, path


def test_a_confidence_head_is_its_drafters_acceptance_head(dspark, target):
    """Teacher-forced records carry the confidence head's P(accept) as `acceptance_head`, the
    head's own states fed to it; it ranks accepted tokens above rejected ones."""
    head, _ = dspark
    own = head.own_acceptance()
    assert (
        own is not None and own.state_size == head.state_size == head.as_drafter(target).state_size
    )
    records = collect_teacher_forced(head, target, documents(target), acceptance=own)
    probs = torch.tensor(records["acceptance_head"])
    accepted = torch.tensor(records["accepted"]).bool()
    assert accepted.any() and (~accepted).any()
    assert probs[accepted].mean() > probs[~accepted].mean()


def test_draftsmith_calibrate_fits_platt_on_a_confidence_head_and_decodes_with_it(
    dspark, target, target_dir, tmp_path, capsys
):
    """`calibrate --signals acceptance_head` reads a DSpark head's own confidence head (the
    artifact holds no acceptance head file); the calibrated model is then the policy's, a
    `LearnedAcceptance` on the drafter's confidence head, and decoding stays lossless."""
    _, saved = dspark
    artifact = shutil.copytree(saved, tmp_path / "artifact")
    calibrate_on_the_head(artifact, target_dir, tmp_path)
    assert json.loads((artifact / "calibration.json").read_text())["n_eval"] > 0
    assert "calibrator: platt on acceptance_head" in capsys.readouterr().out

    drafter = load_drafter(artifact, target)
    model = load_acceptance_model(artifact, drafter)
    assert isinstance(model, LearnedAcceptance) and model.head.state_size == drafter.state_size
    decoder = SpeculativeDecoder(
        target, drafter, policy=build_policy("specdec++", acceptance=model)
    )
    result = decoder.generate(PROMPTS[0], max_new_tokens=10)
    assert result.tokens == greedy_reference(target, torch.tensor(PROMPTS[0]), 10)
    assert result.stats.drafted > 0

"""The artifact format: save -> load_drafter round trips, and every way an artifact can be wrong
gets a clear error."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import tiny_model
from head_helpers import HEADS, build_head, fit, target_batch
from safetensors.torch import load_file, save_file

from draftsmith import FixedPolicy, SpeculativeDecoder, load_acceptance_model, load_drafter
from draftsmith.artifact import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    UntrainedDrafterError,
    load_head,
    read_artifact_config,
    save_artifact,
    target_fingerprint,
)
from draftsmith.build.drafters import build_drafter
from draftsmith.calibration import PlattScaling
from draftsmith.core.config import config_to_dict
from draftsmith.core.sampling import SamplingParams
from draftsmith.core.signals import confidence_signals
from draftsmith.decoding.results import GenerationStats
from draftsmith.evaluation.report import Aggregate, PromptResult, PromptRun, format_table
from draftsmith.heads import Draft
from draftsmith.heads.blocks import ROTARY_BUFFERS

TRAINING = {"recipe": {"data": {"name": "tiny"}}, "steps": 5, "metrics": {"top1": 0.5}}


@pytest.fixture(scope="module")
def target():
    model = tiny_model("llama", seed=0)
    model.config.name_or_path = "tiny-llama-a"
    return model


@pytest.fixture(scope="module")
def artifacts(target, tmp_path_factory):
    """One briefly trained artifact per head, saved on first use; tests copy before editing."""
    saved = {}

    def get(name: str):
        if name not in saved:
            head = fit(build_head(name, target), target, steps=5)
            path = tmp_path_factory.mktemp("artifacts") / name
            save_artifact(head, target, path, training=TRAINING, target_name_or_path="tiny-llama-a")
            saved[name] = (head, path)
        return saved[name]

    return get


@pytest.fixture
def artifact(artifacts, tmp_path):
    """A private copy of the EAGLE-3 (reduced vocabulary) artifact, free to damage."""
    _, path = artifacts("eagle3-reduced")
    return shutil.copytree(path, tmp_path / "artifact")


def _drafts(drafter, head, target, prompt: list[int]):
    prompt = torch.tensor(prompt)
    features = target_batch(target, head, prompt[None]).features
    drafter.start(prompt, None if features is None else features[0, :-1])
    return drafter.propose(3, SamplingParams())


@pytest.mark.parametrize("name", HEADS)
def test_round_trip_gives_the_same_drafts(name, artifacts, target):
    head, path = artifacts(name)
    loaded = load_drafter(path, target)
    original = head.as_drafter(target)
    for prompt in ([5, 6, 7], [40, 41, 42]):
        a, b = _drafts(original, head, target, prompt), _drafts(loaded, head, target, prompt)
        assert torch.equal(a.tokens, b.tokens)
        torch.testing.assert_close(a.logits, b.logits)
    prompt = torch.tensor([5, 6, 7])
    policy = FixedPolicy(max_draft_tokens=3)
    expected = SpeculativeDecoder(target, original, policy=policy).generate(prompt, 16)
    got = SpeculativeDecoder(target, loaded, policy=policy).generate(prompt, 16)
    assert got.tokens == expected.tokens
    assert got.stats.accepted == expected.stats.accepted


def test_artifact_layout(artifacts, target):
    head, path = artifacts("eagle3-reduced")
    assert sorted(p.name for p in path.iterdir()) == ["README.md", CONFIG_FILE, WEIGHTS_FILE]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left
    config = json.loads((path / CONFIG_FILE).read_text())
    assert config["drafter"] == "eagle3"
    assert config["head"] == config_to_dict(head.config)
    assert config["head"]["feature_layers"] == [2, 1, 0]  # EAGLE-3's default, as resolved
    assert config["target"] == {
        "name_or_path": "tiny-llama-a",
        "architecture": "LlamaForCausalLM",
        "vocab_size": 256,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "fingerprint": target_fingerprint(target),
    }
    assert config["feature_layers"] == list(head.target_feature_layers)
    assert config["draft_vocab"] == {"size": 64}
    assert config["training"] == TRAINING
    tensors = load_file(str(path / WEIGHTS_FILE))
    assert torch.equal(tensors["d2t"], head.draft_to_target())
    assert torch.equal(tensors["t2d"], head.t2d)
    assert "embed_tokens.weight" not in " ".join(tensors)  # the target's modules are not saved
    assert "tiny-llama-a" in (path / "README.md").read_text()


def test_saving_again_replaces_the_artifact_whole(artifacts, target, tmp_path):
    head, path = artifacts("medusa")
    out = shutil.copytree(path, tmp_path / "medusa")
    (out / "calibration.json").write_text("{}")  # describes the old weights
    save_artifact(head, target, out, training={"steps": 6}, target_name_or_path="tiny-llama-a")
    assert json.loads((out / CONFIG_FILE).read_text())["training"] == {"steps": 6}
    assert not (out / "calibration.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["medusa"]


def test_saving_never_leaves_a_half_written_artifact(artifacts, target, tmp_path, monkeypatch):
    head, _ = artifacts("medusa")

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("draftsmith.artifact.save.save_file", fail)
    with pytest.raises(OSError, match="disk full"):
        save_artifact(head, target, tmp_path / "out", training={}, target_name_or_path="t")
    assert list(tmp_path.iterdir()) == []


def test_saving_over_another_directory_is_refused(artifacts, target, tmp_path):
    head, _ = artifacts("medusa")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a draftsmith artifact"):
        save_artifact(head, target, tmp_path, training={}, target_name_or_path="t")
    assert (tmp_path / "notes.txt").read_text() == "mine"


# -- fingerprint ----------------------------------------------------------------------------------


def test_fingerprint_survives_casting_but_not_another_checkpoint(target):
    fingerprint = target_fingerprint(target)
    assert fingerprint == target_fingerprint(target)
    half = tiny_model("llama", seed=0).to(torch.bfloat16)
    assert target_fingerprint(half) == fingerprint
    assert target_fingerprint(tiny_model("llama", seed=7)) != fingerprint  # same config
    assert target_fingerprint(tiny_model("qwen2", seed=0)) != fingerprint


def _rotary_frequencies(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: b for n, b in module.named_buffers() if n.rpartition(".")[2] in ROTARY_BUFFERS}


@pytest.mark.parametrize("name", ["eagle", "eagle3", "peagle", "dflash", "distilled"])
def test_a_head_on_a_bf16_target_keeps_its_rotary_frequencies_in_float32(artifacts, name):
    trained, path = artifacts(name)
    half = tiny_model("llama", seed=0).to(torch.bfloat16)
    half.config.name_or_path = "tiny-llama-a"
    loaded = load_head(path, half)
    want, got = _rotary_frequencies(trained), _rotary_frequencies(loaded)
    assert got and got.keys() == want.keys()
    for name_, frequencies in got.items():
        assert frequencies.dtype == torch.float32 and torch.equal(frequencies, want[name_])
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}


def test_loading_onto_another_target_names_both(artifact):
    other = tiny_model("llama", seed=7)
    other.config.name_or_path = "tiny-llama-b"
    with pytest.raises(ValueError, match="fingerprint") as error:
        load_drafter(artifact, other)
    assert "tiny-llama-a" in str(error.value) and "tiny-llama-b" in str(error.value)


def test_loading_onto_another_vocabulary_is_refused(artifact):
    with pytest.raises(ValueError, match="vocabulary of 256 tokens.*has 320"):
        load_drafter(artifact, tiny_model("llama", seed=0, vocab_size=320))


# -- damaged artifacts ----------------------------------------------------------------------------


def _rewrite_tensors(path, edit) -> None:
    tensors = load_file(str(path / WEIGHTS_FILE))
    edit(tensors)
    save_file(tensors, str(path / WEIGHTS_FILE))


def test_missing_tensor_is_named(artifact, target):
    _rewrite_tensors(artifact, lambda t: t.pop("fc.weight"))
    with pytest.raises(ValueError, match=r"missing tensors \['fc.weight'\]"):
        load_drafter(artifact, target)


def test_unexpected_tensor_is_named(artifact, target):
    _rewrite_tensors(artifact, lambda t: t.update(extra=torch.zeros(2)))
    with pytest.raises(ValueError, match=r"unexpected tensors \['extra'\]"):
        load_drafter(artifact, target)


def test_misshapen_tensor_is_named(artifact, target):
    _rewrite_tensors(artifact, lambda t: t.update({"fc.weight": torch.zeros(3, 3)}))
    with pytest.raises(ValueError, match=r"wrong shape: \['fc.weight \(3, 3\)"):
        load_drafter(artifact, target)


def test_non_finite_tensor_is_named(artifact, target):
    _rewrite_tensors(artifact, lambda t: t["lm_head.weight"].fill_(float("nan")))
    with pytest.raises(ValueError, match=r"NaN or infinite values in \['lm_head.weight'\]"):
        load_drafter(artifact, target)


def test_truncated_weights_are_reported(artifact, target):
    weights = artifact / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        load_drafter(artifact, target)


@pytest.mark.parametrize("missing", [CONFIG_FILE, WEIGHTS_FILE])
def test_incomplete_artifact_is_reported(artifact, target, missing):
    (artifact / missing).unlink()
    with pytest.raises(FileNotFoundError, match=f"{missing} is missing"):
        load_drafter(artifact, target)


def test_no_artifact_at_all(target, tmp_path):
    with pytest.raises(FileNotFoundError, match="no drafter artifact"):
        load_drafter(tmp_path / "nowhere", target)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"draftsmith_version": "99.0.0"}, "newer than this draftsmith"),
        ({"draftsmith_version": "soon"}, "unreadable draftsmith_version"),
        ({"drafter": "telepathy"}, "unknown drafter kind 'telepathy'"),
        ({"drafter": "ngram"}, "'ngram' has nothing to train"),
        (
            {"head": {"num_steps": 2, "wings": 2}},
            r"config.json: the eagle3 head config does not fit: unknown key 'head.wings' in "
            r"Eagle3Config; valid keys: seed, num_steps, draft_vocab_size, feature_layers, "
            r"norm_before_fc, norm_before_residual, standardize_fc_init\. "
            r"Correct it",
        ),
        ({"head": {"num_steps": 0}}, "eagle3 head config.*num_steps must be at least 1"),
        ({"head": {"feature_layers": [0, 9]}}, "cannot build the eagle3 head for this target"),
        ({"head": [4]}, "head must be a mapping"),
        ({"draftsmith_version": "0.0.3"}, r"format 0\.0\), older than.*retrain the head"),
        ({"feature_layers": [2]}, "feature_layers"),
    ],
)
def test_bad_config_is_reported(artifact, target, edit, message):
    config = json.loads((artifact / CONFIG_FILE).read_text())
    (artifact / CONFIG_FILE).write_text(json.dumps({**config, **edit}))
    with pytest.raises(ValueError, match=message):
        load_drafter(artifact, target)


@pytest.mark.parametrize(("name", "old_key"), [("medusa", "num_heads"), ("mtp", "num_modules")])
def test_a_0_1_artifact_with_its_old_name_for_the_steps_loads(
    name, old_key, artifacts, target, tmp_path
):
    """draftsmith 0.1 wrote medusa's num_heads and mtp's num_modules; they read as num_steps."""
    head, path = artifacts(name)
    old = shutil.copytree(path, tmp_path / name)
    config = json.loads((old / CONFIG_FILE).read_text())
    head_0_1 = {old_key: head.num_steps, "draft_vocab_size": None, "seed": 0}
    (old / CONFIG_FILE).write_text(
        json.dumps({**config, "draftsmith_version": "0.1.0", "head": head_0_1})
    )
    upgraded = read_artifact_config(old)["head"]
    assert upgraded == {"num_steps": head.num_steps, "draft_vocab_size": None, "seed": 0}
    loaded = load_drafter(old, target)
    for prompt in ([5, 6, 7], [40, 41, 42]):
        original = _drafts(head.as_drafter(target), head, target, prompt)
        assert torch.equal(_drafts(loaded, head, target, prompt).tokens, original.tokens)


def test_an_older_artifact_that_does_not_upgrade_names_its_format_and_the_fix(artifacts, tmp_path):
    old = shutil.copytree(artifacts("medusa")[1], tmp_path / "medusa")
    config = json.loads((old / CONFIG_FILE).read_text())
    edit = {"draftsmith_version": "0.1.0", "head": {"num_steps": 2, "wings": 2}}
    (old / CONFIG_FILE).write_text(json.dumps({**config, **edit}))
    message = (
        r"written by draftsmith 0\.1\.0 \(format 0\.1\).*'head.wings'.*Load it with "
        r"draftsmith 0\.1\.0, or retrain the head"
    )
    with pytest.raises(ValueError, match=message):
        read_artifact_config(old)


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_an_eagle3_head_in_the_old_layout_is_refused_with_the_fix(artifact, target, version):
    config = json.loads((artifact / CONFIG_FILE).read_text())
    (artifact / CONFIG_FILE).write_text(json.dumps({**config, "draftsmith_version": version}))
    with pytest.raises(ValueError, match=r"old draftsmith layout.*Retrain the head"):
        load_drafter(artifact, target)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_untrained_head_is_refused_unless_allowed(target, tmp_path, dtype):
    head = build_head("mtp", target)
    saved = build_head("mtp", target).to(dtype)  # saved in its training precision
    save_artifact(saved, target, tmp_path / "mtp", training={}, target_name_or_path="tiny")
    with pytest.raises(UntrainedDrafterError, match="untrained"):
        load_drafter(tmp_path / "mtp", target)
    with pytest.warns(UserWarning, match="untrained"):
        drafter = load_drafter(tmp_path / "mtp", target, allow_untrained=True)
    assert len(_drafts(drafter, head, target, [1, 2, 3])) == 3


# -- calibration and the command-line spec --------------------------------------------------------


def test_calibration_beside_the_artifact_becomes_the_policy_acceptance_model(artifact, target):
    draft_logits = torch.randn(6, 256, generator=torch.Generator().manual_seed(0))
    signals = confidence_signals(draft_logits)
    assert load_acceptance_model(artifact) is None
    raw = FixedPolicy(acceptance=load_acceptance_model(artifact))
    torch.testing.assert_close(raw.acceptance_prob(signals), signals["top1_prob"])

    rng = np.random.default_rng(0)
    calibrator = PlattScaling().fit(rng.uniform(size=200), rng.uniform(size=200) < 0.3)
    calibrator.save(artifact)
    policy = FixedPolicy(acceptance=load_acceptance_model(artifact))
    expected = calibrator.predict_signals(signals)
    torch.testing.assert_close(policy.acceptance_prob(signals), expected)
    assert not torch.allclose(expected, signals["top1_prob"])
    assert build_drafter(f"artifact:{artifact}", target, tokenizer=None).acceptance is not None


def test_artifact_spec_builds_a_drafter_without_a_hugging_face_counterpart(artifact, target):
    built = build_drafter(f"artifact:{artifact}", target, tokenizer=None)
    assert built.hf_assist == {}
    result = SpeculativeDecoder(target, built.drafter).generate([5, 6, 7], max_new_tokens=8)
    assert len(result.tokens) == 8


def test_benchmark_report_without_hugging_face_counterpart():
    stats = GenerationStats()
    stats.record_round(Draft(tokens=torch.tensor([1, 2])), 1)
    stats.finish(new_tokens=2, wall_s=0.5)
    run = PromptRun(tokens=[1, 2], wall_s=1.0)
    aggregate = Aggregate([PromptResult(0, "code", run, None, PromptRun([1, 2], 0.5), stats)])
    summary = aggregate.summary(greedy=True)
    assert summary["hf_tok_s"] is None and summary["speedup_vs_hf"] is None
    assert summary["hf_speedup_vs_plain"] is None and summary["hf_identical_to_plain"] is None
    assert summary["speedup_vs_plain"] == pytest.approx(2.0)
    table = format_table({"workloads": {"code": summary}, "overall": summary})
    row = table.splitlines()[-1].split()
    assert row[3] == "-" and row[6] == "-" and row[7] == "-"

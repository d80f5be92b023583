"""Distilled draft models through the one trainer: LoRA (train, exact resume, adapter and merged
exports, load), a pretrained sibling as the starting point, the artifact in `draftsmith
calibrate` and `draftsmith bench`, and the bad inputs (another vocabulary or tokenizer, a LoRA
module that does not exist, adapters on another base)."""

from __future__ import annotations

import copy
import json
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_model
from head_helpers import fit
from safetensors.torch import load_file

from draftsmith import FixedPolicy, SpeculativeDecoder, load_drafter
from draftsmith.artifact import save_artifact
from draftsmith.commands.cli import main
from draftsmith.core.fingerprint import model_fingerprint
from draftsmith.core.sampling import SamplingParams
from draftsmith.heads import build_head
from draftsmith.train.checkpoint import latest_checkpoint
from draftsmith.train.config import load_train_config
from draftsmith.train.trainer import Trainer, train

MODULES = ["json/decoder.py", "textwrap.py", "colorsys.py", "shlex.py", "fnmatch.py",
           "bisect.py", "heapq.py", "glob.py", "keyword.py", "string.py"]  # fmt: skip
LORA = {"init": "from_target", "layers": [0], "lora_rank": 4}


@pytest.fixture(autouse=True, scope="module")
def _quiet():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "disabled")
        yield


@pytest.fixture(scope="module")
def tokenizer(byte_tokenizer):
    tokenizer = copy.deepcopy(byte_tokenizer)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(0)  # documents end with it
    return tokenizer


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, target, tokenizer):
    """Folders of the target, a pretrained sibling (same tokenizer), a sibling with another
    vocabulary size and one whose tokenizer gives the same tokens other ids."""
    root = tmp_path_factory.mktemp("distilled-models")
    reordered = copy.deepcopy(tokenizer)
    vocab = reordered.get_vocab()
    assert len(vocab) == 256
    swapped = {token: 255 - i for token, i in vocab.items()}
    reordered.backend_tokenizer.model = type(reordered.backend_tokenizer.model)(swapped, [])
    for name, model, tok in [
        ("target", target, tokenizer),
        ("sibling", tiny_model("llama", seed=5), tokenizer),
        ("other-vocab", tiny_model("llama", seed=6, vocab_size=300), tokenizer),
        ("other-ids", tiny_model("llama", seed=7), reordered),
    ]:
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "code.jsonl"
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    path.write_text(
        "".join(json.dumps({"id": m, "text": (stdlib / m).read_text()}) + "\n" for m in MODULES)
    )
    return path


def recipe(corpus: Path, out: Path, head_args: dict, **overrides) -> dict:
    return {
        "target": "unused-when-passed-in",
        "head": "distilled",
        "head_args": head_args,
        "objective": {"divergence": "forward_kl"},
        "data": {"source": str(corpus), "seq_len": 64, "max_tokens": 64 * 24},
        "eval_data": {"source": str(corpus), "split": "heldout", "seq_len": 64},
        "batch_size": 4,
        "lr": 1e-2,
        "warmup_steps": 1,
        "max_steps": 6,
        "eval_batches": 2,
        "log_every": 1,
        "output_dir": str(out),
        **overrides,
    }


def run(raw: dict, target, tokenizer, tmp_path: Path) -> Trainer:
    path = tmp_path / f"{Path(raw['output_dir']).name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    trainer = Trainer(load_train_config(path), target=target, tokenizer=tokenizer)
    trainer.fit()
    return trainer


def train_losses(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["split"] == "train"]


def drafts(drafter, prompt: list[int]):
    drafter.start(torch.tensor(prompt))
    return drafter.propose(4, SamplingParams())


def assert_same_drafts(a, b) -> None:
    for prompt in ([5, 6, 7], [40, 41, 42, 43]):
        first, second = drafts(a, prompt), drafts(b, prompt)
        assert torch.equal(first.tokens, second.tokens)
        torch.testing.assert_close(first.logits, second.logits, atol=1e-4, rtol=1e-4)


class Killed(Exception):
    pass


# -- LoRA through the trainer ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, corpus, target, tokenizer):
    """A LoRA draft (one target layer) trained 20 steps, checkpointed every 10."""
    tmp = tmp_path_factory.mktemp("lora")
    raw = recipe(corpus, tmp / "straight", LORA, max_steps=20, checkpoint_every=10)
    return raw, run(raw, target, tokenizer, tmp)


def test_lora_trains_only_the_adapters_and_exports_them_alone(lora_run, target):
    raw, trainer = lora_run
    losses = train_losses(Path(raw["output_dir"]))
    assert sum(losses[-5:]) < 0.9 * sum(losses[:5])
    head = trainer.accelerator.unwrap_model(trainer.module).head
    trainable = {n for n, p in head.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # The frozen base is still the target's layer 0.
    base = dict(head.causal_lm().named_parameters())
    q_proj = "model.layers.0.self_attn.q_proj.base_layer.weight"
    assert torch.equal(base[q_proj], target.model.layers[0].self_attn.q_proj.weight)

    artifact = Path(raw["output_dir"]) / "drafter"
    saved = load_file(str(artifact / "model.safetensors"))
    assert saved.keys() == {n for n in head.state_dict() if "lora_" in n} == trainable
    config = json.loads((artifact / "config.json").read_text())["head"]
    assert config["lora_rank"] == 4 and config["lora_export"] == "adapter"
    loaded = load_drafter(artifact, target)
    assert_same_drafts(loaded, head.as_drafter(target))
    # The trained adapters matter: without them the drafts differ.
    plain = build_head("distilled", target, {"init": "from_target", "layers": [0]})
    assert not torch.equal(
        drafts(plain.as_drafter(target), [5, 6, 7]).logits, drafts(loaded, [5, 6, 7]).logits
    )


def test_lora_resumes_exactly(lora_run, tmp_path, target, tokenizer, monkeypatch):
    raw, straight = lora_run
    raw = {**raw, "output_dir": str(tmp_path / "interrupted")}
    original = Trainer._train_step

    def dies_at_step_15(self, window):
        if self.state.step == 15:
            raise Killed
        return original(self, window)

    monkeypatch.setattr(Trainer, "_train_step", dies_at_step_15)
    with pytest.raises(Killed):
        run(raw, target, tokenizer, tmp_path)
    assert latest_checkpoint(tmp_path / "interrupted").name == "step_10"
    monkeypatch.setattr(Trainer, "_train_step", original)
    resumed = run(raw, target, tokenizer, tmp_path)
    assert resumed.state.step == 20
    assert train_losses(tmp_path / "interrupted") == train_losses(Path(lora_run[0]["output_dir"]))
    weights = straight.module.state_dict(), resumed.module.state_dict()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])


def test_a_second_round_continues_the_adapters(lora_run, corpus, target, tokenizer, tmp_path):
    """init_from a LoRA artifact (e.g. before training on on-policy data it wrote)."""
    artifact = Path(lora_run[0]["output_dir"]) / "drafter"
    raw = recipe(corpus, tmp_path / "round2", LORA, init_from=str(artifact), max_steps=2)
    trainer = Trainer(load_train_config(_write(raw, tmp_path)), target=target, tokenizer=tokenizer)
    head = trainer.accelerator.unwrap_model(trainer.module).head
    saved = load_file(str(artifact / "model.safetensors"))
    state = head.state_dict()
    assert all(torch.equal(state[name], tensor) for name, tensor in saved.items())
    assert all("lora_" in n for n, p in head.named_parameters() if p.requires_grad)


def test_a_merged_lora_artifact_is_a_full_model_drafting_the_same(lora_run, target, tmp_path):
    _, trainer = lora_run
    head = trainer.accelerator.unwrap_model(trainer.module).head
    adapter = Path(lora_run[0]["output_dir"]) / "drafter"
    merged_head = copy.deepcopy(head)
    merged_head.config = type(head.config)(**{**vars(head.config), "lora_export": "merged"})
    merged = save_artifact(
        merged_head, target, tmp_path / "merged", training={}, target_name_or_path="tiny"
    )
    tensors = load_file(str(merged / "model.safetensors"))
    assert not [n for n in tensors if "lora_" in n]
    assert "model.model.layers.0.self_attn.q_proj.weight" in tensors
    config = json.loads((merged / "config.json").read_text())["head"]
    assert config["lora_rank"] == 0 and config["lora_export"] == "merged"
    assert_same_drafts(load_drafter(merged, target), load_drafter(adapter, target))


def test_the_trainer_exports_a_merged_lora_draft(corpus, target, tokenizer, tmp_path):
    raw = recipe(corpus, tmp_path / "merged", {**LORA, "lora_export": "merged"}, max_steps=2)
    result = train(load_train_config(_write(raw, tmp_path)), target=target, tokenizer=tokenizer)
    tensors = load_file(str(result.artifact / "model.safetensors"))
    assert tensors and not [n for n in tensors if "lora_" in n]
    drafter = load_drafter(result.artifact, target)
    assert len(drafts(drafter, [5, 6, 7]).tokens) == 4


def test_a_distilled_artifact_calibrates_and_benchmarks(lora_run, saved, tmp_path, capsys):
    artifact = shutil.copytree(Path(lora_run[0]["output_dir"]) / "drafter", tmp_path / "drafter")
    data = tmp_path / "heldout.jsonl"
    texts = [f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 3 for i in range(12)]
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    target_dir = str(saved / "target")
    main(
        ["calibrate", str(artifact), "--target", target_dir, "--data", str(data)]
        + ["--method", "histogram", "--dtype", "float32", "--seq-len", "64"]
    )
    assert json.loads((artifact / "calibration.json").read_text())["n_eval"] > 0
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"prompt": "hello", "workload": "chat"}\n')
    report = tmp_path / "bench.json"
    main(
        ["bench", "--target", target_dir, "--drafter", f"artifact:{artifact}"]
        + ["--prompts", str(prompts), "--max-new-tokens", "8", "--dtype", "float32"]
        + ["--json", str(report)]
    )
    overall = json.loads(report.read_text())["overall"]
    assert overall["identical_to_plain"] is True


# -- a pretrained sibling -------------------------------------------------------------------------


def test_sibling_starts_from_the_pretrained_draft(saved, target):
    head = build_head("distilled", target, {"init": "sibling", "model": str(saved / "sibling")})
    sibling = tiny_model("llama", seed=5)
    start = head.causal_lm().state_dict()
    assert all(torch.equal(start[n], t) for n, t in sibling.state_dict().items())
    assert head.config.base_fingerprint == model_fingerprint(sibling)
    assert head.config.base_fingerprint != model_fingerprint(target)


def test_sibling_trains_into_an_artifact_that_loads(saved, corpus, target, tokenizer, tmp_path):
    head_args = {"init": "sibling", "model": str(saved / "sibling")}
    raw = recipe(corpus, tmp_path / "sibling", head_args, max_steps=3)
    result = train(load_train_config(_write(raw, tmp_path)), target=target, tokenizer=tokenizer)
    tensors = load_file(str(result.artifact / "model.safetensors"))
    sibling = tiny_model("llama", seed=5).state_dict()
    # A full fine-tune keeps every weight (tied ones once), and they moved from the sibling's.
    assert "model.model.layers.1.mlp.down_proj.weight" in tensors
    name = "model.model.layers.1.mlp.down_proj.weight"
    assert not torch.equal(tensors[name], sibling[name.removeprefix("model.")])
    drafter = load_drafter(result.artifact, target)
    out = SpeculativeDecoder(target, drafter, policy=FixedPolicy(max_draft_tokens=3))
    assert len(out.generate([5, 6, 7], 8).tokens) == 8


def test_sibling_adapters_load_only_onto_their_base(saved, target, tmp_path):
    base = shutil.copytree(saved / "sibling", tmp_path / "base")
    head_args = {"init": "sibling", "model": str(base), "lora_rank": 4}
    head = fit(build_head("distilled", target, head_args), target, steps=3)
    artifact = save_artifact(
        head, target, tmp_path / "drafter", training={}, target_name_or_path="t"
    )
    assert all("lora_" in n for n in load_file(str(artifact / "model.safetensors")))
    assert_same_drafts(load_drafter(artifact, target), head.as_drafter(target))

    tiny_model("llama", seed=9).save_pretrained(base)  # another model now sits at the base's path
    with pytest.raises(ValueError, match=r"trained on a base draft model with fingerprint .* "
                       r"put that base back at .*lora_export: merged"):  # fmt: skip
        load_drafter(artifact, target)


# -- bad input ------------------------------------------------------------------------------------


def _write(raw: dict, tmp_path: Path) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_sibling_with_another_vocabulary_is_refused_with_the_fix(saved, target):
    with pytest.raises(ValueError, match=r"has a vocabulary of 300 tokens but the target's has "
                       r"256.*Give head_args.model a draft model of the target's family"):  # fmt: skip
        build_head("distilled", target, {"init": "sibling", "model": str(saved / "other-vocab")})


def test_a_sibling_with_another_tokenizer_is_refused_by_the_trainer(
    saved, corpus, target, tokenizer, tmp_path
):
    head_args = {"init": "sibling", "model": str(saved / "other-ids")}
    config = load_train_config(_write(recipe(corpus, tmp_path / "run", head_args), tmp_path))
    with pytest.raises(ValueError, match=r"uses another tokenizer than the target.*Give "
                       r"head_args.model a draft model of the target's family"):  # fmt: skip
        Trainer(config, target=target, tokenizer=tokenizer)


def test_a_lora_module_that_does_not_exist_is_named_with_the_real_ones(target):
    args = {**LORA, "lora_target_modules": ["q_proj", "qkv_proj"]}
    with pytest.raises(ValueError, match=r"lora_target_modules \['qkv_proj'\] name no linear "
                       r"layer .*down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"):  # fmt: skip
        build_head("distilled", target, args)
    head = build_head("distilled", target, {**LORA, "lora_target_modules": ["q_proj"]})
    adapted = {n.split(".lora_")[0] for n, p in head.named_parameters() if p.requires_grad}
    assert adapted == {"model.base_model.model.model.layers.0.self_attn.q_proj"}
    with pytest.raises(ValueError, match="give lora_rank > 0"):
        build_head("distilled", target, {"lora_target_modules": ["q_proj"]})


# -- on-policy data (DistillSpec) -----------------------------------------------------------------


def regenerate(saved: Path, corpus: Path, out: Path, *flags: str) -> list[dict]:
    main(
        ["regenerate", "--target", str(saved / "target"), "--source", str(corpus)]
        + ["--out", str(out), "--max-new-tokens", "8", "--prompt-tokens", "16"]
        + ["--prompts-per-document", "1", "--max-records", "4", "--dtype", "float32", *flags]
    )
    return [json.loads(line) for line in out.read_text().splitlines()]


def continuation(model, tokenizer, prompt: str) -> str:
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    out = model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False
    )
    row = out[0, ids.shape[1] :].tolist()
    end = row.index(0) if 0 in row else len(row)  # id 0 ends a document
    return tokenizer.decode(row[:end], skip_special_tokens=True)


def test_on_policy_data_is_the_draft_s_text_scored_by_the_target(
    saved, corpus, target, tokenizer, tmp_path
):
    records = regenerate(
        saved, corpus, tmp_path / "on-policy.jsonl", "--draft", str(saved / "sibling")
    )
    assert len(records) == 4
    sibling = tiny_model("llama", seed=5)
    for record in records:
        assert record["completion"] == continuation(sibling, tokenizer, record["prompt"])
    assert any(r["completion"] != continuation(target, tokenizer, r["prompt"]) for r in records)

    # The trainer reads those records (data pipeline: test_data) and scores them with the
    # target's distributions.
    head_args = {"init": "sibling", "model": str(saved / "sibling")}
    raw = recipe(tmp_path / "on-policy.jsonl", tmp_path / "run", head_args, batch_size=1)
    raw["data"] = {**raw["data"], "max_tokens": None, "heldout_fraction": 0.0}
    raw["eval_data"] = {**raw["data"]}
    config = load_train_config(_write(raw, tmp_path))
    trainer = Trainer(config, target=target, tokenizer=tokenizer)
    batch = trainer.train_source.batch(torch.arange(len(trainer.train_source)), "cpu")
    expected = target(batch.input_ids).logits
    torch.testing.assert_close(batch.target_logits.float(), expected)


def test_on_policy_data_from_a_distilled_artifact(
    lora_run, saved, corpus, target, tokenizer, tmp_path
):
    artifact = Path(lora_run[0]["output_dir"]) / "drafter"
    records = regenerate(
        saved, corpus, tmp_path / "round2.jsonl", "--draft", f"artifact:{artifact}"
    )
    writer = load_drafter(artifact, target).model  # the adapters merged
    assert [r["completion"] for r in records] == [
        continuation(writer, tokenizer, r["prompt"]) for r in records
    ]


def test_on_policy_writers_must_write_in_the_target_s_tokens(
    saved, corpus, target, tmp_path, capsys
):
    head = fit(build_head("eagle3", target, {"num_steps": 1}), target, steps=3)
    eagle3 = save_artifact(head, target, tmp_path / "eagle3", training={}, target_name_or_path="t")
    for draft, complaint in [
        (str(saved / "other-ids"), "uses another tokenizer than the target"),
        (f"artifact:{eagle3}", "reads the target's features and cannot write text alone"),
    ]:
        with pytest.raises(SystemExit) as exit:
            regenerate(saved, corpus, tmp_path / "x.jsonl", "--draft", draft)
        assert exit.value.code == 2
        assert complaint in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


# -- the Qwen2.5-Coder recipe ---------------------------------------------------------------------

QWEN_RECIPE = Path(__file__).resolve().parents[1] / "recipes/qwen2.5-coder-1.5b/draft-model.yaml"


@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "tv", "jsd"])
def test_the_qwen_recipe_distils_the_0_5b_toward_the_1_5b(divergence):
    launch = QWEN_RECIPE.read_text().splitlines()[0]
    assert launch.startswith("# accelerate launch") and "draft-model.yaml" in launch
    overrides = [word for word in launch.split() if "=" in word and not word.startswith("-")]
    config = load_train_config(QWEN_RECIPE, [*overrides, f"objective.divergence={divergence}"])
    assert config.target == "qwen2.5-coder-1.5b" and config.head == "distilled"
    head = config.head_args
    assert (head.init, head.model, head.lora_export) == ("sibling", "qwen2.5-coder-0.5b", "adapter")
    assert head.lora_rank > 0
    assert config.objective.divergence == divergence
    # the 1.5B's own words, code and chat, trained on; held-out files of both evaluated
    assert any("stdlib-train" in s for s in config.data.source)
    assert any("chitchat-train" in s for s in config.data.source)
    assert config.eval_data.split == "heldout"
    assert {"stdlib", "chitchat"} <= {Path(s).name.split("-")[0] for s in config.eval_data.source}
    full = load_train_config(QWEN_RECIPE, ["head_args.lora_rank=0"])
    assert full.head_args.lora_rank == 0  # full fine-tuning is one key away


@pytest.mark.slow
def test_the_recipe_s_head_builds_on_the_real_qwen_pair():
    """The 0.5B shares the 1.5B's vocabulary and tokenizer; LoRA leaves a few percent to train."""
    from transformers import AutoConfig, AutoTokenizer

    from draftsmith.heads import head_class
    from draftsmith.zoo import fetch_model

    target_dir = fetch_model("qwen2.5-coder-1.5b")
    args = load_train_config(QWEN_RECIPE).head_args
    head = head_class("distilled")(AutoConfig.from_pretrained(target_dir), args)
    head.check_tokenizer(AutoTokenizer.from_pretrained(target_dir))
    trainable = sum(p.numel() for p in head.parameters() if p.requires_grad)
    total = sum(p.numel() for p in head.parameters())
    assert 0 < trainable < 0.05 * total
    assert head.config.base_fingerprint is not None

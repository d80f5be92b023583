"""EAGLE-3, P-EAGLE, DFlash and DSpark parity with the speculators package's own model classes, in both
directions: our speculators export loaded by speculators, and a head built and saved by
speculators imported here, each giving the same draft logits on the same inputs (a tiny random
target; for P-EAGLE every depth of the block at every row).

speculators pins older transformers and datasets, so it lives in its own environment: make it with
`bash scripts/speculators_env.sh` and point SPECULATORS_PYTHON at its python (default
.venv-speculators/bin/python).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model
from head_helpers import moved_head
from safetensors.torch import load_file, save_file

from draftsmith.artifact.engines import export_head, import_head
from draftsmith.core.target import Target, TargetBatch
from draftsmith.heads import build_draft_vocab, build_head
from draftsmith.heads.blocks import causal_mask, lag

ROOT = Path(__file__).resolve().parents[1]
PYTHON = Path(os.environ.get("SPECULATORS_PYTHON", ROOT / ".venv-speculators/bin/python"))
SCRIPT = ROOT / "scripts" / "speculators_parity.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not PYTHON.is_file(),
        reason=f"no speculators environment at {PYTHON}: bash scripts/speculators_env.sh",
    ),
]


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0, num_hidden_layers=8)


def _speculators(*args: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [str(PYTHON), str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _inputs(target, head, tmp_path: Path) -> tuple[torch.Tensor, torch.Tensor, Path]:
    """The target's real features for a random sequence, lagged one row (row t: position t - 1),
    as both sides read them, saved for the speculators side."""
    input_ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(3))
    features, _, _ = Target(target, head.target_feature_layers).forward(input_ids)
    hidden = lag(features)
    path = tmp_path / "inputs.safetensors"
    save_file({"hidden_states": hidden.contiguous(), "input_ids": input_ids}, str(path))
    return hidden, input_ids, path


def _our_logits(head, hidden, input_ids) -> torch.Tensor:
    """The first draft step over every row: (1, T, V_d)."""
    rows = input_ids.shape[1]
    with torch.no_grad():
        out = head.step(head.fuse(hidden), input_ids, torch.arange(rows), causal_mask(rows))
        return head.logits(out)


@pytest.mark.parametrize(
    ("draft_vocab_size", "variant"),
    [(None, {}), (64, {}), (64, {"norm_before_fc": True}), (64, {"norm_before_residual": True})],
)
def test_speculators_loads_our_export_and_drafts_the_same(
    draft_vocab_size, variant, target, tmp_path
):
    args = {"draft_vocab_size": draft_vocab_size, **variant}
    head = build_head("eagle3", target, args)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    if draft_vocab_size:
        counts = torch.rand(256, generator=gen)
        head.set_draft_vocab(*build_draft_vocab(counts, draft_vocab_size))
    export_head(head, target, tmp_path / "spec", "speculators", verifier="tiny")
    hidden, input_ids, inputs = _inputs(target, head, tmp_path)
    _speculators("logits", str(tmp_path / "spec"), str(inputs), str(tmp_path / "theirs.st"))
    theirs = load_file(str(tmp_path / "theirs.st"))["logits"]
    ours = _our_logits(head, hidden, input_ids)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("norm_before_residual", ["false", "true"])
def test_a_head_saved_by_speculators_imports_and_drafts_the_same(
    norm_before_residual, target, tmp_path
):
    target.save_pretrained(tmp_path / "verifier")
    made = str(tmp_path / "made")
    _speculators("make", str(tmp_path / "verifier"), made, "2,4,5", "64", norm_before_residual)
    head = import_head(tmp_path / "made", target)
    assert head.target_feature_layers == (2, 4, 5)
    assert head.config.norm_before_residual is (norm_before_residual == "true")
    hidden, input_ids, inputs = _inputs(target, head, tmp_path)
    _speculators("logits", str(tmp_path / "made"), str(inputs), str(tmp_path / "theirs.st"))
    theirs = load_file(str(tmp_path / "theirs.st"))["logits"]
    torch.testing.assert_close(_our_logits(head, hidden, input_ids), theirs, rtol=1e-4, atol=1e-4)


def _our_block_logits(head, hidden, input_ids) -> torch.Tensor:
    """Every block depth d at every row t < T - d, depth by depth: (1, sum_d (T - d), V_d), the
    rows the speculators side computes (`peagle-logits`)."""
    rows = input_ids.shape[1]
    features = F.pad(hidden, (0, 0, 0, 1))[:, 1:]  # un-lag: forward_train lags them itself
    batch = TargetBatch(input_ids, torch.ones_like(input_ids, dtype=torch.bool), features, None)
    with torch.no_grad():
        steps = head.forward_train(batch)
    return torch.cat([logits[:, : rows - d] for d, logits in enumerate(steps)], dim=1)


@pytest.mark.parametrize(
    "args",
    [
        {"num_steps": 3},
        {"num_steps": 4, "draft_vocab_size": 64, "norm_before_residual": True, "mask_token_id": 9},
    ],
)
def test_speculators_loads_our_peagle_export_and_drafts_the_same_block(args, target, tmp_path):
    head = moved_head("peagle", target, **args)
    steps = args["num_steps"]
    export_head(head, target, tmp_path / "spec", "speculators", verifier="t", draft_tokens=steps)
    hidden, input_ids, inputs = _inputs(target, head, tmp_path)
    _speculators("peagle-logits", str(tmp_path / "spec"), str(inputs), str(tmp_path / "th.st"))
    theirs = load_file(str(tmp_path / "th.st"))["logits"]
    ours = _our_block_logits(head, hidden, input_ids)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)


def test_a_peagle_head_saved_by_speculators_imports_and_drafts_the_same(target, tmp_path):
    target.save_pretrained(tmp_path / "verifier")
    made = str(tmp_path / "made")
    _speculators("peagle-make", str(tmp_path / "verifier"), made, "2,4,5", "64", "9", "3")
    head = import_head(tmp_path / "made", target)
    assert (head.num_steps, head.config.mask_token_id) == (3, 9)
    hidden, input_ids, inputs = _inputs(target, head, tmp_path)
    _speculators("peagle-logits", made, str(inputs), str(tmp_path / "theirs.st"))
    theirs = load_file(str(tmp_path / "theirs.st"))["logits"]
    ours = _our_block_logits(head, hidden, input_ids)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def _dflash_inputs(target, head, tmp_path: Path) -> tuple[torch.Tensor, torch.Tensor, Path]:
    """The target's real features (row t: position t itself, as DFlash's context reads them)
    for a random sequence, saved for the speculators side."""
    input_ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(3))
    features, _, _ = Target(target, head.target_feature_layers).forward(input_ids)
    path = tmp_path / "inputs.safetensors"
    save_file({"hidden_states": features.contiguous(), "input_ids": input_ids}, str(path))
    return features, input_ids, path


def _dflash_parity(head, features, input_ids, theirs: torch.Tensor) -> None:
    """Every mask row of every anchor t < T - (K + 1): speculators' (its anchor rows' logits,
    which no loss reads, left out) against ours (forward_train's depth d at row t)."""
    block = head.num_steps + 1
    anchors = input_ids.shape[1] - block
    batch = TargetBatch(input_ids, torch.ones_like(input_ids, dtype=torch.bool), features, None)
    with torch.no_grad():
        steps = head.forward_train(batch)
    ours = torch.stack([logits[0, :anchors] for logits in steps], dim=1)  # (A, K, V_d)
    theirs = theirs.reshape(anchors, block, -1)[:, 1:]
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "args",
    [
        {"num_steps": 3},
        {"num_steps": 4, "draft_vocab_size": 64, "num_layers": 2, "mask_token_id": 9},
    ],
)
def test_speculators_loads_our_dflash_export_and_drafts_the_same_blocks(args, target, tmp_path):
    head = moved_head("dflash", target, **args)
    target.save_pretrained(tmp_path / "verifier")  # speculators reads the shared tensors there
    verifier = str(tmp_path / "verifier")
    export_head(head, target, tmp_path / "spec", "speculators", verifier=verifier)
    features, input_ids, inputs = _dflash_inputs(target, head, tmp_path)
    _speculators("dflash-logits", str(tmp_path / "spec"), str(inputs), str(tmp_path / "th.st"))
    _dflash_parity(head, features, input_ids, load_file(str(tmp_path / "th.st"))["logits"])


def test_a_dflash_head_saved_by_speculators_imports_and_drafts_the_same(target, tmp_path):
    target.save_pretrained(tmp_path / "verifier")
    made = str(tmp_path / "made")
    _speculators("dflash-make", str(tmp_path / "verifier"), made, "2,4,5", "64", "9", "5", "2")
    head = import_head(tmp_path / "made", target)
    assert (head.num_steps, head.config.mask_token_id, len(head.layers)) == (4, 9, 2)
    assert head.target_feature_layers == (2, 4, 5)
    features, input_ids, inputs = _dflash_inputs(target, head, tmp_path)
    _speculators("dflash-logits", made, str(inputs), str(tmp_path / "theirs.st"))
    _dflash_parity(head, features, input_ids, load_file(str(tmp_path / "theirs.st"))["logits"])


def _dspark_parity(head, features, input_ids, theirs: dict[str, torch.Tensor]) -> None:
    """`_dflash_parity` of the logits after the Markov bias, and the confidence head's logits
    of every mask row (depth d at anchor t follows token t + d)."""
    _dflash_parity(head, features, input_ids, theirs["logits"])
    block = head.num_steps + 1
    anchors = input_ids.shape[1] - block
    batch = TargetBatch(input_ids, torch.ones_like(input_ids, dtype=torch.bool), features, None)
    with torch.no_grad():
        _, states = head.forward_states(batch)
        # the states a DSpark head exposes are its confidence head's features
        ours = torch.stack([head.confidence_head(state[0, :anchors]) for state in states], dim=1)
    confidence = theirs["confidence"].reshape(anchors, block)[:, 1:]
    torch.testing.assert_close(confidence, ours, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("markov_head_type", ["vanilla", "gated"])
def test_speculators_loads_our_dspark_export_and_drafts_the_same_blocks(
    markov_head_type, target, tmp_path
):
    args = {"num_steps": 3, "draft_vocab_size": 64, "markov_rank": 8, "confidence_head": True}
    head = moved_head("dflash", target, markov_head_type=markov_head_type, **args)
    target.save_pretrained(tmp_path / "verifier")
    export_head(head, target, tmp_path / "spec", "speculators", verifier=str(tmp_path / "verifier"))
    features, input_ids, inputs = _dflash_inputs(target, head, tmp_path)
    _speculators("dspark-logits", str(tmp_path / "spec"), str(inputs), str(tmp_path / "th.st"))
    _dspark_parity(head, features, input_ids, load_file(str(tmp_path / "th.st")))


def test_a_dspark_head_saved_by_speculators_imports_and_drafts_the_same(target, tmp_path):
    target.save_pretrained(tmp_path / "verifier")
    made = str(tmp_path / "made")
    verifier = str(tmp_path / "verifier")
    _speculators("dspark-make", verifier, made, "2,4,5", "64", "9", "4", "1", "16", "gated")
    head = import_head(tmp_path / "made", target)
    assert (head.num_steps, head.config.markov_rank, head.config.markov_head_type) == (
        3,
        16,
        "gated",
    )
    features, input_ids, inputs = _dflash_inputs(target, head, tmp_path)
    _speculators("dspark-logits", made, str(inputs), str(tmp_path / "theirs.st"))
    _dspark_parity(head, features, input_ids, load_file(str(tmp_path / "theirs.st")))

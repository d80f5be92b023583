"""The verification cost curve: measuring it, storing it, reading it, and the draft budget it
chooses. Speed itself is never asserted: a fake clock stands in where times matter."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from conftest import tiny_model

from draftsmith import __version__
from draftsmith.artifact import save_artifact
from draftsmith.commands.cli import main
from draftsmith.decoding import profile
from draftsmith.decoding.profile import (
    CostCurve,
    default_sizes,
    device_name,
    profile_drafter,
    profile_target,
)
from draftsmith.heads import build_head
from draftsmith.heads.base import Draft, Drafter


class FakeClock:
    """Stands in for perf_counter in draftsmith.decoding.profile; advanced by hand."""

    def __init__(self, monkeypatch) -> None:
        self.now = 0.0
        monkeypatch.setattr(profile, "perf_counter", lambda: self.now)


def curve(tokens: list[int], verify_s: list[float], **kwargs) -> CostCurve:
    return CostCurve(tokens=tokens, verify_s=verify_s, context=16, **kwargs)


# -- measuring ------------------------------------------------------------------------------------


def test_default_sizes_are_dense_where_the_curve_bends():
    assert default_sizes(64) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    assert default_sizes(10) == [1, 2, 3, 4, 6, 8, 10]
    assert default_sizes(1) == [1]


def test_profile_target_times_each_size_after_the_same_context(llama):
    measured = profile_target(llama, max_tokens=8, context=16, repeats=2, name="tiny")
    assert measured.tokens == [1, 2, 3, 4, 6, 8]
    assert len(measured.verify_s) == 6 and all(s > 0 for s in measured.verify_s)
    assert (measured.context, measured.target, measured.dtype) == (16, "tiny", "float32")
    assert measured.device == "cpu" and measured.torch_threads == torch.get_num_threads()
    assert measured.draft_step_s is None


@pytest.mark.parametrize("dip", [False, True])
def test_profile_target_reports_the_fastest_run_of_each_size(monkeypatch, dip):
    """Each block forward is seen after exactly `context` cached positions (the cache is cropped
    back), and its time is the fastest of the repeats, warm-up excluded, never below a smaller
    block's."""
    model = tiny_model("llama", seed=5)
    clock = FakeClock(monkeypatch)
    seen: list[tuple[int, int]] = []
    calls = {3: 0, 5: 0}
    slow = {3: [9.0, 0.3, 0.2, 0.4], 5: [9.0, 0.5, 0.7, 0.6]}  # warm-up, then 3 repeats
    if dip:
        slow[5] = [9.0, 0.15, 0.7, 0.6]

    def forward(module, args, kwargs):
        n = kwargs["input_ids"].shape[1]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if n in calls:  # the prefill of the context is not timed
            seen.append((n, cache.get_seq_length()))
            clock.now += slow[n][calls[n]]
            calls[n] += 1

    handle = model.register_forward_pre_hook(forward, with_kwargs=True)
    try:
        measured = profile_target(model, sizes=[5, 3], context=12, repeats=3)
    finally:
        handle.remove()
    assert measured.tokens == [3, 5]
    assert measured.verify_s == pytest.approx([0.2, 0.2 if dip else 0.5])
    assert {length for _, length in seen} == {12} and len(seen) == 8


def test_profile_target_times_every_row_of_a_batch(llama):
    """A curve of 3 rows times forwards of (3, n) blocks after a (3, context) cache."""
    shapes: list[tuple[int, ...]] = []
    handle = llama.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    try:
        measured = profile_target(llama, sizes=[1, 2], context=8, repeats=1, rows=3)
    finally:
        handle.remove()
    assert measured.rows == 3 and measured.tokens == [1, 2]
    assert set(shapes) == {(3, 8), (3, 1), (3, 2)}
    with pytest.raises(ValueError, match="rows >= 1"):
        profile_target(llama, sizes=[1], context=8, rows=0)


def test_a_context_past_the_targets_positions_is_a_clear_error(llama):
    with pytest.raises(ValueError, match="exceeds the target's 256 positions: lower --context"):
        profile_target(llama, max_tokens=8, context=250)


class StepDrafter(Drafter):
    """Advances a fake clock by a fixed cost per round plus a cost per drafted token."""

    def __init__(self, clock: FakeClock, fixed: float, step: float) -> None:
        self.clock, self.fixed, self.step = clock, fixed, step
        self.started = 0

    def start(self, prompt_ids, target_features=None) -> None:
        self.started += 1

    def propose(self, shape, sampling, generator=None, stop=None, acceptance=None) -> Draft:
        self.clock.now += self.fixed + self.step * shape
        return Draft.empty()

    def draft(self, *args) -> Draft:  # the tree interface, where heads/base.py has it
        raise AssertionError("propose is overridden")

    def commit(self, tokens, target_features=None) -> None:
        raise AssertionError("profiling commits nothing")


def test_profile_drafter_cancels_the_fixed_cost_of_a_round(monkeypatch):
    clock = FakeClock(monkeypatch)
    drafter = StepDrafter(clock, fixed=0.5, step=0.01)
    step = profile_drafter(drafter, torch.arange(6), None, repeats=3)
    assert step == pytest.approx(0.01) and drafter.started == 1
    assert profile_drafter(StepDrafter(clock, fixed=0.5, step=0.0), torch.arange(6), None) == 0


class BlockStub(StepDrafter):
    """A block drafter: one forward (`fixed`) drafts up to `block_size` tokens."""

    block_size = 4

    def propose(self, shape, sampling, generator=None, stop=None, acceptance=None) -> Draft:
        self.asked = shape
        return super().propose(min(shape, self.block_size), sampling)


def test_profile_drafter_times_a_block_drafters_round_not_a_seventh_of_it(monkeypatch):
    """Proposing 8 tokens and proposing 1 cost a block drafter the same forward, so the
    difference over 7 would be 0: its figure is the round, its one forward."""
    drafter = BlockStub(FakeClock(monkeypatch), fixed=0.5, step=0.0)
    assert profile_drafter(drafter, torch.arange(6), None, repeats=3) == pytest.approx(0.5)
    assert drafter.asked == 4


# -- the curve ------------------------------------------------------------------------------------


def test_verify_cost_interpolates_and_extrapolates():
    c = curve([1, 2, 4, 8], [1.0, 2.0, 2.0, 4.0])
    assert [c.verify_cost(n) for n in (0, 1, 3, 6, 8, 16)] == [1.0, 1.0, 2.0, 3.0, 4.0, 8.0]
    assert c.relative(6) == 3.0
    falling = curve([1, 4], [2.0, 1.0])  # noise; beyond the last size it never gets cheaper
    assert falling.verify_cost(4) == 1.0 and falling.verify_cost(10) == 1.0
    assert curve([2], [3.0]).verify_cost(9) == 3.0


@pytest.mark.parametrize(
    ("tokens", "verify_s", "complaint"),
    [
        ([1, 2], [1.0], "one time per size"),
        ([], [], "one time per size"),
        ([2, 1], [1.0, 1.0], "increasing positive integers"),
        ([0, 1], [1.0, 1.0], "increasing positive integers"),
        ([1, 2], [1.0, 0.0], "positive seconds"),
    ],
)
def test_a_malformed_curve_is_refused(tokens, verify_s, complaint):
    with pytest.raises(ValueError, match=complaint):
        curve(tokens, verify_s)


def test_save_load_round_trip(tmp_path):
    saved = curve([1, 2, 4], [0.01, 0.012, 0.02], draft_step_s=0.003, drafter="ngram")
    path = tmp_path / "deep" / "curve.json"
    saved.save(path)
    assert CostCurve.load(path) == saved
    assert [p.name for p in path.parent.iterdir()] == ["curve.json"]  # no partial file left


def test_a_missing_curve_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="no cost curve at .*rerun `draftsmith profile"):
        CostCurve.load(tmp_path / "none.json")


@pytest.mark.parametrize(
    "text",
    [
        '{"tokens": [1, 2], "verify_s": [0.1',
        '{"tokens": [1, 2], "verify_s": [0.1, 0.2]}',
        '{"tokens": [1], "verify_s": [0.1], "context": 8, "colour": "red"}',
        '{"tokens": [1, 2], "verify_s": [0.1], "context": 8}',
        "[1, 2]",
    ],
)
def test_a_corrupt_curve_names_the_file_and_the_fix(tmp_path, text):
    path = tmp_path / "curve.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{path} is not a valid cost curve .*draftsmith profile"):
        CostCurve.load(path)


def test_batch_cost_is_measured_at_its_rows_and_read_at_equal_total_tokens_elsewhere():
    one_row = curve([1, 2, 4, 8], [1.0, 2.0, 2.0, 4.0])
    assert one_row.batch_cost(1, 4) == one_row.verify_cost(4)
    assert one_row.batch_cost(4, 2) == one_row.verify_cost(8) == 4.0  # 8 tokens in all
    four_rows = curve([1, 2, 4], [3.0, 5.0, 9.0], rows=4)
    assert four_rows.batch_cost(4, 2) == 5.0  # measured
    assert four_rows.batch_cost(8, 2) == 9.0  # 16 tokens: 4 rows of 4
    assert four_rows.batch_cost(2, 2) == 3.0  # 4 tokens: 4 rows of 1


def test_a_curve_saved_before_rows_existed_is_one_row(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"tokens": [1, 2], "verify_s": [1.0, 1.5], "context": 8}))
    assert CostCurve.load(path).rows == 1
    with pytest.raises(ValueError, match="rows must be a positive integer"):
        curve([1], [1.0], rows=0)


def test_default_path_names_target_dtype_and_device_kind(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    path = CostCurve.default_path("Qwen/Qwen2.5-0.5B", torch.bfloat16, "cuda:0")
    assert path == tmp_path / "profiles" / "Qwen_Qwen2.5-0.5B--bfloat16--cuda.json"
    assert (
        CostCurve.default_path("/models/tiny", "float32").name == "models_tiny--float32--cpu.json"
    )
    batched = CostCurve.default_path("/models/tiny", "float32", rows=4)
    assert batched.name == "models_tiny--float32--cpu--rows4.json"


# -- the command ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, byte_tokenizer):
    folder = tmp_path_factory.mktemp("target")
    tiny_model("llama", seed=0).save_pretrained(folder)
    byte_tokenizer.save_pretrained(folder)
    return folder


def test_profile_command_writes_the_curve(target_dir, tmp_path, capsys):
    out = tmp_path / "curve.json"
    argv = ["--target", str(target_dir), "--max-tokens", "4", "--context", "8", "--out", str(out)]
    main(["profile", *argv, "--repeats", "1", "--dtype", "float32"])
    saved = CostCurve.load(out)
    assert saved.tokens == [1, 2, 3, 4] and saved.context == 8
    assert saved.target == str(target_dir) and saved.draft_step_s is None
    assert json.loads(out.read_text())["dtype"] == "float32"
    printed = capsys.readouterr().out
    assert "x 1 token" in printed and f"wrote {out}" in printed


def test_profile_command_times_a_batch_and_stores_it_beside_the_one_row_curve(
    target_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    argv = ["--target", str(target_dir), "--max-tokens", "2", "--context", "8", "--rows", "3"]
    main(["profile", *argv, "--repeats", "1"])
    saved = CostCurve.load(CostCurve.default_path(str(target_dir), "float32", "cpu", rows=3))
    assert saved.rows == 3 and saved.tokens == [1, 2]
    assert "3 rows, each verifying" in capsys.readouterr().out
    assert not CostCurve.default_path(str(target_dir), "float32", "cpu").exists()


def timed_here(tokens: list[int], verify_s: list[float], **kwargs) -> CostCurve:
    """A curve as this draftsmith would have timed it on this machine."""
    here = {
        "draftsmith_version": __version__,
        "device_name": device_name(torch.device("cpu")),
        "torch_threads": torch.get_num_threads(),
    }
    return curve(tokens, verify_s, **{**here, **kwargs})


def test_bench_reads_the_curve_of_its_batch_size_where_one_is_stored(llama, tmp_path, monkeypatch):
    from draftsmith.build.cost_curve import cost_curve

    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    one_row = timed_here([1, 2], [1.0, 2.0])
    one_row.save(CostCurve.default_path("tiny", "float32", "cpu"))
    four = timed_here([1, 2], [3.0, 4.0], rows=4)
    four.save(CostCurve.default_path("tiny", "float32", "cpu", rows=4))
    assert cost_curve(llama, "tiny", max_tokens=65, rows=4).rows == 4
    assert cost_curve(llama, "tiny", max_tokens=65, rows=2) == one_row  # none stored for 2 rows


@pytest.mark.parametrize(
    ("elsewhere", "said"),
    [
        ({"draftsmith_version": "0.2.0"}, "timed by draftsmith 0.2.0"),
        ({"device_name": "cpu: Another CPU (AVX2)"}, "on cpu: Another CPU (AVX2) with"),
        ({"torch_threads": 64}, "with 64 torch threads"),
    ],
)
def test_bench_times_again_a_curve_timed_by_another_draftsmith_cpu_or_thread_count(
    llama, tmp_path, monkeypatch, capsys, elsewhere, said
):
    from draftsmith.build.cost_curve import cost_curve

    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    path = CostCurve.default_path("tiny", "float32", "cpu")
    timed_here([1, 2], [1.0, 2.0], **elsewhere).save(path)
    measured = cost_curve(llama, "tiny", max_tokens=4)
    here = timed_here([1], [1.0])
    timed = (measured.draftsmith_version, measured.device_name, measured.torch_threads)
    assert timed == (here.draftsmith_version, here.device_name, here.torch_threads)
    assert measured.verify_s[0] < 1.0 and said in capsys.readouterr().out
    assert CostCurve.load(path) == measured  # stored in its place


@pytest.mark.busy_check
@pytest.mark.parametrize(
    ("stored_ms", "now_ms", "timed_again"),
    [(10.0, 4.0, True), (10.0, 6.0, False), (1.0, 50.0, False)],
)
def test_a_curve_timed_while_the_machine_was_busy_is_timed_again(
    llama, tmp_path, monkeypatch, capsys, stored_ms, now_ms, timed_again
):
    """Kept while its one-token figure is at most twice what one costs now; a slow spell now
    (the last case) keeps it too. The clock is the injected profile's."""
    module = importlib.import_module("draftsmith.build.cost_curve")
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    path = CostCurve.default_path("tiny", "float32", "cpu")
    stored = timed_here([1, 2], [stored_ms / 1e3, 2 * stored_ms / 1e3])
    stored.save(path)
    checks = []

    def profile_now(target, *, sizes, context, rows, repeats):
        checks.append((sizes, context, rows))
        return timed_here(sizes, [now_ms / 1e3])

    monkeypatch.setattr(module, "profile_target", profile_now)
    measured = module.cost_curve(llama, "tiny", max_tokens=4)
    assert checks == [([1], stored.context, 1)]
    assert (measured != stored) is timed_again
    assert ("timed while the machine was busy" in capsys.readouterr().out) is timed_again
    assert CostCurve.load(path) == measured


def test_a_cpus_name_holds_its_model_and_matrix_instructions():
    name = device_name(torch.device("cpu"))
    assert name.startswith("cpu: ") and torch.backends.cpu.get_cpu_capability() in name
    assert ("AMX" in name) is torch.cpu._is_amx_tile_supported()


def test_profile_command_with_a_drafter_writes_to_the_default_path(
    target_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    spec = f"draft-model:{target_dir}"
    argv = ["--target", str(target_dir), "--drafter", spec, "--max-tokens", "2", "--context", "8"]
    main(["profile", *argv, "--repeats", "2"])
    saved = CostCurve.load(CostCurve.default_path(str(target_dir), "float32", "cpu"))
    assert saved.drafter == spec and saved.draft_step_s is not None and saved.draft_step_s >= 0


def test_profile_command_reports_a_block_drafters_cost_per_round(target_dir, tmp_path, capsys):
    head = build_head("peagle", tiny_model("llama", seed=0), {"num_steps": 3})
    with torch.no_grad():
        head.mask_hidden.add_(0.1)  # not the initialisation: a trained head to load
    artifact = save_artifact(
        head, tiny_model("llama", seed=0), tmp_path / "peagle", training={}, target_name_or_path=""
    )
    out = tmp_path / "curve.json"
    argv = ["--target", str(target_dir), "--drafter", f"artifact:{artifact}", "--out", str(out)]
    main(["profile", *argv, "--max-tokens", "2", "--context", "8", "--repeats", "1"])
    saved = CostCurve.load(out)
    assert saved.draft_block == 3 and saved.draft_step_s > 0
    printed = capsys.readouterr().out
    assert "draft round: " in printed and "one forward of up to 3 tokens" in printed


def test_profile_command_rejects_a_bad_drafter_before_loading(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["profile", "--target", "unused", "--drafter", "magic"])
    assert exit.value.code == 2
    assert "unknown drafter spec 'magic'" in capsys.readouterr().err

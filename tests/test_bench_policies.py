"""Several draft policies side by side in one benchmark run, and lockstep timing against plain
decoding (`Benchmark`, ``draftsmith bench --policy A B --lockstep``), on tiny models; timings
come from a fake clock, never the wall."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from conftest import greedy_reference, perturbed_copy

from draftsmith.commands.cli import main
from draftsmith.core.sampling import SamplingParams
from draftsmith.decoding import FixedPolicy, SpeculativeDecoder, ThresholdPolicy
from draftsmith.evaluation.benchmark import Benchmark
from draftsmith.evaluation.lockstep import PlainSteps, run_lockstep
from draftsmith.evaluation.report import format_table
from draftsmith.heads import DraftModelDrafter, NgramDrafter

PROMPTS = [
    {"prompt": "def add(a, b):\n    return", "workload": "code"},
    {"prompt": "Once upon a time", "workload": "prose"},
    {"prompt": "for i in range(10):", "workload": "code"},
]
NAMES = ["fixed:max_draft_tokens=2", "fixed:max_draft_tokens=4", "threshold"]


def ticks():
    """A fake clock: each read one second later than the last."""
    return itertools.count().__next__


def side_by_side(target, tokenizer, drafter, **kwargs) -> Benchmark:
    """The three policies of NAMES, each a decoder of its own, with a fake clock."""
    policies = [
        FixedPolicy(max_draft_tokens=2),
        FixedPolicy(max_draft_tokens=4),
        ThresholdPolicy(max_draft_tokens=6),
    ]
    decoders = {
        name: SpeculativeDecoder(target, drafter, tokenizer, policy=policy)
        for name, policy in zip(NAMES, policies, strict=True)
    }
    kwargs.setdefault("max_new_tokens", 10)
    return Benchmark(target, tokenizer, decoders, kwargs.pop("assist", {}), clock=ticks(), **kwargs)


@pytest.mark.parametrize("lockstep", [False, True])
def test_several_policies_are_methods_of_their_own_each_identical_to_plain(
    llama, byte_tokenizer, lockstep
):
    drafter = DraftModelDrafter(perturbed_copy(llama, scale=0.05))
    assist = {"prompt_lookup_num_tokens": 4}
    bench = side_by_side(llama, byte_tokenizer, drafter, assist=assist, lockstep=lockstep)
    report = bench.run(PROMPTS)
    json.loads(json.dumps(report))  # the report is plain JSON
    assert list(report["policies"]) == NAMES and "overall" not in report
    assert ("hf_assisted" in report) is lockstep and ("lockstep" in report) is lockstep
    encoded = [byte_tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in PROMPTS]
    expected = [greedy_reference(llama, ids, 10) for ids in encoded]
    for name, figures in report["policies"].items():
        overall = figures["overall"]
        assert set(figures["workloads"]) == {"code", "prose"}
        assert overall["n_prompts"] == 3 and overall["identical_to_plain"] is True
        assert overall["exact_match_rate"] == 1.0 and overall["divergences"] == []
        assert overall["mean_accepted_length"] > 1.0, name  # the draft model drafted
        assert len(overall["speedup_vs_plain_interval"]) == 2
        assert (overall["speedup_vs_hf"] is None) is lockstep
    # One record per prompt and policy, prompt by prompt, with every method's timings.
    records = report["prompts"]
    assert [(r["index"], r["policy"]) for r in records] == list(itertools.product(range(3), NAMES))
    methods = {"plain", "draftsmith"} if lockstep else {"plain", "hf", "draftsmith"}
    assert all(set(r["seconds"]) == methods and r["identical_to_plain"] for r in records)
    for record in records:  # plain's own tokens (lockstep: the one-token loop's) are greedy's
        assert record["tokens"]["plain"] == len(expected[record["index"]])
    table = format_table(report).splitlines()
    for name in NAMES:
        rows = [row for row in table if f" {name} " in row]
        assert [row.split()[0] for row in rows] == ["code", "prose", "overall"]
        assert all("[" in row and "True" in row for row in rows)  # intervals, identity


@contextmanager
def logged_runs(bench: Benchmark, on_run: Callable[[str], None]) -> Iterator[None]:
    """Calls on_run(method) as each timed run of a method starts (not the warm-up's): plain and
    assisted `generate` of the target, and each policy's decoder."""

    def plain_or_hf(*args, **kwargs):
        if kwargs.get("max_new_tokens") == bench.max_new_tokens:
            on_run("hf" if "prompt_lookup_num_tokens" in kwargs else "plain")
        return own_generate(*args, **kwargs)

    def policy(name: str, generate: Callable) -> Callable:
        def run(ids, max_new_tokens, **kwargs):
            if max_new_tokens == bench.max_new_tokens:
                on_run(name)
            return generate(ids, max_new_tokens, **kwargs)

        return run

    own_generate = bench.target.generate
    bench.target.generate = plain_or_hf
    for name, decoder in bench.decoders.items():
        decoder.generate = policy(name, decoder.generate)
    try:
        yield
    finally:
        del bench.target.generate
        for decoder in bench.decoders.values():
            del decoder.generate


def test_each_repeat_runs_every_method_once_the_first_one_rotating(llama, byte_tokenizer):
    bench = side_by_side(
        llama, byte_tokenizer, NgramDrafter(), assist={"prompt_lookup_num_tokens": 4}, repeats=5
    )
    order = []
    with logged_runs(bench, order.append):
        bench.run(PROMPTS[:1])
    methods = ["plain", "hf", *NAMES]
    assert bench.methods(1) == methods
    repeats = [order[i : i + len(methods)] for i in range(0, len(order), len(methods))]
    assert len(repeats) == 5 and all(sorted(r) == sorted(methods) for r in repeats)
    assert [r[0] for r in repeats] == methods  # each method runs first once


def test_the_fastest_repeat_counts_on_the_injected_clock(llama, byte_tokenizer):
    """Scripted seconds per run (the clock moves only as each run starts): each method's
    fastest run counts, from whichever repeat."""
    seconds = {"plain": [4, 2], NAMES[0]: [1, 3], NAMES[1]: [5, 5], NAMES[2]: [2, 8]}
    now, runs = [0], []

    def start(method: str) -> None:
        runs.append(method)
        now[0] += seconds[method][runs.count(method) - 1]

    bench = side_by_side(llama, byte_tokenizer, NgramDrafter(), repeats=2)
    bench.clock = lambda: now[0]
    with logged_runs(bench, start):
        report = bench.run(PROMPTS[:1])
    assert runs == ["plain", *NAMES, *NAMES, "plain"]
    for record in report["prompts"]:
        assert record["seconds"] == {"plain": 2, "draftsmith": min(seconds[record["policy"]])}
    figures = report["policies"][NAMES[0]]["overall"]
    assert figures["speedup_vs_plain"] == pytest.approx(2.0)  # as many tokens in half the time


def test_lockstep_catches_plain_up_after_every_round(llama, byte_tokenizer, monkeypatch):
    """Plain decoding runs between speculative rounds, as far as speculation has committed
    (after the policy observed the round), and each side's seconds are its own on the clock."""
    events = []

    class Logged(FixedPolicy):
        def observe_round(self, outcomes) -> None:
            super().observe_round(outcomes)
            events.append(("round", outcomes[0].committed))

    step = PlainSteps.step
    monkeypatch.setattr(PlainSteps, "step", lambda self: events.append(("plain", 1)) or step(self))
    draft = perturbed_copy(llama, scale=0.05)
    decoder = SpeculativeDecoder(
        llama, DraftModelDrafter(draft), byte_tokenizer, policy=Logged(max_draft_tokens=3)
    )
    ids = byte_tokenizer(PROMPTS[0]["prompt"], return_tensors="pt").input_ids[0]
    run = run_lockstep(decoder, ids, 12, SamplingParams(), 0, ticks())
    assert "observe_round" not in vars(decoder.policy)  # the hook is gone afterwards
    assert run.plain.tokens == run.result.tokens == greedy_reference(llama, ids, 12)
    committed = plain = 0
    for kind, count in events:
        if kind == "round":  # plain has caught up with every round before this one
            assert plain == min(committed, 12)
            committed += count
        else:
            plain += count
    assert plain == 12 and max(count for kind, count in events if kind == "round") > 1
    # On the ticking clock: plain's prefill and 12 steps, a second each; speculation's seconds
    # are the rest of its span.
    assert run.plain.seconds == 13 and run.seconds > 0


def test_an_unknown_policy_is_one_line_naming_the_valid_ones(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    argv = ["bench", "--target", "unused", "--drafter", "ngram", "--prompts", str(prompts)]
    with pytest.raises(SystemExit) as exit:
        main([*argv, "--policy", "fixed", "fastest:max_draft_tokens=2"])
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and "\n" not in err
    assert err == (
        "draftsmith bench: error: unknown --policy 'fastest': choose one of ['adaedl', "
        "'cm-asd', 'cost-aware', 'fixed', 'specdec++', 'threshold']"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--policy", "fixed", "fixed"], "--policy fixed is given twice"),
        (["--policy", "fixed", "threshold", "--policy-option", "x=1"], "give each its options"),
        (["--policy", "fixed", "threshold", "--min-path-confidence", "0.4"], "several --policy"),
        (["--policy", "fixed", "cost-aware", "--tree", "auto"], "give tree=auto in its spec"),
        (["--policy", "fixed:tree=auto"], "drop tree=auto from --policy fixed:tree=auto"),
        (["--policy", "fixed", "threshold", "--plot", "a.png"], "give one --policy"),
        (["--lockstep", "--batch-size", "2"], "drop --lockstep or --batch-size"),
        (["--policy", "fixed", "fixed:gamma=2"], "takes no option ['gamma']"),
    ],
)
def test_bad_combinations_of_several_policies_fail_before_any_model_loads(
    tmp_path, capsys, flags, message
):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    argv = ["bench", "--target", "unused", "--drafter", "ngram", "--prompts", str(prompts)]
    with pytest.raises(SystemExit):
        main([*argv, *flags])
    assert message in capsys.readouterr().err


@pytest.fixture(scope="module")
def target_folder(llama, byte_tokenizer, tmp_path_factory):
    """The tiny target and its tokenizer, saved as a folder the command loads."""
    folder = tmp_path_factory.mktemp("target")
    llama.save_pretrained(folder)
    byte_tokenizer.save_pretrained(folder)
    return folder


def test_bench_command_runs_several_policies_in_lockstep(target_folder, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"prompt": "hello hello", "workload": "chat"}\n')
    out = tmp_path / "report.json"
    argv = ["bench", "--target", str(target_folder), "--prompts", str(prompts)]
    argv += ["--drafter", f"draft-model:{target_folder}", "--dtype", "float32"]
    argv += ["--policy", "fixed:max_draft_tokens=3", "threshold", "--lockstep"]
    main([*argv, "--max-new-tokens", "6", "--repeats", "2", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["config"]["policy"] == ["fixed:max_draft_tokens=3", "threshold"]
    assert report["config"]["lockstep"] is True and "lockstep" in report
    assert list(report["policies"]) == ["fixed:max_draft_tokens=3", "threshold"]
    for figures in report["policies"].values():
        assert figures["overall"]["identical_to_plain"] is True
        assert figures["overall"]["n_prompts"] == 2 and len(figures["workloads"]) == 2
    printed = capsys.readouterr().out
    assert "fixed:max_draft_tokens=3" in printed and "lockstep:" in printed
    assert "Hugging Face assisted generation: not run" in printed


def test_one_policy_keeps_the_report_and_its_config_as_before(target_folder, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    out = tmp_path / "report.json"
    argv = ["bench", "--target", str(target_folder), "--prompts", str(prompts)]
    argv += ["--drafter", "ngram", "--dtype", "float32", "--policy", "fixed"]
    main([*argv, "--max-new-tokens", "4", "--json", str(out)])
    report = json.loads(out.read_text())
    assert list(report) == [
        "lossy", "batch_size", "repeats", "overall", "workloads", "prompts", "config"
    ]  # fmt: skip
    assert report["config"]["policy"] == "fixed"
    assert report["config"]["drafter_kind"] == "ngram"  # the results page names it
    assert set(report["prompts"][0]["seconds"]) == {"plain", "hf", "draftsmith"}

"""The command line: flags from typed dataclasses, and bad input as one line on stderr."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import pytest
import yaml
from conftest import tiny_model
from head_helpers import build_head, fit

from draftsmith.artifact import save_artifact
from draftsmith.build.flags import (
    ANY_NUMBER,
    POSITIONAL,
    Range,
    at_least,
    from_flags,
    parser_for,
)
from draftsmith.commands.cli import main
from draftsmith.core.models import bf16_matrix_units  # the real one: the conftest fakes it
from draftsmith.zoo import UnknownModelError

REPO = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------------------------
# Flags from a dataclass
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Example:
    """An example command."""

    FLAG_ALIASES: ClassVar[dict[str, tuple[str, ...]]] = {"loud": ("--shout",)}
    FLAG_RANGES: ClassVar[dict[str, Range]] = {"count": at_least(1), "rate": ANY_NUMBER}

    path: Path = field(metadata=POSITIONAL)
    """Where it is."""
    label: str
    """A required label."""
    count: int = 3
    """How many (100% of them)."""
    rate: float | None = None
    """A rate; None: none."""
    mode: Literal["fast", "slow"] = "fast"
    """How to go."""
    loud: bool = False
    """Say more."""
    tidy: bool = True
    """Clean up afterwards."""
    names: tuple[str, ...] = ("a", "b")
    """Some names."""


def parse(cls: type, argv: str):
    return from_flags(cls, parser_for(cls, "example").parse_args(argv.split()))


def test_flags_take_each_fields_default():
    assert parse(Example, "here --label x") == Example(path=Path("here"), label="x")


def test_flags_set_each_field_with_its_type():
    parsed = parse(
        Example,
        "here --label x --count 5 --rate 0.5 --mode slow --loud --no-tidy --names c d",
    )
    expected = Example(
        path=Path("here"), label="x", count=5, rate=0.5, mode="slow", loud=True, tidy=False
    )
    assert parsed == Example(**{**vars(expected), "names": ("c", "d")})
    assert type(parsed.count) is int and type(parsed.rate) is float
    assert parse(Example, "here --label x --shout").loud  # an alias keeps an older flag name


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        ("here", "the following arguments are required: --label"),
        ("here --label x --mode medium", "invalid choice: 'medium'"),
        ("here --label x --count many", "invalid int value: 'many'"),
    ],
)
def test_flags_reject_what_the_types_forbid(argv, complaint, capsys):
    with pytest.raises(SystemExit) as exit:
        parse(Example, argv)
    assert exit.value.code == 2 and complaint in capsys.readouterr().err


def test_flags_reject_a_value_out_of_its_range():
    with pytest.raises(ValueError, match=r"^--count must be >= 1, got 0$"):
        parse(Example, "here --label x --count 0")
    assert parse(Example, "here --label x --rate -7").rate == -7.0  # ANY_NUMBER: no bound


def test_a_numeric_field_without_a_range_is_a_clear_error():
    @dataclass
    class Unranged:
        steps: int = 1

    with pytest.raises(TypeError, match="field 'steps' is numeric: give its range"):
        parser_for(Unranged, "unranged")


def test_field_docs_are_the_help():
    text = " ".join(parser_for(Example, "example").format_help().split())
    assert "An example command." in text
    assert "--count COUNT How many (100% of them). (default: 3; must be >= 1)" in text
    assert "--mode {fast,slow} How to go. (default: fast)" in text
    assert "--loud, --no-loud, --shout, --no-shout Say more. (default: False)" in text
    assert "--names NAMES [NAMES ...] Some names. (default: a b)" in text
    assert "PATH Where it is." in text and "--rate RATE A rate; None: none." in text


def test_a_field_without_a_flag_type_is_a_clear_error():
    @dataclass
    class Odd:
        table: dict[str, int] = field(default_factory=dict)

    with pytest.raises(TypeError, match="field 'table': no command-line flag"):
        parser_for(Odd, "odd")


def command_names(capsys) -> list[str]:
    """The subcommands `draftsmith --help` lists."""
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    return re.findall(r"^    ([a-z][a-z-]+)\s", text.split("COMMAND", 2)[-1], flags=re.M)


def test_every_commands_help_lists_its_flags(capsys):
    """Each subcommand's parser builds (every numeric flag has its range) and documents each
    flag."""
    names = command_names(capsys)
    assert {"bench", "calibrate", "train", "prepare-data", "export", "profile"} <= set(names)
    for name in names:
        with pytest.raises(SystemExit) as exit:
            main([name, "--help"])
        text = capsys.readouterr().out
        assert exit.value.code == 0 and text.startswith(f"usage: draftsmith {name}")
        flags = re.findall(r"^  (--[a-z-]+)", text, flags=re.M)
        assert flags and all(re.search(rf"^  {f}\b.*\n?.*\w", text, re.M) for f in flags)


class ModelLoadAttempted(BaseException):
    """Raised where a model would load: not an Exception, so no command turns it into an
    error line."""


@pytest.fixture
def loading_stops(monkeypatch):
    """Stop a command where it would first fetch or load a model, its config or tokenizer."""
    import transformers

    def stop(*args, **kwargs):
        raise ModelLoadAttempted(args)

    for name in ("AutoModelForCausalLM", "AutoTokenizer", "AutoConfig"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", stop)
    monkeypatch.setattr("draftsmith.zoo.fetch.fetch_model", stop)


@pytest.mark.parametrize(
    "argv",
    [  # the command lines of the README and scripts/quickstart.sh
        "regenerate --target smollm2-135m --source stdlib --split heldout --dtype bfloat16 "
        "--max-new-tokens 128 --batch-size 64 --max-records 256 --prompts-per-document 8 "
        "--out h.jsonl --sample",
        "bench --target qwen2.5-coder-1.5b --drafter draft-model:qwen2.5-coder-0.5b --dtype "
        "bfloat16 --draft-tokens 12 --min-path-confidence 0.4 --json q.json --limit 3 "
        "--prompts p.jsonl",
        "calibrate runs/mine/drafter --target smollm2-135m --data h.jsonl --temperature 1 "
        "--method histogram --collect decode --draft-tokens 6",
        "prepare-data --target t --source stdlib --out rows --seq-len 64 --no-assistant-only-loss",
        "train recipes/smollm2-135m/eagle3.yaml output_dir=runs/mine max_steps=60",
    ],
    ids=lambda argv: argv.split()[0],
)
def test_documented_command_lines_run_up_to_loading_the_model(
    argv, models, loading_stops, tmp_path, monkeypatch
):
    """Each documented line is accepted whole (flags, ranges, files) and goes on to load."""
    monkeypatch.chdir(tmp_path)
    Path(prompts(tmp_path, '{"prompt": "def f():"}')).rename(tmp_path / "p.jsonl")
    (tmp_path / "h.jsonl").write_text('{"text": "def f(x):\\n    return x\\n"}\n')
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    artifact_copy(models, tmp_path / "runs" / "mine")
    (tmp_path / "recipes" / "smollm2-135m").mkdir(parents=True)
    (tmp_path / "recipes" / "smollm2-135m" / "eagle3.yaml").write_text(
        (REPO / "recipes" / "smollm2-135m" / "eagle3.yaml").read_text()
    )
    with pytest.raises(ModelLoadAttempted):
        main(argv.split())


# --------------------------------------------------------------------------------------------
# Errors: one line, exit status 2
# --------------------------------------------------------------------------------------------


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fail the test at any attempt to fetch or load a model, its config or its tokenizer."""
    import transformers

    def refuse(*args, **kwargs):
        pytest.fail(f"a model was loaded: {args}")

    for name in ("AutoModelForCausalLM", "AutoTokenizer", "AutoConfig"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", refuse)
    monkeypatch.setattr("draftsmith.zoo.fetch.fetch_model", refuse)


def fails(capsys, argv: list[str], code: int = 2) -> str:
    """The one line main prints to stderr as it exits with `code` (after any progress bars
    of model loading), with no traceback."""
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.endswith("\n")
    line = err.splitlines()[-1]
    assert line.startswith(f"draftsmith {argv[0]}: error: ")
    return line


@pytest.fixture(scope="module")
def models(tmp_path_factory, byte_tokenizer):
    """Saved folders: a tiny target, another target, a draft model with another tokenizer, and
    an artifact trained (briefly) for the target."""
    root = tmp_path_factory.mktemp("models")
    target = tiny_model("llama", seed=0)
    for name, model, tokenizer in [
        ("target", target, byte_tokenizer),
        ("other-target", tiny_model("llama", seed=1), byte_tokenizer),
        ("other-family", tiny_model("qwen2", seed=2), copy.deepcopy(byte_tokenizer)),
    ]:
        if name == "other-family":
            tokenizer.add_tokens(["<extra>"])
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    head = fit(build_head("medusa", target), target, steps=5)
    save_artifact(head, target, root / "drafter", training={"steps": 5}, target_name_or_path="t")
    return root


def artifact_copy(models: Path, tmp_path: Path) -> Path:
    out = tmp_path / "drafter"
    out.mkdir()
    for file in (models / "drafter").iterdir():
        if file.is_file():
            (out / file.name).write_bytes(file.read_bytes())
    return out


def prompts(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def bench(target: str | Path, drafter: str, prompt_file: str) -> list[str]:
    return ["bench", "--target", str(target), "--drafter", drafter, "--prompts", prompt_file]


def test_unknown_model(capsys):
    line = fails(capsys, ["fetch-model", "no-such-model"])
    assert line.startswith("draftsmith fetch-model: error: 'no-such-model' is not a zoo model")


@pytest.fixture
def unreachable_hub(monkeypatch):
    """Hub access online, the hub unreachable (the probe faked): the probes made, listed."""
    from huggingface_hub import constants

    from draftsmith.core import hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    probes = []
    monkeypatch.setattr(hub, "hub_reachable", lambda: probes.append("probe") or False)
    return probes


@pytest.mark.parametrize("command", ["bench", "profile", "regenerate"])
def test_an_unknown_model_fails_at_once_where_the_hub_cannot_be_reached(
    unreachable_hub, command, tmp_path, capsys
):
    from huggingface_hub import constants

    argv = {
        "bench": ["bench", "--target", "no-such/model", "--drafter", "ngram"],
        "profile": ["profile", "--target", "no-such/model"],
        "regenerate": ["regenerate", "--target", "no-such/model", "--source", "stdlib"],
    }[command]
    if command == "regenerate":
        argv += ["--out", str(tmp_path / "out.jsonl")]
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and len(err.splitlines()) == 1  # no retries logged before it
    assert err.startswith(
        f"draftsmith {command}: error: could not load model 'no-such/model' from 'no-such/model' "
        "(no such local folder, the hub is offline or unreachable from here"
    )
    assert unreachable_hub == ["probe"]  # asked once
    assert constants.HF_HUB_OFFLINE is True


def test_a_local_folder_never_probes_the_hub(unreachable_hub, models, capsys):
    from draftsmith.zoo import load_model

    load_model(str(models / "target"), dtype="float32")
    assert unreachable_hub == []


def test_the_hub_probe_asks_once_and_a_failure_means_unreachable(monkeypatch):
    import huggingface_hub.utils

    from draftsmith.core.hub import hub_reachable

    class Session:
        def __init__(self, answer):
            self.answer, self.asked = answer, []

        def head(self, url, timeout):
            self.asked.append((url, timeout))
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    for answer, reachable in [(OSError("Name or service not known"), False), ("200", True)]:
        session = Session(answer)
        monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda s=session: s)
        assert hub_reachable.__wrapped__(timeout=0.5) is reachable
        assert session.asked == [(session.asked[0][0], 0.5)]


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "dtype"),
    [(False, False, "float32"), (False, True, "bfloat16"), (True, False, "bfloat16")],
)
def test_dtype_auto_is_the_cpus_fast_precision(
    models, tmp_path, monkeypatch, caplog, amx, avx512_bf16, dtype
):
    """bench's default --dtype auto: bfloat16 where the CPU has bf16 matrix units (AMX or
    AVX-512 BF16, the capability probes faked), float32 where it has none."""
    import logging

    import torch

    # The real rule (the conftest fakes a CPU without units), on faked capability probes.
    monkeypatch.setattr("draftsmith.core.models.bf16_matrix_units", bf16_matrix_units)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    file = prompts(tmp_path, '{"prompt": "def f(x):"}')
    out = tmp_path / "report.json"
    argv = [*bench(models / "target", "ngram", file), "--policy", "fixed", "--json", str(out)]
    with caplog.at_level(logging.INFO, logger="draftsmith.core.models"):
        main([*argv, "--max-new-tokens", "2"])
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dtype auto")]
    assert said and said[0].startswith(f"dtype auto: {dtype} (this CPU has")
    assert ("no bf16 matrix units" in said[0]) == (dtype == "float32")
    loaded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loading ")]
    assert loaded and all(m.endswith(f"(torch.{dtype})") for m in loaded)
    report = json.loads(out.read_text())
    assert report["config"]["dtype"] == "auto" and report["overall"]["n_prompts"] == 1


def test_dtype_auto_follows_the_device():
    import torch

    from draftsmith.core.models import load_device, resolve_dtype

    assert resolve_dtype("bfloat16", "cpu") is torch.bfloat16  # a named precision stays
    assert resolve_dtype("auto", "cpu") is torch.float32  # the conftest's CPU without units
    assert load_device() == torch.device("cpu")
    assert load_device(device_map={"model.embed_tokens": 1, "lm_head": 0}) == torch.device(
        "cuda", 1
    )
    assert load_device(device_map={"model": "cpu"}) == torch.device("cpu")
    with pytest.raises(ValueError, match="unknown dtype 'half'"):
        resolve_dtype("half")


def test_missing_prompt_file(tmp_path, capsys):
    line = fails(capsys, bench("unused", "ngram", "no"))
    assert line == (
        "draftsmith bench: error: prompt file no does not exist: give a jsonl with 'prompt' fields"
    )


def test_non_json_prompt_line_names_file_and_line(tmp_path, capsys):
    file = prompts(tmp_path, '{"prompt": "def f():"}', "{not json")
    line = fails(capsys, bench("unused", "ngram", file))
    assert line.startswith(f"draftsmith bench: error: {file}:2: not a JSON record (")


def test_bad_drafter_spec_before_any_model_loads(tmp_path, capsys):
    file = prompts(tmp_path, '{"prompt": "x"}')
    line = fails(capsys, bench("unused", "magic", file))
    assert "unknown drafter spec 'magic'" in line


def test_corrupt_artifact_config_before_any_model_loads(models, tmp_path, capsys):
    artifact = artifact_copy(models, tmp_path)
    (artifact / "config.json").write_text('{"drafter": ')
    data = prompts(tmp_path, '{"text": "x"}')
    line = fails(capsys, ["calibrate", str(artifact), "--target", "unused", "--data", data])
    assert line.startswith(f"draftsmith calibrate: error: {artifact}/config.json is not valid JSON")


def test_corrupt_calibration_json(models, tmp_path, capsys):
    artifact = artifact_copy(models, tmp_path)
    (artifact / "calibration.json").write_text("[1, 2")
    file = prompts(tmp_path, '{"prompt": "x"}')
    line = fails(capsys, bench("unused", f"artifact:{artifact}", file))
    assert f"{artifact}/calibration.json is not valid JSON" in line


def test_truncated_safetensors(models, tmp_path, capsys):
    artifact = artifact_copy(models, tmp_path)
    weights = artifact / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    file = prompts(tmp_path, '{"prompt": "x"}')
    line = fails(capsys, bench(models / "target", f"artifact:{artifact}", file))
    assert "model.safetensors is corrupt or truncated" in line


def test_artifact_of_another_target(models, tmp_path, capsys):
    file = prompts(tmp_path, '{"prompt": "x"}')
    line = fails(capsys, bench(models / "other-target", f"artifact:{models / 'drafter'}", file))
    assert "was trained for" in line and "the fingerprints differ" in line


def test_draft_model_of_another_family(models, tmp_path, capsys):
    file = prompts(tmp_path, '{"prompt": "x"}')
    line = fails(capsys, bench(models / "target", f"draft-model:{models / 'other-family'}", file))
    assert "uses another tokenizer than the target" in line


def test_prompt_longer_than_the_context(models, tmp_path, capsys):
    file = prompts(tmp_path, json.dumps({"prompt": "x" * 300}))
    argv = bench(models / "target", "ngram", file) + ["--max-new-tokens", "2"]
    line = fails(capsys, [*argv, "--dtype", "float32"])
    assert "context of 256 positions: shorten the prompt" in line


def test_empty_calibration_data(models, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    line = fails(
        capsys, ["calibrate", str(models / "drafter"), "--target", "unused", "--data", str(empty)]
    )
    assert f"calibration data {empty} holds no records" in line


def test_unknown_calibration_method(capsys):
    argv = ["calibrate", "a", "--target", "t", "--data", "d", "--method", "magic"]
    assert "unknown calibrator kind 'magic'" in fails(capsys, argv)


def test_invalid_config_value(capsys):
    argv = ["prepare-data", "--target", "t", "--source", "s", "--out", "o", "--seq-len", "64"]
    line = fails(capsys, [*argv, "--max-tokens", "32"])
    assert line == (
        "draftsmith prepare-data: error: max_tokens (32) is below seq_len (64): not even one row "
        "would be made"
    )


BENCH = ["bench", "--target", "t", "--drafter", "ngram"]
PREPARE = ["prepare-data", "--target", "t", "--source", "stdlib", "--out", "o"]
REGENERATE = ["regenerate", "--target", "t", "--source", "stdlib", "--out", "o.jsonl"]
CALIBRATE = ["calibrate", "a", "--target", "t", "--data", "d"]


@pytest.mark.parametrize(
    ("argv", "flag", "value", "allowed"),
    [
        (BENCH, "--max-new-tokens", "-5", ">= 1"),
        (BENCH, "--temperature", "-1", ">= 0"),
        (BENCH, "--top-p", "0", "in (0, 1]"),
        (BENCH, "--top-k", "0", ">= 1"),
        (BENCH, "--limit", "0", ">= 1"),
        (BENCH, "--draft-tokens", "0", ">= 1"),
        (BENCH, "--verify-threshold", "1.5", "in [0, 1]"),
        (BENCH, "--min-path-confidence", "2", "in [0, 1]"),
        (BENCH, "--seed", "-1", ">= 0"),
        (BENCH, "--batch-size", "0", ">= 1"),
        (PREPARE, "--seq-len", "1", ">= 2"),
        (PREPARE, "--max-tokens", "0", ">= 2"),
        (PREPARE, "--max-documents", "0", ">= 1"),
        (PREPARE, "--heldout-fraction", "1", "in [0, 1)"),
        (PREPARE, "--seed", "-1", ">= 0"),
        (REGENERATE, "--max-new-tokens", "0", ">= 1"),
        (REGENERATE, "--batch-size", "0", ">= 1"),
        (REGENERATE, "--temperature", "0", "> 0"),
        (REGENERATE, "--top-p", "1.5", "in (0, 1]"),
        (REGENERATE, "--seed", "-1", ">= 0"),
        (REGENERATE, "--max-records", "0", ">= 1"),
        (REGENERATE, "--prompt-tokens", "0", ">= 1"),
        (REGENERATE, "--prompts-per-document", "0", ">= 1"),
        (REGENERATE, "--max-turns", "0", ">= 1"),
        (CALIBRATE, "--temperature", "-0.5", ">= 0"),
        (CALIBRATE, "--seq-len", "1", ">= 2"),
        (CALIBRATE, "--max-tokens", "0", ">= 1"),
        (CALIBRATE, "--prompt-tokens", "0", ">= 1"),
        (CALIBRATE, "--max-new-tokens", "0", ">= 1"),
        (CALIBRATE, "--max-prompts", "0", ">= 1"),
        (CALIBRATE, "--folds", "1", ">= 2"),
        (CALIBRATE, "--n-bins", "0", ">= 1"),
        (CALIBRATE, "--seed", "-1", ">= 0"),
        (CALIBRATE, "--draft-tokens", "0", ">= 1"),
        (["export", "a", "--format", "speculators", "--out", "o"], "--draft-tokens", "0", ">= 1"),
        (["profile", "--target", "t"], "--max-tokens", "0", ">= 1"),
        (["profile", "--target", "t"], "--context", "0", ">= 1"),
        (["profile", "--target", "t"], "--repeats", "0", ">= 1"),
        (["profile", "--target", "t"], "--rows", "0", ">= 1"),
    ],
)
def test_a_numeric_flag_out_of_range_fails_before_any_model_loads(
    argv, flag, value, allowed, no_model_loads, capsys
):
    line = fails(capsys, [*argv, flag, value])
    assert line == f"draftsmith {argv[0]}: error: {flag} must be {allowed}, got {value}"


def recipe(tmp_path: Path, **changes) -> str:
    raw = {"target": "unused", "head": "medusa", "data": {"source": "stdlib"}, "max_steps": 1}
    raw["output_dir"] = str(tmp_path / "run")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**raw, **changes}))
    return str(path)


def test_unknown_recipe_key_lists_the_valid_ones(tmp_path, capsys):
    line = fails(capsys, ["train", recipe(tmp_path), "max_step=2"])
    assert line.startswith("draftsmith train: error: unknown key 'max_step' in TrainConfig")
    assert "valid keys: target, target_dtype, head" in line


def test_missing_recipe(tmp_path, capsys):
    line = fails(capsys, ["train", str(tmp_path / "none.yaml")])
    assert line == f"draftsmith train: error: recipe {tmp_path / 'none.yaml'} does not exist"


def test_output_dir_that_is_a_file(tmp_path, capsys):
    (tmp_path / "taken").write_text("")
    for output_dir in (tmp_path / "taken", tmp_path / "taken" / "run"):
        line = fails(capsys, ["train", recipe(tmp_path, output_dir=str(output_dir))])
        assert f"output_dir {output_dir}" in line and "taken is a file, not a folder" in line


def test_head_config_typo_before_any_model_loads(tmp_path, capsys):
    line = fails(capsys, ["train", recipe(tmp_path, head_args={"num_stepz": 2})])
    assert "num_stepz" in line


def test_debug_shows_the_traceback():
    with pytest.raises(UnknownModelError):
        main(["--debug", "fetch-model", "no-such-model"])
    with pytest.raises(UnknownModelError):
        main(["fetch-model", "no-such-model", "--debug"])


def test_an_unexpected_error_is_one_line_too(monkeypatch, capsys):
    def broken(name: str) -> Path:
        raise RuntimeError("boom")

    monkeypatch.setattr("draftsmith.commands.fetch.fetch_model", broken)
    line = fails(capsys, ["fetch-model", "smollm2-135m"], code=1)
    assert line.startswith("draftsmith fetch-model: error: unexpected RuntimeError: boom")
    assert "--debug" in line


def test_train_script_gives_one_line_errors(tmp_path):
    missing = tmp_path / "none.yaml"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts/train.py"), str(missing)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"draftsmith train: error: recipe {missing} does not exist"


def test_a_field_of_one_value_or_several_takes_either():
    """A `str | list[str]` field (as DataConfig.source): one value stays a string, several a
    list."""

    @dataclass(kw_only=True)
    class Sources:
        source: str | list[str]
        """Where from."""

    assert parse(Sources, "--source a").source == "a"
    assert parse(Sources, "--source a.jsonl b.jsonl").source == ["a.jsonl", "b.jsonl"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--policy", "fastest"], "unknown --policy 'fastest'"),
        (["--policy", "fixed", "--min-path-confidence", "0.4"], "sets the threshold policy"),
        (["--policy", "fixed", "--tree", "auto"], "--tree auto is the cost-aware policy's"),
        (["--policy-option", "threshold"], "give KEY=VALUE"),
        (["--policy", "specdec++", "--policy-option", "rejection_threshold=2"], "in (0, 1)"),
        (["--policy", "fixed", "--policy-option", "gamma=2"], "takes no option ['gamma']"),
        (["--verify", "sloppy"], "unknown verification mode 'sloppy'"),
        (["--verify", "lossless", "--verify-threshold", "0.1"], "takes no threshold"),
    ],
)
def test_bad_policy_and_verify_flags(tmp_path, capsys, flags, message):
    file = prompts(tmp_path, '{"prompt": "x"}')
    line = fails(capsys, [*bench("unused", "ngram", file), *flags])
    assert message in line


def test_bad_tree_spec(tmp_path, capsys):
    file = prompts(tmp_path, '{"prompt": "x"}')
    line = fails(capsys, [*bench("unused", "ngram", file), "--tree", "3,4"])
    assert "tree '3,4': give chain, auto or TOP_K,DEPTH,TOTAL" in line


def test_bench_with_an_auto_tree_profiles_once_and_plots(models, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))
    file = prompts(tmp_path, '{"prompt": "def f(x):"}', '{"prompt": "hello", "workload": "chat"}')
    png = tmp_path / "sweep.png"
    argv = bench(models / "target", f"artifact:{models / 'drafter'}", file)
    argv += ["--tree", "auto", "--plot", str(png), "--max-new-tokens", "6", "--dtype", "float32"]
    main(argv)
    assert "measuring" in capsys.readouterr().out
    assert list((tmp_path / "home" / "profiles").glob("*.json"))
    assert png.stat().st_size > 0
    main([*argv, "--json", str(tmp_path / "r.json")])
    assert "measuring" not in capsys.readouterr().out  # the stored curve is reused
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["overall"]["identical_to_plain"] is True
    assert [p["size"] for p in report["tree_sweep"]][:3] == [1, 2, 4]


@pytest.mark.parametrize("drafter", ["draft-model", "artifact"])
def test_bench_batch_size_compares_batched_decoding(models, tmp_path, capsys, drafter):
    spec = {
        "draft-model": f"draft-model:{models / 'target'}",
        "artifact": f"artifact:{models / 'drafter'}",
    }[drafter]
    texts = ["def f(x):", "hello hello hello", "a", "The cat sat on the mat. The cat"]
    file = prompts(tmp_path, *(json.dumps({"prompt": t}) for t in texts))
    out = tmp_path / "report.json"
    argv = [*bench(models / "target", spec, file), "--batch-size", "3", "--policy", "fixed"]
    main([*argv, "--max-new-tokens", "10", "--dtype", "float32", "--json", str(out)])
    report = json.loads(out.read_text())
    overall = report["overall"]
    assert report["batch_size"] == report["config"]["batch_size"] == 3
    assert overall["n_prompts"] == 4 and overall["plain_tok_s"] > 0
    assert overall["identical_to_plain"] is True and overall["exact_match_rate"] == 1.0
    assert overall["mean_accepted_length"] >= 1.0
    printed = capsys.readouterr().out
    if drafter == "draft-model":  # it has an assisted-generation counterpart, not run at batch 3
        assert "batch size 1 only" in report["hf_assisted"] and "not run" in printed
        assert overall["mean_accepted_length"] > 1.5  # the target drafting for itself
    else:
        assert "hf_assisted" not in report


def test_bench_batch_with_a_prompt_longer_than_the_context(models, tmp_path, capsys):
    file = prompts(
        tmp_path, '{"prompt": "a"}', '{"prompt": "b"}', json.dumps({"prompt": "x" * 300})
    )
    argv = bench(models / "target", "ngram", file) + ["--batch-size", "3", "--dtype", "float32"]
    line = fails(capsys, [*argv, "--max-new-tokens", "2"])
    assert "prompt 2 has 300 tokens" in line
    assert "context of 256 positions: shorten the prompt, drop it from the prompt file" in line


def test_bench_batch_size_flag_errors(tmp_path, capsys):
    file = prompts(tmp_path, '{"prompt": "x"}')
    line = fails(capsys, [*bench("unused", "ngram", file), "--batch-size", "0"])
    assert "--batch-size must be >= 1" in line
    line = fails(capsys, [*bench("unused", "ngram", file), "--batch-size", "2", "--plot", "a.png"])
    assert "--plot sweeps tree sizes at batch size 1" in line


def test_tree_chain_asks_the_default_policy_for_a_bare_chain():
    from draftsmith.build.policies import tree_options
    from draftsmith.decoding.policies import DEFAULT_POLICY, build_policy

    def largest(spec, policy):
        return build_policy(policy, **tree_options(spec, policy)).largest

    assert largest("chain", DEFAULT_POLICY).is_chain
    assert largest(None, DEFAULT_POLICY).expand == 1  # its own draft: a sibling chain
    assert largest("chain", "fixed").is_chain and largest(None, "fixed").is_chain
    assert largest("4,3,12,1", "fixed").width == 1

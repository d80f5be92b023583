"""The standard benchmark suite: fixed prompts of six workloads, run side by side.

``draftsmith bench --suite standard`` decodes every prompt of ``suites/standard-v1.jsonl`` (package
data) by plain `generate`, Hugging Face assisted generation (where the drafter has a Hugging Face
counterpart) and draftsmith, interleaved per prompt after a warm-up, `SUITE_REPEATS` times with the
methods' order rotating (`Benchmark`); per workload and overall it reports the speedups with 90%
bootstrap intervals over prompts, tau, acceptance by draft position and the divergences from plain
greedy output, and names what it ran on (`environment`).

The workloads follow Spec-Bench (multi-turn chat, code completion, summarisation, translation,
math reasoning, question answering over a passage in the prompt), 12 prompts each, built by
``benchmarks/suite/build_standard.py`` from text that installs offline and that no recipe trains or
calibrates on: the suite measures drafting on text the drafter has not seen.

Tokens per prompt: `SUITE_MAX_NEW_TOKENS` = 48, so that the main job's EAGLE-3 head for
SmolLM2-135M fits the 20 minutes the whole suite may take on a 2-core CPU: 72 prompts x 3
repeats x (plain + draftsmith) x 48 tokens is about 20,700 decoded tokens. A drafter with a
Hugging Face counterpart adds assisted generation, a third method (half as much time again).

Chat-style records (a list of turns) go through the target's chat template; a tokenizer without
one gets a plain ``User:`` / ``Assistant:`` transcript. Code records are text to continue.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

SUITES = {"standard": "suites/standard-v1.jsonl"}
"""Suite names and their files in this package; a new version is a new file."""
SUITE_WORKLOADS = ("chat", "code", "summarisation", "translation", "math", "qa")
SUITE_MAX_NEW_TOKENS = 48
SUITE_REPEATS = 3
NGRAM = 8
RECORD_KEYS = ("id", "workload", "prompt", "source", "licence")


def suite_path(name: str) -> Path:
    """The jsonl of suite `name` (a name of `SUITES`, or a path to such a file)."""
    if name in SUITES:
        return Path(str(resources.files("draftsmith.evaluation") / SUITES[name]))
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"unknown suite {name!r}: give one of {sorted(SUITES)} or a jsonl path")
    return path


def load_suite(name: str) -> list[dict]:
    """The suite's records {"id", "workload", "prompt", "source", "licence"}; a prompt is text to
    continue or a list of chat turns {"role", "content"}."""
    path = suite_path(name)
    records = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        missing = [key for key in RECORD_KEYS if key not in record]
        prompt = record.get("prompt")
        turns_ok = (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, dict) and {"role", "content"} <= set(t) for t in prompt)
        )
        if missing or not (isinstance(prompt, str) and prompt or turns_ok):
            raise ValueError(
                f"{path}:{line_no}: a suite record needs {', '.join(RECORD_KEYS)} (missing "
                f"{missing or 'none'}) and a prompt that is text or a list of {{role, content}}"
            )
        records.append(record)
    if not records:
        raise ValueError(f"suite file {path} holds no records")
    return records


def prompt_text(record: dict) -> str:
    """The record's words, turns joined by newlines (what the disjointness check reads)."""
    prompt = record["prompt"]
    return prompt if isinstance(prompt, str) else "\n".join(t["content"] for t in prompt)


def render_prompt(record: dict, tokenizer: PreTrainedTokenizerBase) -> str:
    """The text the target reads: a text prompt as it is, chat turns through the tokenizer's chat
    template (ending where the assistant answers), or a transcript when it has none."""
    prompt = record["prompt"]
    if isinstance(prompt, str):
        return prompt
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    said = [f"{t['role'].capitalize()}: {t['content']}" for t in prompt]
    return "\n".join([*said, "Assistant:"])


def bench_prompts(records: list[dict], tokenizer: PreTrainedTokenizerBase) -> list[dict]:
    """Suite records as `Benchmark.run`'s prompts {"prompt", "workload"}."""
    return [
        {"prompt": render_prompt(r, tokenizer), "workload": r["workload"], "id": r["id"]}
        for r in records
    ]


def run_suite(bench, records: list[dict], command: str | None = None) -> dict:
    """Run `records` on a `Benchmark` and add what was run and where: the suite's prompt ids and
    `environment`."""
    report = bench.run(bench_prompts(records, bench.tokenizer))
    for entry in report["prompts"]:
        entry["id"] = records[entry["index"]]["id"]
    report["environment"] = environment(bench.target, command)
    return report


# --------------------------------------------------------------------------------------------
# What a run ran on
# --------------------------------------------------------------------------------------------


def environment(target: PreTrainedModel, command: str | None = None) -> dict:
    """The hardware (CPU model and its matrix units, or the GPU) and its class, the target's
    dtype, the torch, transformers and draftsmith versions, the git commit when run from a
    checkout, the date (UTC) and the command."""
    import transformers

    from draftsmith import __version__
    from draftsmith.decoding.profile import device_name

    device = next(target.parameters()).device
    return {
        "hardware": device_name(device),
        "hardware_class": hardware_class(device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "draftsmith": __version__,
        "torch_threads": torch.get_num_threads(),
        **git_commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "command": command if command is not None else " ".join(["draftsmith", *sys.argv[1:]]),
    }


def hardware_class(device: torch.device) -> str:
    """A short name of the kind of hardware, for file names and the results page's tables:
    ``gpu-<model>``, or ``cpu-amx``, ``cpu-avx512-bf16``, ``cpu-<capability>`` (avx2, avx512,
    default) by the CPU's fastest matrix units."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device).lower().replace("nvidia", "")
        return "gpu-" + "-".join(re.findall(r"[a-z0-9]+", name))
    if device.type != "cpu":
        return device.type
    if torch.cpu._is_amx_tile_supported():
        return "cpu-amx"
    if torch.cpu._is_avx512_bf16_supported():
        return "cpu-avx512-bf16"
    return "cpu-" + torch.backends.cpu.get_cpu_capability().lower()


def git_commit() -> dict:
    """{"commit", "dirty"} of the checkout this package runs from; {"commit": None} when it is
    installed from a wheel or git is missing."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None}
    return {"commit": head, "dirty": bool(status.strip())}


# --------------------------------------------------------------------------------------------
# Disjointness from the recipes' sources
# --------------------------------------------------------------------------------------------


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    """The n-grams of the text's lower-cased whitespace tokens."""
    tokens = text.lower().split()
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def shared_ngrams(
    prompts: dict[str, str | list[dict]], texts: Iterable[str], n: int = NGRAM
) -> dict[str, tuple[str, ...]]:
    """Per prompt key that shares an n-gram with any of `texts`: one such n-gram. One pass over
    the texts; only windows whose first token starts some prompt n-gram are looked up."""
    owners: dict[tuple[str, ...], str] = {}
    for key, prompt in prompts.items():
        for gram in ngrams(prompt_text({"prompt": prompt}), n):
            owners.setdefault(gram, key)
    firsts = {gram[0] for gram in owners}
    found: dict[str, tuple[str, ...]] = {}
    for text in texts:
        tokens = text.lower().split()
        for i in range(len(tokens) - n + 1):
            if tokens[i] in firsts:
                gram = tuple(tokens[i : i + n])
                if gram in owners:
                    found.setdefault(owners[gram], gram)
    return found


def recipe_sources(
    home: Path | None = None, recipes: Path | None = None
) -> Iterator[tuple[str, Iterable[str] | None, str]]:
    """(name, texts or None, why not) of every source the recipes and the quickstart train or
    calibrate on: the standard library's non-test modules (both splits), chitchat (every
    conversation, both splits; when fetched into `home`'s data folder), and each local data
    file the recipes under `recipes` name that exists here (the target's continuations of those
    sources). Hub datasets cannot be read on these machines: they come with None and the
    reason."""
    from draftsmith.core.home import default_home
    from draftsmith.data.chitchat import CHITCHAT_REQUIREMENT, chitchat_conversations
    from draftsmith.data.corpora import read_python_source, stdlib_files, stdlib_root

    root = stdlib_root()
    yield "stdlib", (read_python_source(root / m) for m in stdlib_files()), ""
    chitchat = (home or default_home()) / "data" / CHITCHAT_REQUIREMENT.replace("==", "-")
    chitchat = chitchat / "dataset.json"
    if chitchat.is_file():
        yield "chitchat", (" ".join(turns) for _, turns in chitchat_conversations(chitchat)), ""
    else:
        why = f"not fetched here ({chitchat}; data.corpora.chitchat_path fetches it)"
        yield "chitchat", None, why
    for name, path in _recipe_data(recipes):
        if path is None:
            yield name, None, "a Hugging Face hub dataset: these machines cannot reach the hub"
        elif path.is_file():
            yield name, _jsonl_texts(path), ""
        else:
            yield name, None, "not generated on this machine (draftsmith regenerate makes it)"


def _recipe_data(recipes: Path | None) -> list[tuple[str, Path | None]]:
    """(source, local path or None for a hub dataset) named by the recipes' data sections."""
    import yaml

    if recipes is None or not recipes.is_dir():
        return []
    offline = {"stdlib", "chitchat", "chitchat-transcripts"}  # read above
    found: dict[str, Path | None] = {}
    for recipe in sorted(recipes.glob("*/*.yaml")):
        config = yaml.safe_load(recipe.read_text()) or {}
        for section in ("data", "eval_data"):
            sources = (config.get(section) or {}).get("source") or []
            for source in [sources] if isinstance(sources, str) else sources:
                if source in offline:
                    continue
                hub = re.fullmatch(r"[\w.-]+/[\w.-]+", source) and not Path(source).suffix
                found[source] = None if hub else recipes.parent / source
    return sorted(found.items())


def _jsonl_texts(path: Path) -> Iterator[str]:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            turns = row.get("messages") or []
            parts = [row.get("prompt") or "", row.get("text") or ""]
            yield " ".join([*parts, *(t.get("content") or "" for t in turns)])

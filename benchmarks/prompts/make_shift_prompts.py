"""Build the workload-shift prompt sets, ``benchmarks/prompts/shift/{code,docs,prose,chat}.jsonl``:
workloads that no training or calibration data of ours used, to measure how a calibration fitted
on held-out stdlib code holds on other traffic (issue 13, item 6).

    apt-get install -y bible-kjv fortunes jargon-text
    python benchmarks/prompts/make_shift_prompts.py            # rewrites the files, prints a summary
    python benchmarks/prompts/make_shift_prompts.py --check    # exits 1 if a committed file differs

Each line is ``{"prompt", "workload", "source"}``, 16 per workload, plain text any target
continues without a chat template, cut at a line boundary:

- ``code``: functions of third-party packages installed in site-packages (not the standard
  library), two from each of `PACKAGES`, each from its own module: signature, docstring and the
  first body lines, 100-400 tokens.
- ``docs``: the start of Debian package documentation in markdown or reStructuredText
  (``/usr/share/doc/*/*.md|rst[.gz]``, one file per package; change logs, licences and the
  like skipped), 100-300 tokens.
- ``prose``: bible-kjv passages (`BIBLE_PASSAGES`), jargon-text entries and fortunes longer
  than a quip, 100-300 tokens.
- ``chat``: held-out chitchat conversations (`document_split`) as ``A: ... / B: ...``
  transcripts ending on the next speaker's cue, 100-300 tokens.

The bundled benchmark's own prompts (``draftsmith/evaluation/bench_prompts.jsonl``) are never reused.
Deterministic: candidates are ordered by the sha1 of their source name (the seed) and the first
that fit are taken. Tokens are counted with SmolLM2's tokenizer. The code and docs prompts depend
on what is installed: these were made with Python 3.11 and the packages' versions in `PACKAGES`
at the time (numpy 2.4).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from site import getsitepackages

from make_bench_prompts import OUT as BENCH_PROMPTS
from make_bench_prompts import (
    TokenCounter,
    bible_prompt,
    chat_candidates,
    cut_lines,
    fortune_candidates,
    function_prompt,
    functions,
    jargon_lines,
    jargon_prompt,
    stable_order,
    take,
    token_counter,
)

from draftsmith.data.corpora import read_python_source

OUT = Path(__file__).resolve().parent / "shift"
TOKENIZER = "smollm2-135m"
PER_WORKLOAD = 16
TEXT_TOKENS = (100, 300)
PACKAGES = ("numpy", "requests", "click", "jinja2", "networkx", "pygments", "rich", "sympy")
CODE_PER_PACKAGE = 2
DOCS = Path("/usr/share/doc")
DOC_SKIP = ("change", "news", "history", "licen", "copying", "authors", "conduct", "contrib")
BIBLE_PASSAGES = ("Gen37:1-12", "Exo3:1-12", "1Sam17:1-12", "Job1:1-12", "Luke15:11-24")
JARGON_ENTRIES = 5
FORTUNE_FILES = ("literature", "wisdom", "people", "science", "work", "humorists")


def code_candidates(package: str, n_tokens: TokenCounter) -> Iterator[tuple[str, str]]:
    """One function per module of a third-party package (the first in stable order that fits)."""
    root = Path(getsitepackages()[0])
    modules = [
        path.relative_to(root).as_posix()
        for path in sorted((root / package).rglob("*.py"))
        if not {"tests", "testing", "_vendor"} & set(path.parts)
    ]
    for module, _ in stable_order([(m, m) for m in modules]):
        source = read_python_source(root / module)
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines()
        named = [(f"site-packages:{module}::{name}", node) for name, node in functions(tree)]
        for name, node in stable_order(named):
            prompt = function_prompt(node, lines, n_tokens)
            if prompt:
                yield name, prompt
                break


def docs_candidates(n_tokens: TokenCounter) -> Iterator[tuple[str, str]]:
    """The start of one markdown / reST document per Debian package."""
    files = {}
    for path in sorted(DOCS.glob("*/*")):
        name = path.name.lower().removesuffix(".gz")
        if name.endswith((".md", ".rst")) and not any(s in name for s in DOC_SKIP):
            files.setdefault(path.parent.name, path)  # the package's first file, by name
    for _, path in stable_order(list(files.items())):
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8", "replace")
        prompt = cut_lines(text.strip().splitlines(), n_tokens, *TEXT_TOKENS)
        if prompt:
            yield f"doc:{path.relative_to(DOCS)}", prompt


def jargon_candidates(n_tokens: TokenCounter) -> Iterator[tuple[str, str]]:
    headwords = [line[4:].split(":")[0] for line in jargon_lines() if line.startswith("   :")]
    for _, headword in stable_order([(h, h) for h in headwords if h]):
        source, prompt = jargon_prompt(n_tokens, headword)
        if prompt:
            yield source, prompt


def unused(candidates: Iterator[tuple[str, str]], used: set[str]) -> Iterator[tuple[str, str]]:
    """candidates whose source the bundled benchmark does not already use."""
    return (c for c in candidates if c[0] not in used)


def build(n_tokens: TokenCounter) -> dict[str, list[dict[str, str]]]:
    bench = BENCH_PROMPTS.read_text(encoding="utf-8").splitlines()
    used = {json.loads(line)["source"] for line in bench if line.strip()}
    fortunes = [take(unused(fortune_candidates(f, n_tokens), used), 1)[0] for f in FORTUNE_FILES]
    groups = {
        "code": [
            candidate
            for package in PACKAGES
            for candidate in take(code_candidates(package, n_tokens), CODE_PER_PACKAGE)
        ],
        "docs": take(docs_candidates(n_tokens), PER_WORKLOAD),
        "prose": [
            *(bible_prompt(n_tokens, passage) for passage in BIBLE_PASSAGES),
            *take(unused(jargon_candidates(n_tokens), used), JARGON_ENTRIES),
            *fortunes,
        ],
        "chat": take(unused(chat_candidates(n_tokens), used), PER_WORKLOAD),
    }
    return {
        workload: [{"prompt": p, "workload": workload, "source": s} for s, p in chosen]
        for workload, chosen in groups.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = parser.parse_args()

    n_tokens = token_counter(TOKENIZER)
    stale = []
    for workload, records in build(n_tokens).items():
        counts = [n_tokens(r["prompt"]) for r in records]
        print(
            f"{workload}: {len(records)} prompts, {sum(counts)} tokens "
            f"({min(counts)}-{max(counts)} each)"
        )
        content = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        path = args.out / f"{workload}.jsonl"
        if args.check:
            if not (path.exists() and path.read_text(encoding="utf-8") == content):
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(content, encoding="utf-8")
        partial.replace(path)
        print(f"wrote {path}")
    if args.check:
        print("out of date: " + ", ".join(map(str, stale)) if stale else "up to date")
        sys.exit(1 if stale else 0)


if __name__ == "__main__":
    main()

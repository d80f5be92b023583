"""Build the bundled benchmark prompt set, ``draftsmith/evaluation/bench_prompts.jsonl``.

    apt-get install -y bible-kjv fortunes jargon-text
    python benchmarks/prompts/make_bench_prompts.py            # rewrites the file, prints a summary
    python benchmarks/prompts/make_bench_prompts.py --check    # exits 1 if the committed file differs

Each line is ``{"prompt", "workload", "source"}``, a plain-text prompt any target continues
without a chat template:

- ``code``: 8 functions of held-out stdlib modules (`stdlib_split`), never trained on: the
  ``def`` line, docstring and first lines of the body, cut at a line boundary, 100-400 tokens.
- ``chat``: 4 held-out chitchat conversations as an ``A: ... / B: ...`` transcript that ends
  where the next speaker answers, 100-300 tokens.
- ``prose``: 4 English passages nobody here wrote (Debian ``bible-kjv``, ``jargon-text``,
  ``fortunes``), cut at a line boundary, 100-300 tokens.

Deterministic: candidates are ordered by the sha1 of their source name and the first that fit
are taken (the bible passage and the jargon entry are fixed by hand). Tokens are counted with
Qwen2.5-Coder's tokenizer (from the zoo). The code prompts depend on the interpreter's stdlib:
these were made with Python 3.11.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from transformers import AutoTokenizer

from draftsmith.data.chitchat import chitchat_conversations, chitchat_transcript
from draftsmith.data.corpora import (
    python_functions,
    read_python_source,
    stdlib_files,
    stdlib_root,
)
from draftsmith.data.documents import HELDOUT_FRACTION, document_split, stdlib_split
from draftsmith.evaluation.prompts import write_prompt_file
from draftsmith.zoo import fetch_model

OUT = Path(__file__).resolve().parents[2] / "draftsmith" / "evaluation" / "bench_prompts.jsonl"
TOKENIZER = "qwen2.5-coder-0.5b"
CODE_PROMPTS, CHAT_PROMPTS = 8, 4
CODE_TOKENS, TEXT_TOKENS = (100, 400), (100, 300)
BODY_LINES = 3  # body lines shown after the docstring; at least as many are left to write
BIBLE_PASSAGE = "Ruth1:1-7"
JARGON = Path("/usr/share/doc/jargon-text/jargon.txt.gz")
JARGON_ENTRY = "hack mode"  # chosen by hand: the hash-first entry was a tasteless joke
FORTUNES = Path("/usr/share/games/fortunes")
FORTUNE_FILES = ("literature", "wisdom")

TokenCounter = Callable[[str], int]
T = TypeVar("T")


def stable_order(items: list[tuple[str, T]]) -> list[tuple[str, T]]:
    """(source name, item) pairs ordered by the sha1 of the name."""
    return sorted(items, key=lambda item: hashlib.sha1(item[0].encode()).hexdigest())


def token_counter(model: str) -> TokenCounter:
    """Counts a text's tokens with the tokenizer of a zoo model (no special tokens)."""
    tokenizer = AutoTokenizer.from_pretrained(fetch_model(model))
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def take(candidates: Iterator[tuple[str, str]], count: int) -> list[tuple[str, str]]:
    """The first `count` candidates; too few is an error (the token ranges are too narrow)."""
    chosen = []
    for candidate in candidates:
        chosen.append(candidate)
        if len(chosen) == count:
            return chosen
    raise SystemExit(f"only {len(chosen)} of {count} prompts fit the token range")


def cut_lines(lines: list[str], n_tokens: TokenCounter, low: int, high: int) -> str:
    """The longest prefix of `lines` with at most `high` tokens, if it has at least `low` of
    them; else ''."""
    best = ""
    for end in range(1, len(lines) + 1):
        text = "\n".join(lines[:end])
        if n_tokens(text) > high:
            break
        best = text
    return best if best and n_tokens(best) >= low else ""


# --------------------------------------------------------------------------------------------
# Code: held-out stdlib functions
# --------------------------------------------------------------------------------------------


def code_candidates(n_tokens: TokenCounter) -> Iterator[tuple[str, str]]:
    """One candidate per held-out module (its first function in stable order that fits)."""
    modules = [m for m in stdlib_files() if stdlib_split(m) == "heldout"]
    # Codec modules are generated tables with one-line methods: not code anyone writes.
    modules = [m for m in modules if not m.startswith("encodings/")]
    for module, _ in stable_order([(m, m) for m in modules]):
        source = read_python_source(stdlib_root() / module)
        lines = source.splitlines()
        named = [
            (f"stdlib:{module}::{name}", node) for name, node in python_functions(ast.parse(source))
        ]
        for name, node in stable_order(named):
            prompt = function_prompt(node, lines, n_tokens)
            if prompt:
                yield name, prompt
                break


def function_prompt(
    node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str], n_tokens: TokenCounter
) -> str:
    """Signature + docstring + the first `BODY_LINES` lines of the body, dedented; '' if the
    function has no docstring, too little body left to write, or does not fit."""
    if ast.get_docstring(node) is None or len(node.body) < 2:
        return ""
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
    shown = node.body[0].end_lineno + BODY_LINES
    if node.end_lineno - shown < BODY_LINES:
        return ""
    text = textwrap.dedent("\n".join(lines[start:shown])).rstrip() + "\n"
    return text if CODE_TOKENS[0] <= n_tokens(text) <= CODE_TOKENS[1] else ""


# --------------------------------------------------------------------------------------------
# Chat: held-out chitchat conversations as transcripts
# --------------------------------------------------------------------------------------------


def chat_candidates(n_tokens: TokenCounter) -> Iterator[tuple[str, str]]:
    conversations = {
        f"chitchat:{cid}": turns
        for cid, turns in chitchat_conversations()
        if document_split(cid, HELDOUT_FRACTION) == "heldout" and len(turns) >= 4
    }
    for name, turns in stable_order(list(conversations.items())):
        said = chitchat_transcript(turns).split("\n")
        # End on the next speaker's cue, leaving at least one real answer unwritten.
        for end in range(len(turns) - 1, 1, -1):
            prompt = "\n".join(said[:end]) + f"\n{'AB'[end % 2]}:"
            if TEXT_TOKENS[0] <= n_tokens(prompt) <= TEXT_TOKENS[1]:
                yield name, prompt
                break


# --------------------------------------------------------------------------------------------
# Prose: Debian's bible-kjv, jargon-text and fortunes
# --------------------------------------------------------------------------------------------


def bible_prompt(n_tokens: TokenCounter, passage: str = BIBLE_PASSAGE) -> tuple[str, str]:
    """A passage with its chapter heading and verse numbers removed, one verse per line."""
    printed = subprocess.run(["bible", passage], capture_output=True, text=True, check=True)
    verses: list[str] = []
    for line in printed.stdout.splitlines()[2:]:  # skip the blank line and the heading
        number, _, rest = line.strip().partition(" ")
        if number.isdigit():
            verses.append(rest)
        elif line.strip():
            verses[-1] += " " + line.strip()
    return f"bible-kjv:{passage}", cut_lines(verses, n_tokens, *TEXT_TOKENS)


def jargon_lines() -> list[str]:
    return gzip.decompress(JARGON.read_bytes()).decode("utf-8").splitlines()


def jargon_prompt(n_tokens: TokenCounter, entry: str = JARGON_ENTRY) -> tuple[str, str]:
    """A lexicon entry (``:headword: grammar`` then indented paragraphs)."""
    lines = jargon_lines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"   :{entry}:"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("   :"))
    body = [lines[start].strip().lstrip(":"), *(line[3:] for line in lines[start + 1 : end])]
    return f"jargon-text:{entry}", cut_lines(body, n_tokens, *TEXT_TOKENS).strip()


def fortune_candidates(file: str, n_tokens: TokenCounter) -> Iterator[tuple[str, str]]:
    text = (FORTUNES / file).read_text(encoding="utf-8")
    fortunes = [f.strip("\n") for f in text.split("\n%\n") if f.strip()]
    items = [(f"fortunes:{file}#{i}", fortune) for i, fortune in enumerate(fortunes)]
    for name, fortune in stable_order(items):
        if TEXT_TOKENS[0] <= n_tokens(fortune) <= TEXT_TOKENS[1]:
            yield name, fortune


# --------------------------------------------------------------------------------------------


def build(n_tokens: TokenCounter) -> list[dict[str, str]]:
    groups = {
        "code": take(code_candidates(n_tokens), CODE_PROMPTS),
        "chat": take(chat_candidates(n_tokens), CHAT_PROMPTS),
        "prose": [
            bible_prompt(n_tokens),
            jargon_prompt(n_tokens),
            *(take(fortune_candidates(f, n_tokens), 1)[0] for f in FORTUNE_FILES),
        ],
    }
    return [
        {"prompt": prompt, "workload": workload, "source": source}
        for workload, chosen in groups.items()
        for source, prompt in chosen
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"output jsonl (default {OUT})")
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = parser.parse_args()

    n_tokens = token_counter(TOKENIZER)
    records = build(n_tokens)
    for r in records:
        print(f"{r['workload']:<6} {n_tokens(r['prompt']):>4} tokens  {r['source']}")
    for workload in ("code", "chat", "prose"):
        counts = [n_tokens(r["prompt"]) for r in records if r["workload"] == workload]
        print(
            f"{workload}: {len(counts)} prompts, {sum(counts)} tokens "
            f"({min(counts)}-{max(counts)} each)"
        )
    sys.exit(0 if write_prompt_file(records, args.out, check=args.check) else 1)


if __name__ == "__main__":
    main()

"""Data in the target's own words: regenerated chat answers and continued text.

A drafter learns to predict what the target says, so the best data is the target's own output
(EAGLE, Medusa and SpecForge regenerate ShareGPT this way). Two kinds of record:

- `regenerate`: chat records with every assistant turn rewritten, in order, each from the
  conversation so far (its user turns and the target's earlier answers).
- `continue_texts`: for plain text and code, windows of each document cut at line boundaries
  become prompts the target continues. The record ``{"id", "prompt", "completion"}`` trains on
  the completion (`draftsmith.data.documents`), which is exactly the context the decoder drafts in:
  under greedy decoding every token the drafter sees after the prompt is the target's argmax.

Generation is batched across records with left padding. Output is a jsonl that
`draftsmith.data.documents` reads as a local source, resumable: records whose id is already in the
file are skipped, each batch is flushed as it finishes, and a line torn by a kill is cut off
before appending. Derived records are named ``<document id>#<n>``, which keeps them in their
document's train / held-out split (`draftsmith.data.documents.document_split`).

Several processes can share one regeneration (`Shard`): each takes every count-th batch and
writes each finished batch to a file of its own beside the output, and `merge_parts` appends
them in the order one process would have written them, so the output is the same either way.
On a CPU a small model decodes faster as processes of one thread than as threads of one
process (`benchmarks/notes/training.md`).

    documents = load_documents(DataConfig(source="chitchat"))
    regenerate(documents, model, tokenizer, "runs/chitchat-qwen.jsonl",
               RegenerateConfig(max_new_tokens=256, batch_size=16))
    documents = load_documents(DataConfig(source="stdlib"))
    continue_texts(documents, model, tokenizer, "runs/stdlib-smollm2.jsonl",
                   RegenerateConfig(max_new_tokens=128, prompt_tokens=64, max_records=512))
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple

import torch
from tqdm.auto import tqdm

__all__ = [
    "RegenerateConfig",
    "Shard",
    "completed_ids",
    "continue_texts",
    "merge_parts",
    "parts_dir",
    "regenerate",
    "text_prompts",
]

_STREAMS = ("chat", "text")
"""The two kinds of record in the order one process writes them (`RegenerateCommand`)."""


@dataclass(kw_only=True)
class RegenerateConfig:
    """How the target answers."""

    max_new_tokens: int = 512
    """Longest answer per assistant turn, in tokens."""
    batch_size: int = 8
    """Records generated together (their turns are batched turn by turn)."""
    do_sample: bool = False
    """Sample answers (with temperature / top_p) instead of greedy decoding."""
    temperature: float = 1.0
    """Sampling temperature (with do_sample)."""
    top_p: float = 1.0
    """Nucleus sampling mass (with do_sample)."""
    seed: int = 0
    """Seeds torch's generator before each batch's sampling (with the batch's number, so a
    batch draws alike whichever process generates it)."""
    max_records: int | None = None
    """Produce the first this many records (in the source's order) in all, counting those the
    output already holds: rerunning the same call writes nothing more; None: all."""
    prompt_tokens: int = 64
    """`continue_texts`: prompt length, in whole lines of at least this many tokens."""
    max_prompt_tokens: int | None = None
    """`continue_texts`: windows longer than this are skipped (a line too long to cut at a line
    boundary would pad its whole batch to its length); None: 4 x prompt_tokens."""
    prompts_per_document: int = 4
    """`continue_texts`: windows cut from each document (fewer from short ones)."""
    max_turns: int | None = None
    """`regenerate` (chat): keep each conversation up to its first this many assistant answers,
    dropping the rest (a batch runs as long as its longest conversation); None: every turn."""


class Shard(NamedTuple):
    """Process `index` of `count` sharing one regeneration: it generates every count-th batch
    from its index and writes each to its own file in `parts_dir` (`merge_parts` joins them)."""

    index: int
    count: int


def parts_dir(out_path: str | Path) -> Path:
    """Where the shards of a regeneration into `out_path` keep their finished batches."""
    out_path = Path(out_path)
    return out_path.with_name(out_path.name + ".parts")


def merge_parts(out_path: str | Path) -> int:
    """Append the batches the shards of a regeneration finished to `out_path`, in the order one
    process writes them (chat, then text; each in batch order), skipping ids already there (a
    merge cut short by a kill), and remove them. Returns the records appended.

    Run it once every shard has finished: before the shards start, it saves what an
    interrupted run finished, so that every shard reads the same output and plans the same
    batches."""
    out_path, folder = Path(out_path), parts_dir(out_path)
    if not folder.exists():
        return 0
    done = completed_ids(out_path)
    written = 0
    with out_path.open("a", encoding="utf-8") as out:
        for stream in _STREAMS:
            for part in sorted(folder.glob(f"{stream}-*.jsonl")):
                for line in part.read_text(encoding="utf-8").splitlines():
                    if line and json.loads(line)["id"] not in done:
                        out.write(line + "\n")
                        written += 1
            out.flush()
    shutil.rmtree(folder)
    return written


def completed_ids(path: str | Path) -> set[str]:
    """Ids already written to the jsonl at `path` (empty if it does not exist).

    A last line without its newline was torn by a kill mid-write: it is cut off the file, so
    appending starts on a clean line and that record is generated again.
    """
    path = Path(path)
    if not path.exists():
        return set()
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) < len(data):
        with path.open("r+b") as handle:
            handle.truncate(len(complete))
    return {json.loads(line)["id"] for line in complete.decode("utf-8").splitlines() if line}


def regenerate(
    records: Iterable[dict[str, Any]],
    model: Any,
    tokenizer: Any,
    out_path: str | Path,
    config: RegenerateConfig | None = None,
    shard: Shard | None = None,
) -> int:
    """Append regenerated copies of `records` to `out_path`, skipping ids already there.

    Args:
        records: chat records ``{"id", "messages"}`` (e.g. `load_documents` of a chat source).
        model: the target, a transformers causal LM.
        tokenizer: its tokenizer, with a chat template.
        out_path: jsonl to append to.
        config: generation settings.
        shard: this process's share of the batches, written to `parts_dir(out_path)` for
            `merge_parts`; None: all of them, appended to `out_path`.

    Returns:
        The number of records written by this call.
    """
    config = config or RegenerateConfig()
    records = list(records)
    for record in records:
        if not record.get("messages"):
            raise ValueError(f"record {record['id']!r} is not a chat record (no 'messages')")

    def answered(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        conversations = _answer(batch, model, tokenizer, config)
        return [{"id": r["id"], "messages": m} for r, m in zip(batch, conversations, strict=True)]

    def length(record: dict[str, Any]) -> int:
        return sum(len(str(m.get("content", ""))) for m in record["messages"])

    return _append_batches(records, answered, out_path, config, length, "chat", shard)


def continue_texts(
    documents: Iterable[dict[str, Any]],
    model: Any,
    tokenizer: Any,
    out_path: str | Path,
    config: RegenerateConfig | None = None,
    shard: Shard | None = None,
) -> int:
    """Append ``{"id", "prompt", "completion"}`` records to `out_path`: prompts cut from each
    text document (`text_prompts`) and the target's continuation of each, skipping ids already
    there.

    Args:
        documents: text documents ``{"id", "text"}`` (e.g. `load_documents` of ``stdlib``).
        model, tokenizer: the target and its tokenizer.
        out_path: jsonl to append to.
        config: generation settings (`max_new_tokens` is the completion's length).
        shard: as `regenerate`'s.

    Returns:
        The number of records written by this call.
    """
    config = config or RegenerateConfig()
    prompts = (  # lazy: with max_records, only the documents needed are cut
        {"id": key, "prompt": prompt}
        for document in documents
        for key, prompt in text_prompts(document, tokenizer, config)
    )

    def continued(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        texts = [r["prompt"] for r in batch]
        completions = _generate(texts, model, tokenizer, config, add_special_tokens=True)
        return [{**r, "completion": c} for r, c in zip(batch, completions, strict=True)]

    size = lambda r: len(r["prompt"])  # noqa: E731
    return _append_batches(prompts, continued, out_path, config, size, "text", shard)


def text_prompts(
    document: dict[str, Any], tokenizer: Any, config: RegenerateConfig
) -> Iterator[tuple[str, str]]:
    """Up to ``config.prompts_per_document`` (id, prompt) pairs of one text document.

    A prompt is a run of whole lines, starting at a non-blank line, at least
    ``config.prompt_tokens`` and at most ``config.max_prompt_tokens`` tokens long, with at least
    one line after it (the target continues mid-document, as a code-completion request does). Windows do not overlap; their starts are
    drawn with a generator seeded by the document id (and ``config.seed``), so the same document
    always gives the same prompts.
    """
    if document.get("messages"):
        raise ValueError(f"document {document['id']!r} is chat: use regenerate() for chat records")
    lines = (document.get("text") or "").splitlines(keepends=True)
    counts = (
        [len(ids) for ids in tokenizer(lines, add_special_tokens=False)["input_ids"]]
        if lines
        else []
    )
    longest = config.max_prompt_tokens or 4 * config.prompt_tokens
    windows = []  # (first line, stop line) of each candidate window
    start = 0
    while start < len(lines):
        stop, tokens = start, 0
        while stop < len(lines) and tokens < config.prompt_tokens:
            tokens, stop = tokens + counts[stop], stop + 1
        if tokens < config.prompt_tokens or stop >= len(lines):
            break
        if lines[start].strip() and tokens <= longest:
            windows.append((start, stop))
        start += 1
    rng = random.Random(f"{config.seed}:{document['id']}")
    chosen: list[tuple[int, int]] = []
    for start, stop in rng.sample(windows, len(windows)):
        if len(chosen) == config.prompts_per_document:
            break
        if all(stop <= a or start >= b for a, b in chosen):
            chosen.append((start, stop))
    # Numbered in draw order, so asking for more prompts per document later keeps every id
    # already written naming the same prompt (a resumed run only adds the new ones).
    for n, (start, stop) in enumerate(chosen):
        yield f"{document['id']}#{n}", "".join(lines[start:stop])


def _append_batches(
    records: Iterable[dict[str, Any]],
    produce: Any,
    out_path: str | Path,
    config: RegenerateConfig,
    size: Callable[[dict[str, Any]], int],
    stream: str,
    shard: Shard | None,
) -> int:
    """Write ``produce(batch)``, a batch at a time, for each of the first
    ``config.max_records`` records whose id is not yet in `out_path`; returns how many were
    written. Batches hold records of similar `size` (the records in order of it), so a long one
    pads only its own kind, not a batch of short ones. `stream` names the records' kind in the
    parts a `shard` writes."""
    out_path = Path(out_path)
    done = completed_ids(out_path)
    todo = [r for r in islice(records, config.max_records) if r["id"] not in done]
    todo.sort(key=size)
    batches = [todo[i : i + config.batch_size] for i in range(0, len(todo), config.batch_size)]
    numbered = list(enumerate(batches))
    if shard is not None:
        numbered = numbered[shard.index :: shard.count]
        parts_dir(out_path).mkdir(parents=True, exist_ok=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    bar = tqdm(
        total=sum(len(batch) for _, batch in numbered),
        unit="record",
        desc=None if shard is None else f"process {shard.index + 1}/{shard.count}",
        position=None if shard is None else shard.index,
    )
    with bar, out_path.open("a", encoding="utf-8") if shard is None else nullcontext() as out:
        for number, batch in numbered:
            if config.do_sample:  # seeded per batch: the same draws whichever process runs it
                torch.manual_seed(config.seed * 1_000_003 + number)
            lines = "".join(
                json.dumps(record, ensure_ascii=False) + "\n" for record in produce(batch)
            )
            if shard is None:
                out.write(lines)
                out.flush()  # a kill loses at most the batch in flight
            else:  # renamed into place whole: a part that exists is complete
                part = parts_dir(out_path) / f"{stream}-{number:06d}.jsonl"
                part.with_suffix(".tmp").write_text(lines, encoding="utf-8")
                os.replace(part.with_suffix(".tmp"), part)
            written += len(batch)
            bar.update(len(batch))
    return written


def _answer(
    batch: Sequence[dict[str, Any]], model: Any, tokenizer: Any, config: RegenerateConfig
) -> list[list[dict[str, str]]]:
    """The batch's conversations with every assistant turn replaced by the target's answer."""
    conversations = [[dict(m) for m in record["messages"]] for record in batch]
    # An opening assistant turn answers nothing: it is kept as it is.
    turns = [[i for i, m in enumerate(c) if m["role"] == "assistant" and i] for c in conversations]
    if config.max_turns is not None:
        turns = [positions[: config.max_turns] for positions in turns]
        conversations = [
            c[: positions[-1] + 1] if positions else c
            for c, positions in zip(conversations, turns, strict=True)
        ]
    for k in range(max(map(len, turns), default=0)):
        slots = [(c, positions[k]) for c, positions in enumerate(turns) if k < len(positions)]
        prompts = [
            tokenizer.apply_chat_template(
                conversations[c][:i], tokenize=False, add_generation_prompt=True
            )
            for c, i in slots
        ]
        for (c, i), text in zip(slots, _generate(prompts, model, tokenizer, config), strict=True):
            conversations[c][i]["content"] = text
    return conversations


@torch.no_grad()
def _generate(
    prompts: list[str],
    model: Any,
    tokenizer: Any,
    config: RegenerateConfig,
    *,
    add_special_tokens: bool = False,
) -> list[str]:
    """One batched `generate` over prompts (left-padded); the answers' text. Rendered chat
    prompts carry their special tokens already; plain text gets the tokenizer's (a BOS)."""
    eos = {tokenizer.eos_token_id}
    model_eos = model.generation_config.eos_token_id
    eos |= set(model_eos) if isinstance(model_eos, list) else {model_eos}
    eos.discard(None)
    pad_token = tokenizer.pad_token
    if pad_token is None and tokenizer.eos_token is None:
        raise ValueError(
            "the target's tokenizer has neither a padding nor an EOS token, and regeneration pads "
            "its batches: give the tokenizer a pad token (tokenizer.pad_token = ...) and save it"
        )
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    # Many base models ship no pad token: their EOS pads, as in their own batched generate.
    tokenizer.pad_token = tokenizer.eos_token if pad_token is None else pad_token
    try:
        pad = tokenizer.pad_token_id
        inputs = tokenizer(
            prompts, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens
        )
    finally:
        tokenizer.padding_side, tokenizer.pad_token = side, pad_token
    sampling = (
        {"do_sample": True, "temperature": config.temperature, "top_p": config.top_p}
        if config.do_sample
        else {"do_sample": False}
    )
    output = model.generate(
        **inputs.to(model.device),
        max_new_tokens=config.max_new_tokens,
        eos_token_id=sorted(eos),
        pad_token_id=pad,
        **sampling,
    )
    answers = []
    for row in output[:, inputs["input_ids"].shape[1] :].tolist():
        end = next((j for j, token in enumerate(row) if token in eos), len(row))
        answers.append(tokenizer.decode(row[:end], skip_special_tokens=True))
    return answers

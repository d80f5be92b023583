"""The data pipeline: documents -> train / held-out split -> tokens -> packed fixed-length rows.

    load_documents(config)          documents of one split (`draftsmith.data.corpora` reads them)
    build_dataset(config, tok)      Dataset {input_ids (seq_len,) int32, loss_mask (seq_len,) int8}
    prepare_data(config, tok, out)  the same, saved with `save_to_disk` (temp dir, then rename)

**Split.** By document, never by line or packed row: a document is held out iff
``int(sha1(id), 16) % 10_000 < heldout_fraction * 10_000`` (`document_split`). Stdlib documents
are keyed by their module path (``json/decoder.py``), so `stdlib_split` is a property of the
module alone: stable across runs, seeds and machines. The rule is monotone in the fraction (what
is held out at 0.1 stays held out at 0.2); the seed only shuffles the order of documents.

**Plain text and code** are tokenized as the tokenizer does by default (a BOS where it adds one),
end with EOS, and are concatenated into one stream cut into rows of `seq_len` tokens; a document
may continue into the next row. Every token is a target (``loss_mask == 1``).

**Prompt-completion records** (``prompt`` and ``completion`` fields, as `continue_texts` writes
them) are the prompt's tokens (the tokenizer's BOS first, where it adds one) then the
completion's, then EOS. With ``assistant_only_loss`` only the completion is a target: the prompt
is context, and so is the EOS, which the target did not write (the completion was cut at a
length).

**Chat records** are rendered with the target tokenizer's own chat template. With
``assistant_only_loss`` the mask covers each assistant turn's text plus the template's
end-of-turn token right after it (``<|im_end|>`` for ChatML): predicting the end of a turn is
part of drafting it. Headers, system and user turns are context only. The rendered text is
tokenized segment by segment (assistant texts on their own, as the target generates them after
its generation prompt), so the masked tokens decode to exactly the assistant texts. A template
that trims or rewrites assistant texts is an error.

``loss_mask[t] == 1`` means ``input_ids[t]`` is a training target, predicted from
``input_ids[:t]``; the trainer shifts. The last row is padded (pad token, mask 0) rather than
dropped, so small held-out sets keep all their tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import numpy as np
from datasets import Dataset, Features, List, Value, concatenate_datasets
from tqdm.auto import tqdm

from draftsmith.data.corpora import SourceError, load_source

__all__ = [
    "SPLITS",
    "HELDOUT_FRACTION",
    "ChatTemplateError",
    "DataConfig",
    "SourceError",
    "build_dataset",
    "document_split",
    "encode_chat",
    "encode_completion",
    "encode_documents",
    "encode_text",
    "load_documents",
    "pack",
    "prepare_data",
    "stdlib_split",
]

Split = Literal["train", "heldout"]
SPLITS: tuple[str, ...] = ("train", "heldout")
HELDOUT_FRACTION = 0.1
"""The default held-out fraction; `stdlib_split` and the bundled benchmark prompts use it."""
METADATA_FILE = "draftsmith_data.json"
_BUCKETS = 10_000
_PLACEHOLDER = "\ue000"  # a private-use character: rare in text, and a collision is caught
_ENCODE_BATCH = 64  # documents per tokenizer call: amortizes the call, keeps early stops cheap


class ChatTemplateError(ValueError):
    """A chat record cannot be rendered so that its assistant tokens can be located."""


@dataclass(kw_only=True)
class DataConfig:
    """What to read, which split, and how to cut it into training rows."""

    source: str | list[str]
    """``stdlib``, ``chitchat``, a local .jsonl/.json/.parquet/text file or folder, or a Hugging
    Face dataset name (needs the hub); a list of them: their documents together (a mixture, e.g.
    code and chat continuations, each file's size setting its share)."""
    split: Split = "train"
    """``train`` or ``heldout`` (calibration and evaluation)."""
    seq_len: int = 2048
    """Tokens per packed row."""
    max_tokens: int | None = None
    """Stop after this many tokens (whole rows: max_tokens // seq_len of them); None: all."""
    max_documents: int | None = None
    """Use at most this many documents of the split (after shuffling); None: all."""
    heldout_fraction: float = HELDOUT_FRACTION
    """Share of documents held out, chosen by a hash of each document's id (see module doc)."""
    seed: int = 0
    """Shuffles the order of documents (never the split)."""
    assistant_only_loss: bool = True
    """Chat records: train on assistant turns only; prompt-completion records: on completions
    only. False: on every token."""
    include_tests: bool = False
    """stdlib only: keep test modules (``test/``, ``tests/``, ``test_*.py``)."""
    text_sample_by: Literal["document", "paragraph", "line"] = "document"
    """Text files only: one document per file, per blank-line paragraph, or per line."""
    hub_config: str | None = None
    """Hub datasets only: the configuration name."""
    hub_split: str = "train"
    """Hub datasets only: which of its splits to read (ours is cut from it by hash)."""

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")
        if self.seq_len < 2:
            raise ValueError(f"seq_len must be at least 2, got {self.seq_len}")
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in [0, 1), got {self.heldout_fraction}")
        if self.max_tokens is not None and self.max_tokens < self.seq_len:
            raise ValueError(
                f"max_tokens ({self.max_tokens}) is below seq_len ({self.seq_len}): "
                f"not even one row would be made"
            )
        if self.max_documents is not None and self.max_documents < 1:
            raise ValueError(f"max_documents must be positive, got {self.max_documents}")
        if self.text_sample_by not in ("document", "paragraph", "line"):
            raise ValueError(
                f"text_sample_by must be document, paragraph or line, got {self.text_sample_by!r}"
            )


# --------------------------------------------------------------------------------------------
# Splitting
# --------------------------------------------------------------------------------------------


def document_split(key: str, heldout_fraction: float = HELDOUT_FRACTION) -> Split:
    """``heldout`` iff ``int(sha1(key), 16) % 10_000 < heldout_fraction * 10_000``.

    A derived record keyed ``<document id>#<n>`` (a regenerated record, `continue_texts`) is
    split with its document: only the part before the last ``#`` is hashed.
    """
    key = key.rpartition("#")[0] or key
    bucket = int(hashlib.sha1(key.encode("utf-8")).hexdigest(), 16) % _BUCKETS
    return "heldout" if bucket < round(heldout_fraction * _BUCKETS) else "train"


def stdlib_split(relpath: str) -> Split:
    """The split of a stdlib module, from its path relative to the stdlib folder alone
    (``json/decoder.py``, posix separators): held out iff its sha1 falls in the lowest tenth."""
    return document_split(relpath, HELDOUT_FRACTION)


def load_documents(config: DataConfig) -> Dataset:
    """The documents of ``config.split``, shuffled by ``config.seed``: columns ``id``, ``text``,
    ``messages`` (see `draftsmith.data.corpora`).

    Raises:
        SourceError: the source is missing or unreachable, or the split holds no document.
    """
    sources = [config.source] if isinstance(config.source, str) else list(config.source)
    if not sources:
        raise SourceError("data source is an empty list: name at least one source")
    parts = [
        load_source(
            source,
            include_tests=config.include_tests,
            text_sample_by=config.text_sample_by,
            hub_config=config.hub_config,
            hub_split=config.hub_split,
        )
        for source in sources
    ]
    documents = concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    if len(documents) == 0:
        raise SourceError(
            f"data source {config.source!r} holds no documents: check that its files are not "
            f"empty and hold 'text' or 'messages' records."
        )
    keys = documents["id"]
    chosen = [
        i
        for i, key in enumerate(keys)
        if document_split(key, config.heldout_fraction) == config.split
    ]
    if not chosen:
        raise SourceError(
            f"data source {config.source!r} has {len(keys)} documents but none in split "
            f"{config.split!r} at heldout_fraction={config.heldout_fraction}: add documents or "
            f"change heldout_fraction."
        )
    random.Random(config.seed).shuffle(chosen)
    return documents.select(chosen[: config.max_documents])


# --------------------------------------------------------------------------------------------
# Tokenizing
# --------------------------------------------------------------------------------------------


def encode_text(texts: Sequence[str], tokenizer: Any) -> list[list[int]]:
    """Token ids of each text, ending with EOS (the document separator in packed rows)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no EOS token to separate "
            f"documents; set tokenizer.eos_token"
        )
    encoded = tokenizer(list(texts), verbose=False)["input_ids"]
    return [ids if ids and ids[-1] == eos else [*ids, eos] for ids in encoded]


def encode_completion(
    prompt: str, completion: str, tokenizer: Any, *, assistant_only_loss: bool = True
) -> tuple[list[int], list[int]]:
    """One prompt-completion record: ids (T,) and loss mask (T,), 1 on the completion's tokens
    (on every token without `assistant_only_loss`).

    The two parts are tokenized apart, as the target saw them: the prompt as its input, the
    completion as the tokens it generated after it.
    """
    prompt_ids = tokenizer(prompt, verbose=False)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False, verbose=False)["input_ids"]
    ids = [*prompt_ids, *completion_ids, tokenizer.eos_token_id]
    if not assistant_only_loss:
        return ids, [1] * len(ids)
    return ids, [0] * len(prompt_ids) + [1] * len(completion_ids) + [0]


def encode_chat(
    messages: Sequence[dict[str, str]], tokenizer: Any, *, assistant_only_loss: bool = True
) -> tuple[list[int], list[int]]:
    """One conversation rendered with the tokenizer's chat template.

    Returns:
        ids (T,) and loss mask (T,): 1 on each assistant turn's tokens and on the special token
        that follows each (the end-of-turn token); 1 everywhere without `assistant_only_loss`.

    Raises:
        ChatTemplateError: no chat template, or one that does not render assistant texts
            verbatim.
    """
    text, spans = _assistant_spans(messages, tokenizer)
    cuts = [0, *(i for span in spans for i in span), len(text)]
    segments = [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
    encoded = tokenizer(segments, add_special_tokens=False, verbose=False)["input_ids"]
    special = _special_ids(tokenizer)
    ids: list[int] = []
    mask: list[int] = []
    for index, segment in enumerate(encoded):
        if index % 2:  # odd segments are the assistant texts
            flags = [1] * len(segment)
        else:
            flags = [0] * len(segment)
            if index and segment and segment[0] in special:
                flags[0] = 1  # the end-of-turn token closing the assistant text before it
        ids += segment
        mask += flags
    return ids, mask if assistant_only_loss else [1] * len(ids)


def _assistant_spans(
    messages: Sequence[dict[str, str]], tokenizer: Any
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of each assistant text in it.

    Two renderings, whatever the number of turns: the real one, and one with each assistant
    text replaced by a unique placeholder. Putting the texts back in place of the placeholders
    must give the real rendering, which proves the spans (and rejects templates that trim or
    rewrite what the assistant said).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(
            f"tokenizer {tokenizer.name_or_path!r} has no chat template, so chat records cannot "
            f"be rendered: use an instruct model's tokenizer or plain-text data."
        )
    text = _render(tokenizer, messages)
    answers = {i: m["content"] for i, m in enumerate(messages) if m["role"] == "assistant"}
    placeholders = {i: f"{_PLACEHOLDER}{i}{_PLACEHOLDER}" for i in answers}
    skeleton = _render(
        tokenizer,
        [{**m, "content": placeholders.get(i, m["content"])} for i, m in enumerate(messages)],
    )
    pieces: list[str] = []
    spans = []
    cursor = length = 0
    for i, answer in answers.items():
        at = skeleton.find(placeholders[i], cursor)
        if at < 0 or skeleton.count(placeholders[i]) != 1:
            break
        pieces += [skeleton[cursor:at], answer]
        length += at - cursor
        spans.append((length, length + len(answer)))
        length += len(answer)
        cursor = at + len(placeholders[i])
    if len(spans) < len(answers) or "".join(pieces) + skeleton[cursor:] != text:
        raise ChatTemplateError(
            f"the chat template of {tokenizer.name_or_path!r} does not render every assistant "
            f"text verbatim, once and in order, so their tokens cannot be masked reliably"
        )
    return text, spans


def _special_ids(tokenizer: Any) -> set[int]:
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return {*tokenizer.all_special_ids, *(i for i, token in added.items() if token.special)}


def _render(tokenizer: Any, messages: Sequence[dict[str, str]]) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False)


def encode_documents(
    documents: Dataset, tokenizer: Any, assistant_only_loss: bool, progress: tqdm | None = None
) -> Iterator[tuple[list[int], list[int]]]:
    """(ids, mask) of each document in order (the loss mask as packed rows carry it), tokenized
    a batch at a time (lazily: packing stops pulling once it has max_tokens)."""
    for start in range(0, len(documents), _ENCODE_BATCH):
        batch = documents[start : start + _ENCODE_BATCH]
        texts = [
            t
            for t, p, m in zip(batch["text"], batch["prompt"], batch["messages"], strict=True)
            if m is None and p is None
        ]
        encoded_texts = iter(encode_text(texts, tokenizer) if texts else [])
        for text, prompt, messages in zip(
            batch["text"], batch["prompt"], batch["messages"], strict=True
        ):
            if prompt is not None:
                ids, mask = encode_completion(
                    prompt, text, tokenizer, assistant_only_loss=assistant_only_loss
                )
            elif messages is None:
                ids = next(encoded_texts)
                mask = [1] * len(ids)
            else:
                ids, mask = encode_chat(
                    messages, tokenizer, assistant_only_loss=assistant_only_loss
                )
            if progress is not None:
                progress.update(1)  # before yielding: packing may never resume this generator
            yield ids, mask


# --------------------------------------------------------------------------------------------
# Packing
# --------------------------------------------------------------------------------------------


def pack(
    documents: Iterable[tuple[Sequence[int], Sequence[int]]], seq_len: int, pad_id: int
) -> Iterator[tuple[list[int], list[int]]]:
    """Concatenate (ids, mask) documents and cut the stream into rows of `seq_len` tokens.

    Yields:
        ids (seq_len,) and mask (seq_len,) per row. The last, partial row is padded with
        `pad_id` under mask 0, and dropped if it has no target left at all.
    """
    ids: list[int] = []
    mask: list[int] = []
    for doc_ids, doc_mask in documents:
        ids += doc_ids
        mask += doc_mask
        full = len(ids) // seq_len * seq_len
        for start in range(0, full, seq_len):
            yield ids[start : start + seq_len], mask[start : start + seq_len]
        del ids[:full], mask[:full]
    if any(mask):
        padding = seq_len - len(ids)
        yield ids + [pad_id] * padding, mask + [0] * padding


def build_dataset(config: DataConfig, tokenizer: Any) -> Dataset:
    """Packed rows of ``config.split``: ``input_ids`` (seq_len,) int32 and ``loss_mask``
    (seq_len,) int8, in memory (`prepare_data` saves them)."""
    return _build(config, tokenizer)[0]


def _build(config: DataConfig, tokenizer: Any) -> tuple[Dataset, dict[str, Any]]:
    documents = load_documents(config)
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    max_rows = config.max_tokens // config.seq_len if config.max_tokens else None
    desc = f"tokenizing {config.source} ({config.split})"
    with tqdm(total=len(documents), unit="doc", desc=desc) as progress:
        encoded = encode_documents(documents, tokenizer, config.assistant_only_loss, progress)
        rows = list(islice(pack(encoded, config.seq_len, pad_id), max_rows))
        used = progress.n
    input_ids = np.array([ids for ids, _ in rows], dtype=np.int32).reshape(-1, config.seq_len)
    loss_mask = np.array([m for _, m in rows], dtype=np.int8).reshape(-1, config.seq_len)
    if not loss_mask.any():
        raise SourceError(
            f"data source {config.source!r} ({config.split}) gave no token to train on: its chat "
            f"records have no assistant turn. Add assistant turns or pass "
            f"assistant_only_loss=False."
        )
    features = Features(
        {
            "input_ids": List(Value("int32"), length=config.seq_len),
            "loss_mask": List(Value("int8"), length=config.seq_len),
        }
    )
    dataset = Dataset.from_dict({"input_ids": input_ids, "loss_mask": loss_mask}, features)
    stats = {
        "documents": used,
        "rows": len(rows),
        "tokens": int(input_ids.size),
        "target_tokens": int(loss_mask.sum()),
    }
    return dataset, stats


# --------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------


def prepare_data(
    config: DataConfig, tokenizer: Any, out_dir: str | Path, *, overwrite: bool = False
) -> Path:
    """Build ``config``'s rows and save them to `out_dir` (``Dataset.load_from_disk`` reads it).

    The dataset is written to ``<out_dir>.partial-<pid>`` and renamed into place, with a
    ``draftsmith_data.json`` (config, tokenizer, counts) beside the Arrow files, so an
    interrupted run never leaves a folder that looks complete. An existing `out_dir` is an error
    unless `overwrite`; it is replaced only once the new one is written.
    """
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(
            f"{out} already exists: choose another output folder or overwrite it "
            f"(overwrite=True, --overwrite)"
        )
    dataset, stats = _build(config, tokenizer)
    partial = out.with_name(f"{out.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    dataset.save_to_disk(str(partial))
    metadata = {
        "config": asdict(config),
        "tokenizer": tokenizer.name_or_path,
        "vocab_size": len(tokenizer),
        **stats,
    }
    (partial / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    if out.exists():
        old = out.with_name(f"{out.name}.old-{os.getpid()}")
        out.rename(old)
        partial.rename(out)
        shutil.rmtree(old)
    else:
        partial.rename(out)
    print(
        f"{config.source} ({config.split}): {stats['documents']:,} documents -> "
        f"{stats['rows']:,} rows x {config.seq_len} = {stats['tokens']:,} tokens "
        f"({stats['target_tokens']:,} targets), saved to {out}"
    )
    return out

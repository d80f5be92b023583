"""The data pipeline: documents -> train / held-out split -> tokens -> packed fixed-length rows.

    load_documents(config)          documents of one split (`draftsmith.data.corpora` reads them)
    build_dataset(config, tok)      Dataset {input_ids (seq_len,) int32, loss_mask (seq_len,) int8}
    prepare_data(config, tok, out)  the same, saved with `save_to_disk` (temp dir, then rename)

**Split.** By document, never by line or packed row: a document is held out iff
``int(sha1(id), 16) % 10_000 < heldout_fraction * 10_000`` (`document_split`). Stdlib documents
are keyed by their module path (``json/decoder.py``), so `stdlib_split` is a property of the
module alone: stable across runs, seeds and machines. The rule is monotone in the fraction (what
is held out at 0.1 stays held out at 0.2); the seed only shuffles the order of documents.

**Encoding** (plain text and code, prompt-completion records, chat records through the target's
chat template) is `draftsmith.data.encoding`'s.

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
from draftsmith.data.encoding import encode_documents

__all__ = [
    "SPLITS",
    "HELDOUT_FRACTION",
    "DataConfig",
    "SourceError",
    "build_dataset",
    "document_split",
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

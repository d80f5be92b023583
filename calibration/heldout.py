"""Held-out calibration data: a jsonl file's prompts and texts, each with its workload, or a
data source's held-out split; which collection it takes, and what it gives each collector.

A line is one JSON record: a user's own traffic as prompts alone (`{"prompt": str, "workload":
str optional}`), or text to score teacher-forced (`text`, `prompt` + `completion` as `draftsmith
regenerate` writes, or chat `messages`). Prompt-only data has nothing to score teacher-forced,
so it is collected from decoding; `has_text` tells the two apart. `load_heldout` reads and
checks the data and chooses the collection before any model loads, so bad data fails in seconds.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from datasets import Dataset

from draftsmith.calibration.evaluate import DEFAULT_WORKLOAD
from draftsmith.calibration.pipeline import CalibrateConfig, Collection, prompt_windows
from draftsmith.data.documents import DataConfig, load_documents
from draftsmith.data.encoding import encode_documents

CollectChoice = Literal["auto", "teacher-forced", "decode"]
"""auto: decode for prompt-only records, teacher-forced otherwise; or either collection."""

TEXT_FIELDS = ("text", "completion", "messages")
"""Fields holding text the target continues, which teacher-forced collection scores."""

EXAMPLE_RECORD = '{"prompt": "def add(a, b):", "workload": "code"}'


@dataclass(frozen=True)
class HeldOutRecords:
    """Prompts (decoded as given) and texts (cut into prompts to decode), each as a (string,
    workload) pair in file order."""

    name: str
    """The data as the user named it (a file or a source), for messages."""
    prompts: list[tuple[str, str]]
    texts: list[tuple[str, str]]
    has_text: bool
    """Some record holds a `TEXT_FIELDS` field (teacher-forced collection can score it)."""

    @property
    def workloads(self) -> list[str]:
        """The workload names the records carry, in order of first appearance."""
        return list(dict.fromkeys(w for _, w in self.prompts + self.texts))


def read_heldout_jsonl(path: str | Path) -> HeldOutRecords:
    """Read and check a calibration jsonl (see the module docstring).

    Raises a FileNotFoundError when the file is missing, and a ValueError naming the line and
    the fix for a line that is not a JSON object, a record with no prompt nor text, a prompt or
    workload that is not a non-empty string, and a file with no records.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"calibration data {path} does not exist")
    prompts, texts, has_text = [], [], False
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{line_no}"
        record = _record(line, where)
        workload = _workload(record, where)
        prompt = _prompt(record, where)
        if prompt is not None:
            prompts.append((prompt, workload))
        if isinstance(record.get("text"), str) and record["text"]:
            texts.append((record["text"], workload))
        has_text = has_text or any(field in record for field in TEXT_FIELDS)
    if not prompts and not has_text:
        raise ValueError(
            f"calibration data {path} holds no records: write one JSON object per line, e.g. "
            f"{EXAMPLE_RECORD}"
        )
    return HeldOutRecords(str(path), prompts, texts, has_text)


def _record(line: str, where: str) -> dict[str, Any]:
    """The JSON object on one line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not a JSON record ({error})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a record is a JSON object, e.g. {EXAMPLE_RECORD}")
    return record


def _prompt(record: dict[str, Any], where: str) -> str | None:
    """The record's prompt; None for a record of text without one. A record with neither a
    prompt nor text is an error: there would be nothing to decode or score."""
    prompt = record.get("prompt")
    if isinstance(prompt, str) and prompt:
        return prompt
    if any(field in record for field in TEXT_FIELDS):
        return None
    if "prompt" in record:
        raise ValueError(f"{where}: 'prompt' must be a non-empty string, got {prompt!r}")
    raise ValueError(
        f"{where}: the record has no 'prompt' (its keys: {sorted(record)}): give each record a "
        f"'prompt' (a user's traffic, e.g. {EXAMPLE_RECORD}), or text to score ('text', "
        "'prompt' + 'completion' or 'messages')"
    )


def _workload(record: dict[str, Any], where: str) -> str:
    """The record's workload name (`DEFAULT_WORKLOAD` when it names none)."""
    workload = record.get("workload", DEFAULT_WORKLOAD)
    if not isinstance(workload, str) or not workload:
        raise ValueError(f"{where}: 'workload' must be a non-empty string, got {workload!r}")
    return workload


@dataclass(frozen=True)
class HeldOutData:
    """Calibration data read and checked, with the collection it takes (`load_heldout`)."""

    name: str
    """The data as the user named it (a jsonl file, another file or a source), for messages."""
    collect: Collection
    reason: str
    """Why this collection (the caller's choice, prompt-only records or held-out text)."""
    records: HeldOutRecords | None = None
    """decode: the prompts (decoded as given) and texts (cut into prompts); else None."""
    documents: Dataset | None = None
    """teacher-forced: the held-out documents to score; else None."""
    assistant_only: bool = True
    """teacher-forced: chat documents count the assistant's tokens only."""

    def encoded(
        self, tokenizer, config: CalibrateConfig, min_documents: int = 2
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """teacher-forced: (input_ids, loss_mask) of each document, cut to config.seq_len
        tokens, up to config.max_tokens in all. Fewer than min_documents with tokens to draft is
        an error: fitting cross-fits over documents (2), evaluating one needs no other (1)."""
        if self.documents is None:
            raise ValueError(f"{self.name} is collected {self.collect}, not teacher-forced")
        encoded, total = [], 0
        for ids, mask in encode_documents(self.documents, tokenizer, self.assistant_only):
            ids, mask = ids[: config.seq_len], mask[: config.seq_len]
            if any(mask[1:]):  # something to draft after the first token
                encoded.append((torch.tensor(ids), torch.tensor(mask, dtype=torch.int8)))
                total += len(ids)
            if total >= config.max_tokens:
                break
        if len(encoded) < min_documents:
            raise ValueError(
                f"calibration data {self.name} gives {len(encoded)} document(s) with tokens to "
                "draft; calibration fits on some documents and evaluates on others: give at "
                f"least {min_documents}"
            )
        return encoded

    def prompts(self, tokenizer, config: CalibrateConfig) -> tuple[list, list[str]]:
        """decode: up to config.max_prompts prompts, the given ones (strings, as they are)
        first, then windows of token ids cut from the texts; and the workload of each."""
        heldout = self.records
        if heldout is None:
            raise ValueError(f"{self.name} is collected {self.collect}, not from decoding")
        if not heldout.prompts and not heldout.texts:
            raise ValueError(
                f"{heldout.name} has no 'prompt' or 'text' to decode (chat 'messages' only): "
                "collect teacher-forced (--collect auto or teacher-forced)"
            )
        given = heldout.prompts[: config.max_prompts]
        prompts, workloads = [p for p, _ in given], [w for _, w in given]
        room = config.max_prompts - len(prompts)
        if heldout.texts and room > 0:
            stride = config.prompt_tokens + config.max_new_tokens
            texts = [text for text, _ in heldout.texts]
            for index, window in prompt_windows(
                texts, tokenizer, config.prompt_tokens, stride, room
            ):
                prompts.append(window)
                workloads.append(heldout.texts[index][1])
        return prompts, workloads


def load_heldout(data: str, collect: CollectChoice = "auto", *, seq_len: int = 512) -> HeldOutData:
    """Read and check calibration data (a `.jsonl` file as `read_heldout_jsonl` reads it,
    another file taken whole, or a source name: its held-out split) and choose its collection:
    `collect` auto decodes prompt-only records and scores anything else teacher-forced.

    Raises a ValueError for teacher-forced collection of prompt-only records (there is no text
    to score), besides `read_heldout_jsonl`'s and `load_documents`' errors.
    """
    heldout = read_heldout_jsonl(data) if data.endswith(".jsonl") else None
    collection, reason = _collection(data, heldout, collect)
    if collection == "decode":
        return HeldOutData(data, collection, reason, records=heldout or _source_texts(data))
    if heldout is not None and any(w != DEFAULT_WORKLOAD for w in heldout.workloads):
        warnings.warn(
            "teacher-forced collection keeps no workload names: every record counts "
            "under 'default' (--collect decode keeps them)",
            stacklevel=2,
        )
    # A file is held-out data as a whole: heldout_fraction 0 puts all of it in one split (a
    # missing path is `load_documents`' clear error).
    whole = Path(data).exists()
    split = {"split": "train", "heldout_fraction": 0.0} if whole else {"split": "heldout"}
    config = DataConfig(source=data, seq_len=seq_len, **split)
    return HeldOutData(
        data,
        collection,
        reason,
        documents=load_documents(config),
        assistant_only=config.assistant_only_loss,
    )


def _collection(
    data: str, heldout: HeldOutRecords | None, collect: CollectChoice
) -> tuple[Collection, str]:
    """The collection to run, and why."""
    prompt_only = heldout is not None and not heldout.has_text
    if prompt_only and collect == "teacher-forced":
        raise ValueError(
            f"{data} holds prompt-only records (no 'text', 'completion' or 'messages'), "
            "and teacher-forced collection scores a text the target continues: drop "
            "--collect teacher-forced (prompt-only data is collected from decoding), or "
            "give records with text (draftsmith regenerate writes prompt + completion)"
        )
    if collect != "auto":
        return collect, f"--collect {collect}"
    if prompt_only:
        return "decode", "prompt-only records"
    return "teacher-forced", "held-out text"


def _source_texts(data: str) -> HeldOutRecords:
    """The texts of a data source's held-out split (or of a non-jsonl file), to cut."""
    documents = load_documents(DataConfig(source=data, split="heldout"))
    texts = [(text, DEFAULT_WORKLOAD) for text in documents["text"] if text]
    return HeldOutRecords(data, prompts=[], texts=texts, has_text=True)

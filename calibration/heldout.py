"""Calibration data given as a jsonl file: its prompts and texts, each with its workload.

A line is one JSON record: a user's own traffic as prompts alone (`{"prompt": str, "workload":
str optional}`), or text to score teacher-forced (`text`, `prompt` + `completion` as `draftsmith
regenerate` writes, or chat `messages`). Prompt-only data has nothing to score teacher-forced,
so it is collected from decoding; `has_text` tells the two apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.calibration.evaluate import DEFAULT_WORKLOAD

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

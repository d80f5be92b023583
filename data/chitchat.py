"""The chitchat corpus (`chitchat-dataset` on PyPI, MIT): 7,168 human conversations, fetched
once with pip into ``$DRAFTSMITH_HOME/data/`` (`chitchat_path`), read as alternating chat
records (`chitchat_records`) or as plain ``A: / B:`` transcripts (`chitchat_transcript`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftsmith.core.home import default_home
from draftsmith.data.errors import SourceError

CHITCHAT_REQUIREMENT = "chitchat-dataset==0.9.0"
_CHITCHAT_MEMBER = "chitchat_dataset/dataset.json"
_CHITCHAT_SHA256 = "d2a5d0bf6acf354fef51f3af39cbece2220d3b8f6086b658c3d335105798312a"


def chitchat_path(home: str | Path | None = None) -> Path:
    """Local path of chitchat's ``dataset.json``, fetched with pip on first use.

    The wheel is downloaded and unpacked into ``<home>/data/chitchat-dataset-0.9.0.partial-<pid>``
    and renamed into place once its checksum is verified, so an interrupted fetch never leaves a
    file that looks usable. `home` defaults to ``$DRAFTSMITH_HOME`` or ``~/.cache/draftsmith``.
    """
    final = Path(home).expanduser() if home else default_home()
    final = final / "data" / CHITCHAT_REQUIREMENT.replace("==", "-")
    target = final / "dataset.json"
    if target.is_file():
        return target
    partial = final.with_name(f"{final.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        _fetch_chitchat(partial, final)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            partial.rename(final)
        except OSError:  # another process published it first
            if not target.is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def _fetch_chitchat(partial: Path, final: Path) -> None:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "-d", str(partial), CHITCHAT_REQUIREMENT,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(partial.glob("chitchat_dataset-*.whl"))
    if result.returncode != 0 or not wheels:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-10:])
        raise SourceError(
            f"could not download {CHITCHAT_REQUIREMENT} with pip (exit {result.returncode}):\n"
            f"{tail}\nWithout PyPI, copy {_CHITCHAT_MEMBER} from that wheel to "
            f"{final / 'dataset.json'}."
        )
    digest = hashlib.sha256()
    with (
        zipfile.ZipFile(wheels[0]) as archive,
        archive.open(_CHITCHAT_MEMBER) as member,
        (partial / "dataset.json").open("wb") as out,
    ):
        while block := member.read(1 << 22):
            out.write(block)
            digest.update(block)
    wheels[0].unlink()
    if digest.hexdigest() != _CHITCHAT_SHA256:
        raise SourceError(
            f"{_CHITCHAT_MEMBER} from {CHITCHAT_REQUIREMENT} has sha256 {digest.hexdigest()}, "
            f"expected {_CHITCHAT_SHA256}: pip found a different file (check `pip config list`)."
        )


def chitchat_conversations(path: str | Path | None = None) -> Iterator[tuple[str, list[str]]]:
    """(conversation id, turns) of every chitchat conversation, in file order.

    The JSON maps a conversation id to ``{"messages": [[utterance, ...], ...], ...}``: each inner
    list is one speaker's turn, a run of utterances ``{"text", "sender", "timestamp"}``. A turn's
    utterances are joined with newlines; empty utterances are dropped and the remaining runs of
    one sender merged, so consecutive turns always alternate speakers.
    """
    with open(path or chitchat_path(), encoding="utf-8") as handle:
        conversations = json.load(handle)
    for conversation_id, conversation in conversations.items():
        turns: list[tuple[str, list[str]]] = []
        for turn in conversation["messages"]:
            for utterance in turn:
                text = utterance["text"].strip()
                if not text:
                    continue
                if turns and turns[-1][0] == utterance["sender"]:
                    turns[-1][1].append(text)
                else:
                    turns.append((utterance["sender"], [text]))
        yield conversation_id, ["\n".join(lines) for _, lines in turns]


def chitchat_transcript(turns: list[str]) -> str:
    """A conversation as a plain-text transcript: one line per turn, speakers ``A:`` and ``B:``
    alternating (a turn's own line breaks become spaces)."""
    return "\n".join(f"{'AB'[i % 2]}: " + turn.replace("\n", " ") for i, turn in enumerate(turns))


def chitchat_records(path: str | Path | None = None) -> Iterator[dict[str, Any]]:
    """Chitchat conversations as chat records: the first speaker is the user, the second the
    assistant. A trailing user turn is dropped (nothing answers it) and conversations without
    any answer (44% of them have a single speaker) are skipped."""
    for conversation_id, turns in chitchat_conversations(path):
        turns = turns[: len(turns) // 2 * 2]
        if not turns:
            continue
        messages = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": text}
            for i, text in enumerate(turns)
        ]
        yield {"id": conversation_id, "text": None, "prompt": None, "messages": messages}

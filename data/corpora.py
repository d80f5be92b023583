"""Document sources: each one becomes a `datasets.Dataset` of documents in one schema.

A document is one row of `DOCUMENT_FEATURES`:

    id        str    stable key of the document; the train / held-out split hashes it
    text      str    plain text or code (None for chat records)
    prompt    str    context before `text` that is not trained on (a prompt-completion record,
                     whose completion is `text`); None otherwise
    messages  list   chat turns [{"role", "content"}, ...] (None for text records)

Sources (see `load_source`):

- ``stdlib``: the running interpreter's standard library, one document per ``.py`` file, keyed
  by its path relative to ``sysconfig.get_paths()["stdlib"]`` (``json/decoder.py``).
  ``site-packages`` is skipped; test modules (see `is_stdlib_test`) only on request.
- ``chitchat``: the 7,168 human conversations of the PyPI package ``chitchat-dataset==0.9.0``,
  fetched once with pip into ``$DRAFTSMITH_HOME/data/`` (`draftsmith.data.chitchat`).
- ``chitchat-transcripts``: the same conversations as plain-text ``A: ... / B: ...``
  transcripts (`chitchat_transcript`), the form the bundled benchmark's chat prompts take, for
  continuing as text rather than answering through a chat template.
- a local ``.jsonl`` / ``.json`` / ``.parquet`` file, a text file (any other suffix), or a
  folder of such files.
- anything else is passed to `datasets.load_dataset` as a Hugging Face hub name.

This module only reads; splitting, rendering and packing live in `draftsmith.data.documents`.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import sysconfig
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
from datasets import Dataset, Features, List, Value
from datasets.exceptions import DatasetGenerationError

from draftsmith.data.chitchat import (
    CHITCHAT_REQUIREMENT,
    chitchat_conversations,
    chitchat_records,
    chitchat_transcript,
)
from draftsmith.data.errors import SourceError

__all__ = [
    "CHITCHAT_REQUIREMENT",
    "DOCUMENT_FEATURES",
    "OFFLINE_SOURCES",
    "SourceError",
    "is_stdlib_test",
    "load_source",
    "python_functions",
    "stdlib_files",
    "stdlib_root",
]

DOCUMENT_FEATURES = Features(
    {
        "id": Value("string"),
        "text": Value("string"),
        "prompt": Value("string"),
        "messages": List({"role": Value("string"), "content": Value("string")}),
    }
)
"""The schema every source is normalized to."""

OFFLINE_SOURCES = ("stdlib", "chitchat", "chitchat-transcripts")
"""Source names that need no hub (chitchat needs PyPI once)."""


_TEST_DIRS = frozenset({"test", "tests", "idle_test"})
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
_TABLE_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_PATH_SUFFIXES = {*_TABLE_SUFFIXES, ".txt", ".md", ".py", ".csv", ".gz"}
# ShareGPT-style records name their turns {"from", "value"} with these roles.
_SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user"}


def load_source(
    source: str,
    *,
    include_tests: bool = False,
    text_sample_by: str = "document",
    hub_config: str | None = None,
    hub_split: str = "train",
) -> Dataset:
    """All documents of `source` (both splits), in `DOCUMENT_FEATURES`' schema.

    Args:
        source: ``stdlib``, ``chitchat``, a local file or folder, or a hub dataset name.
        include_tests: stdlib only: keep test modules too.
        text_sample_by: text files only: ``document`` (one document per file), ``paragraph``
            or ``line`` (as `datasets`' text builder cuts them).
        hub_config, hub_split: hub datasets only: the configuration and split to read.
    """
    if source == "stdlib":
        return _stdlib_dataset(include_tests)
    if source == "chitchat":
        return Dataset.from_list(list(chitchat_records()), features=DOCUMENT_FEATURES)
    if source == "chitchat-transcripts":
        records = [
            {"id": cid, "text": chitchat_transcript(turns), "prompt": None, "messages": None}
            for cid, turns in chitchat_conversations()
        ]
        return Dataset.from_list(records, features=DOCUMENT_FEATURES)
    path = Path(source).expanduser()
    if path.exists():
        return _normalize(_load_local(path, text_sample_by), source)
    if _looks_like_path(source):
        raise SourceError(
            f"data source {source!r} does not exist. Give an existing .jsonl/.json/.parquet/text "
            f"file or folder, or one of the offline sources {', '.join(OFFLINE_SOURCES)}."
        )
    return _normalize(_load_hub(source, hub_config, hub_split), source)


# --------------------------------------------------------------------------------------------
# stdlib
# --------------------------------------------------------------------------------------------


def stdlib_root() -> Path:
    """The running interpreter's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_stdlib_test(relpath: str) -> bool:
    """Whether a stdlib module is test code: it lives under a ``test`` / ``tests`` /
    ``idle_test`` folder (this covers the whole ``test`` package) or is named ``test_*.py``."""
    parts = Path(relpath).parts
    return bool(_TEST_DIRS.intersection(parts[:-1])) or parts[-1].startswith("test_")


def stdlib_files(include_tests: bool = False) -> list[str]:
    """Relative posix paths of the stdlib's ``.py`` files, sorted; ``site-packages`` excluded."""
    root = stdlib_root()
    paths = []
    for path in root.rglob("*.py"):
        relpath = path.relative_to(root).as_posix()
        parts = relpath.split("/")
        if _SKIP_DIRS.intersection(parts[:-1]):
            continue
        if include_tests or not is_stdlib_test(relpath):
            paths.append(relpath)
    return sorted(paths)


def read_python_source(path: Path) -> str:
    """A .py file's text in the encoding its coding cookie declares (PEP 263).

    A few stdlib test files declare an encoding they do not use on purpose; those decode with
    replacement characters rather than failing the whole corpus.
    """
    data = path.read_bytes()
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return data.decode("utf-8", errors="replace")


def python_functions(
    tree: ast.Module,
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, node) of a module's top-level functions and of the methods of its
    top-level classes (``Class.method``), in source order: the units prompts are cut from."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{item.name}", item


def _stdlib_dataset(include_tests: bool) -> Dataset:
    root = stdlib_root()
    rows: dict[str, list[Any]] = {"id": [], "text": [], "prompt": [], "messages": []}
    for relpath in stdlib_files(include_tests):
        text = read_python_source(root / relpath)
        if text.strip():  # dozens of empty __init__.py files carry nothing to learn
            rows["id"].append(relpath)
            rows["text"].append(text)
            rows["prompt"].append(None)
            rows["messages"].append(None)
    return Dataset.from_dict(rows, features=DOCUMENT_FEATURES)


# --------------------------------------------------------------------------------------------
# Local files and the hub
# --------------------------------------------------------------------------------------------


def _looks_like_path(source: str) -> bool:
    """Hub names are ``name`` or ``owner/name``; anything else that does not exist is a typo."""
    return (
        source.startswith((".", "~", "/"))
        or source.count("/") > 1
        or Path(source).suffix.lower() in _PATH_SUFFIXES
    )


def _load_local(path: Path, text_sample_by: str) -> Dataset:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    files = [p for p in files if not p.name.startswith(".") and p.stat().st_size > 0]
    if not files:
        raise SourceError(
            f"data source {path} holds no documents (no non-empty file): write .jsonl records "
            f"with a 'text', 'prompt' + 'completion' or 'messages' field, or .parquet / text "
            f"files, there."
        )
    builders = {_TABLE_SUFFIXES.get(p.suffix.lower(), "text") for p in files}
    if len(builders) > 1:
        raise SourceError(
            f"data folder {path} mixes file kinds ({', '.join(sorted(builders))}); "
            f"give one kind per source (a folder each, or a single file)."
        )
    builder = builders.pop()
    kwargs = {"sample_by": text_sample_by} if builder == "text" else {}
    try:
        return datasets.load_dataset(
            builder, data_files=[str(p) for p in files], split="train", **kwargs
        )
    except (DatasetGenerationError, ValueError) as error:  # pyarrow's errors are ValueErrors
        cause = error.__cause__ or error
        raise SourceError(f"could not read data source {path} as {builder}: {cause}") from error


def _load_hub(name: str, config: str | None, split: str) -> Dataset:
    try:
        return datasets.load_dataset(name, config, split=split)
    except (ConnectionError, FileNotFoundError) as error:
        raise SourceError(
            f"could not load {name!r} from the Hugging Face hub ({error}). It is neither a local "
            f"path nor reachable: give a local .jsonl/.parquet/text file or folder, or an offline "
            f"source ({', '.join(OFFLINE_SOURCES)})."
        ) from error


def _normalize(dataset: Dataset, source: str) -> Dataset:
    """Map a loaded table onto `DOCUMENT_FEATURES` (``text`` or ``messages`` / ``conversations``
    columns; an ``id`` column if present, else the sha1 of the content), dropping empty rows."""
    columns = set(dataset.column_names)
    if not columns & {"text", "completion", "messages", "conversations"}:
        raise SourceError(
            f"data source {source!r} has columns {sorted(columns)}; a record needs a 'text' "
            f"column (plain text or code), 'prompt' and 'completion' columns, or a 'messages' "
            f"column (chat: a list of {{'role', 'content'}})."
        )
    return dataset.map(
        _normalize_batch,
        batched=True,
        remove_columns=dataset.column_names,
        features=DOCUMENT_FEATURES,
        desc=f"reading {source}",
    )


def _normalize_batch(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    size = len(next(iter(batch.values())))
    texts = batch.get("text") or batch.get("completion") or [None] * size
    prompts = batch.get("prompt") if "completion" in batch else None
    prompts = prompts or [None] * size
    chats = batch.get("messages") or batch.get("conversations") or [None] * size
    messages = [None if chat is None else [_turn(t) for t in chat] for chat in chats]
    rows: dict[str, list[Any]] = {"id": [], "text": [], "prompt": [], "messages": []}
    keys = batch.get("id") or [None] * size
    for key, text, prompt, chat in zip(keys, texts, prompts, messages, strict=True):
        if chat or (text and text.strip()):  # blank lines and empty records teach nothing
            content = text if prompt is None else prompt + text
            rows["id"].append(str(key) if key is not None else _content_key(content, chat))
            rows["text"].append(None if chat else text)
            rows["prompt"].append(None if chat else prompt)
            rows["messages"].append(chat or None)
    return rows


def _turn(turn: dict[str, Any]) -> dict[str, str]:
    if "role" in turn:
        return {"role": turn["role"], "content": turn.get("content") or ""}
    return {"role": _SHAREGPT_ROLES.get(turn["from"], turn["from"]), "content": turn["value"]}


def _content_key(text: str | None, messages: list[dict[str, str]] | None) -> str:
    """Duplicate documents get the same key, so they always land in the same split."""
    content = text if text is not None else json.dumps(messages, ensure_ascii=False)
    return hashlib.sha1(content.encode("utf-8")).hexdigest()[:20]

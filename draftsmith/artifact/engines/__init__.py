"""Heads in the serving engines' formats: `export_artifact` writes a draftsmith artifact as vLLM
(speculators, Medusa) or SGLang read it; `import_head` reads a head published in one of those
layouts, the EAGLE repository's or the Medusa repository's, as a draftsmith head.

| format | holds | written | read |
|---|---|---|---|
| speculators | EAGLE-3, P-EAGLE, DFlash | `export --format speculators` (vLLM serves it) | yes |
| sglang | EAGLE-3 | `export --format sglang` | yes (also the EAGLE repository's layout) |
| vllm-medusa | Medusa | `export --format vllm-medusa` | yes |
| medusa-repo | Medusa | no | yes (`medusa_lm_head.safetensors`) |
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from draftsmith.artifact.checks import check_tensors
from draftsmith.artifact.engines.conventions import read_safetensors
from draftsmith.artifact.engines.dflash import read_speculators_dflash, write_speculators_dflash
from draftsmith.artifact.engines.eagle3 import (
    read_eagle,
    read_speculators,
    write_sglang,
    write_speculators,
)
from draftsmith.artifact.engines.medusa import read_medusa_repo, read_vllm_medusa, write_vllm_medusa
from draftsmith.artifact.engines.peagle import read_speculators_peagle, write_speculators_peagle
from draftsmith.artifact.save import own_tensors
from draftsmith.artifact.staging import staged_directory
from draftsmith.core.registry import Registry
from draftsmith.heads.blocks import to_target_precision
from draftsmith.heads.trainable import DraftHead, head_class, head_config

Writer = Callable[..., None]
"""writer(head, target, out, *, verifier, draft_tokens): the head in one format, written into out."""

SPECULATORS_WRITERS: dict[str, Writer] = {
    "peagle": write_speculators_peagle,
    "dflash": write_speculators_dflash,
}
"""speculators' writer of each kind it holds beside EAGLE-3 (`write_speculators`)."""

EXPORTERS: Registry[Writer] = Registry("export format")
EXPORTERS.add(
    "speculators",
    lambda head, *args, **kwargs: SPECULATORS_WRITERS.get(head.kind, write_speculators)(
        head, *args, **kwargs
    ),
)
EXPORTERS.add("sglang", lambda head, target, out, **_: write_sglang(head, target, out))
EXPORTERS.add("vllm-medusa", lambda head, target, out, **_: write_vllm_medusa(head, target, out))
EXPORT_FORMATS = tuple(EXPORTERS.names())

READERS: Registry[tuple[str, Callable[..., Any], tuple[str, ...]]] = Registry("engine layout")
"""Per layout: the head kind it holds, its reader and the safetensors files it keeps."""
READERS.add("speculators", ("eagle3", read_speculators, ("model.safetensors",)))
READERS.add("speculators-peagle", ("peagle", read_speculators_peagle, ("model.safetensors",)))
READERS.add("speculators-dflash", ("dflash", read_speculators_dflash, ("model.safetensors",)))
READERS.add("speculators-dspark", ("dflash", read_speculators_dflash, ("model.safetensors",)))
READERS.add("eagle", ("eagle3", read_eagle, ("model.safetensors",)))
READERS.add("vllm-medusa", ("medusa", read_vllm_medusa, ("model.safetensors",)))
READERS.add("medusa-repo", ("medusa", read_medusa_repo, ("medusa_lm_head.safetensors",)))


def export_head(
    head: DraftHead,
    target: PreTrainedModel,
    out_dir: str | os.PathLike,
    fmt: str,
    *,
    verifier: str,
    draft_tokens: int = 3,
) -> Path:
    """Write `head` (bound to `target`) in engine format `fmt` at out_dir, in one rename.

    verifier: the target's name as the engine should load it (speculators writes it into the
    config; vLLM serves the folder with that model as the target). draft_tokens (speculators
    only): the number of speculative tokens the config proposes.
    """
    write = EXPORTERS[fmt]
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty: choose a new directory")
    with staged_directory(out) as tmp:
        write(head, target, tmp, verifier=verifier, draft_tokens=draft_tokens)
    return out


def foreign_layout(path: str | os.PathLike) -> str | None:
    """Which engine layout the folder at path holds (a key of the import table), or None for a
    draftsmith artifact or anything else."""
    config = _read_config(Path(path))
    if config is None or "draftsmith_version" in config:
        return None
    if "speculators_model_type" in config:
        kind = config["speculators_model_type"]
        return f"speculators-{kind}" if kind in ("peagle", "dflash", "dspark") else "speculators"
    if config.get("model_type") == "medusa":
        return "vllm-medusa"
    if "medusa_num_heads" in config:
        return "medusa-repo"
    architectures = config.get("architectures") or []
    if "draft_vocab_size" in config or any("Eagle3" in a for a in architectures):
        return "eagle"
    return None


def import_head(path: str | os.PathLike, target: PreTrainedModel) -> DraftHead:
    """The head published at path (speculators, SGLang / EAGLE repository, vLLM Medusa or Medusa
    repository layout), validated against `target` and bound to it, in eval mode on the
    target's device and dtype."""
    folder = Path(path)
    layout = foreign_layout(folder)
    if layout is None:
        raise ValueError(
            f"{folder} holds no head in a layout draftsmith imports ({', '.join(READERS.names())}): "
            "its config.json is missing or names none of them"
        )
    kind, read, names = READERS[layout]
    config = _read_config(folder)
    tensors = read_safetensors(folder, names)
    where = folder / names[0]
    args, state = read(config, tensors, target, where)
    try:
        head = head_class(kind)(target.config, head_config(kind, args, "head"))
    except ValueError as error:
        raise ValueError(f"{folder}: cannot build a {kind} head for this target: {error}") from None
    head.bind_target(target)
    check_tensors(own_tensors(head), state, where, fix="is it a head for this target?")
    head.load_state_dict(state, strict=False)
    to_target_precision(head, target.device, target.dtype)
    return head.eval()


def _read_config(folder: Path) -> dict[str, Any] | None:
    file = folder / "config.json"
    if not file.is_file():
        return None
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{file} is not valid JSON: {error}") from error
    return config if isinstance(config, dict) else None

"""Writing an artifact folder in one rename, with its model card."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel

from draftsmith.artifact.acceptance import (
    ACCEPTANCE_ENTRY,
    acceptance_entry,
    write_acceptance_head,
)
from draftsmith.artifact.files import CONFIG_FILE, README_FILE, WEIGHTS_FILE, __version__
from draftsmith.artifact.fingerprint import target_record
from draftsmith.artifact.staging import staged_directory
from draftsmith.core.config import config_to_dict
from draftsmith.heads.acceptance import AcceptanceHead
from draftsmith.heads.trainable import DraftHead

logger = logging.getLogger(__name__)


def own_tensors(head: DraftHead) -> dict[str, torch.Tensor]:
    """The head's own state (parameters and buffers), one name per storage: tied tensors are
    saved once, under their first name. Bound target modules are not part of it, nor what the
    head rebuilds from a named base (`DraftHead.is_rebuilt`)."""
    tensors, seen = {}, set()
    for name, tensor in head.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.stride())
        if key in seen or head.is_rebuilt(name):
            continue
        seen.add(key)
        tensors[name] = tensor
    return tensors


def save_artifact(
    head: DraftHead,
    target: PreTrainedModel,
    out_dir: str | os.PathLike,
    *,
    training: dict,
    target_name_or_path: str,
    acceptance: AcceptanceHead | None = None,
) -> Path:
    """Write `head` (as `head.for_artifact()` gives it) as an artifact directory at out_dir and
    return its path.

    training: {"recipe": ..., "steps": ..., "metrics": ...} (JSON-serialisable); acceptance: a
    learned acceptance head reading `head`'s states, saved beside it
    (`draftsmith.artifact.acceptance`). Everything is
    written into a temporary sibling directory, config.json last, which then replaces out_dir in
    one rename: a crash leaves either no artifact or a complete one. An existing artifact at
    out_dir is replaced (its calibration.json too: it described the old weights); any other
    non-empty directory there is an error.
    """
    out = Path(out_dir)
    if out.exists() and not (out / CONFIG_FILE).is_file() and any(out.iterdir()):
        raise FileExistsError(
            f"{out} exists and is not a draftsmith artifact: choose an empty or new directory"
        )
    head = head.for_artifact()
    draft_to_target = head.draft_to_target()
    config = {
        "draftsmith_version": __version__,
        "drafter": head.kind,
        "head": config_to_dict(head.config),
        "target": target_record(target, target_name_or_path),
        "feature_layers": list(head.target_feature_layers),
        "draft_vocab": None if draft_to_target is None else {"size": int(draft_to_target.numel())},
        "training": training,
    }
    if acceptance is not None:
        if acceptance.state_size != head.state_size:
            raise ValueError(
                f"the acceptance head reads states of width {acceptance.state_size}, the "
                f"{head.kind} head's are {head.state_size}"
            )
        config[ACCEPTANCE_ENTRY] = acceptance_entry(acceptance)
    try:
        config_text = json.dumps(config, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"the artifact config is not plain JSON ({error}): check `training`"
        ) from error
    tensors = {name: t.detach().cpu().contiguous() for name, t in own_tensors(head).items()}

    with staged_directory(out) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        if acceptance is not None:
            write_acceptance_head(acceptance, tmp)
        (tmp / README_FILE).write_text(model_card(config))
        (tmp / CONFIG_FILE).write_text(config_text)
    logger.info("wrote %s drafter artifact to %s", head.kind, out)
    return out


def model_card(config: dict[str, Any]) -> str:
    """README.md of an artifact: what it drafts for, how it was trained, how well it drafts."""
    target, training = config["target"], config["training"] or {}
    metrics = training.get("metrics") or {}
    lines = [
        f"# {config['drafter']} drafter for {target['name_or_path'] or target['architecture']}",
        "",
        "A speculative-decoding drafter written by draftsmith "
        f"{config['draftsmith_version']}. Load it next to its target with",
        "",
        "```python",
        "from draftsmith import load_drafter",
        "drafter = load_drafter(ARTIFACT_DIR, target)",
        "```",
        "",
        "## Target",
        "",
        f"- name: `{target['name_or_path']}` ({target['architecture']}, "
        f"{target['num_hidden_layers']} layers, hidden {target['hidden_size']}, "
        f"vocabulary {target['vocab_size']})",
        f"- fingerprint: `{target['fingerprint']}`",
        f"- feature layers read: {config['feature_layers'] or 'none'}",
        "",
        "## Head",
        "",
        f"- kind: `{config['drafter']}`",
        f"- config: `{json.dumps(_without(config['head'], 'draft_config'))}`",
        f"- draft vocabulary: {config['draft_vocab']['size'] if config['draft_vocab'] else 'full'}",
        f"- learned acceptance head: {_acceptance_line(config.get(ACCEPTANCE_ENTRY))}",
        "",
        "## Training",
        "",
        f"- steps: {training.get('steps', 'unknown')}",
    ]
    recipe = training.get("recipe")
    if isinstance(recipe, dict) and "data" in recipe:
        lines.append(f"- data: `{json.dumps(recipe['data'])}`")
    if metrics:
        lines += ["", "| metric (held out) | value |", "|---|---|"]
        lines += [f"| {key} | {value} |" for key, value in _flat(metrics).items()]
    lines += [
        "",
        "Mean accepted length (tau) and calibration: see `draftsmith bench` and the "
        "calibration report; `calibration.json`, when present, holds the calibrator fitted on "
        "held-out data and its metrics before and after.",
        "",
    ]
    return "\n".join(lines)


def _acceptance_line(entry: dict | None) -> str:
    if entry is None:
        return "none"
    return f"`{entry['file']}`, config `{json.dumps(entry['config'])}`"


def _without(mapping: dict, key: str) -> dict:
    return {k: v for k, v in mapping.items() if k != key}


def _flat(metrics: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat

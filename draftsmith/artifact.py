"""The one artifact format of trained drafters: write it (`save_artifact`), check and load it
(`load_drafter`), and identify the target it belongs to (`target_fingerprint`).

    config.json         draftsmith_version, drafter kind, head (the kind's config), target
                        (name_or_path, architecture, vocab_size, hidden_size, num_hidden_layers,
                        fingerprint), feature_layers, draft_vocab, training
    model.safetensors   the head's own tensors (never the target's shared modules)
    calibration.json    optional, written by calibration
    README.md           model card

Loading validates before it trusts: the files exist, the version is readable (older formats are
upgraded on read), the kind is known and the head config fits its config class (all of which
`read_artifact_config` checks without a target), the target is the one the head was trained for
(vocabulary, then fingerprint), the tensors are intact and exactly the ones the head has, finite,
and not all still at their initialisation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import uuid
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from draftsmith.calibration import Calibrator
from draftsmith.core.config import ConfigError, config_to_dict
from draftsmith.heads import Drafter
from draftsmith.heads.trainable import DraftHead, head_class, head_config

logger = logging.getLogger(__name__)

__version__ = version("draftsmith")

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CALIBRATION_FILE = "calibration.json"
README_FILE = "README.md"

FINGERPRINT_CONFIG_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "tie_word_embeddings",
)
FINGERPRINT_ROWS = 8
"""Rows of each sampled weight matrix that enter the fingerprint."""


class UntrainedDrafterError(ValueError):
    """The artifact's weights are all still at the head's initialisation."""


# -- fingerprint ----------------------------------------------------------------------------------


def target_fingerprint(target: PreTrainedModel) -> str:
    """sha256 identifying a target: its key config fields and samples of two weight matrices.

    The samples are the first rows of the input embedding and of the last weight matrix of the
    decoder stack (the last layer's), reduced to their signs: a sign survives casting between
    float32, bfloat16 and float16, so a head trained on a float32 target loads onto the same
    target in bfloat16, while another checkpoint (other seed, a fine-tune) differs in thousands of
    signs. Cheap: a few rows, no pass over the weights.
    """
    config = target.config.get_text_config()
    fields = {key: getattr(config, key, None) for key in FINGERPRINT_CONFIG_KEYS}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    for weight in _fingerprint_weights(target):
        rows = weight.detach()[:FINGERPRINT_ROWS].float().cpu()
        digest.update(str(tuple(weight.shape)).encode())
        digest.update(torch.sign(rows).to(torch.int8).numpy().tobytes())
    return digest.hexdigest()


def _fingerprint_weights(target: PreTrainedModel) -> list[torch.Tensor]:
    embed = target.get_input_embeddings().weight
    output = target.get_output_embeddings()
    skip = {id(embed), id(getattr(output, "weight", None))}
    matrices = [p for p in target.parameters() if p.ndim == 2 and id(p) not in skip]
    return [embed, *matrices[-1:]]


def _target_record(target: PreTrainedModel, name_or_path: str) -> dict[str, Any]:
    config = target.config.get_text_config()
    architectures = getattr(target.config, "architectures", None) or [type(target).__name__]
    return {
        "name_or_path": name_or_path,
        "architecture": architectures[0],
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "fingerprint": target_fingerprint(target),
    }


# -- saving ---------------------------------------------------------------------------------------


def own_tensors(head: DraftHead) -> dict[str, torch.Tensor]:
    """The head's own state (parameters and buffers), one name per storage: tied tensors are
    saved once, under their first name. Bound target modules are not part of it."""
    tensors, seen = {}, set()
    for name, tensor in head.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.stride())
        if key in seen:
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
) -> Path:
    """Write `head` as an artifact directory at out_dir and return its path.

    training: {"recipe": ..., "steps": ..., "metrics": ...} (JSON-serialisable). Everything is
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
    draft_to_target = head.draft_to_target()
    config = {
        "draftsmith_version": __version__,
        "drafter": head.kind,
        "head": config_to_dict(head.config),
        "target": _target_record(target, target_name_or_path),
        "feature_layers": list(head.target_feature_layers),
        "draft_vocab": None if draft_to_target is None else {"size": int(draft_to_target.numel())},
        "training": training,
    }
    try:
        config_text = json.dumps(config, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"the artifact config is not plain JSON ({error}): check `training`"
        ) from error
    tensors = {name: t.detach().cpu().contiguous() for name, t in own_tensors(head).items()}

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / README_FILE).write_text(model_card(config))
        (tmp / CONFIG_FILE).write_text(config_text)
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("wrote %s drafter artifact to %s", head.kind, out)
    return out


def _replace_dir(new: Path, out: Path) -> None:
    """Put the complete directory `new` at `out`, replacing an existing one."""
    if not out.exists():
        new.rename(out)
        return
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    out.rename(old)
    new.rename(out)
    shutil.rmtree(old, ignore_errors=True)


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


# -- loading --------------------------------------------------------------------------------------


def load_drafter(
    path: str | os.PathLike, target: PreTrainedModel, *, allow_untrained: bool = False
) -> Drafter:
    """Load the artifact at `path` as a `Drafter` running next to `target`.

    Raises a ValueError naming the problem and its fix when the artifact is incomplete or
    corrupt, from a newer draftsmith, of an unknown kind, made for another target, holds missing,
    unexpected, misshapen or non-finite tensors, or was never trained (every parameter equal to
    the head's seeded initialisation; `allow_untrained=True` turns that into a warning). The
    drafter knows nothing of calibration: `load_acceptance_model` reads that, for the policy.
    """
    return load_head(path, target, allow_untrained=allow_untrained).as_drafter(target)


def load_acceptance_model(path: str | os.PathLike) -> Calibrator | None:
    """The calibrator fitted on held-out data (the artifact's calibration.json), to hand to the
    draft policy as its acceptance model; None when the artifact is not calibrated."""
    file = Path(path) / CALIBRATION_FILE
    return Calibrator.load(file) if file.is_file() else None


def load_head(
    path: str | os.PathLike, target: PreTrainedModel, *, allow_untrained: bool = False
) -> DraftHead:
    """The artifact's trained head, bound to `target`, in eval mode, on the target's device and
    dtype (its training-side interface, e.g. for teacher-forced calibration); checked as
    `load_drafter` checks it."""
    path = Path(path)
    config = read_artifact_config(path)
    kind = config["drafter"]
    _check_target(config, target, path)
    tensors = _read_tensors(path)
    try:
        head = head_class(kind)(target.config, head_config(kind, config["head"], "head"))
    except ValueError as error:
        raise ValueError(
            f"{path / CONFIG_FILE}: cannot build the {kind} head for this target from its "
            f"config {config['head']}: {error}"
        ) from error
    _check_layout(head, config, path)
    head.bind_target(target)  # before loading: binding may initialise a fresh head
    expected = own_tensors(head)
    _check_tensor_names(expected, tensors, path)
    _check_trained(head, tensors, path, allow_untrained)
    head.load_state_dict(tensors, strict=False)  # tied aliases are filled through their storage
    head.to(device=target.device, dtype=target.dtype)  # integer buffers (d2t) keep their dtype
    return head.eval()


def read_artifact_config(path: str | os.PathLike) -> dict[str, Any]:
    """The artifact's config.json in this version's format, checked without a target: the files
    are there, the JSON parses, the version is readable (an older format is upgraded), the kind
    is a trainable head and `head` fits the kind's config class. Commands call it to check an
    artifact before loading any model."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"no drafter artifact at {path}: give the directory written by training "
            f"(it holds {CONFIG_FILE} and {WEIGHTS_FILE})"
        )
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise FileNotFoundError(
                f"{path} is not a complete drafter artifact: {name} is missing (an interrupted "
                "export? export the drafter again)"
            )
    file = path / CONFIG_FILE
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{file} is not valid JSON: {error}") from error
    keys = ("draftsmith_version", "drafter", "head", "target")
    if not isinstance(config, dict) or any(key not in config for key in keys):
        raise ValueError(f"{file} lacks some of {list(keys)}: not a draftsmith artifact config")
    if not isinstance(config["head"], dict):
        raise ValueError(
            f"{file}: head must be a mapping of the head config, got {config['head']!r}"
        )
    written = _check_version(config["draftsmith_version"], path)
    config = _upgrade(config, written)
    kind = config["drafter"]
    _check_kind(kind, path)
    try:
        head_config(kind, config["head"], "head")
    except ConfigError as error:
        found, running = config["draftsmith_version"], _version_tuple(__version__)
        if written == running:
            raise ValueError(
                f"{file}: the {kind} head config does not fit: {error}. Correct it, or export "
                "the drafter again"
            ) from None
        raise ValueError(
            f"{file}: the {kind} head config, written by draftsmith {found} (format "
            f"{_format(written)}), does not fit format {_format(running)} even upgraded: "
            f"{error}. Load it with draftsmith {found}, or retrain the head with this "
            f"draftsmith {__version__}"
        ) from None
    return config


OLDEST_FORMAT = (0, 1)
"""The oldest format (draftsmith major.minor) `_upgrade` brings to this version's."""
_RENAMED_IN_0_2 = {"medusa": {"num_heads": "num_steps"}, "mtp": {"num_modules": "num_steps"}}


def _upgrade(config: dict[str, Any], written: tuple[int, int]) -> dict[str, Any]:
    """`config` (written in format `written`) as this version writes it.

    0.1 -> 0.2: the number of draft steps has one name across kinds, `num_steps`: medusa's
    `num_heads` and mtp's `num_modules` under "head" are renamed.
    """
    if written < (0, 2):
        renamed = _RENAMED_IN_0_2.get(config["drafter"], {})
        config = {**config, "head": {renamed.get(k, k): v for k, v in config["head"].items()}}
    return config


def _version_tuple(version: Any) -> tuple[int, int] | None:
    match = re.fullmatch(r"(\d+)\.(\d+)(\.\d+)?\S*", str(version))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _format(version: tuple[int, int]) -> str:
    return ".".join(map(str, version))


def _check_version(found: Any, path: Path) -> tuple[int, int]:
    """The format (major, minor) that wrote the artifact, if this version reads it."""
    written, running = _version_tuple(found), _version_tuple(__version__)
    if written is None:
        raise ValueError(f"{path / CONFIG_FILE}: unreadable draftsmith_version {found!r}")
    if written > running:
        raise ValueError(
            f"{path} was written by draftsmith {found}, newer than this draftsmith "
            f"{__version__}: upgrade draftsmith to load it"
        )
    if written < OLDEST_FORMAT:
        raise ValueError(
            f"{path} was written by draftsmith {found} (format {_format(written)}), older than "
            f"this draftsmith {__version__} reads (format {_format(OLDEST_FORMAT)} on): load it "
            f"with draftsmith {found}, or retrain the head with this one"
        )
    return written


def _check_kind(kind: Any, path: Path) -> None:
    try:
        head_class(kind)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def _describe(record: dict[str, Any]) -> str:
    name = record.get("name_or_path") or "an unnamed target"
    return (
        f"{name} ({record.get('architecture')}, fingerprint {str(record.get('fingerprint'))[:12]})"
    )


def _check_target(config: dict[str, Any], target: PreTrainedModel, path: Path) -> None:
    trained_for = config["target"]
    given = _target_record(target, getattr(target.config, "name_or_path", "") or "")
    if trained_for.get("vocab_size") != given["vocab_size"]:
        raise ValueError(
            f"{path} drafts over a vocabulary of {trained_for.get('vocab_size')} tokens "
            f"(trained for {_describe(trained_for)}) but the given target {_describe(given)} has "
            f"{given['vocab_size']}: load it with the target it was trained for"
        )
    if trained_for.get("fingerprint") != given["fingerprint"]:
        raise ValueError(
            f"{path} was trained for {_describe(trained_for)}, but the given target is "
            f"{_describe(given)}: the fingerprints differ, so the head would draft for another "
            "model. Load it with the target it was trained for, or train a head on this one"
        )


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path / WEIGHTS_FILE))
    except (SafetensorError, OSError) as error:
        raise ValueError(
            f"{path / WEIGHTS_FILE} is corrupt or truncated ({error}): export the drafter again"
        ) from error


def _check_layout(head: DraftHead, config: dict[str, Any], path: Path) -> None:
    """The rebuilt head reads the feature layers and vocabulary the config says it does."""
    layers = list(head.target_feature_layers)
    if config.get("feature_layers", layers) != layers:
        raise ValueError(
            f"{path / CONFIG_FILE}: feature_layers {config['feature_layers']} disagree with the "
            f"head config, which reads {layers}"
        )
    d2t = head.draft_to_target()
    size = None if d2t is None else {"size": int(d2t.numel())}
    if config.get("draft_vocab", size) != size:
        raise ValueError(
            f"{path / CONFIG_FILE}: draft_vocab {config['draft_vocab']} disagrees with the head "
            f"config ({size})"
        )


def _check_tensor_names(
    expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], path: Path
) -> None:
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{path / WEIGHTS_FILE} does not match the head its config describes: missing "
            f"tensors {missing}, unexpected tensors {unexpected} (was it written by another "
            "head kind or version? export the drafter again)"
        )
    misshapen = [
        f"{name} {tuple(found[name].shape)} (expected {tuple(t.shape)})"
        for name, t in expected.items()
        if found[name].shape != t.shape
    ]
    if misshapen:
        raise ValueError(f"{path / WEIGHTS_FILE} has tensors of the wrong shape: {misshapen}")
    broken = [
        name
        for name, t in found.items()
        if t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]
    if broken:
        raise ValueError(
            f"{path / WEIGHTS_FILE} holds NaN or infinite values in {broken}: the training "
            "diverged; retrain (lower the learning rate) or use an earlier checkpoint"
        )


def _check_trained(
    head: DraftHead, tensors: dict[str, torch.Tensor], path: Path, allow_untrained: bool
) -> None:
    """Every saved parameter exactly equal to the fresh head's (seeded, hence reproducible)
    initialisation, in the saved precision, means nothing was trained."""
    saved = [(p, tensors[name]) for name, p in head.named_parameters() if name in tensors]
    if any(not torch.equal(p.detach().to(t.dtype), t) for p, t in saved):
        return
    message = (
        f"{path} holds an untrained drafter: every parameter equals the {head.kind} head's "
        "initialisation, so it would draft at random. Train it (draftsmith train), or pass "
        "allow_untrained=True to load it anyway"
    )
    if not allow_untrained:
        raise UntrainedDrafterError(message)
    warnings.warn(message, stacklevel=3)

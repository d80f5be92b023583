"""Reading an artifact folder: validate before trusting, upgrade older formats, load."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import PreTrainedModel

from draftsmith.artifact.acceptance import read_acceptance_head
from draftsmith.artifact.checks import check_tensors
from draftsmith.artifact.engines import foreign_layout, import_head
from draftsmith.artifact.files import CALIBRATION_FILE, CONFIG_FILE, WEIGHTS_FILE, __version__
from draftsmith.artifact.fingerprint import target_record
from draftsmith.artifact.save import own_tensors
from draftsmith.calibration import Calibrator
from draftsmith.core.config import ConfigError
from draftsmith.core.signals import ACCEPTANCE_HEAD_SIGNAL, AcceptanceModel
from draftsmith.heads import Drafter
from draftsmith.heads.acceptance import AcceptanceHead
from draftsmith.heads.blocks import to_target_precision
from draftsmith.heads.eagle import FeatureDrafter
from draftsmith.heads.learned_acceptance import LearnedAcceptance
from draftsmith.heads.trainable import DraftHead, head_class, head_config


class UntrainedDrafterError(ValueError):
    """The artifact's weights are all still at the head's initialisation."""


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


def load_acceptance_model(
    path: str | os.PathLike, drafter: Drafter | None = None
) -> AcceptanceModel | None:
    """The calibrator fitted on held-out data (the artifact's calibration.json), to hand to the
    draft policy as its acceptance model; None when the artifact is not calibrated.

    A calibrator of the learned acceptance head's output (signal `acceptance_head`) needs the
    head and the drafter it watches: given `drafter` (`load_drafter`'s), it comes as a
    `LearnedAcceptance`; without, the head is only checked and the bare calibrator returned
    (it scores records that carry the signal, e.g. `draftsmith calibrate --evaluate-only`)."""
    path = Path(path)
    file = path / CALIBRATION_FILE
    if not file.is_file():
        return None
    calibrator = Calibrator.load(file)
    if ACCEPTANCE_HEAD_SIGNAL not in calibrator.signals:
        return calibrator
    head = load_acceptance_head(path, None if drafter is None else drafter.state_size)
    if head is None and isinstance(drafter, FeatureDrafter):
        head = drafter.acceptance_head()
    elif head is None and trains_own_acceptance(read_artifact_config(path)):
        return calibrator
    if head is None:
        raise ValueError(
            f"{file} calibrates the learned acceptance head, which {path} does not have: "
            "calibrate the artifact again on other signals, or train the head into it"
        )
    return calibrator if drafter is None else LearnedAcceptance(head, drafter, calibrator)


def trains_own_acceptance(config: dict) -> bool:
    """Whether an artifact's head (its config.json) holds a learned acceptance head of its own,
    trained with it (DSpark's `confidence_head`)."""
    head = config.get("head")
    return isinstance(head, dict) and bool(head.get("confidence_head"))


def load_acceptance_head(
    path: str | os.PathLike, state_size: int | None = None
) -> AcceptanceHead | None:
    """The artifact's learned acceptance head (None when it has none), on the CPU in float32,
    checked against the width of the hidden states it will read (`DraftHead.state_size`,
    `Drafter.state_size`; None: unchecked). Run it beside a drafter with
    `LearnedAcceptance(head, drafter)`."""
    path = Path(path)
    return read_acceptance_head(path, read_artifact_config(path), state_size)


def load_head(
    path: str | os.PathLike,
    target: PreTrainedModel,
    *,
    allow_untrained: bool = False,
    dtype: torch.dtype | None = None,
) -> DraftHead:
    """The artifact's trained head, bound to `target`, in eval mode, on the target's device and
    in `dtype` (None: the target's) (its training-side interface, e.g. for teacher-forced
    calibration); checked as `load_drafter` checks it. A head published in an engine's layout
    (speculators, SGLang, the EAGLE or Medusa repository, vLLM Medusa) is imported
    (`engines.import_head`)."""
    path = Path(path)
    if foreign_layout(path) is not None:
        return import_head(path, target)
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
    check_tensors(expected, tensors, path / WEIGHTS_FILE)
    _check_trained(head, tensors, path, allow_untrained)
    head.load_state_dict(tensors, strict=False)  # tied aliases are filled through their storage
    # integer buffers (d2t) keep their dtype
    to_target_precision(head, target.device, dtype or target.dtype)
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
    0.3: EAGLE-3 heads take the published layout; older ones have other weights and do not load.
    """
    if written < (0, 3) and config["drafter"] == "eagle3":
        raise ValueError(
            f"this EAGLE-3 head was written by draftsmith {config['draftsmith_version']} in the "
            "old draftsmith layout (a 2H -> H projection before a standard decoder layer); "
            f"draftsmith {__version__} uses the published EAGLE-3 layout that vLLM and SGLang "
            "load, which has other weights. Retrain the head with this draftsmith (same recipe), "
            "or load it with draftsmith 0.2"
        )
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
    given = target_record(target, getattr(target.config, "name_or_path", "") or "")
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

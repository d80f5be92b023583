"""calibration.json: one fitted calibrator's description plus metadata, as plain JSON.

The file holds the calibrator's own keys (`Calibrator.to_dict`: kind, signals, params and, from
auto, selection), a `format_version`, and any metadata the caller adds (metrics before/after, the
config, the data) for the model card; readers take the calibrator's keys and ignore the rest.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

CALIBRATION_FILE = "calibration.json"
FORMAT_VERSION = 1


def calibration_path(path: str | os.PathLike) -> Path:
    """The calibration.json itself, given it or the folder that holds it."""
    path = Path(path)
    return path / CALIBRATION_FILE if path.is_dir() else path


def write_calibration(
    path: str | os.PathLike,
    description: Mapping[str, Any],
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write description (a calibrator's `to_dict`) and metadata atomically; NaN becomes null.

    Where a metadata key repeats one of the description's, the description's wins.
    """
    payload = {**(metadata or {}), "format_version": FORMAT_VERSION, **description}
    return write_json(calibration_path(path), payload)


def write_json(path: str | os.PathLike, payload: Mapping[str, Any]) -> Path:
    """Write payload as plain JSON (`_json_safe`: NaN, e.g. an AUROC over one class, becomes
    null) atomically."""
    path = Path(path)
    text = json.dumps(_json_safe(payload), indent=2, allow_nan=False)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)  # a crash mid-write leaves the previous file intact
    return path


def read_calibration(path: str | os.PathLike) -> dict[str, Any]:
    """The payload of calibration.json (the file or its folder), less `format_version`.

    Raises a ValueError naming the file when it is not JSON or has another format version.
    """
    path = calibration_path(path)
    try:
        payload = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    version = payload.pop("format_version", None) if isinstance(payload, dict) else None
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path} has calibration format_version {version!r}; this draftsmith reads "
            f"{FORMAT_VERSION}. Re-run calibration with this version."
        )
    return payload


def _json_safe(value: Any) -> Any:
    """Plain JSON: numpy scalars and arrays to Python, NaN and inf to None."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value

"""What an artifact folder holds and which format version writes it."""

from __future__ import annotations

from importlib.metadata import version

from draftsmith.calibration import CALIBRATION_FILE

__version__ = version("draftsmith")
"""The package version: written into config.json, and the newest format this draftsmith reads."""

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
README_FILE = "README.md"

__all__ = ["CALIBRATION_FILE", "CONFIG_FILE", "README_FILE", "WEIGHTS_FILE", "__version__"]

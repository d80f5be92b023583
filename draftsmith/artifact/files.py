"""What an artifact folder holds and which format version writes it."""

from __future__ import annotations

from importlib.metadata import version

__version__ = version("draftsmith")
"""The package version: written into config.json, and the newest format this draftsmith reads."""

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CALIBRATION_FILE = "calibration.json"
README_FILE = "README.md"

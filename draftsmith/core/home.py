"""Where draftsmith keeps what it fetches and measures: ``$DRAFTSMITH_HOME``, else
``~/.cache/draftsmith`` (models, data, cost curves)."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "DRAFTSMITH_HOME"


def default_home() -> Path:
    """The cache root: ``$DRAFTSMITH_HOME``, else ``~/.cache/draftsmith``."""
    env = os.environ.get(HOME_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "draftsmith"

"""``draftsmith fetch-model NAME``: download a zoo model once and print its folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.build.flags import POSITIONAL
from draftsmith.zoo import fetch_model


@dataclass(kw_only=True)
class FetchModelCommand:
    """Fetch a zoo model (on first use; later calls return at once) and print its local folder,
    a plain transformers checkpoint."""

    name: str = field(metadata=POSITIONAL)
    """Zoo name: smollm2-135m, qwen2.5-coder-0.5b or qwen2.5-coder-1.5b."""

    def run(self) -> Path:
        folder = fetch_model(self.name)
        print(folder)
        return folder

"""``draftsmith export`` / ``draftsmith import``: heads to and from the serving engines' formats."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from draftsmith.artifact import load_head, read_artifact_config, save_artifact
from draftsmith.artifact.engines import export_head, foreign_layout, import_head
from draftsmith.build.flags import POSITIONAL, Range, at_least
from draftsmith.core.models import Dtype
from draftsmith.zoo import load_model, resolve_model

ExportFormat = Literal["speculators", "sglang", "vllm-medusa"]


def _check_new_directory(out: Path) -> None:
    """Fail before any model loads when out holds something (nothing is ever overwritten)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not empty: choose a new --out directory")


@dataclass(kw_only=True)
class ExportCommand:
    """Write a draftsmith artifact in a serving engine's format: speculators (EAGLE-3, P-EAGLE
    or DFlash, what vLLM serves), sglang (EAGLE-3) or vllm-medusa (Medusa)."""

    FLAG_RANGES: ClassVar[dict[str, Range]] = {"draft_tokens": at_least(1)}

    artifact: Path = field(metadata=POSITIONAL)
    """Drafter artifact directory."""
    format: ExportFormat
    """Engine format to write."""
    out: Path
    """New directory to write (written in one rename: never half-written)."""
    target: str | None = None
    """Zoo name, local folder or hub id of the artifact's target; None: the name_or_path the
    artifact records."""
    verifier: str | None = None
    """The target as the engine should load it, written into speculators' config (vLLM serves
    the exported folder with it as the target); None: the target's local folder."""
    draft_tokens: int = 3
    """Speculative tokens the speculators config proposes (P-EAGLE, DFlash: the block vLLM
    drafts in one forward, at most the head's num_steps)."""
    dtype: Dtype = "auto"
    """Precision of the target, and so of the exported weights (auto:
    bfloat16 on a GPU and on a CPU with bf16 matrix units, AMX or AVX512-BF16; float32
    elsewhere)."""

    def run(self) -> Path:
        config = read_artifact_config(self.artifact)
        _check_new_directory(self.out)
        name = self.target or config["target"]["name_or_path"]
        if not name:
            raise ValueError(f"{self.artifact} records no target name: pass --target")
        target, _ = load_model(name, dtype=self.dtype)
        head = load_head(self.artifact, target)
        verifier = self.verifier or str(resolve_model(name))
        export_head(
            head, target, self.out, self.format, verifier=verifier, draft_tokens=self.draft_tokens
        )
        print(f"wrote the {head.kind} head as {self.format} to {self.out}")
        return self.out


@dataclass(kw_only=True)
class ImportCommand:
    """Import a head published in an engine's layout (speculators, SGLang or the EAGLE
    repository's EAGLE-3; vLLM's or the Medusa repository's Medusa) as a draftsmith artifact,
    checked against the target, ready for `draftsmith calibrate` and `draftsmith bench`."""

    source: Path = field(metadata=POSITIONAL)
    """Directory holding the published head (config.json and safetensors weights)."""
    target: str
    """Zoo name, local folder or hub id of the head's target model."""
    out: Path
    """New artifact directory to write."""
    dtype: Dtype = "auto"
    """Precision of the target, and so of the artifact's weights (auto:
    bfloat16 on a GPU and on a CPU with bf16 matrix units, AMX or AVX512-BF16; float32
    elsewhere)."""

    def run(self) -> Path:
        layout = foreign_layout(self.source)
        if layout is None:
            raise ValueError(
                f"{self.source} holds no head in a layout draftsmith imports (speculators, "
                "SGLang / EAGLE repository, vLLM Medusa, Medusa repository)"
            )
        _check_new_directory(self.out)
        target, _ = load_model(self.target, dtype=self.dtype)
        head = import_head(self.source, target)
        training = {"imported_from": {"path": str(self.source), "layout": layout}}
        save_artifact(head, target, self.out, training=training, target_name_or_path=self.target)
        print(f"imported the {layout} {head.kind} head to {self.out}")
        return self.out

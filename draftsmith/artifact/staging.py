"""Writing a folder in one rename: a crash or an error leaves either no folder or a complete one."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """Yield a fresh temporary sibling of `out` to fill; on success it replaces `out` (an existing
    one included) in one rename, on any error it is removed and `out` is left as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_dir(new: Path, out: Path) -> None:
    """Put the complete directory `new` at `out`, replacing an existing one."""
    if not out.exists():
        new.rename(out)
        return
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    out.rename(old)
    new.rename(out)
    shutil.rmtree(old, ignore_errors=True)

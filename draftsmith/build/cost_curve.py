"""The target's verification cost curve, measured once per target, precision, device model and
draftsmith version and kept on disk (`draftsmith profile` writes the same files)."""

from __future__ import annotations

import logging

import torch
from transformers import PreTrainedModel

from draftsmith import __version__
from draftsmith.core.parallel import is_main_process, placement
from draftsmith.decoding.profile import CostCurve, device_name, measure_cost_curve, profile_target

logger = logging.getLogger(__name__)

BUSY_FACTOR = 2.0
"""A stored curve is timed again when its one-token verification took more than this many times
what one takes now: it was timed while other work held the machine, and every later run would
plan with it."""


def cost_curve(target: PreTrainedModel, name: str, *, max_tokens: int, rows: int = 1) -> CostCurve:
    """The stored curve of `target` (zoo name or path `name`) on this device: the one timed over
    `rows` rows where there is one, else the one-row curve; measured for 1..`max_tokens` tokens
    and stored now when there is none, or when the stored one was timed by another draftsmith
    version (whose forward may cost differently), on another device model or with another
    number of torch threads (a cache directory carried to another machine), or while the machine
    was busy (`timed_while_busy`)."""
    where = (name, target.dtype, str(target.device), placement(target))
    batched = CostCurve.default_path(*where, rows=rows)
    path = CostCurve.default_path(*where)
    here = (__version__, device_name(target.device), torch.get_num_threads())
    for stored in ([batched] if rows > 1 else []) + [path]:
        if stored.is_file():
            curve = CostCurve.load(stored)
            timed = (curve.draftsmith_version, curve.device_name, curve.torch_threads)
            if timed != here:
                why = (
                    f"was timed by draftsmith {timed[0] or 'before 0.3'} on "
                    f"{timed[1] or 'an unnamed device'} with {timed[2]} torch threads; this is "
                    f"{here[0]} on {here[1]} with {here[2]}"
                )
            else:
                why = timed_while_busy(curve, target)
                if why is None:
                    return curve
            if is_main_process():
                print(f"{stored} {why}: measuring it again")
    if is_main_process():
        print(f"measuring {name}'s verification cost (once; kept in {path})")
    curve = measure_cost_curve(target, max_tokens, name=name)
    if is_main_process():
        curve.save(path)
    return curve


def timed_while_busy(curve: CostCurve, target: PreTrainedModel) -> str | None:
    """Why `curve` misstates `target`'s cost now, or None: its one-token verification, timed again
    here (fastest of 3), costs less than 1 / `BUSY_FACTOR` of the stored figure. A curve that is
    only faster than now is kept: a busy spell now says nothing against it."""
    n = curve.tokens[0]
    now = profile_target(target, sizes=[n], context=curve.context, rows=curve.rows, repeats=3)
    stored, fresh = curve.verify_s[0], now.verify_s[0]
    if stored <= BUSY_FACTOR * fresh:
        return None
    return (
        f"says {n} token(s) take {stored * 1e3:.1f} ms to verify, {stored / fresh:.1f}x the "
        f"{fresh * 1e3:.1f} ms they take now: it was timed while the machine was busy"
    )

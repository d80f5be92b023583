"""The target's verification cost curve, measured once per target, precision, device model and
draftsmith version and kept on disk (`draftsmith profile` writes the same files)."""

from __future__ import annotations

import logging

import torch
from transformers import PreTrainedModel

from draftsmith import __version__
from draftsmith.core.parallel import is_main_process, placement
from draftsmith.decoding.profile import CostCurve, device_name, measure_cost_curve

logger = logging.getLogger(__name__)


def cost_curve(target: PreTrainedModel, name: str, *, max_tokens: int, rows: int = 1) -> CostCurve:
    """The stored curve of `target` (zoo name or path `name`) on this device: the one timed over
    `rows` rows where there is one, else the one-row curve; measured for 1..`max_tokens` tokens
    and stored now when there is none, or when the stored one was timed by another draftsmith
    version (whose forward may cost differently), on another device model or with another
    number of torch threads (a cache directory carried to another machine)."""
    where = (name, target.dtype, str(target.device), placement(target))
    batched = CostCurve.default_path(*where, rows=rows)
    path = CostCurve.default_path(*where)
    here = (__version__, device_name(target.device), torch.get_num_threads())
    for stored in ([batched] if rows > 1 else []) + [path]:
        if stored.is_file():
            curve = CostCurve.load(stored)
            timed = (curve.draftsmith_version, curve.device_name, curve.torch_threads)
            if timed == here:
                return curve
            if is_main_process():
                print(
                    f"{stored} was timed by draftsmith {timed[0] or 'before 0.3'} on "
                    f"{timed[1] or 'an unnamed device'} with {timed[2]} torch threads; this is "
                    f"{here[0]} on {here[1]} with {here[2]}: measuring it again"
                )
    if is_main_process():
        print(f"measuring {name}'s verification cost (once; kept in {path})")
    curve = measure_cost_curve(target, max_tokens, name=name)
    if is_main_process():
        curve.save(path)
    return curve

"""Drafters: the modules that propose tokens for a target, behind one `Drafter` interface."""

from draftsmith.heads.base import Draft, Drafter, StopFn, drafter_class, register_drafter
from draftsmith.heads.draft_model import DraftModelDrafter
from draftsmith.heads.ngram import NgramDrafter

__all__ = [
    "Draft",
    "Drafter",
    "DraftModelDrafter",
    "NgramDrafter",
    "StopFn",
    "drafter_class",
    "register_drafter",
]

"""Drafters: the modules that propose tokens for a target, behind one `Drafter` interface.

Importing this package registers every built-in kind: the draft-model and n-gram drafters and
the trainable heads (medusa, mtp, eagle, eagle3, distilled)."""

from draftsmith.heads.base import Draft, Drafter, StopFn, drafter_class, register_drafter
from draftsmith.heads.distilled import DistilledHead
from draftsmith.heads.draft_model import DraftModelDrafter
from draftsmith.heads.eagle import EagleHead
from draftsmith.heads.eagle3 import Eagle3Head
from draftsmith.heads.medusa import MedusaHead
from draftsmith.heads.mtp import MTPHead
from draftsmith.heads.ngram import NgramDrafter
from draftsmith.heads.trainable import DraftHead, build_head, fit_draft_vocab
from draftsmith.heads.vocab import build_draft_vocab

__all__ = [
    "Draft",
    "DraftHead",
    "Drafter",
    "DistilledHead",
    "DraftModelDrafter",
    "Eagle3Head",
    "EagleHead",
    "MTPHead",
    "MedusaHead",
    "NgramDrafter",
    "StopFn",
    "build_draft_vocab",
    "build_head",
    "drafter_class",
    "fit_draft_vocab",
    "register_drafter",
]

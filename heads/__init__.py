"""Drafters: the modules that propose tokens for a target, behind one `Drafter` interface.

Importing this package registers every built-in kind: the draft-model and n-gram drafters and
the trainable heads (medusa, mtp, eagle, eagle3, peagle, dflash, distilled), each with its typed config."""

from draftsmith.heads.base import (
    AcceptanceFn,
    Draft,
    Drafter,
    DraftRequest,
    StopFn,
    TreeShape,
    drafter_class,
    drafter_kinds,
    register_drafter,
)
from draftsmith.heads.dflash import DFlashConfig, DFlashHead
from draftsmith.heads.distilled import DistilledConfig, DistilledHead
from draftsmith.heads.draft_model import DraftModelDrafter
from draftsmith.heads.eagle import EagleConfig, EagleHead
from draftsmith.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.heads.medusa import MedusaConfig, MedusaHead
from draftsmith.heads.mtp import MTPConfig, MTPHead
from draftsmith.heads.ngram import NgramDrafter
from draftsmith.heads.peagle import PEagleConfig, PEagleHead
from draftsmith.heads.trainable import (
    DraftHead,
    HeadConfig,
    StepsConfig,
    build_head,
    fit_draft_vocab,
    head_class,
    head_config,
)
from draftsmith.heads.vocab import DraftVocabConfig, build_draft_vocab

__all__ = [
    "AcceptanceFn",
    "DFlashConfig",
    "DFlashHead",
    "DistilledConfig",
    "DistilledHead",
    "Draft",
    "DraftRequest",
    "DraftHead",
    "DraftModelDrafter",
    "DraftVocabConfig",
    "Drafter",
    "Eagle3Config",
    "Eagle3Head",
    "EagleConfig",
    "EagleHead",
    "HeadConfig",
    "MTPConfig",
    "MTPHead",
    "MedusaConfig",
    "MedusaHead",
    "NgramDrafter",
    "PEagleConfig",
    "PEagleHead",
    "StepsConfig",
    "StopFn",
    "TreeShape",
    "build_draft_vocab",
    "build_head",
    "drafter_class",
    "drafter_kinds",
    "fit_draft_vocab",
    "head_class",
    "head_config",
    "register_drafter",
]

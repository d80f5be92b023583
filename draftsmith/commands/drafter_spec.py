"""Build a drafter from a command-line spec: `draft-model:NAME_OR_PATH`, `ngram[:N]` or
`artifact:PATH`."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftsmith.artifact import load_acceptance_model, load_drafter, read_artifact_config
from draftsmith.artifact.engines import foreign_layout
from draftsmith.core.models import check_same_vocabulary, load_model
from draftsmith.core.signals import AcceptanceModel
from draftsmith.heads import Drafter, DraftModelDrafter, NgramDrafter

SPEC_HELP = (
    "draft-model:NAME_OR_PATH (a causal LM sharing the target's vocabulary), ngram[:MAX_N] or "
    "artifact:PATH (a trained drafter)"
)


@dataclass
class BuiltDrafter:
    drafter: Drafter
    hf_assist: dict = field(default_factory=dict)
    """The `generate` arguments of Hugging Face's counterpart (for side-by-side benchmarks);
    empty when Hugging Face has none."""
    acceptance: AcceptanceModel | None = None
    """The artifact's calibrated acceptance model, for the draft policy; None: uncalibrated."""


def parse_spec(spec: str) -> tuple[str, str]:
    """(kind, argument) of a drafter spec; a ValueError naming the accepted forms otherwise."""
    kind, _, arg = spec.partition(":")
    needs_arg = kind in ("draft-model", "artifact")
    if (needs_arg and arg) or (kind == "ngram" and (not arg or arg.isdigit())):
        return kind, arg
    raise ValueError(f"unknown drafter spec {spec!r}; expected {SPEC_HELP}")


def check_spec(spec: str) -> None:
    """What of a spec can be checked before any model loads: its form, and an artifact's
    config.json and calibration.json."""
    kind, arg = parse_spec(spec)
    if kind == "artifact" and foreign_layout(arg) is None:
        read_artifact_config(arg)
        load_acceptance_model(arg)


def build_drafter(
    spec: str, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, dtype: str = "auto"
) -> BuiltDrafter:
    kind, arg = parse_spec(spec)
    if kind == "draft-model":
        model, draft_tokenizer = load_model(arg, dtype=dtype, device=str(target.device))
        check_same_vocabulary(tokenizer, draft_tokenizer, arg)
        return BuiltDrafter(DraftModelDrafter(model), {"assistant_model": model})
    if kind == "artifact":
        # No Hugging Face counterpart: the benchmark skips assisted generation.
        return BuiltDrafter(load_drafter(arg, target), acceptance=load_acceptance_model(arg))
    drafter = NgramDrafter(max_ngram=int(arg)) if arg else NgramDrafter()
    assist = {"prompt_lookup_num_tokens": 10, "max_matching_ngram_size": drafter.max_ngram}
    return BuiltDrafter(drafter, assist)

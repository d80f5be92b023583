"""Build a drafter from a command-line spec: `draft-model:NAME_OR_PATH`, `ngram[:N]`,
`artifact:PATH`, or `route:SPEC+SPEC[+...]` (several of those, routed per request)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftsmith.artifact import load_acceptance_model, load_drafter, read_artifact_config
from draftsmith.artifact.engines import foreign_layout
from draftsmith.core.models import check_same_vocabulary
from draftsmith.core.signals import AcceptanceModel
from draftsmith.decoding.routing import RoutingDrafter
from draftsmith.heads import Drafter, DraftModelDrafter, NgramDrafter
from draftsmith.zoo import load_model

logger = logging.getLogger(__name__)

SPEC_HELP = (
    "draft-model:NAME_OR_PATH (a causal LM sharing the target's vocabulary), ngram[:MAX_N], "
    "artifact:PATH (a trained drafter) or route:SPEC+SPEC[+...] (several of these; per request "
    "the fastest serves, e.g. route:artifact:runs/x/drafter+ngram)"
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
    if kind == "route":
        route_parts(spec)
        return kind, arg
    needs_arg = kind in ("draft-model", "artifact")
    if (needs_arg and arg) or (kind == "ngram" and (not arg or arg.isdigit())):
        return kind, arg
    raise ValueError(f"unknown drafter spec {spec!r}; expected {SPEC_HELP}")


def route_parts(spec: str) -> list[str]:
    """The drafter specs of `route:SPEC+SPEC[+...]`, each checked; a ValueError for an empty
    route, an empty part, a route inside the route, or a drafter named twice."""
    parts = spec.partition(":")[2].split("+")
    example = "e.g. route:artifact:runs/x/drafter+ngram"
    if not any(parts):
        raise ValueError(f"drafter spec {spec!r} routes between nothing: give {example}")
    if not all(parts):
        raise ValueError(f"drafter spec {spec!r} has an empty part around a '+': give {example}")
    for part in parts:
        if part.partition(":")[0] == "route":
            raise ValueError(
                f"drafter spec {spec!r} holds a route in a route: list every drafter in one "
                f"route:SPEC+SPEC, {example}"
            )
        parse_spec(part)
    twice = sorted({part for part in parts if parts.count(part) > 1})
    if twice:
        raise ValueError(f"drafter spec {spec!r} names {twice} twice: name each drafter once")
    return parts


def check_spec(spec: str) -> None:
    """What of a spec can be checked before any model loads: its form, and an artifact's
    config.json and calibration.json."""
    kind, arg = parse_spec(spec)
    if kind == "route":
        for part in route_parts(spec):
            check_spec(part)
    if kind == "artifact" and foreign_layout(arg) is None:
        read_artifact_config(arg)
        load_acceptance_model(arg)


def drafter_kind(spec: str) -> str:
    """What a spec drafts with, for reports: an artifact's head kind (eagle3, peagle, ...; an
    engine layout's name for a foreign one), a route's kinds joined by '+', else the spec's own
    kind (ngram, draft-model)."""
    kind, arg = parse_spec(spec)
    if kind == "route":
        return "+".join(drafter_kind(part) for part in route_parts(spec))
    if kind == "artifact":
        layout = foreign_layout(arg)
        return read_artifact_config(arg)["drafter"] if layout is None else layout
    return kind


def build_drafter(
    spec: str,
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    dtype: str = "auto",
) -> BuiltDrafter:
    """The drafter of `spec` for `target`. tokenizer: the target's, which a draft model's must
    equal token for token (None: only the vocabulary sizes are compared, by the decoder)."""
    kind, arg = parse_spec(spec)
    if kind == "route":
        return _build_route(spec, target, tokenizer, dtype)
    if kind == "draft-model":
        model, draft_tokenizer = load_model(arg, dtype=dtype, device=str(target.device))
        if tokenizer is not None:
            check_same_vocabulary(tokenizer, draft_tokenizer, arg)
        return BuiltDrafter(DraftModelDrafter(model), {"assistant_model": model})
    if kind == "artifact":
        # No Hugging Face counterpart: the benchmark skips assisted generation.
        drafter = load_drafter(arg, target)
        # Given the drafter, a calibrated learned acceptance head comes as its acceptance model.
        return BuiltDrafter(drafter, acceptance=load_acceptance_model(arg, drafter))
    drafter = NgramDrafter(max_ngram=int(arg)) if arg else NgramDrafter()
    assist = {"prompt_lookup_num_tokens": 10, "max_matching_ngram_size": drafter.max_ngram}
    return BuiltDrafter(drafter, assist)


def _build_route(
    spec: str, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, dtype: str
) -> BuiltDrafter:
    """A `RoutingDrafter` over the route's drafters, named by their specs. No Hugging Face
    counterpart; the acceptance model is the one calibrated part's (the policy applies it to
    whichever drafter serves; n-gram drafts carry no logits, so it leaves them alone)."""
    built = {
        part: build_drafter(part, target, tokenizer, dtype=dtype) for part in route_parts(spec)
    }
    vocab_size = target.config.get_text_config().vocab_size
    router = RoutingDrafter({part: b.drafter for part, b in built.items()}, vocab_size=vocab_size)
    calibrated = [part for part, b in built.items() if b.acceptance is not None]
    if len(calibrated) > 1:
        logger.warning(
            "%s carry calibrations; a route takes one: the policy runs on raw confidence",
            " and ".join(calibrated),
        )
    acceptance = built[calibrated[0]].acceptance if len(calibrated) == 1 else None
    return BuiltDrafter(router, acceptance=acceptance)

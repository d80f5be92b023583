"""draftsmith's speculative decoding behind transformers' own ``model.generate``: its
``custom_generate`` hook (transformers 5.x) with a callable.

    from draftsmith import speculative_generate
    out = model.generate(input_ids, custom_generate=speculative_generate, drafter="ngram",
                         max_new_tokens=64, streamer=streamer)

transformers prepares the call as for any other decoding (generation config, special tokens,
length, logits processors, stopping criteria; the streamer receives the prompt) and hands it to
`speculative_generate`, which decodes with a `SpeculativeDecoder` and returns what plain
``generate`` returns: the ids (B, T + new). The assistant mechanism is no alternative: its
candidate generators are transformers' own classes, and none hands a head the target's features.
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation import (
    EosTokenCriteria,
    LogitsProcessorList,
    MaxLengthCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.streamers import BaseStreamer
from transformers.generation.utils import GenerationMixin

from draftsmith.build.drafters import SPEC_HELP, build_drafter
from draftsmith.build.policies import policy_from_spec
from draftsmith.core.signals import AcceptanceModel
from draftsmith.decoding import DraftPolicy, SpeculativeDecoder
from draftsmith.decoding.policies import DEFAULT_POLICY
from draftsmith.heads import Drafter

SAMPLING_PROCESSORS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
"""The logits processing the decoder applies itself, to the target and the draft alike."""
PREPARED_MODEL_KWARGS = frozenset(
    {"attention_mask", "position_ids", "cache", "past_key_values", "use_cache", "logits_to_keep"}
)
"""The model inputs transformers' generate prepares for any decoding; the decoder makes its own."""

_prepared: weakref.WeakKeyDictionary[PreTrainedModel, dict] = weakref.WeakKeyDictionary()
"""Per target, each `drafter=` value's `_Prepared`: an artifact loads, and the default policy's
cost curve is read (and what it learns kept), once per target, not once per call."""


def speculative_generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    drafter: str | Drafter | None = None,
    draft_policy: DraftPolicy | None = None,
    streamer: BaseStreamer | None = None,
    **model_kwargs,
) -> torch.Tensor:
    """The ids (B, T + new) that ``model.generate(input_ids (B, T), ...)`` returns, decoded
    speculatively: greedy output identical to plain ``generate``'s, sampled output distributed as
    plain sampling's (the rejection rule), each row of a padded batch as its prompt alone gives.

    drafter: a spec (ngram[:N], artifact:PATH, draft-model:NAME_OR_PATH, route:SPEC+SPEC) or a
    `Drafter`; draft_policy: how much to draft each round (default: the cost-aware policy, with
    the artifact's calibration). transformers passes both on from ``generate``'s keywords.
    Honoured: max_new_tokens / max_length, eos_token_id, do_sample with temperature, top_k and
    top_p, streamer (one prompt). Any other processing or stopping rule is a ValueError naming
    it, as are beams and several sequences a prompt.
    """
    streamer = streamer if streamer is not None else _generate_callers_streamer()
    _check_supported(generation_config, logits_processor, stopping_criteria, model_kwargs)
    if streamer is not None and input_ids.shape[0] > 1:
        raise ValueError(
            f"streamer= streams one prompt, and this batch has {input_ids.shape[0]}: generate "
            "each prompt apart to stream it, or drop streamer"
        )
    mask = model_kwargs.get("attention_mask")
    prompts = [
        (row if mask is None else row[mask[b].bool()]).tolist() for b, row in enumerate(input_ids)
    ]
    eos = _token_ids(generation_config.eos_token_id)
    prepared = _prepare(model, drafter)
    decoder = SpeculativeDecoder(
        model, prepared.drafter, policy=draft_policy or prepared.policy(model), eos_tokens=eos
    )
    results = decoder.generate_batch(
        prompts,
        generation_config.max_length - input_ids.shape[1],
        **_sampling(generation_config),
        on_commit=None if streamer is None else lambda _, new: streamer.put(torch.tensor([new])),
    )
    if streamer is not None:
        streamer.end()
    # Rows that stopped early are padded as transformers pads them.
    longest = max(len(r.tokens) for r in results)
    pad = _token_ids(generation_config.pad_token_id)[:1] or eos[:1]
    new = torch.tensor([r.tokens + pad * (longest - len(r.tokens)) for r in results])
    return torch.cat([input_ids, new.to(input_ids)], dim=1)


def _sampling(config: GenerationConfig) -> dict:
    """The decoder's sampling options from the generation config: greedy unless do_sample."""
    if not config.do_sample:
        return {"temperature": 0.0}
    top_p = config.top_p if config.top_p is not None and config.top_p < 1.0 else None
    return {"temperature": config.temperature, "top_k": config.top_k or None, "top_p": top_p}


@dataclass
class _Prepared:
    """A target's drafter for one `drafter=` value, and its default policy once asked for."""

    drafter: Drafter
    acceptance: AcceptanceModel | None
    _policy: DraftPolicy | None = None

    def policy(self, model: PreTrainedModel) -> DraftPolicy:
        """The cost-aware policy on the drafter's calibration and the target's cost curve (a
        model built in memory has no name to keep its curve under: measured, uncached)."""
        if self._policy is None:
            name = model.name_or_path
            self._policy = policy_from_spec(
                DEFAULT_POLICY,
                acceptance=self.acceptance,
                target=model if name else None,
                target_name=name,
            )
        return self._policy


def _prepare(model: PreTrainedModel, drafter: str | Drafter | None) -> _Prepared:
    """The drafter `drafter` names on `model`, built on its first use with `model`."""
    if drafter is None:
        raise ValueError(
            f"custom_generate=speculative_generate needs drafter=: a spec, {SPEC_HELP}, or a "
            "draftsmith Drafter"
        )
    made = _prepared.setdefault(model, {})
    # A Drafter by its id (it need not be hashable), which its entry keeps alive and so unique.
    key = drafter if isinstance(drafter, str) else id(drafter)
    if key not in made:
        if isinstance(drafter, str):
            # A draft model loads in the target's precision.
            dtype = str(model.dtype).removeprefix("torch.")
            built = build_drafter(drafter, model, None, dtype=dtype)
            made[key] = _Prepared(built.drafter, built.acceptance)
        else:
            made[key] = _Prepared(drafter, None)
    return made[key]


def _check_supported(
    config: GenerationConfig,
    processors: LogitsProcessorList,
    criteria: StoppingCriteriaList,
    model_kwargs: dict,
) -> None:
    """A ValueError naming the first `generate` option the decoder does not honour, and the fix."""
    if config.num_beams > 1:
        raise ValueError(
            f"num_beams={config.num_beams}: speculative decoding follows one sequence (greedy or "
            "sampled); drop num_beams"
        )
    if config.num_return_sequences > 1:
        raise ValueError(
            f"num_return_sequences={config.num_return_sequences}: draftsmith returns one sequence "
            "a prompt; repeat the prompt in the batch instead"
        )
    if config.return_dict_in_generate:
        raise ValueError(
            "return_dict_in_generate: draftsmith's generate returns the ids only (its "
            "SpeculativeDecoder gives statistics); drop it"
        )
    for processor in processors:
        if not isinstance(processor, SAMPLING_PROCESSORS):
            raise ValueError(
                f"this generate call asks for {type(processor).__name__}, which draftsmith's "
                "speculative decoding does not apply (it applies temperature, top_k and top_p "
                "only): drop the option that adds it"
            )
    for criterion in criteria:
        if not isinstance(criterion, (MaxLengthCriteria, EosTokenCriteria)):
            raise ValueError(
                f"this generate call stops by {type(criterion).__name__}, which draftsmith's "
                "speculative decoding does not check (it stops at max_new_tokens / max_length "
                "and eos_token_id): drop the option that adds it"
            )
    for key, value in model_kwargs.items():
        if key not in PREPARED_MODEL_KWARGS and value is not None:
            raise ValueError(
                f"generate argument {key!r}: draftsmith's speculative decoding reads token ids "
                "alone; drop it"
            )
    cache = model_kwargs.get("cache") or model_kwargs.get("past_key_values")
    if cache is not None and cache.get_seq_length() > 0:
        raise ValueError(
            "a filled cache (past_key_values): draftsmith prefills the prompt itself; pass the "
            "whole prompt as input_ids and no cache"
        )


def _token_ids(ids: int | list[int] | None) -> list[int]:
    return [] if ids is None else [ids] if isinstance(ids, int) else list(ids)


def _generate_callers_streamer() -> BaseStreamer | None:
    """The streamer given to the ``generate`` call running this one. transformers (5.x) hands a
    callable ``custom_generate`` only the keywords ``_sample`` lacks, so never its `streamer`,
    though it has sent the prompt to it: it is read from that call's frame."""
    code = inspect.unwrap(GenerationMixin.generate).__code__
    frame = inspect.currentframe()
    try:
        while frame is not None and frame.f_code is not code:
            frame = frame.f_back
        return None if frame is None else frame.f_locals.get("streamer")
    finally:
        del frame

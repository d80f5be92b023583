"""Collect (confidence signals, outcome) pairs for every drafted token.

Per drafted token: the signals (`confidence_signals`) and two outcomes,

- `accepted`: 1 when the draft token equals the target's argmax (greedy verification);
- `accept_prob`: the probability that sampling verification at the collection temperature
  accepts it.

Two ways to get them:

- **From real decoding runs** (`collect_from_decoding`): a round hook on
  `SpeculativeDecoder.generate` sees each draft with its logits and the target's logits at the
  same positions. `accept_prob` is min(1, p(x) / q(x)) for the drafted token x. Only tokens whose
  draft prefix was accepted by the verification that actually ran are recorded (positions up to
  and including the first rejection): later ones were conditioned on a rejected prefix.
- **Teacher-forced** (`collect_teacher_forced`): one target forward and one `forward_train` of
  the head over held-out rows score a draft chain at every position at once, where decoding
  needs a round per draft. Step k of the chain at position t is recorded when the head's steps
  before it drafted the target's argmax *and* the text continues with those same tokens: then
  the head saw exactly the context greedy decoding would give it, and the record equals a
  decoding one.
  On text the target wrote itself under greedy decoding (`draftsmith.data.regenerate`) every
  chain qualifies; on other text, chains are cut where text and target part. `accept_prob` is
  the expectation over the draft token, sum_x min(p(x), q(x)), which has the same mean given the
  signals as min(1, p(x) / q(x)) with less noise; under sampling the chain condition (greedy
  tokens) only approximates a sampled context after step 0.

`collect_heldout` runs the collection held-out data takes (`draftsmith.calibration.heldout`)
with a loaded head and target.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from datasets import Dataset
from tqdm import tqdm
from transformers import PreTrainedModel

from draftsmith.calibration.heldout import HeldOutData
from draftsmith.calibration.pipeline import CalibrateConfig
from draftsmith.core.context import CONTEXT_SIGNAL, ContextIndex
from draftsmith.core.sampling import SamplingParams, probabilities
from draftsmith.core.signals import ACCEPTANCE_HEAD_SIGNAL, SIGNAL_NAMES, confidence_signals
from draftsmith.core.target import Target, TargetBatch
from draftsmith.decoding import FixedPolicy, RoundRecord, SpeculativeDecoder
from draftsmith.heads.acceptance import AcceptanceHead, chain_labels, chain_outcomes, chain_signals
from draftsmith.heads.base import Draft
from draftsmith.heads.learned_acceptance import LearnedAcceptance
from draftsmith.heads.trainable import DraftHead

OUTCOME_COLUMNS = ("accepted", "accept_prob")


@dataclass
class DraftRecorder:
    """Round hook that accumulates one row per informative drafted token."""

    temperature: float = 1.0
    """Temperature of the sampling outcome `accept_prob` (and of the signals)."""
    rows: dict[str, list] = field(default_factory=lambda: {c: [] for c in _COLUMNS})
    source: int = 0
    """Id of the prompt or document being decoded, stored with each row."""
    acceptance: LearnedAcceptance | None = None
    """Decoding: the drafter's learned acceptance head, whose P(accept) is recorded as the
    `acceptance_head` signal; None: no such column."""

    def __call__(self, record: RoundRecord) -> None:
        draft = record.draft
        k = len(draft)
        if k == 0 or draft.logits is None:
            return  # nothing drafted, or a drafter without confidence (n-gram)
        if not draft.is_chain:
            raise ValueError(
                "calibration data is collected from chain drafts: decode without a tree"
            )
        n = min(record.n_accepted + 1, k)  # the accepted prefix and the first rejected token
        target_logits = record.target_logits[:n]
        accepted = (draft.tokens[:n] == target_logits.argmax(-1)).float()
        signals = confidence_signals(draft.logits[:n], temperature=self.temperature)
        sampling = SamplingParams(temperature=self.temperature)
        p = probabilities(target_logits, sampling)
        q = probabilities(draft.logits[:n].float(), sampling)
        tokens = draft.tokens[:n, None]
        ratio = p.gather(1, tokens)[:, 0] / q.gather(1, tokens)[:, 0].clamp_min(1e-12)
        for name in SIGNAL_NAMES:
            self.rows[name].extend(signals[name].tolist())
        self.rows[CONTEXT_SIGNAL].extend(_draft_context_match(draft, n))
        if self.acceptance is not None:  # the head reads the signals at temperature 1
            head = self.acceptance.head_probability(confidence_signals(draft.logits[:n]))
            self.rows.setdefault(ACCEPTANCE_HEAD_SIGNAL, []).extend(head.tolist())
        self.rows["accepted"].extend(accepted.tolist())
        self.rows["accept_prob"].extend(ratio.clamp(max=1.0).tolist())
        self.rows["source"].extend([self.source] * n)

    def add_chains(
        self,
        step_logits: torch.Tensor,
        batch: TargetBatch,
        row: int,
        draft_to_target: torch.Tensor | None,
        first: int = 0,
        head_probs: torch.Tensor | None = None,
    ) -> None:
        """Record the qualifying chain steps of one teacher-forced row (`chain_outcomes`).

        step_logits (T, K, V_d): draft position k of the chain after position t drafts token
        t + 1 + k; batch: the target's view of the rows; draft_to_target (V_d,) or None; chains
        after positions before `first` are not recorded; head_probs (T, K): a learned
        acceptance head's P(accept) of each step, recorded as `acceptance_head`.
        """
        length, num_steps, _ = step_logits.shape
        ids = batch.input_ids[row]
        target_logits = batch.target_logits[row].float()  # (T, V)
        drafted = step_logits.argmax(-1)  # (T, K)
        if draft_to_target is not None:
            drafted = draft_to_target.to(drafted.device)[drafted]
        loss_mask = batch.loss_mask[row].to(ids.device)
        accepted, keep = chain_outcomes(drafted, ids, target_logits.argmax(-1), loss_mask)
        keep[:first] = False
        if not keep.any():
            return
        # label[t, k] = t + k: the target position whose logits score step k at t
        label, _ = chain_labels(length, num_steps, ids.device)
        signals = confidence_signals(step_logits, temperature=self.temperature)
        sampling = SamplingParams(temperature=self.temperature)
        q = probabilities(step_logits.float(), sampling)  # (T, K, V_d)
        p = probabilities(target_logits, sampling)  # (T, V)
        if draft_to_target is not None:  # q is 0 outside the draft vocabulary
            p = p.index_select(-1, draft_to_target.to(p.device))
        accept_prob = torch.minimum(p[label], q).sum(-1).clamp(max=1.0)
        for name in SIGNAL_NAMES:
            self.rows[name].extend(signals[name][keep].tolist())
        self.rows[CONTEXT_SIGNAL].extend(_chain_context_match(ids, drafted, keep))
        if head_probs is not None:
            self.rows.setdefault(ACCEPTANCE_HEAD_SIGNAL, []).extend(head_probs[keep].tolist())
        self.rows["accepted"].extend(accepted[keep].float().tolist())
        self.rows["accept_prob"].extend(accept_prob[keep].tolist())
        self.rows["source"].extend([self.source] * int(keep.sum()))

    def dataset(self) -> Dataset:
        if not self.rows["accepted"]:
            raise ValueError(
                "no drafted token was recorded: the drafter proposed nothing with logits "
                "(an n-gram drafter has no confidence to calibrate) or the data was empty"
            )
        return Dataset.from_dict(self.rows)


_COLUMNS = (*SIGNAL_NAMES, CONTEXT_SIGNAL, *OUTCOME_COLUMNS, "source")


def _draft_context_match(draft: Draft, n: int) -> list[float]:
    """The `context_match` of a decoded chain's first n tokens, as its drafter gave it (0.0 for
    a drafter that gives none: no repeat known)."""
    if draft.signals is None or CONTEXT_SIGNAL not in draft.signals:
        return [0.0] * n
    return draft.signals[CONTEXT_SIGNAL][:n].tolist()


def _chain_context_match(
    ids: torch.Tensor, drafted: torch.Tensor, keep: torch.Tensor
) -> list[float]:
    """The `context_match` of the kept chain steps (in `keep`'s row-major order), as a drafter
    decoding the text would give it: step k after position t repeats the context when the n
    tokens before its token (the text up to t + k: a kept chain drafted the text's own tokens)
    followed by it occur in the text up to t, the committed sequence.

    ids (T,), drafted and keep (T, K): the text, each step's token and the steps recorded."""
    index = ContextIndex()
    text = ids.tolist()
    tokens = drafted.tolist()
    matched = []
    for t, steps in enumerate(keep.tolist()):
        index.extend(text[t : t + 1])
        for k, kept in enumerate(steps):
            if kept:
                before = text[max(t + k + 1 - index.n, 0) : t + k + 1]
                matched.append(float(index.matches(before, tokens[t][k])))
    return matched


@torch.inference_mode()
def collect_from_decoding(
    decoder: SpeculativeDecoder,
    prompts: Iterable[str | list[int]],
    *,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    decode_temperature: float = 0.0,
    seed: int = 0,
    acceptance: LearnedAcceptance | None = None,
) -> Dataset:
    """Decode every prompt and record each informative drafted token (see module docstring).

    temperature: temperature of the recorded sampling outcome and signals.
    decode_temperature: temperature the decoding itself runs at (0: greedy, the usual case).
    acceptance: the decoder's drafter's learned acceptance head: records `acceptance_head`.
    """
    recorder = DraftRecorder(temperature=temperature, acceptance=acceptance)
    for index, prompt in enumerate(tqdm(list(prompts), desc="collect")):
        recorder.source = index
        decoder.generate(
            prompt,
            max_new_tokens=max_new_tokens,
            temperature=decode_temperature,
            seed=seed + index,
            on_round=recorder,
        )
    return recorder.dataset()


@torch.inference_mode()
def collect_teacher_forced(
    head: DraftHead,
    target: PreTrainedModel,
    documents: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    temperature: float = 1.0,
    batch_size: int = 4,
    acceptance: AcceptanceHead | None = None,
) -> Dataset:
    """Record every qualifying drafted token of the head's chains over held-out documents (see
    the module docstring); with the head's learned `acceptance` head, its P(accept) too, as the
    `acceptance_head` signal.

    documents: (input_ids (T,), loss_mask (T,)) pairs of any lengths, in the data pipeline's
    convention (loss_mask[t] = 1: token t counts); a chain step is recorded only where the token
    it drafts counts. Each document is one `source` (calibration splits fit / eval by source).
    Documents are batched with right padding, which a causal target and head never attend to.
    """
    recorder = DraftRecorder(temperature=temperature)
    layers = tuple(head.target_feature_layers)
    shift = head.first_drafted_step
    draft_to_target = head.draft_to_target()
    head = head.eval()
    for first in tqdm(range(0, len(documents), batch_size), desc="collect (teacher-forced)"):
        group = documents[first : first + batch_size]
        ids, loss_mask = _right_padded(group)
        batch = Target(target, layers).batch(ids.to(target.device), loss_mask)
        if acceptance is None:
            step_logits, head_probs = head.forward_train(batch), None
        else:
            step_logits, states = head.forward_states(batch)
            head_probs = acceptance.predict(torch.stack(states, 2), chain_signals(step_logits))
            head_probs = _drafted_steps(head_probs, shift)
        steps = _drafted_steps(torch.stack(step_logits, dim=2), shift)  # (B, T, K - s, V_d)
        for row in range(len(group)):
            recorder.source = first + row
            probs = None if head_probs is None else head_probs[row]
            recorder.add_chains(steps[row], batch, row, draft_to_target, shift, probs)
    return recorder.dataset()


def _drafted_steps(steps: torch.Tensor, shift: int) -> torch.Tensor:
    """Per-step values (B, T, K, ...) of the rows read at t -> those of the draft after position
    t (B, T, K - s, ...): it comes from row t - s, steps s .. K-1 (rows t < s wrap around and are
    never kept)."""
    return steps[:, :, shift:].roll(shift, dims=1)


def _right_padded(
    documents: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids, loss_mask (B, T_max), padded on the right with token 0 under mask 0."""
    length = max(ids.numel() for ids, _ in documents)
    ids = torch.zeros(len(documents), length, dtype=torch.long)
    mask = torch.zeros(len(documents), length, dtype=torch.int8)
    for row, (doc_ids, doc_mask) in enumerate(documents):
        ids[row, : doc_ids.numel()] = doc_ids
        mask[row, : doc_mask.numel()] = doc_mask
    return ids, mask


def collect_heldout(
    data: HeldOutData,
    head: DraftHead,
    target: PreTrainedModel,
    tokenizer,
    config: CalibrateConfig,
    *,
    acceptance: AcceptanceHead | None = None,
    draft_tokens: int = 4,
    min_documents: int = 2,
) -> Dataset:
    """The drafted-token records of `head` (bound to `target`) on held-out data, collected as
    `data.collect` says: teacher-forced over its documents, or from decoding its prompts with
    chains of up to `draft_tokens` tokens, each record then carrying its prompt's `workload`.

    config: the temperature (0, greedy, still reads the signals at temperature 1), seq_len and
    max_tokens (teacher-forced), prompt_tokens, max_new_tokens, max_prompts and seed (decode).
    acceptance: the head's learned acceptance head, whose P(accept) the records carry as the
    `acceptance_head` signal. min_documents: see `HeldOutData.encoded`.
    """
    temperature = config.temperature if config.temperature > 0 else 1.0
    if data.collect == "teacher-forced":
        documents = data.encoded(tokenizer, config, min_documents)
        return collect_teacher_forced(
            head, target, documents, temperature=temperature, acceptance=acceptance
        )
    policy = FixedPolicy(max_draft_tokens=draft_tokens)
    drafter = head.as_drafter(target)
    decoder = SpeculativeDecoder(target, drafter, tokenizer, policy=policy)
    prompts, workloads = data.prompts(tokenizer, config)
    records = collect_from_decoding(
        decoder,
        prompts,
        max_new_tokens=config.max_new_tokens,
        temperature=temperature,
        decode_temperature=config.temperature,
        seed=config.seed,
        acceptance=None if acceptance is None else LearnedAcceptance(acceptance, drafter),
    )
    return records.add_column("workload", [workloads[s] for s in records["source"]])

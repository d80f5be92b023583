"""Collect (confidence signals, outcome) pairs for every drafted token.

From real decoding runs: a round hook on `SpeculativeDecoder.generate` sees each draft with its
logits and the target's logits at the same positions. Per drafted token it records the signals and
two outcomes:

- `accepted`: 1 when the draft token equals the target's argmax (greedy verification);
- `accept_prob`: min(1, p(x) / q(x)) with p, q the target and draft distributions at the
  collection temperature (the probability that sampling verification accepts token x).

Only tokens whose draft prefix was accepted by the verification that actually ran are recorded
(positions up to and including the first rejection): later ones were conditioned on a rejected
prefix and say nothing about acceptance.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from datasets import Dataset
from tqdm import tqdm

from draftsmith.calibration.signals import SIGNAL_NAMES, confidence_signals
from draftsmith.decoding import RoundRecord, SpeculativeDecoder
from draftsmith.sampling import SamplingParams, probabilities

OUTCOME_COLUMNS = ("accepted", "accept_prob")


@dataclass
class DraftRecorder:
    """Round hook that accumulates one row per informative drafted token."""

    temperature: float = 1.0
    """Temperature of the sampling outcome `accept_prob` (and of the signals)."""
    rows: dict[str, list] = field(default_factory=lambda: {c: [] for c in _COLUMNS})
    source: int = 0
    """Id of the prompt or document being decoded, stored with each row."""

    def __call__(self, record: RoundRecord) -> None:
        draft = record.draft
        k = len(draft)
        if k == 0 or draft.logits is None:
            return  # nothing drafted, or a drafter without confidence (n-gram)
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
        self.rows["accepted"].extend(accepted.tolist())
        self.rows["accept_prob"].extend(ratio.clamp(max=1.0).tolist())
        self.rows["source"].extend([self.source] * n)

    def dataset(self) -> Dataset:
        if not self.rows["accepted"]:
            raise ValueError(
                "no drafted token was recorded: the drafter proposed nothing with logits "
                "(an n-gram drafter has no confidence to calibrate) or the data was empty"
            )
        return Dataset.from_dict(self.rows)


_COLUMNS = (*SIGNAL_NAMES, *OUTCOME_COLUMNS, "source")


@torch.inference_mode()
def collect_from_decoding(
    decoder: SpeculativeDecoder,
    prompts: Iterable[str | list[int]],
    *,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    decode_temperature: float = 0.0,
    seed: int = 0,
) -> Dataset:
    """Decode every prompt and record each informative drafted token (see module docstring).

    temperature: temperature of the recorded sampling outcome and signals.
    decode_temperature: temperature the decoding itself runs at (0: greedy, the usual case).
    """
    recorder = DraftRecorder(temperature=temperature)
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

"""A learned acceptance head as a draft policy's acceptance model, with no change to the decoder
or the policies.

A policy sees a drafted token through its confidence signals only
(`AcceptanceModel.predict_signals`), computed from the draft logits, while the head also reads
the drafter's hidden state behind them. So the drafter hands every batch of logits it emits,
with their states, to a hook (`Drafter.expose_states`), and `LearnedAcceptance` finds each
queried row's state again by the signals that logits alone fix (top-1 probability, margin,
entropy), newest rows first. Policies ask about the rows the drafter has just emitted (stop
rules, tree ranking, trimming) or those of the round just verified (online recalibration); rows
are kept for a few rounds.

    drafter = load_drafter(path, target)
    acceptance = LearnedAcceptance(head, drafter)       # or load_acceptance_model(path, drafter)
    policy = build_policy("cost-aware", acceptance=acceptance)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from draftsmith.core.signals import ACCEPTANCE_HEAD_SIGNAL, AcceptanceModel, confidence_signals
from draftsmith.heads.acceptance import AcceptanceHead
from draftsmith.heads.base import Drafter

KEY_SIGNALS = ("top1_prob", "margin", "entropy")
"""The signals that identify an emitted row of draft logits."""
RECENT_ROWS = 1024
"""Emitted rows remembered (several rounds of the largest draft trees)."""
TOLERANCE = 1e-6
"""Relative tolerance of a key match: a row's signals computed in another batch may differ in
the last bits."""


class LearnedAcceptance:
    """`AcceptanceModel`: the acceptance head on the hidden state behind each queried row,
    optionally calibrated (a calibrator reading the `acceptance_head` signal, e.g. Platt)."""

    def __init__(
        self,
        head: AcceptanceHead,
        drafter: Drafter,
        calibrator: AcceptanceModel | None = None,
    ) -> None:
        """Watches `drafter` from now on (`expose_states`)."""
        self.head = head.eval()
        self.calibrator = calibrator
        self._keys: torch.Tensor | None = None  # (n, len(KEY_SIGNALS)) float32
        self._states: torch.Tensor | None = None  # (n, H) float32
        drafter.expose_states(self.record)

    @torch.inference_mode()
    def record(self, logits: torch.Tensor, states: torch.Tensor) -> None:
        """Remember the states (m, H) behind rows of draft logits (m, V) (a `StatesHook`)."""
        signals = confidence_signals(logits)
        keys = torch.stack([signals[name] for name in KEY_SIGNALS], dim=-1)
        states = states.detach().float()
        if self._keys is not None:
            keys = torch.cat([self._keys, keys])[-RECENT_ROWS:]
            states = torch.cat([self._states, states])[-RECENT_ROWS:]
        self._keys, self._states = keys, states

    def states_of(self, signals: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The states (k, H) behind the rows whose signals (each (k,)) are given; a ValueError
        when a row was not emitted recently by the watched drafter."""
        query = torch.stack([signals[name].float() for name in KEY_SIGNALS], dim=-1)
        if self._keys is None:
            raise ValueError(
                "the learned acceptance head has seen no draft yet: its drafter emits the "
                "states it reads (build LearnedAcceptance on the drafter that drafts)"
            )
        keys = self._keys.to(query.device)
        close = (query[:, None] - keys[None]).abs() <= TOLERANCE * (1 + keys.abs())
        match = close.all(-1)  # (k, n)
        if not bool(match.any(-1).all()):
            raise ValueError(
                "the learned acceptance head was asked about draft logits its drafter did not "
                "emit recently: build LearnedAcceptance on the drafter that drafts"
            )
        newest = keys.shape[0] - 1 - match.flip(-1).int().argmax(-1)
        return self._states[newest.to(self._states.device)]

    @torch.inference_mode()
    def head_probability(self, signals: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The head's own P(accept) (k,) float32 for the rows whose signals are given."""
        device = signals["top1_prob"].device
        return self.head.predict(self.states_of(signals), signals).to(device)

    def predict_signals(self, signals: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """P(accept) (k,) float32: the head's, through the calibrator when there is one."""
        probability = self.head_probability(signals)
        if self.calibrator is None:
            return probability
        return self.calibrator.predict_signals({**signals, ACCEPTANCE_HEAD_SIGNAL: probability})

"""Online recalibration (`draftsmith.decoding.online`): which nodes a round reveals, the signals
of a tree, and the Bayesian logit correction on synthetic streams whose offline model is off by
a known logit shift."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from draftsmith.calibration.metrics import ece
from draftsmith.core.signals import confidence_signals
from draftsmith.decoding.online import (
    SPLIT_SIGNALS,
    OnlineAcceptance,
    draft_signals,
    round_outcomes,
)
from draftsmith.heads.base import Draft


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p) - np.log1p(-p)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _stream(shift: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """top1 (n,) draft confidences and outcomes (n,) accepted with sigmoid(logit(top1) + shift):
    the raw top-1 probability is miscalibrated by `shift` in logit space."""
    rng = np.random.default_rng(seed)
    top1 = rng.uniform(0.05, 0.98, n)
    return top1, (rng.random(n) < _sigmoid(_logit(top1) + shift)).astype(np.float64)


def _run(
    model: OnlineAcceptance,
    top1: np.ndarray,
    outcomes: np.ndarray,
    round_size: int = 5,
    **others: np.ndarray,
):
    """Stream in rounds (signals: top1 and others, each (n,)); returns the predictions (n,)
    each made before its round was observed."""
    predictions = []
    for start in range(0, top1.size, round_size):
        part = slice(start, start + round_size)
        signals = {
            name: torch.tensor(value[part], dtype=torch.float32)
            for name, value in {"top1_prob": top1, **others}.items()
        }
        predictions.append(model.predict_signals(signals).numpy())
        model.observe(signals, torch.tensor(outcomes[start : start + round_size]))
    return np.concatenate(predictions)


def _ece(conf: np.ndarray, outcomes: np.ndarray) -> float:
    return ece(conf, outcomes, n_bins=15, binning="equal_mass")


@pytest.mark.parametrize("shift", [-1.0, 1.0])
def test_corrects_a_known_logit_shift(shift):
    top1, outcomes = _stream(shift, 2000, seed=1)
    online = _run(OnlineAcceptance(), top1, outcomes)
    after = slice(300, None)  # after a few hundred observations
    raw_ece, online_ece = _ece(top1[after], outcomes[after]), _ece(online[after], outcomes[after])
    assert raw_ece > 0.12
    assert online_ece < 0.4 * raw_ece


def test_calibrated_offline_model_stays_calibrated():
    gaps = []
    for seed in range(4):
        top1, outcomes = _stream(0.0, 2000, seed=10 + seed)
        online = _run(OnlineAcceptance(), top1, outcomes)
        gaps.append(_ece(online[300:], outcomes[300:]) - _ece(top1[300:], outcomes[300:]))
    # Equal-mass ECE over 1,700 outcomes has a noise floor of ~0.03; the online model may not
    # add more than a fraction of it on average.
    assert np.mean(gaps) < 0.01


def test_prior_dominates_with_few_observations():
    signals = {"top1_prob": torch.tensor([0.2, 0.6, 0.9])}
    rejected = ({"top1_prob": torch.tensor([0.9, 0.9, 0.9])}, torch.zeros(3))
    moves = {}
    default = OnlineAcceptance().prior_strength
    for strength in (0.5, default, 1e4):
        model = OnlineAcceptance(prior_strength=strength)
        torch.testing.assert_close(model.predict_signals(signals), signals["top1_prob"])
        model.observe(*rejected)
        moves[strength] = float(signals["top1_prob"][2] - model.predict_signals(signals)[2])
    # Three confident misses: the default prior gives ground but keeps most of its confidence,
    # a weaker one gives more, a very strong one none.
    assert 0.0 < moves[default] < 0.25 < moves[0.5]
    assert moves[1e4] < 1e-3


def test_reset_returns_to_the_prior():
    model = OnlineAcceptance()
    signals = {"top1_prob": torch.tensor([0.2, 0.6, 0.9])}
    model.observe(signals, torch.zeros(3))
    model.reset()
    torch.testing.assert_close(model.predict_signals(signals), signals["top1_prob"])
    assert model.n_observed == 0


def test_follows_a_workload_change():
    model = OnlineAcceptance()
    for shift, seed in ((-1.5, 2), (1.5, 3)):
        top1, outcomes = _stream(shift, 1500, seed=seed)
        predicted = _run(model, top1, outcomes)
        truth = _sigmoid(_logit(top1) + shift)
        # Once a few hundred of the new workload's outcomes are in, predictions track the truth.
        assert np.abs(predicted[300:] - truth[300:]).mean() < 0.05
        assert np.abs(top1[300:] - truth[300:]).mean() > 0.2


def test_first_tokens_and_later_ones_are_corrected_apart():
    """A stream whose first tokens are accepted less often than their confidence says and whose
    later ones more often: one correction each follows both, where one shared by all could not
    (it would settle between the two shifts)."""
    rng = np.random.default_rng(7)
    n = 3000
    top1 = rng.uniform(0.05, 0.95, n)
    position = rng.integers(0, 3, n).astype(np.float32)
    truth = _sigmoid(_logit(top1) + np.where(position == 0, -1.0, 1.0))
    outcomes = (rng.random(n) < truth).astype(np.float64)
    model = OnlineAcceptance()
    predicted = _run(model, top1, outcomes, position=position)
    after = slice(500, None)
    assert np.abs(predicted[after] - truth[after]).mean() < 0.05
    (a_first, _), (a_later, _) = (c.mean for c in model.corrections[:2])
    assert a_first < -0.5 and a_later > 0.5
    shared = _run(OnlineAcceptance(), top1, outcomes)  # no position: one correction
    assert np.abs(shared[after] - truth[after]).mean() > 0.1


def test_tokens_that_continue_the_context_are_corrected_apart():
    """Tokens that repeat an n-gram of the context (`context_match`) are accepted more often
    than their confidence says and the others less often: a correction each follows both."""
    rng = np.random.default_rng(8)
    n = 3000
    top1 = rng.uniform(0.05, 0.95, n)
    position = rng.integers(0, 3, n).astype(np.float32)
    match = (rng.random(n) < 0.5).astype(np.float32)
    truth = _sigmoid(_logit(top1) + np.where(match > 0, 2.0, -0.5))
    outcomes = (rng.random(n) < truth).astype(np.float64)
    model = OnlineAcceptance()
    predicted = _run(model, top1, outcomes, position=position, context_match=match)
    after = slice(500, None)
    assert np.abs(predicted[after] - truth[after]).mean() < 0.05
    a = [c.mean[0] for c in model.corrections]
    assert max(a[:2]) < -0.2 and min(a[2:]) > 1.0  # (first, later) without, then with, a match
    blind = _run(OnlineAcceptance(), top1, outcomes, position=position)
    assert np.abs(blind[after] - truth[after]).mean() > 0.1


class _ShiftedModel:
    """An offline acceptance model that says sigmoid(logit(top1) + 1.5)."""

    def predict_signals(self, signals):
        top1 = signals["top1_prob"].double().numpy()
        return torch.tensor(_sigmoid(_logit(top1) + 1.5), dtype=torch.float32)


def test_corrects_a_wrapped_offline_model():
    top1, outcomes = _stream(0.0, 2000, seed=5)
    offline = _ShiftedModel()
    online = _run(OnlineAcceptance(offline), top1, outcomes)
    offline_conf = offline.predict_signals({"top1_prob": torch.tensor(top1)}).numpy()
    assert _ece(online[300:], outcomes[300:]) < 0.4 * _ece(offline_conf[300:], outcomes[300:])


def test_bad_arguments():
    with pytest.raises(ValueError, match="forgetting"):
        OnlineAcceptance(forgetting=0.0)
    with pytest.raises(ValueError, match="prior_strength"):
        OnlineAcceptance(prior_strength=-1.0)
    with pytest.raises(ValueError, match="accepted"):
        OnlineAcceptance().observe({"top1_prob": torch.tensor([0.5])}, torch.tensor([2.0]))


def test_draft_signals_of_a_chain_are_confidence_signals():
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(0)) * 3
    draft = Draft(tokens=logits.argmax(-1), logits=logits)
    expected = confidence_signals(logits)
    got = draft_signals(draft)
    assert set(got) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0)


def _tree() -> Draft:
    """Six nodes over a 4-token vocabulary; siblings share their parent's draft distribution.

    root -> 0 (token 1, argmax) -> 2 (token 3, argmax) -> 4 (token 1, argmax)
                                -> 3 (token 0, not argmax)
         -> 1 (token 2, not argmax) -> 5 (token 2, argmax)
    """
    root = torch.tensor([0.0, 3.0, 1.0, -1.0])  # argmax 1
    after0 = torch.tensor([0.5, -2.0, 0.0, 2.0])  # argmax 3
    after2 = torch.tensor([-1.0, 1.0, 0.0, 0.0])  # argmax 1
    after1 = torch.tensor([0.0, 0.0, 4.0, 0.0])  # argmax 2
    return Draft(
        tokens=torch.tensor([1, 2, 3, 0, 1, 2]),
        logits=torch.stack([root, root, after0, after0, after2, after1]),
        parents=torch.tensor([-1, -1, 0, 0, 2, 1]),
    )


def test_round_outcomes_on_a_tree():
    draft = _tree()
    signals, accepted = round_outcomes(draft, [0, 2])
    # Judged: children of the root and of path nodes (0, 1, 2, 3, 4); of those, the top-1
    # tokens (0, 2, 4). Node 5 hangs under a rejected node: never judged.
    torch.testing.assert_close(accepted, torch.tensor([1.0, 1.0, 0.0]))
    all_signals = draft_signals(draft)
    for name, value in signals.items():
        torch.testing.assert_close(value, all_signals[name][[0, 2, 4]])
    torch.testing.assert_close(signals["position"], torch.tensor([0.0, 1.0, 2.0]))
    top1 = all_signals["top1_prob"]
    path = torch.stack([top1[0], top1[0] * top1[2], top1[0] * top1[2] * top1[4]])
    torch.testing.assert_close(signals["path_prob"], path)
    # Everything rejected at the root: only the root's top-1 child is observed.
    signals, accepted = round_outcomes(draft, [])
    torch.testing.assert_close(accepted, torch.tensor([0.0]))
    torch.testing.assert_close(signals["position"], torch.tensor([0.0]))


def test_draft_signals_of_some_nodes_are_those_of_the_whole_tree():
    """Signals of nodes that hold their ancestors equal the whole tree's at those nodes, path
    probabilities included (what `round_outcomes` reads of a wide tree)."""
    draft = _tree()
    whole = draft_signals(draft)
    for nodes in ([0, 2, 4], [1, 5], [0, 1, 2, 3]):
        some = draft_signals(draft, nodes)
        for name, value in whole.items():
            torch.testing.assert_close(some[name], value[nodes], rtol=0, atol=0)
    chain = Draft(tokens=torch.tensor([1, 3, 1]), logits=draft.logits[[0, 2, 4]])
    torch.testing.assert_close(
        draft_signals(chain, [0, 1])["path_prob"], draft_signals(chain)["path_prob"][:2]
    )


def test_signals_need_logits():
    with pytest.raises(ValueError, match="no logits"):
        draft_signals(Draft(tokens=torch.tensor([1, 2])))


def test_round_outcomes_of_a_sampled_draft_count_the_first_child_of_each_judged_node():
    """A sampled token counts whether or not it is its distribution's argmax; a later sibling,
    tried only after its elder one was rejected, does not."""
    tree = _tree()
    sampled = replace(tree, probs=torch.softmax(tree.logits, -1))
    signals, accepted = round_outcomes(sampled, [1, 5])
    # Judged: 0 and 1 (the root's children) and 5 (under accepted 1); of those, first children
    # 0 and 5. Node 1 was only tried once 0 was rejected.
    torch.testing.assert_close(accepted, torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(signals["position"], torch.tensor([0.0, 1.0]))
    chain = Draft(tokens=torch.tensor([0, 0]), logits=tree.logits[[0, 2]])
    chain = replace(chain, probs=torch.softmax(chain.logits, -1))  # neither token is the argmax
    _, accepted = round_outcomes(chain, [0])
    torch.testing.assert_close(accepted, torch.tensor([1.0, 0.0]))
    assert round_outcomes(replace(chain, probs=None), [0])[1].numel() == 0


def test_round_outcomes_read_what_the_drafter_kept():
    """A greedy draft that kept its signals and top-1 flags is read from those, not from its
    logits: the same nodes count, and of two tokens tied for the top probability only the
    first-ranked one (the token the policy asked about)."""
    tree = _tree()
    signals = draft_signals(tree)
    marked = {**signals, "entropy": torch.arange(6.0)}  # tells kept signals from recomputed
    top1 = torch.tensor([True, False, True, False, True, True])
    kept = replace(tree, signals=marked, top1=top1)
    for path in ([0, 2], [1, 5], []):
        got, accepted = round_outcomes(kept, path)
        want, want_accepted = round_outcomes(tree, path)
        assert torch.equal(accepted, want_accepted)
        torch.testing.assert_close(got["top1_prob"], want["top1_prob"], rtol=0, atol=0)
        assert set(got["entropy"].tolist()) <= {0.0, 2.0, 4.0, 5.0}
    tied = torch.tensor([0.0, 3.0, 3.0, -1.0])  # tokens 1 and 2 tie at the root
    siblings = torch.tensor([-1, -1])
    draft = Draft(tokens=torch.tensor([1, 2]), logits=torch.stack([tied, tied]), parents=siblings)
    assert round_outcomes(draft, [1])[1].tolist() == [0.0, 1.0]
    ranked = replace(draft, signals=draft_signals(draft), top1=torch.tensor([True, False]))
    assert round_outcomes(ranked, [1])[1].tolist() == [0.0]


@pytest.mark.parametrize("signal", SPLIT_SIGNALS)
def test_a_model_not_split_on_a_signal_corrects_its_tokens_together(signal):
    """Split on fewer signals (the baselines of `compare_policies`), misses of later tokens (or of
    tokens that repeat the context) move the prediction for the other tokens, where the default's
    corrections keep them apart."""
    other = {"top1_prob": torch.tensor([0.6]), signal: torch.tensor([0.0])}
    missed = {"top1_prob": torch.full((20,), 0.6), signal: torch.ones(20)}
    together = OnlineAcceptance(split_on=tuple(s for s in SPLIT_SIGNALS if s != signal))
    apart = OnlineAcceptance()
    for model in (together, apart):
        model.observe(missed, torch.zeros(20))
    torch.testing.assert_close(apart.predict_signals(other), torch.tensor([0.6]))
    assert float(together.predict_signals(other)[0]) < 0.5
    with pytest.raises(ValueError, match="split_on"):
        OnlineAcceptance(split_on=("entropy",))

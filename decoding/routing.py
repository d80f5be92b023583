"""Routing: several drafters behind one `Drafter`; per request, the one that commits tokens
fastest serves it.

Per request the router
(a) orders the candidates by a prior from the prompt (n-gram lookup goes first on a repetitive
    prompt, see `repetition`),
(b) lets each candidate serve a stint of `probe_rounds` measured rounds in that order, measuring
    its realised rate: committed tokens per second of round (from the start of its draft to the
    end of the router's `commit`, so verification and every candidate's commit count),
(c) then serves the rest of the request with the fastest, switching when its moving-average rate
    falls below another's last measured rate, and re-probing the runner-up every
    `reprobe_every` measured rounds, since what a drafter accepts changes within a request.

The first round of every stint is a warm-up and is not measured: a drafter that sat idle catches
up on the tokens committed meanwhile (its own KV cache or the lagged target features), a cost
paid once per switch that says nothing of its rate. Rounds the draft policy decodes plainly
(drafting nothing, `DraftPolicy.shape` of zero tokens) are served by no drafter: recorded as
`PLAIN`, never measured.

Every candidate is started on every request and told every commit, so each stays in sync with
the committed sequence; the built-in drafters' commits are lazy (they append tokens and features
and catch up when next asked to draft). Each round's draft comes from one drafter, so greedy
output stays the target's and rejection sampling stays exact. The route depends on measured
speed, so a seeded sampled run may take another route, and other tokens, on another run.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from draftsmith.heads.base import Draft, Drafter, DraftRequest, StatesHook
from draftsmith.heads.ngram import NgramDrafter

PLAIN = "plain"
"""What `Route.served` calls the rounds the draft policy decoded without a draft."""

NEUTRAL_PRIOR = 0.5
"""The prior of a drafter the prompt says nothing about; an n-gram drafter's is `repetition`, so
n-gram lookup is probed first once at least half the prompt's recent n-grams repeat."""


def repetition(prompt_ids: Sequence[int], n: int = 3, window: int = 64) -> float:
    """The fraction of the prompt's last `window` n-grams that occurred earlier in the prompt:
    near 1 for a list being continued or code repeating a pattern, near 0 for prose."""
    ids = list(prompt_ids)
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    if not grams:
        return 0.0
    first: dict[tuple[int, ...], int] = {}
    for i, gram in enumerate(grams):
        first.setdefault(gram, i)
    recent = range(max(len(grams) - window, 0), len(grams))
    return sum(first[grams[i]] < i for i in recent) / len(recent)


def prompt_prior(drafter: Drafter, prompt_ids: Sequence[int]) -> float:
    """How promising `drafter` looks for a prompt before any round, on a 0-1 scale."""
    if isinstance(drafter, NgramDrafter):
        return repetition(prompt_ids, n=drafter.max_ngram)
    return NEUTRAL_PRIOR


@dataclass
class Served:
    """Rounds served and tokens they committed (accepted drafts plus the target's own token)."""

    rounds: int = 0
    tokens: int = 0

    def add(self, tokens: int) -> None:
        self.rounds += 1
        self.tokens += tokens


@dataclass
class Stint:
    """A run of consecutive drafting rounds served by one drafter (plain rounds do not end it)."""

    drafter: str
    rounds: int = 0


@dataclass
class Route:
    """How one request was served."""

    prior: dict[str, float]
    """Each candidate's prompt prior (`prompt_prior`)."""
    order: list[str]
    """The probing order the prior gave."""
    stints: list[Stint] = field(default_factory=list)
    """In order: the story of the request's switches."""
    served: dict[str, Served] = field(default_factory=lambda: defaultdict(Served))
    """Per drafter (and `PLAIN`), the rounds it served and the tokens they committed."""

    def to_dict(self) -> dict:
        return {
            "prior": self.prior,
            "order": self.order,
            "stints": [[s.drafter, s.rounds] for s in self.stints],
            "served": {name: vars(s) for name, s in self.served.items()},
        }


@dataclass
class _Rate:
    """Committed tokens per second as a ratio of moving averages; None before a measurement."""

    smoothing: float
    tokens: float = 0.0
    seconds: float = 0.0
    measured: bool = False

    def add(self, tokens: int, seconds: float) -> None:
        w = self.smoothing if self.measured else 1.0
        self.tokens = (1 - w) * self.tokens + w * tokens
        self.seconds = (1 - w) * self.seconds + w * seconds
        self.measured = True

    @property
    def value(self) -> float:
        return self.tokens / max(self.seconds, 1e-12)


class RoutingDrafter(Drafter):
    """Several named drafters behind one; each request is served by the one measured fastest.

    All candidates share the target's vocabulary. Their target feature layers may differ: the
    router reads the union (in first-named order) and hands each candidate its own columns.
    """

    def __init__(
        self,
        drafters: Mapping[str, Drafter],
        *,
        vocab_size: int | None = None,
        probe_rounds: int = 2,
        reprobe_every: int = 32,
        smoothing: float = 0.3,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """drafters: candidates by name, in the order that breaks ties of the prior. vocab_size:
        the target's, to check each candidate against (default: they are checked against each
        other). probe_rounds: measured rounds per probing stint (after its warm-up round).
        reprobe_every: measured rounds the best serves before the runner-up is probed again.
        smoothing: weight of the newest round in the moving-average rates. clock: seconds (a
        fake one makes routing deterministic in tests)."""
        if not drafters:
            raise ValueError("a routing drafter needs at least one drafter to route between")
        if probe_rounds < 1 or reprobe_every < 1:
            raise ValueError(
                f"need probe_rounds >= 1 and reprobe_every >= 1, got {probe_rounds}, "
                f"{reprobe_every}"
            )
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.drafters = dict(drafters)
        self.vocab_size = _shared_vocab_size(self.drafters, vocab_size)
        self.target_feature_layers = tuple(
            dict.fromkeys(i for d in self.drafters.values() for i in d.target_feature_layers)
        )
        widths = {d.state_size for d in self.drafters.values() if d.state_size is not None}
        self.state_size = widths.pop() if len(widths) == 1 else None
        # Where each candidate's layers sit in the union.
        self._layer_index = {
            name: [self.target_feature_layers.index(i) for i in d.target_feature_layers]
            for name, d in self.drafters.items()
        }
        self.probe_rounds = probe_rounds
        self.reprobe_every = reprobe_every
        self.smoothing = smoothing
        self.clock = clock
        self.workload: str | None = None
        """Set by the caller before a request: `served` counts under it ('default' if None)."""
        self.served: dict[str, dict[str, Served]] = defaultdict(lambda: defaultdict(Served))
        """Cumulative over requests: workload -> drafter (or `PLAIN`) -> rounds and tokens."""
        self.last_route: Route | None = None
        """The current (or last) request's `Route`."""
        self._rates: dict[str, _Rate] = {}
        self._stint = Stint("")  # the newest of last_route.stints
        self._round_started = 0.0
        self._drafted_by: str | None = None

    # -- the Drafter interface -------------------------------------------------------------------

    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        """prompt_ids (T,); target_features (T-1, F) of the union of feature layers, or None."""
        for name, drafter in self.drafters.items():
            drafter.start(prompt_ids, self._columns(name, target_features))
        ids = prompt_ids.tolist()
        prior = {name: prompt_prior(d, ids) for name, d in self.drafters.items()}
        order = sorted(self.drafters, key=lambda name: -prior[name])  # stable: ties keep order
        self.last_route = Route(prior=prior, order=order)
        self._rates = {}
        self._switch(order[0])
        self._drafted_by = None

    def draft(self, request: DraftRequest) -> Draft:
        # Not called on a plain round (`propose` of zero tokens): the round is nobody's.
        self._round_started = self.clock()
        self._drafted_by = self._stint.drafter
        return self.drafters[self._drafted_by].draft(request)

    def commit(self, tokens: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        """tokens (n,); target_features (n, F) of the union of feature layers, or None."""
        for name, drafter in self.drafters.items():
            drafter.commit(tokens, self._columns(name, target_features))
        seconds = 0.0 if self._drafted_by is None else self.clock() - self._round_started
        self._observe(tokens.numel(), seconds)
        self._drafted_by = None

    def expose_states(self, hook: StatesHook | None) -> None:
        """Forwarded to every candidate with hidden states (the others emit none to read); a
        ValueError when none has any, or their widths differ."""
        watched = [d for d in self.drafters.values() if d.state_size is not None]
        if watched and self.state_size is None:
            raise ValueError(
                "the routed drafters' hidden states differ in width, so one learned acceptance "
                "head cannot read them all: route drafters of one width, or use a calibrator on "
                "the confidence signals"
            )
        if not watched:
            super().expose_states(hook)
        for drafter in watched:
            drafter.expose_states(hook)

    # -- routing ---------------------------------------------------------------------------------

    @property
    def serving(self) -> str:
        """The drafter that drafts the next round."""
        return self._stint.drafter

    def _observe(self, tokens: int, seconds: float) -> None:
        name = self._drafted_by or PLAIN
        self.last_route.served[name].add(tokens)
        self.served[self.workload or "default"][name].add(tokens)
        if name == PLAIN:
            return
        self._stint.rounds += 1
        if self._stint.rounds == 1:  # the warm-up round: catching up, not drafting
            return
        if self._stint.rounds == 2:  # a stint's rate starts afresh
            self._rates[name] = _Rate(self.smoothing)
        self._rates[name].add(tokens, seconds)
        chosen = self._choose()
        if chosen != name:
            self._switch(chosen)

    def _choose(self) -> str:
        """Who serves next: the current stint until it is measured, then any candidate not yet
        probed, then the fastest; the runner-up once the fastest has served `reprobe_every`."""
        name, measured = self._stint.drafter, self._stint.rounds - 1
        if measured < self.probe_rounds:
            return name
        unprobed = [n for n in self.last_route.order if n not in self._rates]
        if unprobed:
            return unprobed[0]
        ranked = sorted(self.last_route.order, key=lambda n: -self._rates[n].value)
        if ranked[0] != name:
            return ranked[0]
        if len(ranked) > 1 and measured >= self.reprobe_every:
            return ranked[1]
        return name

    def _switch(self, name: str) -> None:
        self._stint = Stint(name)
        self.last_route.stints.append(self._stint)

    def _columns(self, name: str, features: torch.Tensor | None) -> torch.Tensor | None:
        """The columns of features (..., len(union) * H) that drafter `name` reads, or None."""
        index = self._layer_index[name]
        if features is None or not index:
            return None
        if index == list(range(len(self.target_feature_layers))):  # all of them, in order
            return features
        per_layer = features.unflatten(-1, (len(self.target_feature_layers), -1))
        return per_layer[..., index, :].flatten(-2)


def _shared_vocab_size(drafters: Mapping[str, Drafter], target_vocab: int | None) -> int | None:
    """The candidates' common vocabulary size (None if none has one); a ValueError naming the
    first drafter that differs from the target's (or from the first candidate's)."""
    reference, owner = target_vocab, "the target"
    for name, drafter in drafters.items():
        if drafter.vocab_size is None:
            continue
        if reference is None:
            reference, owner = drafter.vocab_size, f"drafter {name!r}"
        elif drafter.vocab_size != reference:
            raise ValueError(
                f"drafter {name!r} proposes from a vocabulary of {drafter.vocab_size} tokens but "
                f"{owner} has {reference}: every routed drafter must share the target's "
                "vocabulary (drop it from the route, or use a draft model of the target's family "
                "or a head trained on this target)"
            )
    return reference

"""The one interface every drafter implements, and the registry of drafter kinds.

The decoder never branches on a drafter's kind: it asks for a draft, verifies it with the target
and tells the drafter which tokens were committed, so the drafter can roll back its own state.

Target features lag one token behind the committed sequence: the target's hidden states exist
for every position it has run, and it has run every committed token except the newest one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from draftsmith.core.context import ContextIndex
from draftsmith.core.registry import Registry
from draftsmith.core.sampling import SamplingParams
from draftsmith.core.tree import chain_parents, check_parents, is_chain, tree_depths

StopFn = Callable[[int, torch.Tensor, bool], bool]
"""stop(position, draft_logits (V_s,), context_match) -> True to end a chain draft after the token
just proposed; the logits are those of the draft's `support` (the target's whole vocabulary
without one), and context_match whether their top-1 token repeats the context
(`draftsmith.core.context`)."""

TreeStopFn = Callable[[int, "TreeNodes"], bool]
"""stop(depth, nodes) -> True to end a tree's growth after its `depth` depths so far (before the
drafter expands another): nodes are every node drafted so far."""

RoundStopFn = Callable[[int], bool]
"""stop(steps) -> True to end a lockstep round's drafting (`RowDrafters.lockstep`) after `steps`
drafter forwards, every row's draft with it: called once the rows' own stop rules saw the step."""


AcceptanceFn = Callable[[dict[str, torch.Tensor]], torch.Tensor]
"""acceptance(signals) -> (m,): for m tree nodes about to get children, the estimated probability
that the target accepts the top-1 token of each node's draft distribution, given that the node's
path was accepted: the top-1 child's; a runner-up keeps its draft probability.
signals are the distributions' `confidence_signals`, each (m,), with `position` the children's
0-based depth and `path_prob` the product of the draft's top-1 probabilities along the node's
path and this distribution, and `context_match` whether each top-1 token repeats the request's
`context` (`draftsmith.core.context`). A draft policy supplies it (calibrated when the artifact is);
drafters only rank tree nodes with it."""

StatesHook = Callable[[torch.Tensor, torch.Tensor], None]
"""hook(logits (m, V), states (m, H)): m rows of draft logits a drafter just emitted (the very
tensor it drafts from) and the hidden states it computed them from."""


def raw_acceptance(signals: dict[str, torch.Tensor]) -> torch.Tensor:
    """`AcceptanceFn` of an uncalibrated drafter: its own top-1 probability."""
    return signals["top1_prob"]


class TreeNodes(Protocol):
    """The nodes of a tree being drafted, in the order drafted (parents first)."""

    values: list[float]
    """Per node, the estimated probability that the target accepts its whole path."""
    parents: list[int]
    """Per node, its parent's index, or -1 for a child of the newest committed token."""
    depths: list[int]
    """Per node, its 1-based depth."""


def on_support(logits: torch.Tensor, support: torch.Tensor | None) -> torch.Tensor:
    """logits (..., V) on the target ids `support` (V_s,) only (None: all of them): the same
    confidence signals, without the -inf columns of a reduced draft vocabulary, which are most
    of their work."""
    if support is None:
        return logits
    return logits.index_select(-1, support.to(logits.device))


@dataclass(frozen=True)
class TreeShape:
    """How large a draft tree to propose: the EAGLE-2 dynamic tree's budget.

    Each of `depth` rounds expands the `expand` (EAGLE-2: `top_k`) most valuable nodes of the
    newest depth with `top_k` children each; the tree keeps the `total_tokens` most valuable
    nodes (parents always kept). top_k == 1 is a chain of `depth` tokens; expand == 1 a chain
    whose every token comes with up to top_k - 1 siblings, leaves the drafter never runs: the
    chain's drafting for more candidates, which suits a drafter whose step costs as much over
    one token as over several (a draft model, a batch drafting in lockstep).
    """

    top_k: int = 1
    depth: int = 8
    total_tokens: int | None = None
    """None: every node drafted (top_k + (depth - 1) * expand * top_k at most)."""
    expand: int | None = None
    """Nodes of a depth given children at the next; None: top_k."""

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.depth < 0:
            raise ValueError(f"a tree needs top_k >= 1 and depth >= 0, got {self}")
        if self.total_tokens is not None and self.total_tokens < 0:
            raise ValueError(f"total_tokens must be >= 0, got {self.total_tokens}")
        if self.expand is not None and not 1 <= self.expand <= self.top_k:
            raise ValueError(f"expand must be in [1, top_k = {self.top_k}], got {self.expand}")

    @classmethod
    def chain(cls, length: int) -> TreeShape:
        return cls(top_k=1, depth=length, total_tokens=length)

    @property
    def is_chain(self) -> bool:
        return self.top_k == 1

    @property
    def width(self) -> int:
        """Nodes of a depth given children at the next."""
        return self.top_k if self.expand is None else self.expand

    @property
    def max_tokens(self) -> int:
        """The most nodes a tree of this shape holds."""
        per_depth = self.width * self.top_k
        drafted = self.top_k + max(self.depth - 1, 0) * per_depth if self.depth else 0
        return drafted if self.total_tokens is None else min(drafted, self.total_tokens)

    def capped(self, tokens: int) -> TreeShape:
        """This shape with at most `tokens` nodes and at most that depth."""
        total = min(self.max_tokens, tokens)
        return replace(self, depth=min(self.depth, tokens), total_tokens=total)

    def narrowed(self, top_k: int, expand: int | None = None) -> TreeShape:
        """This shape with at most `top_k` children a node and at most `expand` nodes expanded a
        depth (None: at most top_k)."""
        top_k = min(self.top_k, top_k)
        width = min(self.width, top_k, expand or top_k)
        return replace(self, top_k=top_k, expand=None if width == top_k else width)


def most_valuable(values: Sequence[float], depths: Sequence[int], size: int) -> list[int]:
    """The indices (ascending) of the `size` largest values; ties go to the shallower, then the
    earlier node, so a node never goes before a parent of equal value."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], depths[i], i))
    return sorted(order[:size])


@dataclass(frozen=True)
class DraftRequest:
    """What a round asks of a drafter."""

    shape: TreeShape
    sampling: SamplingParams
    generator: torch.Generator | None = None
    stop: StopFn | None = None
    """Ends a chain early after the token just proposed (trees ignore it)."""
    acceptance: AcceptanceFn = raw_acceptance
    """Ranks a tree's nodes."""
    tree_stop: TreeStopFn | None = None
    """Ends a tree's growth early after a depth (chains ignore it)."""
    context: ContextIndex = field(default_factory=ContextIndex)
    """The committed sequence's n-grams, from which a draft gives each token its `context_match`
    signal (by default none: no token repeats the context)."""


@dataclass
class Draft:
    """A draft tree: proposed continuations of the committed sequence. Nodes are in topological
    order (a parent before its children) and siblings carry distinct tokens. A chain is the tree
    whose every node has one child."""

    tokens: torch.Tensor
    """(k,) int64 proposed token ids, k >= 0."""
    probs: torch.Tensor | None = None
    """(k, V) per node, the draft distribution q the token was drawn from, after the same sampling
    processing as the target's; for siblings drawn one after another without replacement, q
    without the earlier siblings, renormalised. None means the tokens were chosen
    deterministically (one-hot q)."""
    logits: torch.Tensor | None = None
    """(k, V) per node, the raw draft logits it was chosen from (its parent's prediction), the
    source of confidence signals. None for drafters without a distribution (n-gram)."""
    parents: torch.Tensor | None = None
    """(k,) int64 per node, the index of its parent node, or -1 for a child of the newest
    committed token. None (the default) builds a chain."""
    values: torch.Tensor | None = None
    """(k,) per node, the estimated probability that the target accepts its whole path (the
    `AcceptanceFn` multiplied along it), never above its parent's; None when not estimated."""
    support: torch.Tensor | None = None
    """(V_s,) int64 the target ids outside which every node's logits are -inf (a reduced draft
    vocabulary), or None (the whole vocabulary): confidence signals read these columns only."""
    signals: dict[str, torch.Tensor] | None = None
    """Per node, the confidence signals of its logits (`confidence_signals` names, each (k,);
    `position` its depth - 1, `path_prob` the product of the top-1 probabilities along its path),
    as the drafter computed them while drafting, with `context_match` (whether its top-1 token
    repeats the request's `context`); None: computed from `logits` when asked (without
    `context_match`). Kept so that learning from a verified round recomputes nothing."""
    top1: torch.Tensor | None = None
    """(k,) bool per node: its token is its draft distribution's most probable (a greedy tree's
    first-ranked child); None: found from `logits` when asked."""

    def __post_init__(self) -> None:
        if self.parents is None:
            self.parents = chain_parents(len(self))
        check_parents(self.parents)
        if self.parents.numel() != len(self):
            raise ValueError(f"{len(self)} draft tokens but {self.parents.numel()} parents")

    def __len__(self) -> int:
        return int(self.tokens.numel())

    @classmethod
    def empty(cls) -> Draft:
        return cls(tokens=torch.empty(0, dtype=torch.long))

    @property
    def is_chain(self) -> bool:
        return is_chain(self.parents)

    @property
    def depths(self) -> torch.Tensor:
        """(k,) 1-based depth of each node: 1 for the children of the newest committed token."""
        return tree_depths(self.parents) + 1

    def pruned(self, size: int) -> Draft:
        """The `size` most valuable nodes (by `values`; ties: shallower, then earlier, first),
        which keep every parent since no node is worth more than its parent."""
        if size >= len(self) or self.values is None:
            return self
        return self.subtree(most_valuable(self.values.tolist(), self.depths.tolist(), size))

    def subtree(self, nodes: Sequence[int]) -> Draft:
        """The draft of `nodes` (ascending, each node's parent among them), renumbered."""
        index = torch.tensor(nodes, dtype=torch.long)
        renumber = {old: new for new, old in enumerate(nodes)}
        parents = [renumber.get(int(self.parents[i]), -1) for i in nodes]
        if any(int(self.parents[i]) >= 0 and int(self.parents[i]) not in renumber for i in nodes):
            raise ValueError("a subtree must keep every kept node's parent")
        return Draft(
            tokens=self.tokens[index],
            probs=None if self.probs is None else self.probs[index],
            logits=None if self.logits is None else self.logits[index],
            parents=torch.tensor(parents, dtype=torch.long),
            values=None if self.values is None else self.values[index],
            support=self.support,
            signals=None
            if self.signals is None
            else {name: value[index] for name, value in self.signals.items()},
            top1=None if self.top1 is None else self.top1[index],
        )

    def children(self, node: int) -> list[int]:
        """The children of `node` (-1: of the newest committed token), in draft order."""
        return (self.parents == node).nonzero().flatten().tolist()

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node` (empty for -1)."""
        path = []
        while node >= 0:
            path.append(node)
            node = int(self.parents[node])
        return path[::-1]


class Drafter(ABC):
    """Proposes tokens for a target model to verify."""

    vocab_size: int | None = None
    """Size of the token space the drafter proposes from; None if it only copies token ids."""
    target_feature_layers: tuple[int, ...] = ()
    """Indices into the target's `hidden_states` output that this drafter reads (empty: none)."""
    state_size: int | None = None
    """Width of the hidden states `expose_states` hands out; None: the drafter has none."""
    block_size: int = 1
    """Tokens one drafter forward proposes: 1 for a drafter stepping token by token; a block
    drafter's K, whose draft of up to K tokens costs one forward whatever its length."""

    @abstractmethod
    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        """Begin a new sequence.

        prompt_ids (T,); target_features (T-1, F) for all prompt tokens but the last, or None.
        """

    def propose(
        self,
        shape: TreeShape | int,
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        stop: StopFn | None = None,
        acceptance: AcceptanceFn | None = None,
        tree_stop: TreeStopFn | None = None,
    ) -> Draft:
        """Propose a draft tree of at most `shape` after the committed sequence (an int: a chain of
        at most that many tokens).

        stop ends a chain early (trees ignore it), tree_stop a tree's growth (chains ignore it);
        acceptance ranks a tree's nodes (default: the raw draft probabilities). Under sampling every token must be drawn from its node's `probs`
        (or be deterministic, `probs=None`), or verification would not preserve the target's
        distribution.
        """
        if isinstance(shape, int):
            shape = TreeShape.chain(shape)
        return self.propose_request(
            DraftRequest(shape, sampling, generator, stop, acceptance or raw_acceptance, tree_stop)
        )

    def propose_request(self, request: DraftRequest) -> Draft:
        """`propose` of a request built already: nothing for a shape of no tokens."""
        return Draft.empty() if request.shape.max_tokens == 0 else self.draft(request)

    @abstractmethod
    def draft(self, request: DraftRequest) -> Draft:
        """`propose` for a shape of at least one token."""

    def fork(self) -> Drafter:
        """A drafter of the same kind sharing this one's weights, with no sequence yet: the
        drafter of another row of a batch (`SpeculativeDecoder.generate_batch`), whose state is
        its own. Kinds that cannot decode a batch raise a ValueError naming the kind."""
        kind = getattr(self, "kind", None)
        name = type(self).__name__ if kind is None else f"the {kind} drafter"
        raise ValueError(
            f"{name} cannot decode a batch: decode these prompts one at a time (batch size 1)"
        )

    def chain_batch(self, rows: int) -> RowDrafters | None:
        """The drafters of a batch of `rows` rows drafting chains (or trees that expand one node
        a depth, `TreeShape.expand` 1), when this kind drafts every row's chain in one forward
        per step; None (the default): each row drafts alone, with `fork`s."""
        return None

    def expose_states(self, hook: StatesHook | None) -> None:
        """Call hook with every batch of draft logits this drafter emits and the hidden states
        behind them (what a learned acceptance head reads); None: stop. Kinds without hidden
        states raise a ValueError."""
        raise ValueError(
            f"{type(self).__name__} has no hidden states behind its drafts, which a learned "
            "acceptance head reads: use an eagle, eagle3, peagle or dflash drafter"
        )

    @abstractmethod
    def commit(self, tokens: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        """Append tokens (n,) the target accepted (the accepted draft prefix plus the target's own
        next token) to the committed sequence and drop any state built on rejected tokens.

        target_features (n, F): the target's features for the previous newest token and the
        accepted draft tokens (one row per target position that was kept), or None.
        """


class RowDrafters:
    """The drafters of a batch's rows, addressed by row index: one `Drafter` per row, each
    drafting alone. `Drafter.chain_batch` may give a subclass that drafts all rows together."""

    lockstep: bool = False
    """Whether every row drafts in the same forwards, a step for all at once (so the round's
    drafting lasts as long as its longest row's): `propose` then honours a `RoundStopFn`."""

    def __init__(self, drafters: Sequence[Drafter]) -> None:
        self.drafters = list(drafters)

    def start(
        self, row: int, prompt_ids: torch.Tensor, target_features: torch.Tensor | None
    ) -> None:
        """`Drafter.start` of row `row`."""
        self.drafters[row].start(prompt_ids, target_features)

    def propose(
        self,
        rows: Sequence[int],
        requests: Sequence[DraftRequest],
        round_stop: RoundStopFn | None = None,
    ) -> list[Draft]:
        """One draft per row of `rows` (the rows still decoding, in order), for its request;
        round_stop ends every row's drafting together where the rows draft in `lockstep`."""
        return [self.drafters[r].propose_request(q) for r, q in zip(rows, requests, strict=True)]

    def commit(self, row: int, tokens: torch.Tensor, target_features: torch.Tensor | None) -> None:
        """`Drafter.commit` of row `row`."""
        self.drafters[row].commit(tokens, target_features)

    def select(self, rows: Sequence[int]) -> None:
        """Only `rows` (in that order) decode from now on; the others finished."""


DRAFTERS: Registry[type] = Registry("drafter kind")
"""Every drafter kind by name: a `Drafter`, or a trainable `DraftHead` whose `as_drafter` gives
one (the kinds an artifact can hold)."""


def register_drafter(kind: str) -> Callable[[type], type]:
    """Class decorator: make a drafter kind buildable by name (its `kind` set to it)."""
    return DRAFTERS.register(kind)


def drafter_class(kind: str) -> type:
    """The class registered as `kind`; an `UnknownNameError` listing the kinds otherwise."""
    return DRAFTERS[kind]


def drafter_kinds() -> list[str]:
    """Every registered kind, sorted."""
    return DRAFTERS.names()

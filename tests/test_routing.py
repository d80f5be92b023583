"""Routing between drafters: the one that commits most per second serves, every candidate stays
in sync, and the output stays the target's."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    MarkovTarget,
    OracleDrafter,
    TableDrafter,
    greedy_reference,
    perturbed_copy,
    tiny_model,
)
from head_helpers import build_head

from draftsmith import FixedPolicy, SpeculativeDecoder
from draftsmith.core.target import Target
from draftsmith.decoding.routing import PLAIN, RoutingDrafter, repetition
from draftsmith.heads import DraftModelDrafter, NgramDrafter
from draftsmith.heads.base import Draft, Drafter

PROMPT = torch.tensor([5, 17, 42, 99, 3, 250, 77, 12])


class Clock:
    """Every reading one second after the last: each round lasts one second, so a drafter's
    measured rate is its committed tokens per round and routing is deterministic."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def route(drafters: dict, **options) -> RoutingDrafter:
    return RoutingDrafter(drafters, clock=Clock(), **options)


def stints(router: RoutingDrafter) -> list[tuple[str, int]]:
    return [(s.drafter, s.rounds) for s in router.last_route.stints]


def test_the_drafter_that_accepts_serves(llama):
    router = route(
        {
            "unrelated": DraftModelDrafter(tiny_model("llama", seed=99)),
            "same": DraftModelDrafter(llama),
            "ngram": NgramDrafter(),
        }
    )
    decoder = SpeculativeDecoder(llama, router, policy=FixedPolicy(max_draft_tokens=4))
    result = decoder.generate(PROMPT, max_new_tokens=60)
    assert result.tokens == greedy_reference(llama, PROMPT, 60)
    # Probed in the prior's order (a warm-up round and two measured each), then the best serves.
    assert router.last_route.order == ["unrelated", "same", "ngram"]
    assert stints(router)[:3] == [("unrelated", 3), ("same", 3), ("ngram", 3)]
    assert stints(router)[3][0] == "same" and len(stints(router)) == 4
    served = router.last_route.served
    assert served["same"].tokens == 60 - served["unrelated"].tokens - served["ngram"].tokens
    assert sum(s.rounds for s in served.values()) == result.stats.target_forwards


def cycle_target(period: int = 8, vocab: int = 16) -> MarkovTarget:
    """Greedy output cycles 0, 1, ..., period - 1: n-gram lookup drafts it perfectly."""
    table = torch.zeros(vocab, vocab)
    table[torch.arange(vocab), (torch.arange(vocab) + 1) % period] = 10.0
    return MarkovTarget(table)


def test_a_repetitive_prompt_probes_ngram_first_and_ngram_serves():
    target = cycle_target()
    prompt = torch.arange(8).repeat(3)
    never = torch.full((8, 16), -10.0)
    never[:, 15] = 10.0  # always drafts 15, which the target never accepts
    router = route({"table": TableDrafter(never), "ngram": NgramDrafter()})
    result = SpeculativeDecoder(target, router, policy=FixedPolicy(max_draft_tokens=4)).generate(
        prompt, max_new_tokens=40
    )
    assert result.tokens == [(i + 1) % 8 for i in range(7, 47)]
    assert router.last_route.prior["ngram"] > 0.5 > repetition(PROMPT.tolist())
    assert router.last_route.order == ["ngram", "table"]
    assert [name for name, _ in stints(router)] == ["ngram", "table", "ngram"]
    assert router.last_route.served["ngram"].tokens == 40 - 3


@pytest.mark.parametrize(
    "ids, expected",
    [([1, 2, 3, 4, 5, 6], 0.0), ([1, 2, 3] * 4, 0.7), ([7, 7], 0.0), ([9] * 10, 7 / 8)],
)
def test_repetition_is_the_share_of_recent_ngrams_seen_before(ids, expected):
    assert repetition(ids) == pytest.approx(expected)


class GoodThenBad(OracleDrafter):
    """Gets four tokens a round right until `until` tokens are committed, then none."""

    def __init__(self, reference: list[int], until: int) -> None:
        super().__init__(reference, vocab_size=256, correct=4)
        self.until = until

    def draft(self, request) -> Draft:
        self.correct = 4 if self.committed < self.until else 0
        return super().draft(request)


def test_a_drafter_that_stops_accepting_hands_over_to_the_runner_up(llama):
    reference = greedy_reference(llama, PROMPT, 80)
    router = route(
        {
            "fading": GoodThenBad(reference, until=30),
            "steady": OracleDrafter(reference, vocab_size=256, correct=1),
        }
    )
    decoder = SpeculativeDecoder(llama, router, policy=FixedPolicy(max_draft_tokens=4))
    assert decoder.generate(PROMPT, max_new_tokens=80).tokens == reference
    names = [name for name, _ in stints(router)]
    assert names == ["fading", "steady", "fading", "steady"]  # probe, probe, serve, hand over


def test_the_runner_up_is_probed_again_every_reprobe_every_rounds(llama):
    router = route(
        {
            "unrelated": DraftModelDrafter(tiny_model("llama", seed=99)),
            "same": DraftModelDrafter(llama),
        },
        probe_rounds=1,
        reprobe_every=4,
    )
    decoder = SpeculativeDecoder(llama, router, policy=FixedPolicy(max_draft_tokens=2))
    assert decoder.generate(PROMPT, max_new_tokens=60).tokens == greedy_reference(llama, PROMPT, 60)
    # After the probes, the best serves a warm-up and four measured rounds, the runner-up two.
    assert stints(router)[:6] == [
        ("unrelated", 2),
        ("same", 5),
        ("unrelated", 2),
        ("same", 5),
        ("unrelated", 2),
        ("same", 5),
    ]


def test_plain_rounds_are_served_by_no_drafter(llama):
    router = route({"ngram": NgramDrafter(), "same": DraftModelDrafter(llama)})
    decoder = SpeculativeDecoder(llama, router, policy=FixedPolicy(max_draft_tokens=0))
    assert decoder.generate(PROMPT, max_new_tokens=12).tokens == greedy_reference(llama, PROMPT, 12)
    assert dict(router.last_route.served).keys() == {PLAIN}
    assert vars(router.last_route.served[PLAIN]) == {"rounds": 12, "tokens": 12}
    assert stints(router) == [("same", 0)]


def real_drafters(target) -> dict[str, Drafter]:
    """Every kind of state a drafter keeps: an own KV cache, lagged features of three layers and
    of one, the committed tokens."""
    return {
        "perturbed": DraftModelDrafter(perturbed_copy(target, scale=0.05)),
        "eagle3": build_head("eagle3", target).as_drafter(target),
        "medusa": build_head("medusa", target).as_drafter(target),
        "ngram": NgramDrafter(),
    }


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_identity_over_requests_in_a_row_while_switching_every_round(arch, llama, qwen2):
    """One router decodes several requests; re-probing every round hands each round to another
    drafter, so each must be in sync with every commit it did not draft."""
    target = {"llama": llama, "qwen2": qwen2}[arch]
    router = RoutingDrafter(real_drafters(target), probe_rounds=1, reprobe_every=1)
    assert router.target_feature_layers == (0, 1, 2)  # eagle3's three; medusa reads layer 2
    decoder = SpeculativeDecoder(target, router, policy=FixedPolicy(max_draft_tokens=3))
    for prompt, max_new in [(PROMPT, 40), (torch.tensor([9, 8]), 25), (PROMPT[:3], 33)]:
        result = decoder.generate(prompt, max_new_tokens=max_new)
        assert result.tokens == greedy_reference(target, prompt, max_new)
        assert len({s.drafter for s in router.last_route.stints}) == 4


def test_served_counts_per_workload_over_requests(llama):
    router = route({"same": DraftModelDrafter(llama), "ngram": NgramDrafter()})
    decoder = SpeculativeDecoder(llama, router, policy=FixedPolicy(max_draft_tokens=4))
    totals = {"code": 0, "chat": 0}
    for workload, max_new in [("code", 30), ("chat", 20), ("code", 25)]:
        router.workload = workload
        decoder.generate(PROMPT, max_new_tokens=max_new)
        totals[workload] += max_new
        route_tokens = sum(s.tokens for s in router.last_route.served.values())
        assert route_tokens == max_new
    for workload, tokens in totals.items():
        assert sum(s.tokens for s in router.served[workload].values()) == tokens
    assert router.served["code"]["same"].rounds > router.served["code"]["ngram"].rounds


class Recorder(Drafter):
    """Drafts nothing and records the target features it is handed."""

    def __init__(self, layers: tuple[int, ...]) -> None:
        self.target_feature_layers = layers
        self.seen: list[torch.Tensor] = []

    def start(self, prompt_ids, target_features=None) -> None:
        self.seen = [target_features]

    def draft(self, request) -> Draft:
        return Draft.empty()

    def commit(self, tokens, target_features=None) -> None:
        self.seen.append(target_features)


def test_each_drafter_gets_the_columns_of_its_own_layers(llama):
    router = RoutingDrafter({"a": Recorder((2, 0)), "b": Recorder((1, 2)), "c": Recorder(())})
    assert router.target_feature_layers == (2, 0, 1)
    SpeculativeDecoder(llama, router, policy=FixedPolicy(max_draft_tokens=2)).generate(
        PROMPT, max_new_tokens=5
    )
    ids = torch.cat([PROMPT, torch.tensor(greedy_reference(llama, PROMPT, 5))])
    for name, layers in [("a", (2, 0)), ("b", (1, 2))]:
        # Alone, the target's features of every position but the newest, in the drafter's order
        # (the rounds' forwards multiply weight-first, the prefill does not: float32 rounding).
        expected = Target(llama, layers).forward(ids[None, :-1])[0][0]
        seen = torch.cat(router.drafters[name].seen)
        torch.testing.assert_close(seen, expected, atol=1e-4, rtol=1e-4)
    assert router.drafters["c"].seen == [None] * 6


def test_sampling_through_a_router_runs(llama):
    router = RoutingDrafter(
        {
            "perturbed": DraftModelDrafter(perturbed_copy(llama, scale=0.05)),
            "ngram": NgramDrafter(),
        },
        probe_rounds=1,
        reprobe_every=2,
    )
    decoder = SpeculativeDecoder(llama, router, policy=FixedPolicy(max_draft_tokens=4))
    result = decoder.generate(PROMPT, max_new_tokens=40, temperature=1.0, top_p=0.9, seed=0)
    assert len(result.tokens) == 40 and all(0 <= t < 256 for t in result.tokens)
    assert result.stats.accepted > 0
    assert sum(s.tokens for s in router.last_route.served.values()) == 40


def test_a_drafter_of_another_vocabulary_is_named(llama):
    wide = DraftModelDrafter(tiny_model("llama", seed=1, vocab_size=300))
    with pytest.raises(
        ValueError,
        match="drafter 'wide' proposes from a vocabulary of 300 tokens but the target has 256",
    ):
        RoutingDrafter({"ngram": NgramDrafter(), "wide": wide}, vocab_size=256)
    with pytest.raises(ValueError, match="drafter 'wide' .* but drafter 'same' has 256"):
        RoutingDrafter({"same": DraftModelDrafter(llama), "wide": wide})
    with pytest.raises(ValueError, match="vocabulary has 300 tokens but the target's has 256"):
        SpeculativeDecoder(llama, RoutingDrafter({"wide": wide, "ngram": NgramDrafter()}))


@pytest.mark.parametrize(
    "drafters, options, complaint",
    [
        ({}, {}, "at least one drafter"),
        ({"n": NgramDrafter()}, {"probe_rounds": 0}, "probe_rounds >= 1"),
        ({"n": NgramDrafter()}, {"smoothing": 0.0}, "smoothing must be in"),
    ],
)
def test_bad_router_options(drafters, options, complaint):
    with pytest.raises(ValueError, match=complaint):
        RoutingDrafter(drafters, **options)


def test_hidden_states_are_exposed_by_the_candidates_that_have_them(llama):
    drafters = real_drafters(llama)
    router = route(drafters, probe_rounds=1, reprobe_every=1)
    assert router.state_size == drafters["eagle3"].state_size
    seen = []
    router.expose_states(lambda logits, states: seen.append((logits.shape[0], states.shape)))
    SpeculativeDecoder(llama, router, policy=FixedPolicy(max_draft_tokens=3)).generate(
        PROMPT, max_new_tokens=30
    )
    assert seen and all(shape == (rows, router.state_size) for rows, shape in seen)
    with pytest.raises(ValueError, match="no hidden states behind its drafts"):
        route({"ngram": NgramDrafter()}).expose_states(print)

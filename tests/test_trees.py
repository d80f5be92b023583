"""Draft trees: one target forward with a tree mask, KV compaction, greedy identity for every
drafter kind, and the dynamic tree's construction."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from conftest import greedy_reference, perturbed_copy, tiny_model
from head_helpers import HEADS, build_head

from draftsmith import FixedPolicy, SpeculativeDecoder
from draftsmith.core.attention import GROUPED_SDPA
from draftsmith.core.context import CONTEXT_SIGNAL
from draftsmith.core.ragged import RaggedTarget
from draftsmith.core.sampling import SamplingParams, greedy_tokens
from draftsmith.core.target import Target
from draftsmith.core.tree import ancestor_mask, chain_parents, tree_depths
from draftsmith.decoding import verify_greedy
from draftsmith.decoding.online import draft_signals
from draftsmith.heads import Draft, DraftModelDrafter, NgramDrafter, TreeShape
from draftsmith.heads.base import raw_acceptance
from draftsmith.heads.tree import DynamicTree

# Rows of a tree block: 0 continues the cache; 1, 2 continue 0; 3 continues 1; 4 continues 2.
PARENTS = torch.tensor([-1, 0, 0, 1, 2])
TOKENS = torch.tensor([17, 3, 99, 250, 42])


def test_tree_mask_and_positions():
    mask = ancestor_mask(PARENTS)
    assert mask.tolist()[3] == [True, True, False, True, False]
    assert mask.tolist()[4] == [True, False, True, False, True]
    assert tree_depths(PARENTS).tolist() == [0, 1, 1, 2, 2]


def _fresh_logits(model, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids])).logits[0, -1]


def _after_prompt(model, prompt: list[int]) -> RaggedTarget:
    """A one-row target that has cached prompt."""
    target = RaggedTarget(model)
    target.extend([torch.tensor(prompt)], [chain_parents(len(prompt))])
    target.keep([range(len(prompt))])
    return target


@pytest.mark.parametrize("implementation", ["eager", "sdpa", GROUPED_SDPA])
def test_one_tree_forward_equals_each_branch_run_alone(implementation):
    model = tiny_model("llama", seed=0, attn_implementation=implementation)
    prompt = [5, 6, 7, 8]
    target = _after_prompt(model, prompt)
    logits = target.extend([TOKENS], [PARENTS])[0][0]
    for row in range(len(TOKENS)):
        path = [row]
        while PARENTS[path[0]] >= 0:
            path.insert(0, int(PARENTS[path[0]]))
        expected = _fresh_logits(model, prompt + TOKENS[path].tolist())
        torch.testing.assert_close(logits[row], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("implementation", ["eager", "sdpa", GROUPED_SDPA])
def test_one_sequences_tree_forward_is_a_one_row_batchs(implementation):
    """`Target.extend_tree` passes the mask and positions a one-row `RaggedTarget` builds for the
    same tree after the same cache: the same logits, bit for bit, and the block cached."""
    model = tiny_model("llama", seed=0, attn_implementation=implementation)
    prompt = [5, 6, 7, 8]
    target = Target(model)
    target.extend(torch.tensor(prompt))
    logits, _ = target.extend_tree(TOKENS, PARENTS)
    batched = _after_prompt(model, prompt).extend([TOKENS], [PARENTS])[0][0]
    torch.testing.assert_close(logits, batched, rtol=0, atol=0)
    assert target.length == len(prompt) + len(TOKENS)


def test_an_attention_that_ignores_the_mask_is_refused(llama):
    target = _after_prompt(llama, [1, 2, 3])
    llama.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ValueError, match="does not apply a draft tree's"):
            target.extend([TOKENS], [PARENTS])
    finally:
        llama.config._attn_implementation = "sdpa"


def test_kv_compaction_equals_a_fresh_prefill(llama):
    prompt = [5, 6, 7, 8]
    target = _after_prompt(llama, prompt)
    target.extend([TOKENS], [PARENTS])
    # Keep the block's rows 0, 2, 4: the path 17 -> 99 -> 42.
    target.keep([[0, 2, 4]])
    assert target.lengths == [len(prompt) + 3]
    logits = target.extend([torch.tensor([11])], [chain_parents(1)])[0][0]
    fresh = Target(llama)
    expected, _ = fresh.extend(torch.tensor(prompt + [17, 99, 42, 11]))
    torch.testing.assert_close(logits[-1], expected[-1], rtol=1e-4, atol=1e-4)
    for kept, ref in zip(target.target.cache.layers, fresh.cache.layers, strict=True):
        torch.testing.assert_close(kept.keys, ref.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(kept.values, ref.values, rtol=1e-4, atol=1e-5)


def test_greedy_tree_verification_takes_the_longest_matching_path():
    # Nodes: 0 (a) <- root, 1 (b) <- root, 2 (c) <- 1, 3 (d) <- 1, 4 (e) <- 3.
    draft = Draft(
        tokens=torch.tensor([10, 11, 12, 13, 14]), parents=torch.tensor([-1, -1, 1, 1, 3])
    )
    argmax = torch.tensor([11, 0, 13, 0, 14, 7])  # after root, node 0 .. node 4
    logits = torch.nn.functional.one_hot(argmax, 32).float()
    assert verify_greedy(logits, draft) == ([1, 3, 4], 7)
    argmax[0] = 10  # the root now wants node 0, a leaf
    logits = torch.nn.functional.one_hot(argmax, 32).float()
    assert verify_greedy(logits, draft) == ([0], 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_tokens_break_ties_as_argmax_does(dtype):
    """bf16 logits tie often; greedy identity with `generate` needs argmax's first index."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 3, (64, 1000), generator=generator).to(dtype)  # many ties a row
    assert torch.equal(greedy_tokens(logits), logits.argmax(-1))
    assert torch.equal(greedy_tokens(logits.float()), logits.float().argmax(-1))


def test_dynamic_tree_values_budget_and_closure():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])

    def expand(nodes):
        return probs.log().expand(len(nodes), -1)

    tree = DynamicTree(TreeShape(top_k=2, depth=3, total_tokens=5), raw_acceptance)
    draft = tree.grow(probs.log(), expand)
    assert len(draft) == 5
    # Depth 1: 0.5, 0.3; depth 2 under both: .25 .15 .15 .09; depth 3 under the best two.
    assert sorted(draft.values.tolist(), reverse=True) == pytest.approx(
        [0.5, 0.3, 0.25, 0.15, 0.15]
    )
    for node in range(len(draft)):
        parent = int(draft.parents[node])
        assert parent < node
        if parent >= 0:
            assert draft.values[node] <= draft.values[parent]
    siblings = {}
    for node in range(len(draft)):
        siblings.setdefault(int(draft.parents[node]), []).append(int(draft.tokens[node]))
    assert all(len(set(t)) == len(t) for t in siblings.values())
    assert draft.logits.shape == (5, 4)


def test_a_calibrated_tree_values_its_top_1_children_calibrated_and_runners_up_raw():
    """With a calibrated acceptance a of the top-1 token, the top-1 child is worth a and a
    runner-up its draft probability q_j, each times its parent's value."""
    probs = torch.tensor([0.8, 0.1, 0.06, 0.04])

    def expand(nodes):
        return probs.log().expand(len(nodes), -1)

    shape = TreeShape(top_k=3, depth=2, expand=1)
    calibrated = DynamicTree(shape, lambda signals: torch.full_like(signals["top1_prob"], 0.6))
    draft = calibrated.grow(probs.log(), expand)
    depth1 = draft.children(-1)
    assert draft.values[depth1].tolist() == pytest.approx([0.6, 0.1, 0.06])
    under = draft.children(depth1[0])
    assert draft.values[under].tolist() == pytest.approx([0.36, 0.06, 0.036])
    raw = DynamicTree(shape, raw_acceptance).grow(probs.log(), expand)
    assert raw.values[raw.children(-1)].tolist() == pytest.approx([0.8, 0.1, 0.06])


def test_a_tree_expanding_one_node_a_depth_is_a_chain_with_sibling_leaves():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    expanded = []

    def expand(nodes):
        expanded.append(list(nodes))
        return probs.log().expand(len(nodes), -1)

    shape = TreeShape(top_k=3, depth=4, expand=1)
    assert shape.max_tokens == 3 + 3 * 3
    draft = DynamicTree(shape, raw_acceptance).grow(probs.log(), expand)
    assert len(draft) == 12
    assert all(len(nodes) == 1 for nodes in expanded)  # one drafter row a depth, as a chain
    spine = [-1]
    for depth in range(1, 5):
        children = draft.children(spine[-1])
        assert draft.tokens[children].tolist() == [0, 1, 2]  # the top 3 of each prediction
        assert all(int(d) == depth for d in draft.depths[children])
        spine.append(children[0])  # the most valuable child is the one expanded
    assert len(expanded) == 3


def test_tree_shape_expand_must_fit_top_k():
    with pytest.raises(ValueError, match="expand must be in"):
        TreeShape(top_k=2, depth=3, expand=3)
    with pytest.raises(ValueError, match="expand must be in"):
        TreeShape(top_k=2, depth=3, expand=0)
    assert TreeShape(top_k=4, depth=3, expand=2).narrowed(3) == TreeShape(3, 3, None, 2)
    assert TreeShape(top_k=4, depth=3, expand=2).narrowed(1) == TreeShape(1, 3)
    assert TreeShape(top_k=4, depth=3).narrowed(3, expand=1) == TreeShape(3, 3, None, 1)
    assert TreeShape(top_k=4, depth=3).narrowed(3, expand=5) == TreeShape(3, 3)
    assert TreeShape(top_k=4, depth=3, expand=1).capped(2).expand == 1


def test_a_tree_over_a_reduced_vocabulary_is_grown_on_its_support_alike():
    """A drafter over a reduced vocabulary gives the tree its logits on those columns only
    (`DynamicTree.support`): the same tree, values, confidence signals and draft logits as its
    logits on the whole vocabulary, -inf elsewhere, give."""
    support = torch.tensor([7, 2, 11, 5, 13])
    rows = torch.Generator().manual_seed(0)

    def logits(count: int) -> torch.Tensor:
        full = torch.full((count, 16), float("-inf"))
        full[:, support] = torch.randn(count, len(support), generator=rows) * 2
        return full

    seen = []  # per tree, the signals each depth was ranked on

    def by_entropy(signals):  # reads the signals a calibrator may read
        seen[-1].append({name: value.clone() for name, value in signals.items()})
        return signals["top1_prob"] * signals["margin"] * (-signals["entropy"]).exp()

    expansions = [logits(1)] + [logits(3) for _ in range(3)]
    shape = TreeShape(top_k=3, depth=4, total_tokens=10)
    drafts = []
    for given in (None, support):
        seen.append([])
        columns = expansions if given is None else [e[:, support] for e in expansions]
        steps = iter(columns[1:])
        tree = DynamicTree(shape, by_entropy, support=given, vocab_size=16)
        drafts.append(tree.grow(columns[0][0], lambda nodes, steps=steps: next(steps)))
    for whole_depth, reduced_depth in zip(*seen, strict=True):
        for name, value in whole_depth.items():
            torch.testing.assert_close(reduced_depth[name], value, msg=name)
    whole, reduced = drafts
    assert torch.equal(whole.tokens, reduced.tokens) and torch.equal(whole.parents, reduced.parents)
    assert set(reduced.tokens.tolist()) <= set(support.tolist())
    assert reduced.values.tolist() == pytest.approx(whole.values.tolist())
    assert reduced.support is support and whole.support is None
    assert torch.equal(reduced.logits, whole.logits)  # on the target's columns, -inf elsewhere
    for name, value in draft_signals(reduced).items():
        assert value.tolist() == pytest.approx(draft_signals(whole)[name].tolist()), name
    with pytest.raises(ValueError, match="vocab_size"):
        DynamicTree(shape, by_entropy, support=support)


@pytest.mark.parametrize(
    "shape", [TreeShape(top_k=3, depth=4, total_tokens=9), TreeShape(top_k=3, depth=4, expand=1)]
)
@pytest.mark.parametrize("support", [None, torch.tensor([7, 2, 11, 5, 13, 0])])
def test_a_tree_keeps_the_signals_it_was_ranked_on(shape, support):
    """A grown tree keeps each node's confidence signals and whether it is its parent's top-1
    child (`Draft.signals`, `Draft.top1`): what its logits give, through pruning too, so the
    online recalibration recomputes nothing."""
    columns = support if support is not None else torch.arange(16)
    rows = torch.Generator().manual_seed(1)

    def expand(nodes):
        return torch.randn(len(nodes), len(columns), generator=rows) * 2

    tree = DynamicTree(shape, raw_acceptance, support=support, vocab_size=16)
    draft = tree.grow(expand([-1])[0], expand)
    for kept in (draft, draft.pruned(5)):
        recomputed = draft_signals(replace(kept, signals=None, top1=None))
        # Without a context no node repeats it; the logits alone do not say.
        assert set(kept.signals) == {*recomputed, CONTEXT_SIGNAL}
        assert kept.signals[CONTEXT_SIGNAL].eq(0).all()
        for name, value in recomputed.items():
            torch.testing.assert_close(kept.signals[name], value, msg=name)
        own = kept.logits.gather(1, kept.tokens[:, None]).squeeze(1)
        assert kept.top1.tolist() == (own == kept.logits.max(-1).values).tolist()
    assert draft.top1.any() and not draft.top1.all()


def _sampled_tree(seed: int, shape: TreeShape):
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    tree = DynamicTree(
        shape,
        raw_acceptance,
        sampling=SamplingParams(temperature=1.0),
        generator=torch.Generator().manual_seed(seed),
    )
    return tree.grow(probs.log(), lambda nodes: probs.log().expand(len(nodes), -1)), probs


def test_a_sampled_tree_draws_children_without_replacement_and_records_their_q():
    shape = TreeShape(top_k=3, depth=3, total_tokens=7)
    drafts = [_sampled_tree(seed, shape) for seed in range(20)]
    for draft, q in drafts:
        assert len(draft) == 7  # the budget, spent as the tree grew
        for node in range(len(draft)):
            elders = [
                s for s in draft.children(int(draft.parents[node])) if s < node
            ]  # drawn before it
            expected = q.clone()
            expected[draft.tokens[elders]] = 0
            assert torch.allclose(draft.probs[node], expected / expected.sum())
            assert int(draft.tokens[node]) not in draft.tokens[elders].tolist()
    # The draws differ between seeds; which places the tree holds and their values do not
    # (a node's value is its rank's, never its own token's).
    assert len({tuple(d.tokens.tolist()) for d, _ in drafts}) > 1
    assert len({(tuple(d.parents.tolist()), tuple(d.values.tolist())) for d, _ in drafts}) == 1


def test_sampled_children_follow_the_draft_distribution_in_draw_order():
    """The first child of the root is a draw from q, the second from q without the first."""
    shape = TreeShape(top_k=2, depth=1)
    first, second = Counter(), Counter()
    for seed in range(4000):
        draft, q = _sampled_tree(seed, shape)
        first[int(draft.tokens[0])] += 1
        second[(int(draft.tokens[0]), int(draft.tokens[1]))] += 1
    for token, count in first.items():
        assert count / 4000 == pytest.approx(float(q[token]), abs=0.03)
    # P(second = 1 | first = 0) = 0.3 / 0.5
    assert second[(0, 1)] / first[0] == pytest.approx(0.6, abs=0.04)


def test_a_tree_stops_growing_where_its_stop_rule_says():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    expanded, seen = [], []

    def expand(nodes):
        expanded.append(len(nodes))
        return probs.log().expand(len(nodes), -1)

    def stop(depth, nodes):
        seen.append((depth, list(nodes.depths)))
        return depth == 2

    tree = DynamicTree(TreeShape(top_k=2, depth=5), raw_acceptance, stop)
    draft = tree.grow(probs.log(), expand)
    # Asked after depth 1 (two nodes) and depth 2 (four more); one expansion between.
    assert seen == [(1, [1, 1]), (2, [1, 1, 2, 2, 2, 2])]
    assert expanded == [2]
    assert int(draft.depths.max()) == 2


def test_ngram_branches_follow_several_earlier_occurrences():
    drafter = NgramDrafter(max_ngram=2)
    # "1 2" occurred twice before: followed by 3 4 and, earlier, by 5 6.
    drafter.start(torch.tensor([1, 2, 5, 6, 9, 1, 2, 3, 4, 9, 1, 2]))
    draft = drafter.propose(TreeShape(top_k=2, depth=2, total_tokens=4), None)
    assert draft.tokens.tolist() == [3, 4, 5, 6]
    assert draft.parents.tolist() == [-1, 0, -1, 2]
    chain = drafter.propose(2, None)
    assert chain.tokens.tolist() == [3, 4] and chain.is_chain


TREE = TreeShape(top_k=3, depth=4, total_tokens=12)
SIBLINGS = TreeShape(top_k=3, depth=4, total_tokens=10, expand=1)
"""A chain whose tokens come with two siblings each."""


def _tree_decoder(target, drafter, tree=TREE):
    return SpeculativeDecoder(target, drafter, policy=FixedPolicy(tree=tree))


@pytest.mark.parametrize("tree", [TREE, SIBLINGS], ids=["eagle2", "siblings"])
@pytest.mark.parametrize("kind", ["perturbed", "unrelated", "ngram"])
def test_greedy_identity_with_trees(kind, tree, llama):
    drafter = {
        "perturbed": lambda: DraftModelDrafter(perturbed_copy(llama, scale=0.3)),
        "unrelated": lambda: DraftModelDrafter(tiny_model("llama", seed=7)),
        "ngram": lambda: NgramDrafter(),
    }[kind]()
    decoder = _tree_decoder(llama, drafter, tree)
    for prompt in ([9], [4, 8, 15, 16, 23, 4, 8]):
        prompt = torch.tensor(prompt)
        result = decoder.generate(prompt, max_new_tokens=24)
        assert result.tokens == greedy_reference(llama, prompt, 24)
        assert result.stats.drafted > 0


@pytest.mark.parametrize("tree", [TREE, SIBLINGS], ids=["eagle2", "siblings"])
@pytest.mark.parametrize("name", [n for n in HEADS if not n.startswith("distilled")])
def test_untrained_heads_decode_losslessly_with_trees(name, tree, llama):
    drafter = build_head(name, llama).as_drafter(llama)
    decoder = _tree_decoder(llama, drafter, tree)
    for prompt in ([9], [4, 8, 15, 16, 23]):
        prompt = torch.tensor(prompt)
        result = decoder.generate(prompt, max_new_tokens=16)
        assert result.tokens == greedy_reference(llama, prompt, 16)


def test_a_tree_accepts_more_than_a_chain_from_the_same_drafter(llama):
    draft_model = perturbed_copy(llama, scale=0.6)
    accepted = {}
    for name, policy in {
        "chain": FixedPolicy(max_draft_tokens=4),
        "tree": FixedPolicy(tree=TreeShape(top_k=4, depth=4, total_tokens=16)),
    }.items():
        decoder = SpeculativeDecoder(llama, DraftModelDrafter(draft_model), policy=policy)
        result = decoder.generate(torch.tensor([4, 8, 15, 16, 23]), max_new_tokens=48)
        accepted[name] = result.stats.mean_accepted_length
    assert accepted["tree"] > accepted["chain"]


def test_draft_model_cache_after_a_tree_round_equals_a_fresh_prefill(llama):
    draft_model = perturbed_copy(llama, scale=0.3)
    drafter = DraftModelDrafter(draft_model)
    prompt = [4, 8, 15, 16, 23]
    drafter.start(torch.tensor(prompt))
    draft = drafter.propose(TREE, SamplingParams())
    deepest = int(draft.depths.argmax())
    assert int(draft.depths[deepest]) >= 3
    accepted = draft.tokens[draft.path_to(deepest)].tolist()
    drafter.commit(torch.tensor([*accepted, 77]))
    own = drafter._own
    # The path's nodes that were expanded (all but perhaps the leaf) keep their rows.
    assert len(own) >= len(prompt) + len(accepted) - 1
    assert own.tokens == (prompt + accepted)[: len(own)]
    fresh = Target(draft_model)
    fresh.extend(torch.tensor(own.tokens))
    for kept, ref in zip(own.kv.layers, fresh.cache.layers, strict=True):
        torch.testing.assert_close(kept.keys, ref.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(kept.values, ref.values, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "name", ["medusa", "mtp", "eagle", "eagle3", "peagle", "dflash", "draft-model", "ngram"]
)
def test_every_drafter_kind_branches(name, llama):
    if name == "draft-model":
        drafter = DraftModelDrafter(perturbed_copy(llama, scale=0.3))
    elif name == "ngram":
        drafter = NgramDrafter()
    else:
        drafter = build_head(name, llama).as_drafter(llama)
    prompt = torch.tensor([4, 8, 15, 4, 8, 16, 4, 8])
    features = Target(llama, drafter.target_feature_layers).extend(prompt[:-1])[1]
    drafter.start(prompt, features)
    draft = drafter.propose(TREE, SamplingParams())
    assert int(draft.depths.max()) < len(draft) <= TREE.max_tokens  # branches, within budget


@pytest.mark.parametrize(
    "name", ["medusa", "mtp", "eagle", "eagle3", "peagle", "dflash", "draft-model"]
)
def test_every_drafter_kind_samples_its_tree(name, llama):
    """At temperature 1 each node carries the q it was drawn from (its elder siblings' tokens
    taken out), and the decoder runs sampled trees round after round."""
    if name == "draft-model":
        drafter = DraftModelDrafter(perturbed_copy(llama, scale=0.3))
    else:
        drafter = build_head(name, llama).as_drafter(llama)
    prompt = torch.tensor([4, 8, 15, 4, 8, 16, 4, 8])
    features = Target(llama, drafter.target_feature_layers).extend(prompt[:-1])[1]
    drafter.start(prompt, features)
    sampling = SamplingParams(temperature=1.0)
    draft = drafter.propose(TREE, sampling, torch.Generator().manual_seed(0))
    assert int(draft.depths.max()) < len(draft) <= TREE.max_tokens
    for node in range(len(draft)):
        elders = [s for s in draft.children(int(draft.parents[node])) if s < node]
        assert draft.probs[node, draft.tokens[node]] > 0
        assert (draft.probs[node, draft.tokens[elders]] == 0).all()
        assert float(draft.probs[node].sum()) == pytest.approx(1.0, abs=1e-5)
    result = _tree_decoder(llama, drafter).generate(prompt, 16, temperature=1.0, seed=0)
    assert len(result.tokens) == 16 and result.stats.drafted > 0

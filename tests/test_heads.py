"""Trainable heads: built from tiny Llama / Qwen2 configs, trained with the alignment convention,
drafting losslessly through the decoder, and rolling their own state back."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import greedy_reference, tiny_model
from head_helpers import HEADS, REDUCED_VOCAB, TRAIN_PROMPTS, build_head, fit, target_batch

from draftsmith import FixedPolicy, SpeculativeDecoder
from draftsmith.core.config import ConfigError, config_to_dict
from draftsmith.core.sampling import SamplingParams
from draftsmith.core.signals import confidence_signals
from draftsmith.core.target import TargetBatch
from draftsmith.heads import DraftHead, EagleConfig, MedusaConfig, build_draft_vocab, head_config
from draftsmith.heads import build_head as build_kind
from draftsmith.heads.blocks import causal_mask
from draftsmith.heads.dspark import acceptance_rate, confidence_targets
from draftsmith.heads.state import LaggedFeatures


@pytest.fixture(scope="module")
def trained():
    """Heads of every kind trained briefly on the tiny Llama, built on first use."""
    target, heads = tiny_model("llama", seed=0), {}

    def get(name: str) -> tuple[object, DraftHead]:
        if name not in heads:
            heads[name] = fit(build_head(name, target), target)
        return target, heads[name]

    return get


# -- building and training ------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("name", HEADS)
def test_forward_train_shapes_and_gradients(name, arch, llama, qwen2):
    target = {"llama": llama, "qwen2": qwen2}[arch]
    head = build_head(name, target)
    input_ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    step_logits = head.forward_train(target_batch(target, head, input_ids))
    vocab = REDUCED_VOCAB if head.draft_to_target() is not None else 256
    assert len(step_logits) == head.num_steps
    assert all(logits.shape == (2, 9, vocab) for logits in step_logits)
    loss = sum(logits.logsumexp(-1).sum() for logits in step_logits)
    auxiliary = (
        head.auxiliary_loss()
    )  # what the trainer adds: EAGLE's regression, a confidence head
    (loss if auxiliary is None else loss + auxiliary).backward()
    trainable = [(n, p) for n, p in head.named_parameters() if p.requires_grad]
    assert trainable and all(p.grad is not None for _, p in trainable), (
        "a parameter gets no gradient: " + str([n for n, p in trainable if p.grad is None])
    )
    # The target is shared, never owned: no tensor of the head is one of the target's.
    target_storage = {p.data_ptr() for p in target.parameters()}
    assert not target_storage & {t.data_ptr() for t in head.state_dict().values()}


@pytest.mark.parametrize("name", HEADS)
def test_initialisation_is_a_function_of_the_config(name, llama):
    """What lets load_drafter tell an untrained artifact: rebuilding from the head's config, as
    plain JSON-able data, gives the same weights."""
    head = build_head(name, llama)
    kind, _ = HEADS[name]
    again = build_kind(kind, llama, config_to_dict(head.config))
    assert again.config == head.config
    first, second = head.state_dict(), again.state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    if name == "distilled":
        return  # a plain copy of target layers: nothing random to seed
    other = build_kind(kind, llama, replace(head.config, seed=1))
    assert any(not torch.equal(p, first[n]) for n, p in other.state_dict().items())


def test_head_configs_name_bad_keys_and_values():
    with pytest.raises(ConfigError, match=r"'head_args.num_heads' in MedusaConfig; valid keys"):
        head_config("medusa", {"num_heads": 4})
    with pytest.raises(ConfigError, match="num_steps must be at least 2"):
        head_config("medusa", {"num_steps": 1})
    with pytest.raises(ConfigError, match="num_steps must be at least 1"):
        head_config("eagle3", {"num_steps": 0})
    with pytest.raises(ConfigError, match="head_args.num_steps must be int"):
        head_config("mtp", {"num_steps": "four"})
    with pytest.raises(ConfigError, match="must be a MedusaConfig"):
        head_config("medusa", EagleConfig())
    with pytest.raises(ValueError, match="nothing to train"):
        head_config("ngram", {})
    assert head_config("medusa", {"num_steps": 3}) == MedusaConfig(num_steps=3)


# Which inputs step k at row t reads at the latest: the token at t + k (None: no tokens; "t": the
# token at t, a block head's steps all reading the newest committed token alone) and the target
# feature at t + offset (None: no features).
READS = {
    "medusa": (None, 0),
    "medusa-reduced": (None, 0),
    "mtp": (0, -1),
    "mtp-reduced": (0, -1),
    "eagle": (0, -1),
    "eagle3": (0, -1),
    "eagle3-reduced": (0, -1),
    "peagle": ("t", -1),
    "peagle-reduced": ("t", -1),
    "dflash": ("t", -1),
    "dflash-reduced": ("t", -1),
    "dspark": (0, -1),  # each row reads the token before it
    "distilled": (0, None),
    "distilled-lora": (0, None),
}


@pytest.mark.parametrize("name", HEADS)
def test_step_k_at_t_reads_nothing_past_what_drafting_has(name, llama):
    """Causality and the alignment convention: step k at row t (predicting token t + 1 + k) sees
    tokens up to t + k (up to t for a block head, P-EAGLE, whose steps read no drafted token)
    and target features up to t - 1 (features lag the tokens: drafting never has the newest
    token's feature), or up to t for Medusa, whose head k predicts from the feature of t itself. Changing the latest input it may read changes it (the test can fail)."""
    head = build_head(name, llama)
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, 256, (1, 10), generator=gen)
    batch = target_batch(llama, head, input_ids)
    base = head.forward_train(batch)
    token_offset, feature_offset = READS[name]
    t = 4
    for k in range(head.num_steps):
        later_ids = input_ids.clone()
        later_ids[:, t + k + 1 :] = torch.randint(0, 256, (1, 10 - t - k - 1), generator=gen)
        features = batch.features
        if features is not None:
            features = features.clone()
            features[:, t + feature_offset + 1 :] += 1.0
        changed = head.forward_train(TargetBatch(later_ids, batch.loss_mask, features, None))
        torch.testing.assert_close(changed[k][:, : t + 1], base[k][:, : t + 1])

        if token_offset == "t":  # nothing drafted is read: the tokens after t change nothing
            ids = input_ids.clone()
            ids[:, t + 1 :] = (ids[:, t + 1 :] + 1) % 256
            unmoved = head.forward_train(TargetBatch(ids, batch.loss_mask, batch.features, None))
            torch.testing.assert_close(unmoved[k][:, t], base[k][:, t])
        if token_offset is not None:
            latest = t if token_offset == "t" else t + k
            ids = input_ids.clone()
            ids[:, latest] = (ids[:, latest] + 1) % 256
            moved = head.forward_train(TargetBatch(ids, batch.loss_mask, batch.features, None))
            assert not torch.allclose(moved[k][:, t], base[k][:, t])
        if feature_offset is not None:
            features = batch.features.clone()
            features[:, t + feature_offset] += 1.0
            moved = head.forward_train(TargetBatch(input_ids, batch.loss_mask, features, None))
            assert not torch.allclose(moved[k][:, t], base[k][:, t])


def test_eagle3_has_the_published_layout(llama):
    """Parameter names and shapes are the ones the EAGLE repository, speculators and the engines
    use, so a weight maps onto theirs by name."""
    head = build_head("eagle3", llama)
    hidden, kv = llama.config.hidden_size, llama.config.num_key_value_heads * 16
    shapes = {name: tuple(t.shape) for name, t in head.state_dict().items()}
    assert shapes == {
        "fc.weight": (hidden, 3 * hidden),
        "midlayer.self_attn.q_proj.weight": (hidden, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, hidden),
        "midlayer.mlp.gate_proj.weight": (128, hidden),
        "midlayer.mlp.up_proj.weight": (128, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, 128),
        "midlayer.input_layernorm.weight": (hidden,),
        "midlayer.hidden_norm.weight": (hidden,),
        "midlayer.post_attention_layernorm.weight": (hidden,),
        "norm.weight": (hidden,),
        "lm_head.weight": (256, hidden),
    }


def test_eagle3_norm_before_fc_bounds_massive_features(llama):
    """norm_before_fc: the fused feature no longer scales with the target's feature size."""
    plain = build_kind("eagle3", llama, {"feature_layers": [0, 1, 2]})
    normed = build_kind("eagle3", llama, {"feature_layers": [0, 1, 2], "norm_before_fc": True})
    assert tuple(normed.input_norm.weight.shape) == (3 * 64,)
    features = torch.randn(1, 4, 3 * 64)
    with torch.no_grad():
        torch.testing.assert_close(normed.fuse(1000 * features), normed.fuse(features))
        assert plain.fuse(1000 * features).abs().mean() > 100 * plain.fuse(features).abs().mean()


def _feature_sample(features: torch.Tensor) -> TargetBatch:
    """A batch of training rows carrying `features` (B, T, F), for `fit_to_sample`."""
    rows, length = features.shape[:2]
    return TargetBatch(
        input_ids=torch.zeros(rows, length, dtype=torch.long),
        loss_mask=torch.ones(rows, length, dtype=torch.bool),
        features=features,
        target_logits=torch.zeros(rows, length, 256),
    )


@pytest.mark.parametrize("norm_before_fc", [False, True])
def test_eagle3_fc_init_is_standardised_on_a_sample(norm_before_fc, llama):
    """Fitted on a sample with massive channels, fc's initial weights are the seeded ones divided
    by each channel's RMS (of what fc reads), so no channel dominates the fused feature."""
    args = {"feature_layers": [0, 1, 2], "norm_before_fc": norm_before_fc}
    head, fresh = build_kind("eagle3", llama, args), build_kind("eagle3", llama, args)
    features = torch.randn(2, 16, 3 * 64, generator=torch.Generator().manual_seed(0))
    features[..., [3, 70]] *= 5000.0  # massive activations
    sample = _feature_sample(features)
    with torch.no_grad():
        head.fit_to_sample(sample)
        inputs = head.input_norm(features) if norm_before_fc else features
        rms = inputs.pow(2).mean((0, 1)).sqrt()
        torch.testing.assert_close(head.fc.weight, fresh.fc.weight / rms)
        if not norm_before_fc:  # the massive channels no longer dominate the fused feature
            assert head.fuse(features).abs().max() < 0.01 * fresh.fuse(features).abs().max()
    kept = build_kind("eagle3", llama, {**args, "standardize_fc_init": False})
    kept.fit_to_sample(sample)
    assert torch.equal(kept.fc.weight, fresh.fc.weight)


@pytest.mark.parametrize("confidence_target", ["overlap", "greedy"])
def test_a_dspark_confidence_head_learns_each_rows_acceptance_rate(confidence_target, llama):
    """The confidence head's loss pulls sigmoid(its logit) toward each row's acceptance rate,
    sum_v min(p_v, q_v) (overlap) or whether the row's top token is the target's (greedy):
    fitted alone on one batch, its mean error falls well below a fresh head's."""
    head = build_kind(
        "dflash", llama, {**HEADS["dspark"][1], "confidence_target": confidence_target}
    )
    input_ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    batch = target_batch(llama, head, input_ids)

    def error() -> float:
        with torch.no_grad():
            logits, states = head.forward_states(batch)
            d2t = head.draft_to_target()
            if confidence_target == "overlap":
                rate = acceptance_rate(logits[0][:, :-1], batch.target_logits[:, :-1, d2t])
            else:
                rate = d2t[logits[0][:, :-1].argmax(-1)] == batch.target_logits[:, :-1].argmax(-1)
            predicted = head.own_acceptance().predict(states[0][:, :-1], {})
            return float((predicted - rate.float()).abs().mean())

    before = error()
    optimizer = torch.optim.Adam(head.confidence_head.parameters(), lr=0.05)
    for _ in range(100):
        head.forward_states(batch)
        optimizer.zero_grad()
        head.auxiliary_loss().backward()
        optimizer.step()
    assert error() < 0.5 * before


def test_greedy_confidence_targets_accept_the_targets_top_token_only():
    """greedy: 1 where the drafted top token, mapped to a target id, is the target's top token
    over the whole vocabulary; a target top token outside the draft vocabulary is never hit."""
    d2t = torch.tensor([0, 2, 3])  # draft ids -> target ids; target id 1 cannot be drafted
    draft = torch.tensor([[[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0]]])  # tops: 2, 3, 0
    target = torch.tensor([[[0.0, 0.0, 5.0, 0.0], [0.0, 5.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]]])
    (rates,) = confidence_targets([draft], target, d2t, "greedy")
    assert rates.tolist() == [[1.0, 0.0]]  # the last anchor drafts past the row: not judged
    (overlap,) = confidence_targets([draft], target, d2t, "overlap")
    assert overlap.shape == (1, 2) and 0 < float(overlap[0, 1]) < float(overlap[0, 0])


@pytest.mark.parametrize("markov_rank", [8, 0])
def test_a_confidence_heads_states_in_decoding_are_the_ones_it_trained_on(markov_rank, llama):
    """The states a DFlash drafter with a confidence head hands a states hook are the ones
    `forward_states` trains it on: the first drafted row's are the teacher-forced anchor's at the
    prompt's last position. Without a Markov head nothing follows the previous token, so the
    block's rows are read at once."""
    args = {"num_steps": 3, "markov_rank": markov_rank, "confidence_head": True}
    head = build_kind("dflash", llama, args)
    prompt = torch.tensor(TRAIN_PROMPTS[2])
    drafter = head.as_drafter(llama)
    assert drafter.conditions_on_previous == bool(markov_rank)
    emitted = []
    drafter.expose_states(lambda logits, states: emitted.append(states.clone()))
    SpeculativeDecoder(llama, drafter, policy=FixedPolicy(max_draft_tokens=3)).generate(
        prompt, max_new_tokens=4
    )
    with torch.no_grad():
        _, states = head.forward_states(target_batch(llama, head, prompt[None]))
    first = emitted[0][0]
    assert first.shape == (head.state_size,)
    torch.testing.assert_close(first, states[0][0, -1], atol=1e-4, rtol=1e-4)


def test_acceptance_rate_is_the_overlap_of_the_two_distributions():
    same = torch.tensor([[1.0, 2.0, 0.5]])
    assert torch.allclose(acceptance_rate(same, same), torch.ones(1))
    apart = torch.tensor([[30.0, -30.0, -30.0]]), torch.tensor([[-30.0, 30.0, -30.0]])
    assert float(acceptance_rate(*apart)) < 1e-6
    q, p = torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, float("-inf")]])
    assert torch.allclose(acceptance_rate(q, p), torch.tensor([0.5]))  # min(.5, 1) + min(.5, 0)


def test_dflash_fc_init_is_standardised_on_a_sample(llama):
    """DFlash's fc, which fuses the context every block row attends to, starts standardised as
    EAGLE-3's does: with massive channels in the sample, the fused context still varies from
    position to position instead of being one massive direction."""
    args = {"feature_layers": [0, 1, 2], "num_steps": 3}
    head, fresh = build_kind("dflash", llama, args), build_kind("dflash", llama, args)
    features = torch.randn(2, 16, 3 * 64, generator=torch.Generator().manual_seed(0))
    features[..., [3, 70]] += 5000.0  # massive activations, nearly the same at every position
    sample = _feature_sample(features)
    head.fit_to_sample(sample)
    with torch.no_grad():
        torch.testing.assert_close(
            head.fc.weight, fresh.fc.weight / features.pow(2).mean((0, 1)).sqrt()
        )

        def spread(h) -> float:  # how much the normed context differs between positions
            return h.hidden_norm(h.fc(features)).std(dim=1).mean().item()

        assert spread(head) > 5 * spread(fresh)
    kept = build_kind("dflash", llama, {**args, "standardize_fc_init": False})
    kept.fit_to_sample(sample)
    assert torch.equal(kept.fc.weight, fresh.fc.weight)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def test_eagle3_layer_computes_the_published_formula(llama):
    """The layer against the EAGLE-3 formula written out here by hand: attention over
    [input_layernorm(embeds) ; hidden_norm(hidden)], residual from the un-normalised hidden, then
    post_attention_layernorm and the SwiGLU MLP; logits lm_head(norm(h))."""
    head = build_head("eagle3", llama)
    layer, eps = head.midlayer, llama.config.rms_norm_eps
    gen = torch.Generator().manual_seed(0)
    hidden, embeds = torch.randn(1, 5, 64, generator=gen), torch.randn(1, 5, 64, generator=gen)
    positions = torch.arange(3, 8)
    with torch.no_grad():
        got = layer(hidden, embeds, positions, mask=causal_mask(5))
        attn = layer.self_attn
        both = torch.cat(
            [
                _rms(embeds, layer.input_layernorm.weight, eps),
                _rms(hidden, layer.hidden_norm.weight, eps),
            ],
            dim=-1,
        )
        heads = lambda x: x.view(1, 5, -1, 16).transpose(1, 2)  # noqa: E731
        q, k, v = heads(attn.q_proj(both)), heads(attn.k_proj(both)), heads(attn.v_proj(both))
        cos, sin = layer.rotary(hidden, positions[None])
        q, k = _rotate(q, cos[:, None], sin[:, None]), _rotate(k, cos[:, None], sin[:, None])
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        scores = (q @ k.transpose(-1, -2) / 4.0).masked_fill(~causal_mask(5), float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        h = hidden + attn.o_proj((weights @ v).transpose(1, 2).reshape(1, 5, 64))
        mlp = layer.mlp
        x = _rms(h, layer.post_attention_layernorm.weight, eps)
        want = h + mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        logits = head.lm_head(_rms(want, head.norm.weight, eps))
        torch.testing.assert_close(head.logits(got), logits, rtol=1e-5, atol=1e-5)


def test_eagle3_training_time_test_unrolls_on_its_own_outputs(llama):
    """Step 1 at row t must not read the target feature of position t (drafting does not have
    it), yet must depend on step 0's output there: it consumes the head's own prediction."""
    head = build_head("eagle3", llama)
    input_ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(2))
    batch = target_batch(llama, head, input_ids)
    base = head.forward_train(batch)
    t = 3
    with torch.no_grad():
        head.midlayer.mlp.down_proj.weight.mul_(1.5)  # changes step 0's outputs
    reweighted = head.forward_train(batch)
    assert not torch.allclose(reweighted[1][:, t], base[1][:, t])
    # Step 0 at row t + 1 reads feature t; step 1 at row t stands for the same draft position
    # and must not.
    with torch.no_grad():
        head.midlayer.mlp.down_proj.weight.div_(1.5)
    features = batch.features.clone()
    features[:, t] += 1.0
    moved = head.forward_train(TargetBatch(input_ids, batch.loss_mask, features, None))
    assert not torch.allclose(moved[0][:, t + 1], base[0][:, t + 1])
    torch.testing.assert_close(moved[1][:, t], base[1][:, t])


@pytest.mark.parametrize("name", HEADS)
def test_drafting_computes_what_training_scored(name, llama):
    """The drafter's logits for draft token j equal forward_train's step j at the newest
    committed row, teacher-forced on the drafted tokens: training and drafting agree on the
    alignment (for Medusa the row is the one before, whose feature drafting reads)."""
    head = build_head(name, llama)
    prompt = torch.tensor([7, 1, 99, 23, 5, 64])
    drafter = head.as_drafter(llama)
    features = target_batch(llama, head, prompt[None]).features
    drafter.start(prompt, None if features is None else features[0, :-1])
    draft = drafter.propose(4, SamplingParams())
    assert len(draft) >= 1
    sequence = torch.cat([prompt, draft.tokens])[None]
    step_logits = head.forward_train(target_batch(llama, head, sequence))
    d2t = head.draft_to_target()
    newest = prompt.numel() - 1
    medusa = head.kind == "medusa"
    steps = head.num_steps - 1 if medusa else head.num_steps
    for j in range(min(len(draft), steps)):
        step, row = (j + 1, newest - 1) if medusa else (j, newest)
        expected = step_logits[step][0, row]
        got = draft.logits[j] if d2t is None else draft.logits[j, d2t]
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


# -- decoding -------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("name", HEADS)
def test_untrained_heads_decode_losslessly(name, arch, llama, qwen2):
    target = {"llama": llama, "qwen2": qwen2}[arch]
    drafter = build_head(name, target).as_drafter(target)
    drafted = accepted = 0
    for prompt, draft_len in (([9], 3), ([4, 8, 15, 16, 23], 5)):
        prompt = torch.tensor(prompt)
        decoder = SpeculativeDecoder(
            target, drafter, policy=FixedPolicy(max_draft_tokens=draft_len)
        )
        result = decoder.generate(prompt, max_new_tokens=16)
        assert result.tokens == greedy_reference(target, prompt, 16)
        drafted += result.stats.drafted
        accepted += result.stats.accepted
        sampled = decoder.generate(prompt, max_new_tokens=16, temperature=0.8, top_k=50, seed=0)
        assert len(sampled.tokens) == 16
    assert drafted > 0 and accepted < drafted  # drafts were made and rejected


@pytest.mark.parametrize("name", HEADS)
def test_trained_heads_accept_partially_and_stay_lossless(name, trained):
    target, head = trained(name)
    drafter = head.as_drafter(target)
    decoder = SpeculativeDecoder(target, drafter, policy=FixedPolicy(max_draft_tokens=3))
    drafted = accepted = 0
    for prompt in [*TRAIN_PROMPTS, [9, 9, 9]]:
        prompt = torch.tensor(prompt)
        result = decoder.generate(prompt, max_new_tokens=24)
        assert result.tokens == greedy_reference(target, prompt, 24)
        drafted += result.stats.drafted
        accepted += result.stats.accepted
    assert 0 < accepted < drafted


def _assert_rows_equal(cache, fresh, rows: int) -> None:
    for layer, fresh_layer in zip(cache.layers, fresh.layers, strict=True):
        assert layer.keys.shape[-2] == rows
        torch.testing.assert_close(
            layer.keys, fresh_layer.keys[..., :rows, :], atol=1e-5, rtol=1e-4
        )
        torch.testing.assert_close(
            layer.values, fresh_layer.values[..., :rows, :], atol=1e-5, rtol=1e-4
        )


@pytest.mark.parametrize("name", ["eagle", "eagle3", "peagle", "mtp", "distilled"])
def test_own_cache_after_decoding_equals_a_fresh_prefill(name, trained):
    """After rounds with rejections, the rows a drafter kept are exactly what a fresh drafter
    computes from the committed tokens and the target's features."""
    target, head = trained(name)
    drafter = head.as_drafter(target)
    prompt = [40, 41]  # near a training path: partly accepted
    decoder = SpeculativeDecoder(target, drafter, policy=FixedPolicy(max_draft_tokens=3))
    result = decoder.generate(prompt, max_new_tokens=20)
    assert 0 < result.stats.accepted < result.stats.drafted
    committed = torch.tensor(prompt + result.tokens)

    fresh = head.as_drafter(target)
    features = target_batch(target, head, committed[None]).features
    fresh.start(committed, None if features is None else features[0, :-1])
    fresh.propose(3, SamplingParams())  # runs every committed row (and drafts)
    if name == "mtp":
        pairs = list(zip(drafter._depths, fresh._depths, strict=True))
    else:
        pairs = [(drafter._own, fresh._own)]
    for k, (own, fresh_own) in enumerate(pairs):  # module k's row q read token q + k
        assert len(own) > 0 and own.tokens == committed[k : k + len(own)].tolist()
        _assert_rows_equal(own.kv, fresh_own.kv, len(own))


def test_dflash_context_after_decoding_equals_a_fresh_one(trained):
    """A DFlash drafter's context grows round by round from the features each commit brings:
    after rounds with rejections it holds exactly what a fresh drafter computes from the
    committed tokens' features, every position before the newest token and no other."""
    target, head = trained("dflash")
    drafter = head.as_drafter(target)
    decoder = SpeculativeDecoder(target, drafter, policy=FixedPolicy(max_draft_tokens=3))
    result = decoder.generate([40, 41], max_new_tokens=20)
    assert 0 < result.stats.accepted < result.stats.drafted
    committed = torch.tensor([40, 41, *result.tokens])
    drafter.propose(3, SamplingParams())  # takes in the last round's features

    fresh = head.as_drafter(target)
    features = target_batch(target, head, committed[None]).features
    fresh.start(committed, features[0, :-1])
    fresh.propose(3, SamplingParams())
    for (keys, values), (fresh_keys, fresh_values) in zip(
        drafter._context, fresh._context, strict=True
    ):
        assert keys.shape[2] == committed.numel() - 1
        torch.testing.assert_close(keys, fresh_keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(values, fresh_values, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", HEADS)
def test_stop_callback_and_draft_caps(name, llama):
    head = build_head(name, llama)
    drafter = head.as_drafter(llama)
    prompt = torch.tensor([3, 1, 4, 1, 5])
    features = target_batch(llama, head, prompt[None]).features
    drafter.start(prompt, None if features is None else features[0, :-1])
    seen = []

    def stop(position, logits, context_match):
        seen.append((position, logits))
        return position == 1

    draft = drafter.propose(6, SamplingParams(), stop=stop)
    assert len(draft) == 2
    # The stop rule reads the draft distribution's support (a reduced vocabulary's columns),
    # whose confidence signals are the whole distribution's.
    support = 256 if draft.support is None else len(draft.support)
    assert [(p, tuple(logits.shape)) for p, logits in seen] == [(0, (support,)), (1, (support,))]
    read = confidence_signals(torch.stack([logits for _, logits in seen]))
    whole = confidence_signals(draft.logits)
    for name in ("top1_prob", "margin", "entropy"):
        torch.testing.assert_close(read[name], whole[name])
    # K - 1 Medusa heads after head 0, K MTP modules, a block of K for P-EAGLE and DFlash
    cap = {"medusa": head.num_steps - 1, "mtp": head.num_steps}
    cap |= {kind: head.num_steps for kind in ("peagle", "dflash")}
    cap = cap.get(head.kind, 6)
    assert len(drafter.propose(6, SamplingParams())) == cap
    assert len(drafter.propose(0, SamplingParams())) == 0


# -- reduced draft vocabulary ---------------------------------------------------------------------


def test_build_draft_vocab_round_trip():
    counts = torch.tensor([5, 0, 9, 9, 1, 7, 0, 2])
    d2t, t2d = build_draft_vocab(counts, 4)
    assert d2t.tolist() == [0, 2, 3, 5]  # the four most frequent, in target-id order
    assert torch.equal(t2d[d2t], torch.arange(4))
    assert t2d.tolist() == [0, -1, 1, 2, -1, 3, -1, -1]
    assert build_draft_vocab(torch.tensor([3, 3, 3]), 2)[0].tolist() == [0, 1]  # ties: lower ids
    with pytest.raises(ValueError, match="draft vocabulary size"):
        build_draft_vocab(counts, 9)


def test_set_draft_vocab_rejects_maps_that_are_not_inverse(llama):
    head = build_head("eagle3-reduced", llama)
    d2t, t2d = build_draft_vocab(torch.arange(256), REDUCED_VOCAB)
    with pytest.raises(ValueError, match="not inverse"):
        head.set_draft_vocab(d2t, t2d.roll(1))
    head.set_draft_vocab(d2t, t2d)
    assert torch.equal(head.draft_to_target(), d2t)


@pytest.mark.parametrize("name", ["medusa-reduced", "mtp-reduced", "dflash-reduced"])
def test_shared_lm_head_heads_score_the_draft_vocabulary_rows(name, llama):
    """A head sharing the target's LM head over a reduced vocabulary gives exactly the full head's
    logits at the draft vocabulary's target ids."""
    reduced = build_head(name, llama)
    full = build_kind(reduced.kind, llama, replace(reduced.config, draft_vocab_size=None))
    input_ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(3))
    batch = target_batch(llama, full, input_ids)
    reduced.forward_train(batch)  # gathers (and keeps) the placeholder vocabulary's rows
    d2t, t2d = build_draft_vocab(torch.arange(256), REDUCED_VOCAB)  # ids 192 .. 255
    reduced.set_draft_vocab(d2t, t2d)
    with torch.inference_mode():  # as drafting does: training afterwards must still backpropagate
        step_logits = reduced.forward_train(batch)
    for got, expected in zip(step_logits, full.forward_train(batch), strict=True):
        torch.testing.assert_close(got, expected[..., d2t])
    sum(logits.sum() for logits in reduced.forward_train(batch)).backward()
    reduced.set_draft_vocab(*build_draft_vocab(-torch.arange(256), REDUCED_VOCAB))  # ids 0 .. 63
    for got, expected in zip(reduced.forward_train(batch), full.forward_train(batch), strict=True):
        torch.testing.assert_close(got, expected[..., :REDUCED_VOCAB])


@pytest.mark.parametrize(
    "name", ["eagle3-reduced", "peagle-reduced", "dflash-reduced", "medusa-reduced", "mtp-reduced"]
)
def test_reduced_vocab_puts_q_on_the_target_vocabulary(name, trained):
    target, head = trained(name)
    d2t = head.draft_to_target()
    outside = torch.ones(256, dtype=torch.bool)
    outside[d2t] = False
    drafter = head.as_drafter(target)
    prompt = torch.tensor(TRAIN_PROMPTS[0])
    features = target_batch(target, head, prompt[None]).features
    drafter.start(prompt, features[0, :-1])
    sampling = SamplingParams(temperature=1.0)
    draft = drafter.propose(3, sampling, torch.Generator().manual_seed(0))
    assert draft.probs.shape == (len(draft), 256)
    assert torch.all(draft.probs[:, outside] == 0)
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(len(draft)))
    assert torch.isin(draft.tokens, d2t).all()
    assert torch.all(draft.logits[:, outside] == float("-inf"))


def test_lagged_features_keep_every_committed_rows_feature_through_growth_and_release():
    """Rows appended a round at a time (past the buffer's first size, and in a new dtype) read
    back what a list of them holds; released rows are refused."""
    features = LaggedFeatures(3)
    prompt = torch.randn(4, 3)
    features.start(prompt, 5)
    held = [torch.zeros(3), *prompt]
    for size in (1, 3, 70, 2, 130):
        new = torch.randn(size, 3)
        features.append(new, size)
        held.extend(new)
        if size == 3:
            features.release(len(held) - 2)
    features.append(torch.randn(2, 3).double(), 2)
    assert len(features) == len(held) + 2
    torch.testing.assert_close(features.rows(10, len(held)), torch.stack(held[10:]).double())
    assert features.rows(len(held), len(held) + 2).dtype == torch.float64
    with pytest.raises(IndexError, match="outside"):
        features.rows(6, 8)  # released after the second round
    with pytest.raises(ValueError, match="commit needs"):
        features.append(torch.randn(1, 3), 2)


def test_peagle_mask_feature_starts_at_the_samples_mean_feature(llama):
    """fit_to_sample: the unknown feature of a mask row starts as the average one (after
    EAGLE-3's fc initialisation), so the mask rows start on the scale fc was fitted to."""
    head = build_head("peagle", llama)
    input_ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    sample = target_batch(llama, head, input_ids)
    fresh = head.mask_hidden.detach().clone()
    head.fit_to_sample(sample)
    torch.testing.assert_close(head.mask_hidden.detach(), sample.features.mean((0, 1)))
    assert not torch.allclose(head.mask_hidden.detach(), fresh)

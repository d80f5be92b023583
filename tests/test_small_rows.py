"""Linear layers for a few rows on a prepacked weight (`draftsmith.core.small_rows`)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import greedy_reference, perturbed_copy, tiny_model
from head_helpers import build_head
from torch import nn

from draftsmith import FixedPolicy, SpeculativeDecoder
from draftsmith.core import small_rows as small_rows_module
from draftsmith.core.small_rows import MAX_ROWS, SmallRowsLinear, small_rows
from draftsmith.heads import DraftModelDrafter


@pytest.fixture(autouse=True)
def enabled(monkeypatch):
    """As on x86 builds of torch (DRAFTSMITH_SMALL_ROWS unset)."""
    monkeypatch.setattr(small_rows_module, "ENABLED", True)


@pytest.mark.parametrize("rows", [1, 2, 7, MAX_ROWS, MAX_ROWS + 1])
@pytest.mark.parametrize("bias", [True, False])
def test_small_rows_linear_computes_what_linear_does(rows, bias):
    torch.manual_seed(rows)
    layer = nn.Linear(48, 80, bias=bias)
    x = torch.randn(1, rows, 48)
    expected = F.linear(x, layer.weight, layer.bias)
    layer.__class__ = SmallRowsLinear
    with torch.no_grad():
        got = layer(x)
    assert got.shape == expected.shape == (1, rows, 80)
    assert got.is_contiguous()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("onednn_bf16", [True, False])
def test_small_rows_swaps_linears_within_the_block_only(monkeypatch, onednn_bf16):
    monkeypatch.setattr(small_rows_module, "_onednn_bf16", lambda: onednn_bf16)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).bfloat16(), nn.Embedding(4, 8))
    bf16_class = SmallRowsLinear if onednn_bf16 else nn.Linear
    with small_rows(model, rows=4):
        assert [type(m) for m in model] == [SmallRowsLinear, bf16_class, nn.Embedding]
        with small_rows(model, rows=4):  # nested: the outer block restores
            assert type(model[0]) is SmallRowsLinear
        assert type(model[0]) is SmallRowsLinear
    assert [type(m) for m in model] == [nn.Linear, nn.Linear, nn.Embedding]
    with pytest.raises(RuntimeError, match="inside"), small_rows(model, rows=4):
        raise RuntimeError("inside")
    assert type(model[0]) is nn.Linear


@pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="oneDNN has no bf16 kernels here"
)
@pytest.mark.parametrize("tokens", [1, 5, 24, MAX_ROWS])
def test_a_bf16_forward_on_packed_weights_gives_the_plain_forwards_bits(tokens):
    model = tiny_model().bfloat16().eval()
    ids = torch.randint(model.config.vocab_size, (1, tokens))
    with torch.no_grad():
        plain = model(ids).logits
        with small_rows(model, ids.numel()):
            assert type(model.lm_head) is SmallRowsLinear
            packed = model(ids).logits
    assert torch.equal(packed, plain)


def test_small_rows_leaves_many_rows_alone():
    model = nn.Sequential(nn.Linear(8, 8))
    with small_rows(model, MAX_ROWS + 1):
        assert type(model[0]) is nn.Linear


def test_a_forward_that_records_gradients_runs_f_linear():
    layer = nn.Linear(8, 8)
    layer.__class__ = SmallRowsLinear
    x = torch.randn(3, 8, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None


def test_the_packed_weight_follows_changes_of_the_weight():
    layer = nn.Linear(16, 24)
    layer.__class__ = SmallRowsLinear
    x = torch.randn(4, 16)
    with torch.no_grad():
        before = layer(x)
        layer.weight.mul_(2)  # as an optimiser step does: in place
        after = layer(x)
        torch.testing.assert_close(after - layer.bias, 2 * (before - layer.bias))
        layer.weight = nn.Parameter(torch.zeros(24, 16))  # as loading new weights does
        torch.testing.assert_close(layer(x), layer.bias.expand(4, 24))


def test_small_rows_turned_off_changes_nothing(monkeypatch):
    monkeypatch.setattr(small_rows_module, "ENABLED", False)
    model = nn.Sequential(nn.Linear(8, 8))
    with small_rows(model, rows=4):
        assert type(model[0]) is nn.Linear


def test_a_forward_under_small_rows_matches_the_plain_forward():
    model = tiny_model().eval()
    ids = torch.randint(model.config.vocab_size, (1, 6))
    with torch.no_grad():
        plain = model(ids).logits
        with small_rows(model, ids.numel()):
            assert type(model.lm_head) is SmallRowsLinear
            weight_first = model(ids).logits
    torch.testing.assert_close(weight_first, plain, rtol=1e-4, atol=1e-5)


def test_the_decoder_verifies_and_drafts_weight_first(monkeypatch):
    calls = []
    forward = SmallRowsLinear.forward
    monkeypatch.setattr(
        SmallRowsLinear, "forward", lambda self, x: calls.append(x.shape) or forward(self, x)
    )
    target = tiny_model()
    decoder = SpeculativeDecoder(
        target,
        DraftModelDrafter(perturbed_copy(target, scale=0.05)),
        policy=FixedPolicy(max_draft_tokens=4),
    )
    prompt = torch.tensor([1, 2, 3])
    assert decoder.generate(prompt, max_new_tokens=12).tokens == greedy_reference(
        target, prompt, 12
    )
    assert any(shape[-2] > 1 for shape in calls)  # multi-token blocks ran weight-first


def test_an_eagle_drafters_one_row_chain_steps_run_on_packed_weights(monkeypatch):
    """Its catch-up over the committed rows and each one-row chain step after it (the head's
    layer and its LM head) all run on the packed weights."""
    packed = []  # (layer, rows) of each packed forward
    forward = SmallRowsLinear.forward
    monkeypatch.setattr(
        SmallRowsLinear,
        "forward",
        lambda self, x: packed.append((self, x.shape[-2])) or forward(self, x),
    )
    target = tiny_model()
    head = build_head("eagle3", target).eval()
    decoder = SpeculativeDecoder(
        target, head.as_drafter(target), policy=FixedPolicy(max_draft_tokens=3)
    )
    prompt = torch.tensor([1, 2, 3])
    assert decoder.generate(prompt, max_new_tokens=12).tokens == greedy_reference(
        target, prompt, 12
    )
    one_row = {layer for layer, rows in packed if rows == 1}
    assert head.lm_head in one_row and head.fc in one_row
    assert any(layer is head.midlayer.mlp.down_proj for layer in one_row)


def test_a_decoder_and_its_draft_model_pack_their_weights_before_the_first_round(monkeypatch):
    packed = []
    reorder = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(
        small_rows_module.torch.ops.mkldnn,
        "_reorder_linear_weight",
        lambda weight: packed.append(weight.shape) or reorder(weight),
    )
    target = tiny_model()
    draft = perturbed_copy(target, scale=0.05)
    linears = [m for model in (target, draft) for m in model.modules() if type(m) is nn.Linear]
    SpeculativeDecoder(target, DraftModelDrafter(draft))
    assert len(packed) == len(linears)
    with torch.no_grad(), small_rows(target, rows=2), small_rows(draft, rows=2):
        target(torch.tensor([[1, 2]]))
        draft(torch.tensor([[1, 2]]))
    assert len(packed) == len(linears)  # the forwards found every weight packed


def test_the_decoder_finds_the_targets_layers_once_per_generation(monkeypatch):
    """Finding the layers to swap costs about 0.15 ms for a 30-layer target: once per
    generation, not per round (a nested block returns at once)."""
    walked = []
    linears = small_rows_module._linears
    monkeypatch.setattr(small_rows_module, "_linears", lambda m: walked.append(m) or linears(m))
    target = tiny_model()
    decoder = SpeculativeDecoder(
        target,
        DraftModelDrafter(perturbed_copy(target, scale=0.05)),
        policy=FixedPolicy(max_draft_tokens=2),
    )
    walked.clear()  # the decoder's prepack
    out = decoder.generate(torch.tensor([1, 2, 3]), max_new_tokens=12)
    assert out.stats.target_forwards > 2
    assert sum(m is target for m in walked) == 1
    drafter_model = decoder.drafter.model
    assert sum(m is drafter_model for m in walked) <= out.stats.target_forwards + 1
    walked.clear()  # a batch: the draft model drafts every row's chain in one forward a step
    batch = decoder.generate_batch([torch.tensor([1, 2, 3]), torch.tensor([4, 5])], 12)
    assert sum(m is target for m in walked) == 1
    rounds = max(row.stats.target_forwards for row in batch)
    assert sum(m is drafter_model for m in walked) <= rounds + 1

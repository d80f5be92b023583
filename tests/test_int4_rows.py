"""A drafter's linear layers on 4-bit weights (`draftsmith.core.int4_rows`)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import greedy_reference, perturbed_copy, tiny_model
from head_helpers import HEADS, build_head
from torch import nn

from draftsmith import CostAwarePolicy, FixedPolicy, SpeculativeDecoder
from draftsmith.core import int4_rows
from draftsmith.core.int4_rows import GROUP_SIZE, MAX_ROWS, Int4RowsLinear
from draftsmith.heads import DraftModelDrafter, TreeShape
from draftsmith.heads.blocks import int4_target_lm_head

pytestmark = pytest.mark.skipif(
    not int4_rows.available(nn.Linear(32, 16).bfloat16()), reason="torch has no int4 CPU kernel"
)


def _quantized_layer(weight: torch.Tensor, bias: bool = False) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias).bfloat16()
    with torch.no_grad():
        layer.weight.copy_(weight)
    int4_rows.quantize(layer)
    return layer


def test_a_weight_on_a_4_bit_grid_per_group_is_kept_as_it_is():
    """The zoo's models come as GGUF Q4_K: 16 evenly spaced levels per group of 32 inputs."""
    out_features, in_features = 48, 4 * GROUP_SIZE
    gen = torch.Generator().manual_seed(0)
    groups = (out_features, in_features // GROUP_SIZE, 1)
    step = torch.rand(groups, generator=gen).bfloat16().float() / 8 + 1 / 64
    low = torch.randn(groups, generator=gen).bfloat16().float()
    levels = torch.randint(
        0, 16, (out_features, in_features // GROUP_SIZE, GROUP_SIZE), generator=gen
    )
    levels[..., 0], levels[..., 1] = 0, 15  # each group spans its grid
    weight = (low + levels * step).reshape(out_features, in_features)
    layer = _quantized_layer(weight)
    # Scales, offsets and the kernel's output are bf16: their rounding is all that may differ.
    torch.testing.assert_close(
        int4_rows.dequantize(layer), layer.weight.float(), atol=0.01, rtol=2**-7
    )


def test_each_weight_is_rounded_to_its_groups_nearest_level():
    weight = torch.randn(64, 2 * GROUP_SIZE, generator=torch.Generator().manual_seed(1))
    layer = _quantized_layer(weight)
    groups = layer.weight.float().reshape(64, 2, GROUP_SIZE)
    half_step = (groups.amax(-1) - groups.amin(-1)) / 30
    error = (int4_rows.dequantize(layer) - layer.weight.float()).abs().reshape(64, 2, GROUP_SIZE)
    bf16_rounding = 2**-7 * layer.weight.float().abs().reshape(64, 2, GROUP_SIZE) + 0.01
    assert (error <= half_step[..., None] + bf16_rounding).all()
    assert error.amax() > 0.01  # it is coarser than bf16


@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS, MAX_ROWS + 1])
@pytest.mark.parametrize("bias", [True, False])
def test_int4_rows_linear_computes_on_the_4_bit_weight_up_to_max_rows(rows, bias):
    torch.manual_seed(rows)
    layer = _quantized_layer(torch.randn(80, 64), bias=bias)
    x = torch.randn(1, rows, 64, dtype=torch.bfloat16)
    weight = int4_rows.dequantize(layer) if rows <= MAX_ROWS else layer.weight.float()
    bias_term = 0 if layer.bias is None else layer.bias.float()
    expected = x.float() @ weight.t() + bias_term
    layer.__class__ = Int4RowsLinear
    with torch.no_grad():
        got = layer(x)
    assert got.shape == (1, rows, 80) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=0.1, rtol=0.02)
    # Not the bf16 weight's product where the 4-bit one is asked for.
    assert (rows <= MAX_ROWS) == (
        got.float() - F.linear(x, layer.weight, layer.bias).float()
    ).abs().amax().gt(0.1)


def test_int4_rows_swaps_quantized_layers_within_the_block_only():
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(64, 7), nn.Embedding(4, 64)).bfloat16()
    int4_rows.quantize(model)
    assert int4_rows.is_quantized(model)
    with int4_rows.int4_rows(model):
        # An output width the kernel cannot pack (7) stays on its bf16 weight.
        assert [type(m) for m in model] == [Int4RowsLinear, nn.Linear, nn.Embedding]
        with int4_rows.int4_rows(model):  # nested: the outer block restores
            pass
        assert type(model[0]) is Int4RowsLinear
    assert [type(m) for m in model] == [nn.Linear, nn.Linear, nn.Embedding]
    with pytest.raises(RuntimeError, match="inside"), int4_rows.int4_rows(model):
        raise RuntimeError("inside")
    assert type(model[0]) is nn.Linear
    plain = nn.Sequential(nn.Linear(64, 32)).bfloat16()
    with int4_rows.int4_rows(plain):  # never quantized: left alone
        assert type(plain[0]) is nn.Linear


def test_quantize_names_what_it_needs():
    with pytest.raises(ValueError, match="bfloat16"):
        int4_rows.quantize(nn.Linear(64, 32))  # float32


def test_a_bf16_draft_model_drafts_on_4_bit_weights_by_default(llama):
    assert DraftModelDrafter(perturbed_copy(llama, 0.05).bfloat16()).int4
    assert not DraftModelDrafter(perturbed_copy(llama, 0.05)).int4  # float32
    assert not DraftModelDrafter(perturbed_copy(llama, 0.05).bfloat16(), int4=False).int4
    with pytest.raises(ValueError, match="bfloat16"):
        DraftModelDrafter(perturbed_copy(llama, 0.05), int4=True)


@pytest.mark.parametrize(
    "policy",
    [
        FixedPolicy(max_draft_tokens=4),
        FixedPolicy(tree=TreeShape(top_k=3, depth=3, expand=1)),
        FixedPolicy(tree=TreeShape(top_k=3, depth=3, total_tokens=8)),
        CostAwarePolicy(),
    ],
    ids=["chain", "siblings", "eagle2", "cost-aware"],
)
def test_greedy_output_is_the_targets_with_a_4_bit_draft_model(llama, policy, monkeypatch):
    steps = []
    forward = Int4RowsLinear.forward

    def counted(layer, x):
        steps.append(x.numel() // layer.in_features)
        return forward(layer, x)

    monkeypatch.setattr(Int4RowsLinear, "forward", counted)
    drafter = DraftModelDrafter(perturbed_copy(llama, 0.05).bfloat16())
    prompt = torch.tensor([1, 17, 4, 99, 23, 8])
    result = SpeculativeDecoder(llama, drafter, policy=policy).generate(prompt, max_new_tokens=24)
    assert result.tokens == greedy_reference(llama, prompt, 24)
    assert any(rows <= MAX_ROWS for rows in steps)  # the 4-bit weights drafted
    assert result.stats.accepted > 0


def test_the_4_bit_copy_follows_changes_of_the_weight():
    layer = _quantized_layer(torch.randn(32, 64))
    before = int4_rows.dequantize(layer)
    with torch.no_grad():
        layer.weight.mul_(2)  # as an optimiser step does: in place
    torch.testing.assert_close(int4_rows.dequantize(layer), 2 * before, atol=0.02, rtol=2**-7)


@pytest.mark.parametrize("kind", ["eagle3", "eagle"])
def test_a_bf16_feature_head_drafts_on_4_bit_weights_and_decodes_the_targets_greedy_output(
    llama, kind
):
    head = build_head(kind, llama).bfloat16()
    drafter = head.as_drafter(llama)
    assert drafter.int4 and drafter.fork().int4
    assert not build_head(kind, llama).as_drafter(llama).int4  # float32
    prompt = torch.tensor([1, 17, 4, 99, 23, 8])
    policy = FixedPolicy(tree=TreeShape(top_k=3, depth=3, expand=1))
    result = SpeculativeDecoder(llama, drafter, policy=policy).generate(prompt, max_new_tokens=16)
    assert result.tokens == greedy_reference(llama, prompt, 16)


@pytest.mark.parametrize("name", ["medusa", "mtp", "eagle"])
def test_heads_without_an_lm_head_draft_on_a_4_bit_copy_of_the_targets(name, monkeypatch):
    """Medusa, MTP and EAGLE-1 run the target's LM head every draft step: on a bf16 target
    they draft on a 4-bit copy of it, swapped in for drafting only (the target verifies on its
    own weights); not over a reduced vocabulary, on a float32 target, or with int4=False."""
    target = tiny_model("llama", seed=0).bfloat16()
    head = build_head(name, target).bfloat16()
    verifying, drafted_on = [False], []
    target.register_forward_pre_hook(lambda *_: verifying.__setitem__(0, True))
    target.register_forward_hook(lambda *_: verifying.__setitem__(0, False))
    forward = Int4RowsLinear.forward

    def spied(layer, x):
        assert not (layer is target.lm_head and verifying[0]), "verified on the 4-bit copy"
        drafted_on.append(layer)
        return forward(layer, x)

    monkeypatch.setattr(Int4RowsLinear, "forward", spied)
    drafter = head.as_drafter(target)
    prompt = torch.tensor([1, 17, 4, 99, 23, 8])
    policy = FixedPolicy(max_draft_tokens=3)
    result = SpeculativeDecoder(target, drafter, policy=policy).generate(prompt, max_new_tokens=12)
    assert len(result.tokens) == 12 and result.stats.drafted > 0
    assert target.lm_head in drafted_on
    assert type(target.lm_head) is nn.Linear
    assert int4_target_lm_head(head, False) is None
    if f"{name}-reduced" in HEADS:  # EAGLE-1 has no reduced vocabulary
        assert int4_target_lm_head(build_head(f"{name}-reduced", target), None) is None
    float32 = tiny_model("llama", seed=0)
    assert int4_target_lm_head(build_head(name, float32), None) is None

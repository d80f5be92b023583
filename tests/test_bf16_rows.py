"""bf16 linear layers over a few rows on draftsmith's kernel (`draftsmith.core.bf16_rows`), for
CPUs without bf16 matrix units."""

import logging

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model
from torch import nn

from draftsmith.core import bf16_rows
from draftsmith.core import small_rows as small_rows_module
from draftsmith.core.small_rows import MAX_ROWS, Bf16RowsLinear, SmallRowsLinear, small_rows

pytestmark = pytest.mark.skipif(
    not {"avx2", "fma"} <= bf16_rows._cpu_flags(), reason="the kernel needs AVX2 and FMA"
)


@pytest.fixture
def kernel_in_use(monkeypatch):
    """As on a CPU that needs the kernel (this one may have bf16 units)."""
    monkeypatch.setattr(small_rows_module, "ENABLED", True)
    monkeypatch.setattr(bf16_rows, "available", lambda: True)


def bf16_error_bound(reference: torch.Tensor) -> torch.Tensor:
    """Half a bf16 ulp of the exact value (rounding the float32 sum once) plus float32 summation
    slack."""
    return reference.abs() * 2.0**-8 + 1e-4


@pytest.mark.parametrize("rows", [1, 2, 7, 8, 9, 17, MAX_ROWS])
@pytest.mark.parametrize("in_features", [64, 573])  # 573: a tail of 5 past the 8-wide blocks
@pytest.mark.parametrize("bias", [True, False])
def test_the_kernel_computes_linear_to_bf16_rounding(rows, in_features, bias):
    torch.manual_seed(rows * in_features)
    weight = torch.randn(131, in_features).bfloat16()
    b = torch.randn(131).bfloat16() if bias else None
    x = torch.randn(1, rows, in_features).bfloat16()
    got = bf16_rows.linear(x, weight, b)
    exact = x.double() @ weight.double().t() + (0 if b is None else b.double())
    assert got.dtype == torch.bfloat16 and got.shape == (1, rows, 131) and got.is_contiguous()
    assert ((got.double() - exact).abs() <= bf16_error_bound(exact)).all()
    torch_error = (F.linear(x, weight, b).double() - exact).abs()
    assert (got.double() - exact).abs().mean() <= torch_error.mean() * 1.05  # as good as torch's


@pytest.mark.parametrize(("small", "rounded"), [(1.0, 256.0), (3.0, 260.0), (2.0, 258.0)])
def test_the_kernel_reads_strided_inputs_and_rounds_to_nearest_even(small, rounded):
    """256 + small: 257 lies halfway between bf16's 256 and 258 and 259 between 258 and 260; each
    rounds to the one with an even mantissa."""
    weight = torch.ones(3, 16).bfloat16()
    x = torch.zeros(16, 2).bfloat16()[:, 0]  # a strided view
    x[0], x[1] = 256.0, small
    assert bf16_rows.linear(x.unsqueeze(0), weight, None).tolist() == [[rounded] * 3]


def test_small_rows_swaps_bf16_linears_where_the_kernel_is_needed(kernel_in_use):
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).bfloat16(), nn.Linear(8, 8).half())
    with small_rows(model, rows=4):
        assert [type(m) for m in model] == [SmallRowsLinear, Bf16RowsLinear, nn.Linear]
    assert [type(m) for m in model] == [nn.Linear] * 3


@pytest.mark.parametrize("tokens", [6, bf16_rows.MAX_ROWS + 8])  # a few rows; a prefill
def test_a_bf16_forward_under_small_rows_matches_the_plain_forward(kernel_in_use, tokens):
    model = tiny_model().bfloat16().eval()
    ids = torch.randint(model.config.vocab_size, (1, tokens))
    calls = []
    forward = Bf16RowsLinear.forward
    with torch.no_grad():
        plain = model(ids).logits.float()
        with small_rows(model, ids.numel()):
            Bf16RowsLinear.forward = lambda self, x: calls.append(x.shape) or forward(self, x)
            try:
                ours = model(ids).logits.float()
            finally:
                Bf16RowsLinear.forward = forward
    assert calls and type(model.lm_head) is nn.Linear
    # Each layer rounds to bf16 as torch's does; the sums' order differs, so a few last bits do.
    torch.testing.assert_close(ours, plain, rtol=0.02, atol=0.02)


def test_a_failed_build_keeps_torchs_kernels_and_says_so(monkeypatch, caplog):
    def broken():
        raise RuntimeError("Error building extension 'draftsmith_bf16_rows'\nlong log")

    monkeypatch.setattr(bf16_rows, "needed", lambda: True)
    monkeypatch.setattr(bf16_rows, "_kernel", broken)
    bf16_rows.available.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=bf16_rows.__name__):
            assert bf16_rows.available() is False
        assert "keep torch's kernels" in caplog.text and "draftsmith_bf16_rows" in caplog.text
        assert "long log" not in caplog.text
    finally:
        bf16_rows.available.cache_clear()


def test_the_kernel_is_not_used_where_onednn_has_bf16_kernels(monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert bf16_rows.needed() is False


@pytest.mark.parametrize("out_features", [bf16_rows.WIDEN_BLOCK * 2 + 3, 7])  # a tail block; one
@pytest.mark.parametrize("bias", [True, False])
def test_many_rows_compute_linear_to_bf16_rounding_in_blocks(out_features, bias):
    torch.manual_seed(out_features)
    weight = torch.randn(out_features, 96).bfloat16()
    b = torch.randn(out_features).bfloat16() if bias else None
    x = torch.randn(2, bf16_rows.MAX_ROWS, 96).bfloat16()
    got = bf16_rows.linear_many(x, weight, b)
    widened = F.linear(x.float(), weight.float(), None if b is None else b.float())
    assert got.dtype == torch.bfloat16 and got.shape == (2, bf16_rows.MAX_ROWS, out_features)
    assert torch.equal(got, widened.bfloat16())  # each output rounded once, as `linear` rounds


def test_bf16_layers_take_the_kernel_for_few_rows_and_blocks_for_many(kernel_in_use, monkeypatch):
    layer = nn.Linear(16, 8).bfloat16()
    layer.__class__ = Bf16RowsLinear
    taken = []
    monkeypatch.setattr(bf16_rows, "linear", lambda *a: taken.append("kernel") or F.linear(*a))
    monkeypatch.setattr(bf16_rows, "linear_many", lambda *a: taken.append("blocks") or F.linear(*a))
    with torch.no_grad():
        for rows in (1, bf16_rows.MAX_ROWS, bf16_rows.MAX_ROWS + 1, 500):
            layer(torch.randn(rows, 16).bfloat16())
    assert taken == ["kernel", "kernel", "blocks", "blocks"]


def test_a_prefill_under_small_rows_swaps_only_the_bf16_layers(kernel_in_use):
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).bfloat16())
    with small_rows(model, rows=MAX_ROWS + 1):
        assert [type(m) for m in model] == [nn.Linear, Bf16RowsLinear]
    assert [type(m) for m in model] == [nn.Linear] * 2

"""The Triton quantiser against the definition (``runtime.fp8_quant.quantize``): the same bytes and
scales on every finite row, rotated or not, every input dtype; E4M3 ties, carries into the next
binade, subnormals and signed zeros included; non-finite rows stay non-finite where the definition's do."""
import pytest
import torch

from compiler.lowering.scoring.fp8_quant import quantize_rows
from runtime.fp8_quant import E4M3_MAX, quantize


def _bits(x8, scale):
    return x8.view(torch.uint8), scale.view(torch.int32)


def _assert_same(x, rotate):
    got8, got_scale = quantize_rows(x, rotate)
    want8, want_scale = quantize(x, rotate)
    assert got8.dtype == torch.float8_e4m3fn and got8.shape == x.shape and got_scale.shape == x.shape[:-1]
    # tensors of their own: a cache keeps them, and a cached view makes Dynamo compile the step again
    assert got8._base is None and got_scale._base is None
    finite = want_scale.isfinite()
    assert torch.equal(got_scale.isfinite(), finite)
    assert torch.equal(_bits(got8, got_scale)[0][finite], _bits(want8, want_scale)[0][finite])
    assert torch.equal(_bits(got8, got_scale)[1][finite], _bits(want8, want_scale)[1][finite])
    g, w = got8.float()[~finite], want8.float()[~finite]
    assert bool(((g == w) | (g.isnan() & w.isnan())).all())


@pytest.mark.parametrize("D", [1, 2, 16, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rotate", [True, False])
def test_quantize_rows_matches_the_definition_on_rows_of_every_scale(D, dtype, rotate):
    g = torch.Generator().manual_seed(D)
    x = torch.randn(2, 37, D, generator=g) * torch.logspace(-40, 30, 37)[None, :, None]
    x[0, 0] = 0.0
    x[1, 0] = -0.0
    x[1, 2] = torch.randint(-2, 3, (D,), generator=g).float()  # integers: ties after the rotation
    if D > 1:
        x[0, 1, 0] = float("nan")
        x[0, 2, 1] = float("inf")
        x[1, 1, -1] = -float("inf")
    _assert_same(x.to(dtype), rotate)


def test_quantize_rows_rounds_every_e4m3_midpoint_and_its_neighbours_to_nearest_even():
    # a second value of E4M3_MAX makes the row's scale exactly 1: the quotients are the values
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = codes[codes.isfinite()].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    near = torch.cat([mids, mids.nextafter(torch.tensor(float("inf"))), mids.nextafter(torch.tensor(-float("inf"))),
                      grid, torch.linspace(-2.0**-5, 2.0**-5, 4001)])
    x = torch.stack([near, torch.full_like(near, E4M3_MAX)], dim=1)
    _assert_same(x, rotate=False)


def test_quantize_rows_reads_strided_rows_and_keeps_the_leading_shape():
    x = torch.randn(3, 8, 5, 16)[:, :, 1:4]  # rows of a non-contiguous view
    got8, got_scale = quantize_rows(x, True)
    want8, want_scale = quantize(x, True)
    assert got8.shape == (3, 8, 3, 16) and got_scale.shape == (3, 8, 3)
    assert torch.equal(got8.view(torch.uint8), want8.view(torch.uint8))
    assert torch.equal(got_scale, want_scale)


def test_quantize_rows_refuses_what_it_cannot_quantise_by_name():
    with pytest.raises(ValueError, match="x: the last dimension must be a power of two"):
        quantize_rows(torch.randn(2, 12), True)
    with pytest.raises(TypeError, match="x: expected bf16, fp16 or fp32"):
        quantize_rows(torch.randn(2, 16).double(), True)

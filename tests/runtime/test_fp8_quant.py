"""runtime.fp8_quant: the E4M3 quantisation of SPEC A.10 (scales, rounding, the Hadamard rotation,
folded query scales, non-finite rows)."""
import pytest
import torch

from runtime.fp8_key_cache import Fp8KeyCache
from runtime.fp8_quant import (AMAX_FLOOR, E4M3_MAX, check_precision, hadamard, quantize_keys, quantize_queries,
                               quantize_rows)

E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
FINITE_E4M3 = torch.unique(E4M3_VALUES[torch.isfinite(E4M3_VALUES)])


def nearest_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even E4M3 of float64 values in [-448, 448], by search over every value."""
    pos = torch.searchsorted(FINITE_E4M3, x).clamp(1, len(FINITE_E4M3) - 1)
    lo, hi = FINITE_E4M3[pos - 1], FINITE_E4M3[pos]
    even = lambda v: (v.to(torch.float8_e4m3fn).view(torch.uint8) & 1) == 0  # noqa: E731
    pick_hi = (hi - x < x - lo) | ((hi - x == x - lo) & even(hi))
    return torch.where(x <= lo, lo, torch.where(pick_hi, hi, lo))


def test_rows_quantise_to_the_nearest_e4m3_of_x_over_amax_448():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=g) * torch.logspace(-15, 15, 64)[:, None]
    x8, scale = quantize_rows(x)
    assert x8.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert torch.equal(scale, x.abs().amax(-1) / E4M3_MAX)
    ratio = (x / scale[:, None]).double()  # the float32 quotient, as the quantiser forms it
    assert torch.equal(x8.double(), nearest_e4m3(ratio.clamp(-E4M3_MAX, E4M3_MAX)))
    assert torch.equal(x8.double().abs().amax(-1), torch.full((64,), E4M3_MAX, dtype=torch.float64))


def test_zero_and_tiny_rows_get_the_floor_scale_and_non_finite_rows_stay_non_finite():
    x = torch.tensor([[0.0, 0.0], [1e-21, -2e-21], [1.0, float("inf")], [1.0, float("nan")]])
    x8, scale = quantize_rows(x)
    assert scale[0] == scale[1] == torch.tensor(AMAX_FLOOR / E4M3_MAX)
    assert torch.equal(x8[0].float(), torch.zeros(2)) and x8[1].float().abs().max() > 0
    assert torch.isinf(scale[2]) and torch.isnan(x8[2].float()[1])
    assert torch.isnan(scale[3]) and torch.isnan(x8[3].float()).all()


def test_hadamard_is_orthonormal_and_its_own_inverse():
    x = torch.randn(5, 3, 128, dtype=torch.float64)
    y = hadamard(x).double()
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-6, atol=0)
    torch.testing.assert_close(hadamard(hadamard(x)).double(), x, rtol=0, atol=1e-5)
    ones = hadamard(torch.eye(4))  # Sylvester's H_4 / 2
    assert torch.equal(ones * 2, torch.tensor([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1.0]]))
    with pytest.raises(ValueError, match="power of two"):
        hadamard(torch.zeros(2, 24))


def test_query_scales_are_folded_into_the_weights_and_rotation_follows_the_precision():
    g = torch.Generator().manual_seed(1)
    q, w = torch.randn(2, 3, 4, 32, generator=g).bfloat16(), torch.randn(2, 3, 4, generator=g)
    for precision, rows in (("fp8", hadamard(q)), ("fp8_unrotated", q)):
        q8, w8 = quantize_queries(q, w, precision)
        want8, scale = quantize_rows(rows)
        assert torch.equal(q8.view(torch.uint8), want8.view(torch.uint8))
        assert torch.equal(w8, w * scale)
    with pytest.raises(ValueError, match="fp8 precision"):
        quantize_queries(q, w, "bf16")
    with pytest.raises(ValueError, match="precision: expected one of"):
        quantize_keys(q[:, 0], "e5m2")
    with pytest.raises(ValueError, match="got int 8"):
        check_precision("precision", 8)


def _butterflies(x: torch.Tensor) -> torch.Tensor:
    """The rotation's definition, stage by stage with new tensors: a + b and a - b in float32."""
    D = x.shape[-1]
    y = x.float()
    h = 1
    while h < D:
        pairs = y.reshape(*y.shape[:-1], D // (2 * h), 2, h)
        y = torch.stack((pairs[..., 0, :] + pairs[..., 1, :], pairs[..., 0, :] - pairs[..., 1, :]), dim=-2)
        y = y.reshape(*x.shape[:-1], D)
        h *= 2
    return y * torch.tensor(D ** -0.5, dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rotation_and_quantisation_are_bitwise_their_definitions_and_leave_the_input_alone(dtype):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 5, 64, generator=g) * torch.logspace(-6, 6, 5)[:, None]).to(dtype)
    x[0, 1, 7], x[1, 2, 0], x[2, 3, 63], x[2, 4] = float("nan"), float("inf"), float("-inf"), -0.0
    x = x.transpose(0, 1)  # a strided view
    before = x.clone()
    rotated = hadamard(x)
    assert torch.equal(rotated.view(torch.int32), _butterflies(x).view(torch.int32))
    for rows in (rotated, x):
        x8, scale = quantize_rows(rows)
        f = rows.float()
        want_scale = torch.clamp(f.abs().amax(-1), min=AMAX_FLOOR) / E4M3_MAX
        want8 = torch.clamp(f / want_scale[..., None], -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        assert torch.equal(scale.view(torch.int32), want_scale.view(torch.int32))
        assert torch.equal(x8.view(torch.uint8), want8.view(torch.uint8))
    assert torch.equal(x.view(torch.uint8) if dtype != torch.float32 else x.view(torch.int32),
                       before.view(torch.uint8) if dtype != torch.float32 else before.view(torch.int32))
    assert torch.equal(hadamard(x[..., :1]), x[..., :1].float())  # D = 1: the identity


def test_keys_and_queries_the_quantisation_cannot_take_are_named_before_any_allocation():
    with pytest.raises(ValueError, match="k: precision 'fp8' rotates q and k by a Hadamard transform.*got D=24"):
        quantize_keys(torch.zeros(1, 3, 24), "fp8")
    with pytest.raises(ValueError, match="q: precision 'fp8' rotates q and k .*got D=24"):
        quantize_queries(torch.zeros(1, 3, 2, 24), torch.zeros(1, 3, 2), "fp8")
    assert quantize_keys(torch.zeros(1, 3, 24), "fp8_unrotated")[0].shape == (1, 3, 24)
    with pytest.raises(ValueError, match=r"k: shape \(1, 17179869184, 16\) need about .* GiB of workspace on cpu"):
        quantize_keys(torch.zeros(1, 1, 16).expand(1, 2**34, 16), "fp8")
    with pytest.raises(ValueError, match="k: precision 'fp8' rotates"):
        Fp8KeyCache("fp8").append(torch.zeros(1, 3, 24))

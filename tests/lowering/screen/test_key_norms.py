"""The key-norm bounds of the screen (compiler.lowering.screen.key_norms): never below the norm, at
most one float32 step above the runtime's bound (runtime.rounding.key_norm_up, rounded up), for every
key dtype, strided keys, zero keys and keys whose norm passes float32's range."""
import pytest
import torch

from compiler.lowering.screen.key_norms import key_norms
from runtime.rounding import key_norm_up, round_up_to_float32

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn])
def test_key_norms_bound_the_norm_and_match_the_runtime_bound(dtype):
    g = torch.Generator().manual_seed(3)
    scale = torch.exp(torch.randn(1, 1, 40, generator=g) * 2).clamp(max=100.0)
    k = (torch.randn(2, 70, 40, generator=g) * scale).to(dtype)
    k[0, 5] = 0
    got = key_norms(k)
    exact = k.double().norm(dim=-1)
    want = round_up_to_float32(key_norm_up(k.float()))
    assert got.dtype == torch.float32 and got.shape == (2, 70)
    assert (got.double() >= exact).all() and got[0, 5] > 0
    normal = exact > 0  # a zero key's bound may be any tiny positive float32
    assert (got <= torch.nextafter(want, torch.full_like(want, float("inf"))))[normal].all()
    assert (got >= torch.nextafter(want, torch.zeros_like(want)))[normal].all()


def test_key_norms_read_strided_keys_and_overflow_to_inf():
    base = torch.randn(1, 9, 2, 16)
    k = base[:, :, 1]  # strides (288, 32, 1): a view into a wider cache row
    assert torch.equal(key_norms(k), key_norms(k.contiguous()))
    big = torch.full((1, 2, 16), 3e38)
    assert torch.isinf(key_norms(big)).all()

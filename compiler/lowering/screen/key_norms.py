"""Upper bounds of the key norms the screen multiplies e with, in one launch (SPEC C.2).

``key_norms(k)``: k [B, T, D] (any float dtype the scorer takes; any strides) -> fp32 [B, T], never
below ||k_t||: ``runtime.rounding.key_norm_up`` rounded up to float32, by the same formula with the
float64 sum in another order (squares of float32 values are exact in float64, and the factor
1 + 2 gamma_{D+2}(u64) bounds the sum's and the square root's rounding in any order)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiler.lowering import defaults
from compiler.lowering.outward_rounding import next_up_f64, round_up_f32
from runtime.rounding import U64, gamma
from compiler.lowering.host_ints import cdiv, next_power_of_2

__all__ = ["key_norms"]


@triton.jit
def _key_norms_kernel(k_ptr, out_ptr, T, D, skb, skt, skd, factor: tl.float64, BLOCK: tl.constexpr, DP: tl.constexpr):
    b = tl.program_id(1).to(tl.int64)
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    d = tl.arange(0, DP)
    ok = t < T
    x = tl.load(k_ptr + b * skb + t.to(tl.int64)[:, None] * skt + d[None, :] * skd,
                mask=ok[:, None] & (d < D)[None, :], other=0.0).to(tl.float32).to(tl.float64)
    norm = tl.sqrt(tl.sum(x * x, axis=1))  # float64: sqrt.rn.f64 (no approximate form exists)
    tl.store(out_ptr + b * T + t, round_up_f32(next_up_f64(norm * factor)), mask=ok)


def key_norms(k: torch.Tensor) -> torch.Tensor:
    """fp32 [B, T] upper bounds of the norms of the keys k [B, T, D] (module docstring)."""
    B, T, D = k.shape
    out = torch.empty((B, T), dtype=torch.float32, device=k.device)
    if B * T:
        block = defaults.KEY_NORM_BLOCK
        _key_norms_kernel[(cdiv(T, block), B)](k, out, T, D, k.stride(0), k.stride(1), k.stride(2),
                                               1.0 + 2.0 * gamma(D + 2, U64), BLOCK=block,
                                               DP=next_power_of_2(D), num_warps=4)
    return out

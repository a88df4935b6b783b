"""The indexer's E4M3 quantisation (``runtime.fp8_quant``, SPEC A.10) in one Triton pass over the rows.

``quantize_rows(x, rotate)``: x [..., D] (bf16, fp16 or fp32; D a power of two) -> (x8 [..., D]
float8_e4m3fn, scale [...] fp32), bitwise ``runtime.fp8_quant``'s definition on every finite
row: the same float32 operations in the same order (the rotation's butterfly stages a + b, a - b,
the multiply by fl32(D^-1/2), the exact maximum of |x_d|, the floor, one division for the scale
and one per value, the clamp, the cast to nearest even), one program reading a tile of rows once
and writing its values and scales once. A row holding NaN or inf gives the definition's
non-finite scale and NaN values (which NaN encoding is not specified).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.fp8_quant import AMAX_FLOOR, E4M3_MAX, hadamard_scale
from compiler.lowering.host_ints import cdiv

ROWS_PER_PROGRAM = 32
"""Rows of one program: 16 KB of float32 at D = 128."""


@triton.jit
def _butterflies(y, R: tl.constexpr, D: tl.constexpr, LOG2_D: tl.constexpr):
    """The fast Walsh-Hadamard stages of ``runtime.fp8_quant.hadamard`` on rows y [R, D] fp32: in
    stage h = 1, 2, .., D/2 the pair (i, i + h) of every block of 2h becomes (a + b, a - b)."""
    for s in tl.static_range(LOG2_D):
        pairs = tl.permute(tl.reshape(y, (R, D >> (s + 1), 2, 1 << s)), (0, 1, 3, 2))
        a, b = tl.split(pairs)
        y = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2)), (R, D))
    return y


@triton.jit
def _e4m3_bits(v):
    """The float8_e4m3fn bytes (uint8) of v (fp32, |v| <= 448 or NaN) rounded to nearest, ties to
    even, as torch casts: |v| is scaled by a power of two to units of its E4M3 spacing (2^(e-3), e
    its exponent, at least -6), rounded to an integer by adding and subtracting 1.5·2^23, and the
    byte is assembled from that integer and e (a carry to the next binade included); the sign bit
    is v's (so -0.0 and tiny negatives give 0x80), NaN gives 0x7F with v's sign. Integer and
    float32 operations only: the same bytes on the GPU and in the interpreter."""
    vbits = v.to(tl.int32, bitcast=True)
    a = tl.abs(v)
    e = tl.maximum((a.to(tl.int32, bitcast=True) >> 23) - 127, -6)
    per_unit = ((130 - e) << 23).to(tl.float32, bitcast=True)  # 2^(3-e)
    n = ((a * per_unit + 12582912.0) - 12582912.0).to(tl.int32)  # 0..16 units of 2^(e-3)
    # n < 8 only below the normal range (e = -6): the subnormal code n; else exponent field e + 7
    # (e + 8 when n = 16) and mantissa n - 8
    code = tl.where(n < 8, n, tl.where(n == 16, (e + 8) << 3, ((e + 7) << 3) + n - 8))
    code = tl.where(v != v, 0x7F, code) | tl.where(vbits < 0, 0x80, 0)
    return code.to(tl.uint8)


@triton.jit
def _quantize_rows_kernel(x_ptr, x8_ptr, scale_ptr, n_rows, stride_x, inv_sqrt_d, amax_floor, e4m3_max,
                          D: tl.constexpr, LOG2_D: tl.constexpr, ROTATE: tl.constexpr, R: tl.constexpr):
    """One program: rows R·pid .. R·pid + R - 1 of x [n_rows, D] (row stride ``stride_x``) ->
    x8 [n_rows, D] E4M3 and scale [n_rows] fp32 (module docstring)."""
    rows = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    live = rows < n_rows
    cols = tl.arange(0, D)
    y = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    if ROTATE:
        y = _butterflies(y, R, D, LOG2_D) * inv_sqrt_d
    nan = tl.max((y != y).to(tl.int32), axis=1) > 0
    amax = tl.where(nan, float("nan"), tl.max(tl.abs(y), axis=1))
    scale = tl.math.div_rn(tl.maximum(amax, amax_floor, propagate_nan=tl.PropagateNan.ALL), e4m3_max)
    v = tl.math.div_rn(y, scale[:, None])
    v = tl.clamp(v, -e4m3_max, e4m3_max, propagate_nan=tl.PropagateNan.ALL)
    tl.store(x8_ptr + rows[:, None] * D + cols[None, :], _e4m3_bits(v), mask=live[:, None])
    tl.store(scale_ptr + rows, scale, mask=live)


def quantize_rows(x: torch.Tensor, rotate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(x8 [..., D] float8_e4m3fn, scale [...] float32) of x [..., D] (module docstring); ``rotate``:
    the Hadamard rotation first (precision "fp8"). Both are tensors of their own, not views: a model's
    cache keeps them, and Dynamo guards on whether a cached tensor is a view."""
    D = x.shape[-1]
    if D < 1 or D & (D - 1):
        raise ValueError(f"x: the last dimension must be a power of two, got {D}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"x: expected bf16, fp16 or fp32, got {x.dtype}")
    lead = x.shape[:-1]
    rows = x.reshape(-1, D)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    n = rows.shape[0]
    x8 = torch.empty((*lead, D), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(lead, dtype=torch.float32, device=x.device)
    if n:
        _quantize_rows_kernel[(cdiv(n, ROWS_PER_PROGRAM),)](
            rows, x8.view(torch.uint8), scale, n, rows.stride(0), hadamard_scale(D), AMAX_FLOOR, E4M3_MAX,
            D=D, LOG2_D=D.bit_length() - 1, ROTATE=rotate and D > 1, R=ROWS_PER_PROGRAM, num_warps=4)
    return x8, scale


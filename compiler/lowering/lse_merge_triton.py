"""Merge of attention partials by log-sum-exp, in Triton.

Contract (the same as ``runtime.lse_merge.merge_partials``): outputs ``[n, ..., D]`` (bf16, fp16
or fp32), lses ``[n, ...]`` (float, natural log) of n partials over disjoint key sets ->
``(o [..., D] in outputs' dtype, lse [...] fp32)`` with m = max_i l_i,
l = m + log Σ_i exp(l_i − m), o = Σ_i exp(l_i − m) o_i / Σ_i exp(l_i − m); fp32 arithmetic.
Every weight lies in [0, 1] (no overflow). A partial with l_i = -inf has weight 0 and its output
is never used (a NaN there contributes nothing); all -inf -> o = 0, l = -inf. A NaN or +inf l_i
makes that row's o and l NaN.

Kernel: one program per tile of rows (all of D), two passes over the n partials: the row maximum
(tracking NaN separately, since a maximum may drop NaN), then the weighted sums.

Dispatch: ``torch.ops.pulsar_dosa.merge_partials_triton`` (custom op with a fake implementation)
runs the kernel on CUDA tensors and on CPU tensors under ``TRITON_INTERPRET=1``; on CPU without
the interpreter it runs the plain-torch reference.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from compiler.autotune import interpreter_active
from runtime.lse_merge import check_partials, merge_partials

_OUTPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _merge_partials_kernel(out_ptr, lse_ptr, merged_ptr, merged_lse_ptr,
                           num_partials, num_rows, head_dim,
                           stride_on, stride_or, stride_od, stride_ln, stride_lr,
                           stride_mr, stride_md,
                           BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program: BLOCK_R rows of D values, merged over the n partials."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_r < num_rows
    tile_ok = row_ok[:, None] & (offs_d[None, :] < head_dim)

    top = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    has_nan = tl.zeros([BLOCK_R], dtype=tl.int1)
    for i in range(0, num_partials):
        lse = tl.load(lse_ptr + i * stride_ln + offs_r * stride_lr, mask=row_ok,
                      other=float("-inf")).to(tl.float32)
        has_nan = has_nan | (lse != lse)
        top = tl.maximum(top, lse)
    top = tl.where(has_nan, float("nan"), top)
    # All -inf: shift by 0 so every weight is exp(-inf) = 0; +inf or NaN: the shift is NaN/inf
    # and the weights become NaN, which then reaches o and l.
    shift = tl.where(top == float("-inf"), 0.0, top)

    total = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for i in range(0, num_partials):
        lse = tl.load(lse_ptr + i * stride_ln + offs_r * stride_lr, mask=row_ok,
                      other=float("-inf")).to(tl.float32)
        weight = tl.exp(lse - shift)
        total += weight
        live = weight > 0.0
        part = tl.load(out_ptr + i * stride_on + offs_r[:, None] * stride_or
                       + offs_d[None, :] * stride_od,
                       mask=tile_ok & live[:, None], other=0.0).to(tl.float32)
        acc += tl.where(live[:, None], part * weight[:, None], 0.0)

    empty = total == 0.0
    merged = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, total)[:, None])
    tl.store(merged_ptr + offs_r[:, None] * stride_mr + offs_d[None, :] * stride_md,
             merged.to(merged_ptr.dtype.element_ty), mask=tile_ok)
    merged_lse = tl.where(empty, float("-inf"), shift + tl.log(tl.where(empty, 1.0, total)))
    tl.store(merged_lse_ptr + offs_r, merged_lse, mask=row_ok)


_INTERPRETED = interpreter_active()
"""True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 at import)."""


def _launch(outputs: torch.Tensor, lses: torch.Tensor):
    """Flatten the row dimensions, allocate (o, lse) and run the kernel over row tiles."""
    n, d = outputs.shape[0], outputs.shape[-1]
    row_shape = tuple(outputs.shape[1:-1])
    rows = math.prod(row_shape)
    parts = outputs.reshape(n, rows, d)
    part_lses = lses.reshape(n, rows)
    merged = torch.empty((rows, d), dtype=outputs.dtype, device=outputs.device)
    merged_lse = torch.empty((rows,), dtype=torch.float32, device=outputs.device)
    if rows > 0:
        block_d = max(16, triton.next_power_of_2(d))
        block_r = 16 if _INTERPRETED else max(1, min(64, 8192 // block_d))
        _merge_partials_kernel[(triton.cdiv(rows, block_r),)](
            parts, part_lses, merged, merged_lse, n, rows, d,
            *parts.stride(), *part_lses.stride(), *merged.stride(),
            BLOCK_R=block_r, BLOCK_D=block_d, num_warps=1 if _INTERPRETED else 4)
    return merged.reshape(*row_shape, d), merged_lse.reshape(row_shape)


@torch.library.custom_op("pulsar_dosa::merge_partials_triton", mutates_args=())
def _merge_partials_op(outputs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton on CUDA (or under the interpreter); the plain-torch reference on CPU otherwise."""
    if outputs.is_cuda or _INTERPRETED:
        return _launch(outputs, lses)
    return merge_partials(outputs, lses)


@_merge_partials_op.register_fake
def _merge_partials_fake(outputs, lses):
    return (outputs.new_empty(outputs.shape[1:]),
            outputs.new_empty(outputs.shape[1:-1], dtype=torch.float32))


def merge_partials_triton(outputs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge n attention partials ``(outputs [n, ..., D], lses [n, ...])`` into ``(o, lse)``.

    Contract in the module doc. Raises TypeError/ValueError naming the argument for a bad type,
    dtype, shape or device.
    """
    check_partials(outputs, lses)
    if outputs.dtype not in _OUTPUT_DTYPES:
        raise TypeError(f"outputs must be bfloat16, float16 or float32, got {outputs.dtype}")
    if lses.dtype not in _OUTPUT_DTYPES:
        raise TypeError(f"lses must be bfloat16, float16 or float32, got {lses.dtype}")
    return torch.ops.pulsar_dosa.merge_partials_triton(outputs, lses)

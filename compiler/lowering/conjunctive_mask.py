"""``conjunctive_mask_triton(rows, cols, terms)``: ``runtime.conjunctive_mask`` in one Triton launch.

The row and column factors of every term are gathered into int64 [terms, L, S] and [terms, L, T]
(L planes of the broadcast shape; integer and bool values convert exactly, so every comparison is
the torch one); program (key block, query block, plane) evaluates the terms of its [BLOCK_S,
BLOCK_T] tile in registers and writes it once, with no per-element index division. Bitwise equal
to the definition for every input."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiler.lowering import defaults
from runtime.conjunctive_mask import CODES, leading_size, mask_shape
from compiler.lowering.host_ints import cdiv

_BITS = 3
"""Bits of one term's code in the kernel's packed CODES (``CODES`` has 8 entries; MAX_TERMS of them
fit an int64)."""


@triton.jit
def _term(keep, r, c, CODE: tl.constexpr):
    """keep & term CODE (runtime.conjunctive_mask.CODES) of rows r [BS, 1] and columns c [1, BT]."""
    if CODE == 0:
        keep = keep & (r <= c)
    elif CODE == 1:
        keep = keep & (r < c)
    elif CODE == 2:
        keep = keep & (r >= c)
    elif CODE == 3:
        keep = keep & (r > c)
    elif CODE == 4:
        keep = keep & (r == c)
    elif CODE == 5:
        keep = keep & (r != c)
    elif CODE == 6:
        keep = keep & (r != 0)
    else:
        keep = keep & (c != 0)
    return keep


@triton.jit
def _conjunctive_mask_kernel(r_ptr, c_ptr, out_ptr, S, T, L, CODES: tl.constexpr, BITS: tl.constexpr,
                             TERMS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr):
    """out[l, s, t] = AND over terms n of code_n(r[n, l, s], c[n, l, t]), code_n = bits n*BITS.. of CODES."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    plane = tl.program_id(2).to(tl.int64)
    s_ok, t_ok = s < S, t < T
    keep = tl.full((BLOCK_S, BLOCK_T), 1, tl.int1)
    for n in tl.static_range(TERMS):
        r = tl.load(r_ptr + (n * L + plane) * S + s, mask=s_ok, other=0)[:, None]
        c = tl.load(c_ptr + (n * L + plane) * T + t, mask=t_ok, other=0)[None, :]
        keep = _term(keep, r, c, (CODES >> (BITS * n)) & ((1 << BITS) - 1))
    rows = plane * S + s.to(tl.int64)
    tl.store(out_ptr + rows[:, None] * T + t[None, :], keep, mask=s_ok[:, None] & t_ok[None, :])


def _factors(xs, terms, slot, shape, axis, device):
    """int64 [terms, L, n]: per term its factor (``xs[terms[t + slot]]``) broadcast to the row (axis
    -2) or column (axis -1) vector of every plane, zeros where the term has none."""
    L, n = leading_size(shape), shape[axis]
    vec = [*shape[:-2], n, 1] if axis == -2 else [*shape[:-2], 1, n]
    out = torch.zeros((len(terms) // 3, L, n), dtype=torch.int64, device=device)
    for t in range(0, len(terms), 3):
        index = terms[t + slot]
        if index >= 0:
            out[t // 3] = xs[index].expand(vec).reshape(L, n)
    return out


def conjunctive_mask_triton(rows, cols, terms) -> torch.Tensor:
    """The mask of ``runtime.conjunctive_mask`` (same arguments, same checks, same bits)."""
    shape = mask_shape(rows, cols, terms)
    device = (rows or cols)[0].device
    out = torch.empty(shape, dtype=torch.bool, device=device)
    L, S, T = leading_size(shape), shape[-2], shape[-1]
    if out.numel() == 0:
        return out
    r = _factors(rows, terms, 1, shape, -2, device)
    c = _factors(cols, terms, 2, shape, -1, device)
    codes = sum(terms[t] << (_BITS * (t // 3)) for t in range(0, len(terms), 3))
    bs, bt = defaults.MASK_BLOCK_S, defaults.MASK_BLOCK_T
    _conjunctive_mask_kernel[(cdiv(T, bt), cdiv(S, bs), L)](
        r, c, out, S, T, L, CODES=codes, BITS=_BITS, TERMS=len(terms) // 3, BLOCK_S=bs, BLOCK_T=bt, num_warps=4)
    return out

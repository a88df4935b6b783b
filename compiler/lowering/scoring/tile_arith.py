"""The tile dot and group sum of the indexer kernels, with an interpreter form whose rounding does
not depend on the tile (SPEC C.1).

``tile_dot``: the [M, N] fp32 products of M rows with N key rows; ``group_sum``: the sums over
groups of R consecutive rows of a tile. On the GPU (``SEQUENTIAL`` False) they are ``tl.dot`` and
``tl.sum``; under ``TRITON_INTERPRET=1`` ``sequential_dot`` and ``sequential_group_sum`` accumulate
from 0 in ascending d (r), every product and sum rounded to fp32 with elementwise operations only,
so that an element's value depends on its own operands alone: the same on every CPU, tile shape
and launch config, and exactly THE SCORER of ``runtime/dense_scorer.py`` (ascending d, then h)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def sequential_dot(a_ptr, a_off, a_ok, b_ptr, b_off, b_ok, D: tl.constexpr, M: tl.constexpr,
                   N: tl.constexpr):
    """[M, N] fp32: rows ``a_ptr[a_off[i] + d]`` (masked by ``a_ok`` [M]) dotted with rows
    ``b_ptr[b_off[j] + d]`` (masked by ``b_ok`` [N]), d = 0..D-1 ascending, from 0."""
    x = tl.zeros((M, N), dtype=tl.float32)
    for d in range(D):
        a = tl.load(a_ptr + a_off + d, mask=a_ok, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + b_off + d, mask=b_ok, other=0.0).to(tl.float32)
        x = x + a[:, None] * b[None, :]
    return x


@triton.jit
def sequential_group_sum(y, n, G: tl.constexpr, R: tl.constexpr, N: tl.constexpr):
    """[G, N] fp32: the first ``n`` rows of each group of R consecutive rows of ``y`` [G * R, N],
    summed from 0 in ascending row order (rows n..R-1 are padding and are not added)."""
    y3 = tl.reshape(y, (G, R, N))
    member = tl.arange(0, R)[None, :, None]
    s = tl.zeros((G, N), dtype=tl.float32)
    for r in range(n):
        s = s + tl.sum(tl.where(member == r, y3, 0.0), axis=1)
    return s


@triton.jit
def tile_dot(at, a_ptr, a_off, a_ok, k_ptr, k_off, k_ok, D: tl.constexpr, M: tl.constexpr,
             N: tl.constexpr, SEQUENTIAL: tl.constexpr, IEEE: tl.constexpr):
    """[M, N] fp32 products of the rows ``at`` [M, D] (loaded from ``a_ptr + a_off``, masked by
    ``a_ok``) with the key rows ``k_ptr + k_off`` (masked by ``k_ok`` [N]): one ``tl.dot`` (fp32
    accumulation; ``input_precision="ieee"`` when IEEE; the keys converted to the rows' dtype, exact
    for E4M3 keys against bf16 rows), or ``sequential_dot`` when SEQUENTIAL (``at`` unused)."""
    if SEQUENTIAL:
        x = sequential_dot(a_ptr, a_off, a_ok, k_ptr, k_off, k_ok, D, M, N)
    else:
        kt = tl.load(k_ptr + k_off[:, None] + tl.arange(0, D)[None, :], mask=k_ok[:, None], other=0.0)
        kt = kt.to(at.dtype)
        if IEEE:
            x = tl.dot(at, tl.trans(kt), input_precision="ieee")
        else:
            x = tl.dot(at, tl.trans(kt))
    return x


@triton.jit
def group_sum(y, n, G: tl.constexpr, R: tl.constexpr, N: tl.constexpr, SEQUENTIAL: tl.constexpr):
    """[G, N] sums over groups of R consecutive rows of ``y`` [G * R, N] (rows n..R-1 of a group
    are zero padding): ``tl.sum`` over the reshaped tile, or ``sequential_group_sum`` when SEQUENTIAL."""
    if SEQUENTIAL:
        s = sequential_group_sum(y, n, G, R, N)
    else:
        s = tl.sum(tl.reshape(y, (G, R, N)), axis=1)
    return s


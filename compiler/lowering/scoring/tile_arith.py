"""The tile dot and group sum of the indexer kernels, with an interpreter form whose rounding does
not depend on the tile (SPEC C.1).

``group_bound``: per group of R rows, the sum of alpha relu(x) + beta min(x, 0) over its rows'
products x with N key rows (the certificate screen's bound). On the GPU (``SEQUENTIAL`` False) it
is ``tl.dot`` and ``tl.sum``; under ``TRITON_INTERPRET=1`` ``sequential_dot`` and
``sequential_group_sum`` accumulate from 0 in ascending d (r), every product and sum rounded to
fp32 with elementwise operations and running sums only, so that an element's value depends on its
own operands alone: the same on every CPU, tile shape and launch config, and exactly THE SCORER of
``runtime/dense_scorer.py`` (ascending d, then h)."""
from __future__ import annotations

import triton
import triton.language as tl

_MAX_NUMEL = tl.constexpr(2**20)
"""Triton's largest tile (elements): ``sequential_dot``'s chunks of products stay within it."""


@triton.jit
def sequential_dot(a_ptr, a_off, a_ok, b_ptr, b_off, b_ok, D: tl.constexpr, M: tl.constexpr,
                   N: tl.constexpr):
    """[M, N] fp32: rows ``a_ptr[a_off[i] + d]`` (masked by ``a_ok`` [M]) dotted with rows
    ``b_ptr[b_off[j] + d]`` (masked by ``b_ok`` [N]), d = 0..D-1 ascending, from 0 (D a power of
    two). The products are rounded to fp32 one by one and summed by running sums along d, DC of
    them at a time (the [M, N, DC] products within Triton's largest tile), the sum so far added to
    each chunk's first product, each chunk's last element taken by adding zeros to it: every
    partial sum is the loop's, rounded to fp32 in the same order."""
    DC: tl.constexpr = D if M * N * D <= _MAX_NUMEL else _MAX_NUMEL // (M * N)
    dc = tl.arange(0, DC)
    x = tl.zeros((M, N), dtype=tl.float32)
    for d0 in range(0, D, DC):
        a = tl.load(a_ptr + a_off[:, None] + d0 + dc[None, :], mask=a_ok[:, None], other=0.0).to(tl.float32)
        b = tl.load(b_ptr + b_off[:, None] + d0 + dc[None, :], mask=b_ok[:, None], other=0.0).to(tl.float32)
        p = a[:, None, :] * b[None, :, :]
        run = tl.cumsum(tl.where(dc[None, None, :] == 0, p + x[:, :, None], p), axis=2)
        x = tl.sum(tl.where(dc[None, None, :] == DC - 1, run, 0.0), axis=2)
    return x


@triton.jit
def sequential_group_sum(y, n, G: tl.constexpr, R: tl.constexpr, N: tl.constexpr):
    """[G, N] fp32: the first ``n`` rows of each group of R consecutive rows of ``y`` [G * R, N],
    summed from 0 in ascending row order: a running sum (rows n..R-1, padding, replaced by zeros),
    its last element taken by adding zeros to it. Each partial sum is the loop's but for the sign of
    a zero (a running sum starts at the first row, not at 0 + it), which taking it makes +0, as a
    sum from 0 is."""
    y3 = tl.reshape(y, (G, R, N))
    member = tl.arange(0, R)[None, :, None]
    run = tl.cumsum(tl.where(member < n, y3, 0.0), axis=1)
    return tl.sum(tl.where(member == R - 1, run, 0.0), axis=1)


@triton.jit
def group_bound(at, alpha, beta, a_ptr, a_off, a_ok, k_ptr, k_off, k_ok, D: tl.constexpr, G: tl.constexpr,
                R: tl.constexpr, N: tl.constexpr, SEQUENTIAL: tl.constexpr, IEEE: tl.constexpr):
    """[G, N] fp32: for each group of R consecutive rows of ``at`` [G * R, D] (loaded from ``a_ptr +
    a_off``, masked by ``a_ok``) and each key row ``k_ptr + k_off`` (masked by ``k_ok`` [N]), the sum
    over the group's rows of ``alpha * relu(x) + beta * min(x, 0)``, x the row's product with the key,
    computed as ``x * (alpha if x > 0 else beta)`` (the same rounded product; NaN propagates; on the
    GPU the compiler may fuse a product into the group sum, one rounding fewer). On the GPU the keys are the product's rows (``[N, D] x [D, G * R]``, as the
    scorer's tile) so that each group sums along the columns a thread holds; under SEQUENTIAL the
    ``sequential_dot`` and ``sequential_group_sum`` forms (``at`` unused)."""
    if SEQUENTIAL:
        x = sequential_dot(a_ptr, a_off, a_ok, k_ptr, k_off, k_ok, D, G * R, N)
        x = x * tl.where(x > 0, alpha[:, None], beta[:, None])
        s = sequential_group_sum(x, R, G, R, N)
    else:
        kt = tl.load(k_ptr + k_off[:, None] + tl.arange(0, D)[None, :], mask=k_ok[:, None], other=0.0)
        kt = kt.to(at.dtype)
        if IEEE:
            xt = tl.dot(kt, tl.trans(at), input_precision="ieee")
        else:
            xt = tl.dot(kt, tl.trans(at))
        xt = xt * tl.where(xt > 0, alpha[None, :], beta[None, :])
        s = tl.trans(tl.sum(tl.reshape(xt, (N, G, R)), axis=2))
    return s

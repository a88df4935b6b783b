"""What the attention kernels share: folding one key tile into an online softmax, merging partials
computed over disjoint key sets by log-sum-exp, and how a row's keys are split into those sets
(``attention_splits``). Base 2 throughout (scores in log2 units, lse2 = log2 of the row's sum of exp2);
the numerics are those of ``runtime.lse_merge``.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from compiler.autotune import multiprocessor_count
from compiler.lowering.host_ints import cdiv

LOG2_E = math.log2(math.e)
"""Scale from natural-log scores to the base-2 units of the kernels."""
TARGET_PROGRAMS_PER_SM = 4
"""Attention programs wanted per streaming multiprocessor before a row's keys are split."""


def attention_splits(programs: int, width: int, block_n: int, device: torch.device,
                     splits: Optional[int] = None) -> tuple[int, int]:
    """(number of splits, keys per split, a multiple of block_n) of rows of ``width`` keys run by
    ``programs`` programs: ``splits`` when given, else enough to fill the GPU (1 off CUDA or when the
    grid already fills it); the count is then trimmed so that no split is empty."""
    if splits is None:
        splits = 1
        if device.type == "cuda":
            target = TARGET_PROGRAMS_PER_SM * multiprocessor_count(device)
            splits = max(1, min(cdiv(target, programs), cdiv(width, block_n)))
    split_len = cdiv(cdiv(width, splits), block_n) * block_n
    return cdiv(width, split_len), split_len


def split_partials(n_split: int, rows: tuple[int, ...], width: int, device: torch.device,
                   unsplit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial outputs [n_split, *rows, width] fp32, partial lse [n_split, *rows] fp32) for a launch
    of ``n_split`` > 1 splits; with one split the kernel writes no partials: both are ``unsplit``
    (an unread placeholder)."""
    if n_split == 1:
        return unsplit, unsplit
    return (torch.empty((n_split, *rows, width), dtype=torch.float32, device=device),
            torch.empty((n_split, *rows), dtype=torch.float32, device=device))


@triton.jit
def online_softmax_step(scores, values, acc, m_i, l_i, DOT_PRECISION: tl.constexpr):
    """Fold one key tile into the running (acc [M, D], row max m_i [M], row sum l_i [M]): scores
    [M, N] in log2 units (-inf = the key does not count), values [N, D]. Returns (acc, m, l)."""
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    # Rows that have seen no counted key yet keep m = -inf; shifting them by 0 keeps exp2 at 0.
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_shift)
    p = tl.exp2(scores - m_shift[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def merge_split_partials(part_o_ptr, part_lse_ptr, first, split_stride, num_splits, ok, offs_d,
                         BLOCK_D: tl.constexpr):
    """(o [R, BLOCK_D], empty [R], lse2 [R]) of R rows merged over ``num_splits`` partials: row r's partial of
    split i is o at ``part_o_ptr + (first[r] + i·split_stride)·BLOCK_D`` and lse2 at ``part_lse_ptr``
    (same index); rows where ``ok`` is False are not read. A partial with lse2 = -inf weighs exactly
    0; a row whose every partial is -inf is empty (o = 0)."""
    top = tl.full(first.shape, float("-inf"), dtype=tl.float32)
    for split in range(0, num_splits):
        top = tl.maximum(top, tl.load(part_lse_ptr + first + split * split_stride, mask=ok, other=float("-inf")))
    shift = tl.where(top == float("-inf"), 0.0, top)
    total = tl.zeros(first.shape, dtype=tl.float32)
    acc = tl.zeros([first.shape[0], BLOCK_D], dtype=tl.float32)
    for split in range(0, num_splits):
        part = first + split * split_stride
        weight = tl.exp2(tl.load(part_lse_ptr + part, mask=ok, other=float("-inf")) - shift)
        # An empty split has weight exactly 0 and its o is 0: it adds nothing.
        acc += weight[:, None] * tl.load(part_o_ptr + part[:, None] * BLOCK_D + offs_d[None, :], mask=ok[:, None],
                                         other=0.0)
        total += weight
    empty = total == 0.0
    return acc / tl.where(empty, 1.0, total)[:, None], empty, tl.where(empty, float("-inf"),
                                                                          shift + tl.log2(tl.where(empty, 1.0, total)))

"""The certified pipeline's row bookkeeping after the refine, one launch each (SPEC C.5): which rows
are short or redone (``row_flags``), the dense redo's row lists (``redo_row_lists``) and the call's
statistics counters (``call_counts``). Integer and bool work only, no host synchronisation: the
values of the torch forms they replace (a comparison, a rank by prefix sum, a scatter, sums), in
fewer launches."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiler.lowering import defaults
from runtime.certified_topk import TopkStats
from compiler.lowering.host_ints import cdiv, next_power_of_2

__all__ = ["call_counts", "row_flags", "redo_row_lists"]


@triton.jit
def _row_flags_kernel(count_ptr, tau_ptr, shared_ptr, redo_ptr, short_ptr, n, kk, cand_cap,
                      SHARED: tl.constexpr, BLOCK: tl.constexpr):
    """Rows pid * BLOCK ..: short = written < kk and tau the finite shared bound (SHARED), redo =
    written > cand_cap or (written < kk and not short)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    count = tl.load(count_ptr + i, mask=ok, other=0)
    short = count < 0
    if SHARED:
        tau = tl.load(tau_ptr + i, mask=ok, other=0.0)
        bound = tl.load(shared_ptr + i, mask=ok, other=0.0)
        short = (count < kk) & (tau == bound) & (tl.abs(tau) < float("inf"))  # equal: neither is NaN
    redo = (count > cand_cap) | ((count < kk) & ~short)
    tl.store(redo_ptr + i, redo.to(tl.int8), mask=ok)
    tl.store(short_ptr + i, short.to(tl.int8), mask=ok)


def row_flags(cand_count: torch.Tensor, kk: int, cand_cap: int, tau: torch.Tensor,
              shared: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(redo, short) bool [B, S] of certified rows that wrote ``cand_count`` [B, S] int32 candidates
    into buffers of ``cand_cap``: short where a finite shared bound ``shared`` [B, S] is the row's tau
    [B, S] and fewer than kk were written (all false without ``shared``); redo where the buffer
    overflowed or fewer than kk were written by a row that is not short."""
    redo = torch.empty(cand_count.shape, dtype=torch.int8, device=cand_count.device)
    short = torch.empty_like(redo)
    n = cand_count.numel()
    if n:
        tau_c = tau.contiguous()
        shared_c = tau_c if shared is None else shared.contiguous()
        block = defaults.REDO_ROWS_BLOCK
        _row_flags_kernel[(cdiv(n, block),)](cand_count.contiguous(), tau_c, shared_c, redo, short, n, kk,
                                             cand_cap, SHARED=shared is not None, BLOCK=block)
    return redo.view(torch.bool), short.view(torch.bool)


@triton.jit
def _redo_lists_kernel(redo_ptr, lists_ptr, valid_ptr, out_ptr, B, S, head, width, slots,
                       RANKED: tl.constexpr, BLOCK: tl.constexpr):
    """Batch row b = pid: its flagged rows into a [B, head] head then [rounds, B, width] rounds (position
    j of the row's list: head slot j when j < head, else round (j - head) // width, slot (j - head) %
    width); RANKED: in rank order then -1 up to ``slots`` positions, else each row at its own slot."""
    b = tl.program_id(0).to(tl.int64)
    carry = tl.sum(tl.zeros([1], dtype=tl.int64), axis=0)
    for s0 in range(0, S, BLOCK):
        s = s0 + tl.arange(0, BLOCK).to(tl.int64)
        ok = s < S
        flag = tl.load(redo_ptr + b * S + s, mask=ok, other=0) != 0
        if RANKED:
            j = carry + tl.cumsum(flag.to(tl.int64), axis=0) - 1
            keep = ok & flag
            carry += tl.sum(flag.to(tl.int64), axis=0)
        else:
            j = s
            keep = ok
        r = j - head
        at = tl.where(j < head, b * head + j, B * head + (r // width) * B * width + b * width + r % width)
        tl.store(lists_ptr + at, tl.where(flag, s, -1), mask=keep)
        tl.store(valid_ptr + at, flag.to(tl.int8), mask=keep)
        tl.store(out_ptr + at, b * S + tl.where(flag, s, 0), mask=keep)
    if RANKED:  # the empty slots after the last flagged row
        for j0 in range(0, slots, BLOCK):
            j = j0 + tl.arange(0, BLOCK).to(tl.int64)
            empty = (j >= carry) & (j < slots)
            r = j - head
            at = tl.where(j < head, b * head + j, B * head + (r // width) * B * width + b * width + r % width)
            tl.store(lists_ptr + at, tl.full([BLOCK], -1, tl.int64), mask=empty)
            tl.store(valid_ptr + at, tl.zeros([BLOCK], dtype=tl.int8), mask=empty)
            tl.store(out_ptr + at, tl.zeros([BLOCK], dtype=tl.int64) + b * S, mask=empty)


RowLists = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""(lists, valid, out_rows) of the dense redo's slots: int64 row ids (-1 = empty slot), bool (lists >=
0), int64 rows of the call's [B * S] output (b * S + the row, b * S for an empty slot)."""


def redo_row_lists(redo: torch.Tensor, slots: int, head: int = 0) -> tuple[RowLists, RowLists]:
    """(head, rounds) ``RowLists`` of the flagged rows of ``redo`` [B, S] bool, holding every flagged
    row once: head [B, H'] with H' = min(head, S), rounds [rounds, B, R]. Without a head (``head``
    0): one round with each row in its own slot (R = S) when S <= slots, else the flagged rows in
    rank order, ceil(S / slots) rounds of R = ``slots``. With one: a row's first min(head, S)
    flagged rows in rank order in the head, the rest in rank order in ceil((S - H') / R) rounds of
    R = min(slots, S - H'). Each round's [B, R] slice is contiguous."""
    B, S = redo.shape
    head = min(head, S)
    ranked = head > 0 or slots < S
    width = min(slots, S - head) if head else slots if ranked else S
    rounds = cdiv(S - head, width) if width else 0
    dev = redo.device
    n = B * (head + rounds * width)
    lists = torch.empty(n, dtype=torch.int64, device=dev)
    valid = torch.empty(n, dtype=torch.int8, device=dev)
    out_rows = torch.empty_like(lists)
    if B * S:
        _redo_lists_kernel[(B,)](redo.contiguous().view(torch.int8), lists, valid, out_rows, B, S, head, max(width, 1),
                                 head + rounds * width, RANKED=ranked, BLOCK=defaults.REDO_ROWS_BLOCK)
    parts = (lists, valid.view(torch.bool), out_rows)
    return (tuple(x[:B * head].view(B, head) for x in parts),
            tuple(x[B * head:].view(rounds, B, width) for x in parts))


@triton.jit
def _call_counts_kernel(list_ptr, count_ptr, short_ptr, out_ptr, names, L, N, T, cap, list_queries, kk, cand_cap,
                        QUERIES: tl.constexpr, SCREENED: tl.constexpr, SURVIVORS: tl.constexpr,
                        WRITTEN: tl.constexpr, OVERFLOW: tl.constexpr, MISS: tl.constexpr, NP: tl.constexpr,
                        BLOCK: tl.constexpr):
    """One program: out[names] int64, zero but for the counters at the given slots (``call_counts``)."""
    offs = tl.arange(0, BLOCK)
    zero = tl.sum(tl.zeros([BLOCK], dtype=tl.int64), axis=0)
    survivors = zero
    for s0 in range(0, L, BLOCK):
        i = s0 + offs
        listed = tl.load(list_ptr + i, mask=i < L, other=0).to(tl.int64)
        survivors += tl.sum(tl.where(listed > cap, T, listed), axis=0)
    written = zero
    overflow = zero
    miss = zero
    for s0 in range(0, N, BLOCK):
        i = s0 + offs
        ok = i < N
        count = tl.load(count_ptr + i, mask=ok, other=0).to(tl.int64)
        short = tl.load(short_ptr + i, mask=ok, other=0) != 0
        written += tl.sum(count, axis=0)
        overflow += tl.sum((ok & (count > cand_cap)).to(tl.int64), axis=0)
        miss += tl.sum((ok & (count < kk) & ~short).to(tl.int64), axis=0)
    n = tl.arange(0, NP)
    queries = N.to(tl.int64)
    out = tl.where(n == QUERIES, queries, 0) + tl.where(n == SCREENED, queries * T, 0) \
        + tl.where(n == SURVIVORS, survivors * list_queries, 0) + tl.where(n == WRITTEN, written, 0) \
        + tl.where(n == OVERFLOW, overflow, 0) + tl.where(n == MISS, miss, 0)
    tl.store(out_ptr + n, out, mask=n < names)


def call_counts(list_count: torch.Tensor, cand_count: torch.Tensor, short: torch.Tensor, T: int, cap: int,
                list_queries: int, kk: int, cand_cap: int) -> torch.Tensor:
    """int64 [len(TopkStats.NAMES)] on the device (``TopkStats.add_counts``), zero but for a certified
    call's counters: queries (the B*S rows of ``cand_count`` [B,S] int32), keys_screened
    (queries * T), survivors (each list of ``list_count`` [B,L] int32 counted list_queries times, T
    keys for a list past ``cap``), written (the sum of cand_count), overflow (rows past ``cand_cap``)
    and threshold_miss (rows under kk that are not ``short`` [B,S] bool)."""
    names = TopkStats.NAMES
    out = torch.empty(len(names), dtype=torch.int64, device=cand_count.device)
    lists, counts = list_count.contiguous(), cand_count.contiguous()
    _call_counts_kernel[(1,)](lists, counts, short.contiguous().view(torch.int8), out, len(names), lists.numel(),
                              counts.numel(), T, cap, list_queries, kk, cand_cap, QUERIES=names.index("queries"),
                              SCREENED=names.index("keys_screened"), SURVIVORS=names.index("survivors"),
                              WRITTEN=names.index("written"), OVERFLOW=names.index("overflow"),
                              MISS=names.index("threshold_miss"), NP=next_power_of_2(len(names)),
                              BLOCK=defaults.REDO_ROWS_BLOCK)
    return out

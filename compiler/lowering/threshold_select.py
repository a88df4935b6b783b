"""Exact top-kk of long rows of int64 order codes: a proven threshold, compaction, a short selection.

``top_codes(codes, kk)``: codes [..., N] int64, distinct within a row (order codes are), 1 <= kk <= N;
returns [..., kk], each row's kk largest codes in descending order: exactly
``torch.topk(codes, kk).values``, with no host synchronisation and a fixed number of launches.

Rows of at most ``LONG_ROW_FACTOR * kk`` codes go to ``torch.topk``. A longer row is cut into n
interleaved chunks (chunk j holds positions j, j + n, j + 2n, ...), n = min(N, CHUNKS_PER_K * kk)
>= kk, and tau is the kk-th largest chunk maximum. The kk chunks whose maxima are >= tau are
disjoint and each holds a code >= tau, so at least kk codes are >= tau: tau <= the row's kk-th
largest code, and the row's top kk are exactly the top kk of its codes >= tau. Those are compacted
into a buffer of ``CANDIDATE_FACTOR * kk`` per row (the count goes on past the buffer) and
selected there; a row whose candidates overflow the buffer is selected from its whole row by the
row-gated exact selector (select_codes_triton), so nothing is ever dropped.

Why interleaved chunks: large scores cluster in position (an indexer favours recent keys, so a
row's best keys sit at its end). Contiguous chunks would put all of them in a few chunks and tau
far below the kk-th code; interleaved chunks spread any run of positions over all chunks. Memory
traffic: two reads of the row (chunk maxima, compaction) instead of a full sort-based selection.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiler.lowering.select_codes_triton import select_top_codes

LONG_ROW_FACTOR = 8
"""Rows longer than LONG_ROW_FACTOR * kk take the threshold path; shorter ones torch.topk."""
CHUNKS_PER_K = 2
"""Interleaved chunks per selected code (n = CHUNKS_PER_K * kk): tau is the kk-th of n maxima. On the
H200 (4096 scorer rows of 131072 keys, kk=2048, random and structured indexers) 2 left 2797-2807
codes per row on average (at most 2934) for a tau of 0.65 ms; 1 left 15500 (tau 0.5 ms, every row
overflowing any buffer); 4 left 2330 for a tau of 1.0 ms
(benchmarks/results/selection_constants_h200.json)."""
CANDIDATE_FACTOR = 2
"""Candidate buffer per row, in multiples of kk (an overflowing row is selected from the whole row,
exactly but slower). 2 kk holds every row of the sweep above (at most 1.43 kk codes >= tau) and its
final top-kk takes 1.0 ms against 1.4 ms for 4 kk (whole selection 5.0-5.1 ms against 5.4)."""
COMPACT_BLOCK = 512
"""Codes per step of the compaction (one program per row): at 4096 rows of 131072 codes on the H200
it took 2.3 ms with steps of 512, 2.4 with 1024 and 256, 3.1 with 2048 and 5.4 with 4096
(benchmarks/results/selection_parts_h200.json: every part of the selection at that size). Splitting
a row over 1-16 programs that reserve their slots by one atomic add per step was slower there
(2.7-2.9 ms at steps of 1024): each step then waits on its atomic."""
INT64_MIN = -(2**63)


@triton.jit
def _chunk_max_kernel(codes_ptr, out_ptr, N, n, stride_c, stride_o, BLOCK_J: tl.constexpr):
    """out[row, j] = max of codes[row, j + i n] over i (interleaved chunk j), for j < n <= N."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    jok = j < n
    m = tl.full([BLOCK_J], -9223372036854775808, tl.int64)
    for t0 in range(0, N, n):
        t = t0 + j
        m = tl.maximum(m, tl.load(codes_ptr + row * stride_c + t, mask=jok & (t < N),
                                  other=-9223372036854775808))
    tl.store(out_ptr + row * stride_o + j, m, mask=jok)


@triton.jit
def _compact_kernel(codes_ptr, tau_ptr, cand_ptr, count_ptr, N, cap, stride_c, stride_d,
                    BLOCK: tl.constexpr):
    """The codes >= tau[row] of a row, in position order, into cand[row, :cap]; count[row] = how many."""
    row = tl.program_id(0).to(tl.int64)
    tau = tl.load(tau_ptr + row)
    running = tl.zeros([1], dtype=tl.int32)
    for t0 in range(0, N, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        c = tl.load(codes_ptr + row * stride_c + t, mask=t < N, other=-9223372036854775808)
        keep = (c >= tau) & (t < N)
        keep_i = keep.to(tl.int32)
        slot = running + tl.cumsum(keep_i, axis=0) - 1
        tl.store(cand_ptr + row * stride_d + slot, c, mask=keep & (slot < cap))
        running += tl.sum(keep_i, axis=0)
    tl.store(count_ptr + row + tl.arange(0, 1), running)


def chunk_maxima(rows: torch.Tensor, n: int) -> torch.Tensor:
    """[R, n] int64: the maximum of each of the n interleaved chunks of ``rows [R, N]`` (n <= N,
    last dim contiguous)."""
    R, N = rows.shape
    maxima = torch.empty((R, n), dtype=torch.int64, device=rows.device)
    block_j = min(1024, triton.next_power_of_2(n))
    _chunk_max_kernel[(R, triton.cdiv(n, block_j))](rows, maxima, N, n, rows.stride(0), maxima.stride(0),
                                                   BLOCK_J=block_j)
    return maxima


def threshold(maxima: torch.Tensor, kk: int) -> torch.Tensor:
    """[R] int64: the kk-th largest of each row of chunk maxima (tau of the module docstring)."""
    return torch.topk(maxima, kk, dim=-1, sorted=False).values.amin(-1).contiguous()


def compact(rows: torch.Tensor, tau: torch.Tensor, cap: int,
            step: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cand [R, cap] int64, count [R] int32): each row's codes >= tau[row] in position order, padded
    with INT64_MIN; count goes on past ``cap`` (the row overflowed). ``step``: codes per pass
    (COMPACT_BLOCK when None; speed only)."""
    R, N = rows.shape
    cand = torch.full((R, cap), INT64_MIN, dtype=torch.int64, device=rows.device)
    count = torch.empty(R, dtype=torch.int32, device=rows.device)
    _compact_kernel[(R,)](rows, tau, cand, count, N, cap, rows.stride(0), cand.stride(0),
                          BLOCK=COMPACT_BLOCK if step is None else step)
    return cand, count


def top_codes(codes: torch.Tensor, kk: int) -> torch.Tensor:
    """The kk largest codes of each row of ``codes [..., N]``, descending (module docstring)."""
    N = codes.shape[-1]
    if not 1 <= kk <= N:
        raise ValueError(f"kk: expected 1 <= kk <= N = {N}, got {kk}")
    if N <= LONG_ROW_FACTOR * kk:
        return torch.topk(codes, kk, dim=-1, largest=True, sorted=True).values
    lead = codes.shape[:-1]
    rows = codes.reshape(-1, N)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    tau = threshold(chunk_maxima(rows, min(N, CHUNKS_PER_K * kk)), kk)
    cand, count = compact(rows, tau, CANDIDATE_FACTOR * kk)
    out = torch.topk(cand, kk, dim=-1, largest=True, sorted=True).values
    select_top_codes(rows, count > cand.shape[1], kk, out=out)
    return out.reshape(*lead, kk)

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

The compaction splits each row over several programs (``compact_splits``), each a contiguous range
of whole steps, which reserve their slots in the row's buffer by atomic adds on the row's count:
the candidates land in no particular order, and which codes fill an overflowing buffer is not
determined. Neither shows in the result: a row that fits holds exactly its codes >= tau (a set,
whatever the order), whose top kk by value is unique, and an overflowing row is selected again
from its whole row.

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
"""Interleaved chunks per selected code (n = CHUNKS_PER_K * kk): tau is the kk-th of n maxima."""
CANDIDATE_FACTOR = 4
"""Candidate buffer per row, in multiples of kk (an overflowing row is selected from the whole row)."""
COMPACT_BLOCK = 1024
"""Codes per step of the compaction. Measured with the earlier kernel of one program per row: at
4096 rows of 131072 codes on the H200 it took 2.4 ms with steps of 1024, 3.1 with 2048 and 5.4 with
4096 (benchmarks/results/selection_parts_h200.json: every part of the selection at that size). The
split kernel (COMPACT_PROGRAMS) is not yet timed on the GPU."""
COMPACT_PROGRAMS = 16384
"""Target number of compaction programs in one call: ``compact_splits`` gives each of R rows
ceil(COMPACT_PROGRAMS / R) programs, at least 1, at most one per step. 16384 is about 8 waves of
the H200's 132 SMs at up to 16 resident 4-warp programs each, so that no program runs a long
serial loop (at 4096 rows of 131072 codes: 4 programs of 32 steps per row); not yet timed."""
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
def _compact_kernel(codes_ptr, tau_ptr, cand_ptr, count_ptr, N, cap, chunk, stride_c, stride_d,
                    BLOCK: tl.constexpr):
    """Program (row, part): the codes >= tau[row] of codes[row, part chunk : (part + 1) chunk], each
    step's into slots of cand[row] reserved by one atomic add on count[row] (zero at launch); slots
    from cap on are not stored, the count still grows."""
    row = tl.program_id(0).to(tl.int64)
    lo = tl.program_id(1) * chunk
    hi = tl.minimum(lo + chunk, N)
    tau = tl.load(tau_ptr + row)
    for t0 in range(lo, hi, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        c = tl.load(codes_ptr + row * stride_c + t, mask=t < hi, other=-9223372036854775808)
        keep = (c >= tau) & (t < hi)
        keep_i = keep.to(tl.int32)
        num = tl.sum(keep_i, axis=0)
        base = tl.atomic_add(count_ptr + row, num, mask=num > 0, sem="relaxed")
        slot = base + tl.cumsum(keep_i, axis=0) - 1
        tl.store(cand_ptr + row * stride_d + slot, c, mask=keep & (slot < cap))


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


def compact_splits(R: int, N: int, step: int) -> int:
    """Programs per row of the compaction of R rows of N codes in steps of ``step``:
    ceil(COMPACT_PROGRAMS / R), at least 1, at most ceil(N / step). Shapes only, no device query."""
    return max(1, min(triton.cdiv(COMPACT_PROGRAMS, max(R, 1)), triton.cdiv(N, step)))


def compact(rows: torch.Tensor, tau: torch.Tensor, cap: int, step: int | None = None,
            splits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cand [R, cap] int64, count [R] int32): count[r] = how many codes of row r are >= tau[r] (it
    goes on past ``cap``: the row overflowed); cand[r, :min(count[r], cap)] holds that many of them
    in no particular order (all of them when count[r] <= cap), the rest of cand[r] is INT64_MIN.
    ``step``: codes per pass (COMPACT_BLOCK when None); ``splits``: programs per row, each a
    contiguous range of whole steps (``compact_splits`` when None). Both change speed and the
    order only. Three launches (the two buffers' fills, the kernel), no host synchronisation."""
    R, N = rows.shape
    step = COMPACT_BLOCK if step is None else step
    splits = compact_splits(R, N, step) if splits is None else splits
    chunk = triton.cdiv(triton.cdiv(N, step), splits) * step
    cand = torch.full((R, cap), INT64_MIN, dtype=torch.int64, device=rows.device)
    count = torch.zeros(R, dtype=torch.int32, device=rows.device)
    _compact_kernel[(R, triton.cdiv(N, chunk))](rows, tau, cand, count, N, cap, chunk,
                                                rows.stride(0), cand.stride(0), BLOCK=step)
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

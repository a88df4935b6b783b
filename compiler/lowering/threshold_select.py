"""Exact top-kk of long rows of int64 order codes: a proven threshold, compaction, a short selection.

``top_codes(codes, kk)``: codes [..., N] int64, distinct within a row (order codes are), 1 <= kk <= N;
returns [..., kk], each row's kk largest codes in descending order: exactly
``torch.topk(codes, kk).values``, with no host synchronisation and a fixed number of launches.
The rows may also be int32 *words*, the high words of order codes as the dense scorer writes them
(``score_dense(words=True)``): the code at position t of a row of N is ``(word << 32) + N - 1 - t``,
rebuilt wherever a kernel reads it (select_codes_triton ``row_codes_at``); half the bytes to read.

Rows of at most ``LONG_ROW_FACTOR * kk`` codes go to ``torch.topk``, and so do calls of fewer than
``FEW_ROWS`` rows on the GPU (``takes_threshold``). A longer row is cut into n
interleaved chunks (chunk j holds positions j, j + n, j + 2n, ...), n = ``chunk_count`` (about
CHUNKS_PER_K * kk, at most N) >= kk, and tau is the kk-th largest chunk maximum (``kth_largest``).
The maxima are computed here, or passed in: the dense scorer writes them as it scores
(dsa_score_triton ``score_dense(maxima=...)``), which saves a read of the row; any partition of
the row into n >= kk disjoint chunks gives the same guarantee. The kk chunks whose maxima are >= tau are
disjoint and each holds a code >= tau, so at least kk codes are >= tau: tau <= the row's kk-th
largest code, and the row's top kk are exactly the top kk of its codes >= tau. Those are compacted
into a buffer of ``CANDIDATE_FACTOR * kk`` per row, each code into a slot it draws by an atomic
add on the row's count (the count goes on past the buffer; the buffer's order varies, its content
as a set does not, and the selection's result depends on that set only), and selected there (``top_candidates``: the kk-th in registers, then a sort of the kk); a row whose candidates
overflow the buffer is selected from its whole row by the row-gated exact selector
(select_codes_triton), so nothing is ever dropped.

Why interleaved chunks: large scores cluster in position (an indexer favours recent keys, so a
row's best keys sit at its end). Contiguous chunks would put all of them in a few chunks and tau
far below the kk-th code; interleaved chunks spread any run of positions over all chunks. Memory
traffic: one read of the row (the compaction) when the scorer wrote the maxima, two otherwise,
instead of a full sort-based selection.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiler.lowering.select_codes_triton import row_codes_at, row_codes_at_least, select_top_codes

LONG_ROW_FACTOR = 8
"""Rows longer than LONG_ROW_FACTOR * kk take the threshold path; shorter ones torch.topk."""
FEW_ROWS = 128
"""CUDA calls of fewer rows than this take ``torch.topk``: the threshold path cost about 1 ms
whatever the row count when this was measured (its ~20 launches, and session 8's compaction, one
warp per row scanning the row in sequence, whose latency grows with the row's length; the
atomic compaction shares a row over COMPACT_SPLITS programs, and the cut was not re-measured
with it). H200, rows of 131072 random codes, kk = 2048 (session 8): 1 row 1.01 ms against 0.24 for ``torch.topk``, 8 rows 1.05 / 0.22, 64 rows 1.04 / 0.40, 256 rows
1.05 / 0.97, 1024 rows 1.18 / 3.23. ``torch.topk``'s time grows with rows x length, so the cut is
set below the 131072-key break-even (about 256 rows) to hold for rows four times as long."""
CHUNKS_PER_K = 2
"""Interleaved chunks per selected code (n = CHUNKS_PER_K * kk): tau is the kk-th of n maxima. On the
H200 (4096 scorer rows of 131072 keys, kk=2048, random and structured indexers) 2 left 2797-2808
codes per row on average (at most 2925) for a tau of 0.33 ms; 1 left 15250-15750 (every row
overflowing any buffer); 4 left 2330-2336 for a tau of 0.63-0.68 ms
(benchmarks/results/selection_constants_h200.json)."""
CANDIDATE_FACTOR = 2
"""Candidate buffer per row, in multiples of kk (an overflowing row is selected from the whole row,
exactly but slower). 2 kk holds every row of the sweep above (at most 1.43 kk codes >= tau) and its
final top-kk takes 1.01-1.03 ms against 1.35-1.39 ms for 4 kk (whole selection 4.03-4.15 ms
against 4.40-4.49)."""
COMPACT_BLOCK = 1024
"""Codes per step of a compaction program (COMPACT_WARPS warps, COMPACT_STAGES stages,
COMPACT_SPLITS programs per row). Each kept code takes its slot by its own atomic add on the row's
count: no scan, nothing carried from one step to the next. H200, 4096 dense-scorer rows of 131072
keys, kk = 2048 (session 12, gpu call 2): over int32 words 0.90-1.13 ms at steps of 1024, 4 warps,
4 programs per row, 3 stages (0.97-1.12 at 256; 2.2-3.1 with 1 warp at 1024), against 1.32-1.39
for session 8's scan in position order over int64 codes and 1.58-1.62 for that scan over words.
Over int64 codes the atomics took 1.28-1.64 ms. Session 13 (exploration): one atomic per step
(the step's kept codes ranked by a cumulative sum) 1.47-2.76 ms, one per thread (its codes counted
in registers) 0.96-2.77, against 0.80-1.02 for this form in the same runs."""
COMPACT_WARPS = 4
"""Warps per compaction program (see COMPACT_BLOCK)."""
COMPACT_STAGES = 3
"""Pipeline stages of the compaction's loop (``tl.range(num_stages=...)``; see COMPACT_BLOCK:
1 stage took 1.03-1.39 ms)."""
COMPACT_SPLITS = 4
"""Compaction programs per row (each takes the row's steps s, s + 4, s + 8, ...; see COMPACT_BLOCK:
1 program per row took 0.98-1.14 ms)."""
WINDOW_FACTOR = 2
"""A candidate row of at most ``window(N, kk)`` codes (the power of two >= WINDOW_FACTOR * kk) is
selected in registers by ``top_candidates``; longer ones by the row-gated selector."""
KTH_REGISTER_ROW = 16384
"""``kth_largest`` holds rows of at most this many values in one program's registers."""
KTH_WARPS = 4
"""Warps of a program that finds a kk-th largest in registers (``kth_largest``, ``top_candidates``):
on the H200, rows of 4096 values, 4 warps took 0.14-0.22 ms per 4096 rows against 0.16-0.27 for 8
and 0.19-0.32 for 16 (session 8 exploration)."""
INT64_MIN = -(2**63)


@triton.jit
def _chunk_max_kernel(codes_ptr, out_ptr, N, n, stride_c, stride_o, BLOCK_J: tl.constexpr,
                      WORDS: tl.constexpr):
    """out[row, j] = max of codes[row, j + i n] over i (interleaved chunk j), for j < n <= N."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    jok = j < n
    m = tl.full([BLOCK_J], -9223372036854775808, tl.int64)
    for t0 in range(0, N, n):
        t = t0 + j
        m = tl.maximum(m, row_codes_at(codes_ptr + row * stride_c, t, jok & (t < N), N, WORDS))
    tl.store(out_ptr + row * stride_o + j, m, mask=jok)


@triton.jit
def _compact_kernel(codes_ptr, tau_ptr, cand_ptr, count_ptr, N, cap, stride_c, stride_d,
                    BLOCK: tl.constexpr, STAGES: tl.constexpr, WORDS: tl.constexpr):
    """Program (row, s) of a grid (R, P): the codes >= tau[row] among the row's steps s, s + P, ...
    (BLOCK positions each), each into the slot cand[row, slot] it draws by an atomic add on
    count[row] (zeroed by the caller), if slot < cap. Afterwards count[row] is how many codes of the
    row are >= tau, and cand[row, :min(count, cap)] holds that many of them, in no particular order
    (all of them when count <= cap). STAGES: loads in flight (speed only)."""
    row = tl.program_id(0).to(tl.int64)
    tau = tl.load(tau_ptr + row)
    count = count_ptr + row + tl.zeros([BLOCK], tl.int64)
    ones = tl.full([BLOCK], 1, tl.int32)
    for t0 in tl.range(tl.program_id(1) * BLOCK, N, tl.num_programs(1) * BLOCK, num_stages=STAGES):
        t = t0 + tl.arange(0, BLOCK)
        c, keep = row_codes_at_least(codes_ptr + row * stride_c, t, t < N, N, tau, WORDS)
        slot = tl.atomic_add(count, ones, mask=keep, sem="relaxed")
        tl.store(cand_ptr + row * stride_d + slot, c, mask=keep & (slot < cap))


@triton.jit
def _kth_word(u, kk, live):
    """The kk-th largest of the uint32 tile ``u`` among its ``live`` entries (at least kk of them),
    as a multiset: its bits from the top, each kept set when at least kk live values are >= the
    prefix with it set."""
    ans = tl.zeros([], dtype=tl.uint32)
    one = tl.full([], 1, dtype=tl.uint32)
    for bit in range(31, -1, -1):
        cand = ans | (one << bit)
        count = tl.sum((live & (u >= cand)).to(tl.int32), axis=0)
        ans = tl.where(count >= kk, cand, ans)
    return ans


@triton.jit
def _kth_of(x, kk):
    """The kk-th largest of the int64 tile ``x`` (1 <= kk <= its size; padding must be INT64_MIN),
    as a multiset. Two 32-bit words: the kk-th largest high word h (sign bit flipped, so that the
    unsigned order is the signed one); the kk-th value is then the ``need``-th largest low word
    (unsigned) among the values with high word h, ``need`` = kk - #(high words > h). That search
    runs only when more than ``need`` values share h; otherwise it is their smallest low word.
    (H200, 4096 rows of 4096 values: 0.14-0.18 ms against 0.34-0.39 for 64 steps on the int64
    pattern, session 8 exploration.)"""
    uh = ((x >> 32).to(tl.int32) ^ -2147483648).to(tl.uint32, bitcast=True)
    h = _kth_word(uh, kk, uh == uh)
    tie = uh == h
    need = kk - tl.sum((uh > h).to(tl.int32), axis=0)
    ul = (x & 0xFFFFFFFF).to(tl.uint32)
    low = tl.min(tl.where(tie, ul, tl.full(ul.shape, 0xFFFFFFFF, tl.uint32)), axis=0)
    if tl.sum(tie.to(tl.int32), axis=0) > need:
        low = _kth_word(ul, need, tie)
    return ((h.to(tl.int32, bitcast=True) ^ -2147483648).to(tl.int64) << 32) | low.to(tl.int64)


@triton.jit
def _kth_largest_kernel(x_ptr, out_ptr, n, kk, stride_x, NP: tl.constexpr):
    """out[row] = the kk-th largest of x[row, :n] (int64, 1 <= kk <= n <= NP)."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, NP)
    x = tl.load(x_ptr + row * stride_x + j, mask=j < n, other=-9223372036854775808)
    tl.store(out_ptr + row + tl.arange(0, 1), tl.zeros([1], tl.int64) + _kth_of(x, kk))


@triton.jit
def _top_window_kernel(cand_ptr, count_ptr, out_ptr, N, kk, stride_c, stride_o, NP: tl.constexpr):
    """Rows with count[row] <= NP: out[row, :kk] = the kk largest of the row's first count codes
    (INT64_MIN for missing ones) as a multiset, in no particular order (those greater than the
    kk-th, then copies of it); other rows: nothing written."""
    row = tl.program_id(0).to(tl.int64)
    count = tl.load(count_ptr + row)
    live = count <= NP
    j = tl.arange(0, NP)
    x = tl.load(cand_ptr + row * stride_c + j, mask=live & (j < N) & (j < count), other=-9223372036854775808)
    kth = _kth_of(x, kk)
    greater = (x > kth).to(tl.int32)
    tl.store(out_ptr + row * stride_o + tl.cumsum(greater, axis=0) - 1, x, mask=live & (greater != 0))
    equal = (x == kth).to(tl.int32)
    slot = tl.sum(greater, axis=0) + tl.cumsum(equal, axis=0) - 1
    tl.store(out_ptr + row * stride_o + slot, x, mask=live & (equal != 0) & (slot < kk))


@triton.jit
def _pad_tail_kernel(cand_ptr, count_ptr, NP, N, stride_c, BLOCK: tl.constexpr):
    """Rows with NP < count[row] <= N: cand[row, count:N] = INT64_MIN; other rows untouched."""
    row = tl.program_id(0).to(tl.int64)
    count = tl.load(count_ptr + row)
    start = tl.where((count > NP) & (count <= N), count, N)
    for t0 in range(start, N, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        tl.store(cand_ptr + row * stride_c + t, tl.full([BLOCK], -9223372036854775808, tl.int64), mask=t < N)


def chunk_maxima(rows: torch.Tensor, n: int) -> torch.Tensor:
    """[R, n] int64: the largest code of each of the n interleaved chunks of ``rows [R, N]`` (codes
    or words, n <= N)."""
    R, N = rows.shape
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    maxima = torch.empty((R, n), dtype=torch.int64, device=rows.device)
    block_j = min(1024, triton.next_power_of_2(n))
    _chunk_max_kernel[(R, triton.cdiv(n, block_j))](rows, maxima, N, n, rows.stride(0), maxima.stride(0),
                                                   BLOCK_J=block_j, WORDS=rows.dtype == torch.int32)
    return maxima


def kth_largest(x: torch.Tensor, kk: int) -> torch.Tensor:
    """[...] int64: the kk-th largest of each row of ``x [..., n]`` int64 (1 <= kk <= n), e.g. tau
    of the module docstring from the chunk maxima. Rows of at most KTH_REGISTER_ROW values: one
    Triton program per row holding it in registers (``_kth_largest_kernel``; at 4096 rows of 4096
    maxima on the H200 0.14-0.18 ms with ``_kth_of``'s two 32-bit words (session 8 exploration),
    0.33-0.39 with one 64-bit search, against 0.64 for ``torch.topk`` then the row minimum,
    benchmarks/results/dense_scorer_groups_h200.json, run1); longer rows: ``torch.topk``."""
    n = x.shape[-1]
    if not 1 <= kk <= n:
        raise ValueError(f"kk: expected 1 <= kk <= n = {n}, got {kk}")
    if n > KTH_REGISTER_ROW:
        return torch.topk(x, kk, dim=-1, sorted=False).values.amin(-1)
    rows = x.reshape(-1, n)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], dtype=torch.int64, device=x.device)
    if rows.shape[0]:
        _kth_largest_kernel[(rows.shape[0],)](rows, out, n, kk, rows.stride(0),
                                              NP=triton.next_power_of_2(n), num_warps=KTH_WARPS)
    return out.view(x.shape[:-1])


def window(N: int, kk: int) -> int:
    """Codes of a candidate row that ``top_candidates`` selects in registers: the power of two
    >= WINDOW_FACTOR * kk (at least kk), at most that of N."""
    return triton.next_power_of_2(max(kk, min(N, WINDOW_FACTOR * kk)))


def top_candidates(cand: torch.Tensor, count: torch.Tensor, kk: int, scratch: bool = False) -> torch.Tensor:
    """[R, kk] int64: the kk largest codes of each candidate row ``cand [R, N]`` int64, descending
    (``torch.topk`` of the row's codes with INT64_MIN past them), for rows holding at most N codes.

    A candidate row holds its ``count [R]`` (int32/int64) codes first; what follows them is never
    read as a code (the buffer need not be filled: a row with fewer than kk codes gets INT64_MIN
    for the missing ones). A count above N (an overflowed buffer) leaves that row of the result
    unspecified, for the caller to answer. Rows with count <= the window (``window(N, kk)``) get
    their kk largest, found in registers by one program per row (the kk-th by ``_kth_of``, then
    the codes above it and copies of it), then ``torch.sort`` of the kk; when the buffer is wider
    than the window, rows with a larger count get INT64_MIN written past their codes (one gated
    program per row, ``_pad_tail_kernel``) and take the row-gated selector over the whole row
    (``scratch``: the caller gives up ``cand``'s content, which lets that selector read such a row
    about twice instead of 17 times).
    On the H200, per 4096 rows with kk = 2048: over 2 kk wide buffers (the dense path's) the
    window kernel took 0.21 ms and the sort 0.51, against 1.04 for ``torch.topk`` (session 8
    exploration); over 8 kk wide ones ``torch.topk`` took 2.03-2.29 ms (benchmarks/results/
    selection_parts_h200.json times both forms). No host synchronisation."""
    R, N = cand.shape
    if not 1 <= kk <= N:
        raise ValueError(f"kk: expected 1 <= kk <= N = {N}, got {kk}")
    count = count.contiguous()
    out = torch.empty((R, kk), dtype=torch.int64, device=cand.device)
    if not R:
        return out
    if cand.stride(-1) != 1:
        cand = cand.contiguous()
    np_ = window(N, kk)
    _top_window_kernel[(R,)](cand, count, out, N, kk, cand.stride(0), out.stride(0), NP=np_,
                             num_warps=KTH_WARPS)
    out = torch.sort(out, dim=-1, descending=True).values
    if np_ < N:
        _pad_tail_kernel[(R,)](cand, count, np_, N, cand.stride(0), BLOCK=1024)
        select_top_codes(cand, (count > np_) & (count <= N), kk, out=out, scratch=scratch)
    return out


def long_row(N: int, kk: int) -> bool:
    """Whether rows of N codes are long enough for the threshold path for kk."""
    return N > LONG_ROW_FACTOR * kk


def takes_threshold(rows: int, N: int, kk: int, device: torch.device | str) -> bool:
    """Whether ``rows`` rows of N codes on ``device`` take the threshold path (else ``torch.topk``):
    long rows, and on CUDA at least FEW_ROWS of them."""
    return long_row(N, kk) and (torch.device(device).type != "cuda" or rows >= FEW_ROWS)


def chunk_count(N: int, kk: int, multiple: int = 1) -> int:
    """Interleaved chunks per row of N codes: CHUNKS_PER_K * kk rounded up to a multiple of
    ``multiple`` (the scorer's key tile when it writes the maxima), at most N."""
    return min(N, -(-CHUNKS_PER_K * kk // multiple) * multiple)


def compact(rows: torch.Tensor, tau: torch.Tensor, cap: int, step: int | None = None,
            warps: int | None = None, stages: int | None = None,
            splits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cand [R, cap] int64, count [R] int32) for ``rows [R, N]`` (codes or words) and ``tau [R]``
    int64: count[r] is how many codes of row r are >= tau[r] and cand[r, :min(count[r], cap)]
    holds that many of them, in an order that varies from call to call (all of them when count[r]
    <= cap; count > cap: the row overflowed); slots past that are unspecified. ``step``: codes per
    step, ``warps``, ``stages``: loads in flight, ``splits``: programs per row (COMPACT_BLOCK,
    COMPACT_WARPS, COMPACT_STAGES, COMPACT_SPLITS when None; speed only)."""
    R, N = rows.shape
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    tau = tau.contiguous()
    step = COMPACT_BLOCK if step is None else step
    cand = torch.empty((R, cap), dtype=torch.int64, device=rows.device)
    count = torch.zeros(R, dtype=torch.int32, device=rows.device)
    programs = min(COMPACT_SPLITS if splits is None else splits, triton.cdiv(N, step))
    _compact_kernel[(R, programs)](rows, tau, cand, count, N, cap, rows.stride(0), cand.stride(0),
                                   BLOCK=step, STAGES=COMPACT_STAGES if stages is None else stages,
                                   WORDS=rows.dtype == torch.int32,
                                   num_warps=COMPACT_WARPS if warps is None else warps)
    return cand, count


def codes_of_words(words: torch.Tensor) -> torch.Tensor:
    """int64 codes of int32 words ``[..., N]``: ``(word << 32) + N - 1 - position``."""
    N = words.shape[-1]
    return (words.to(torch.int64) << 32) + torch.arange(N - 1, -1, -1, device=words.device)


def top_codes(codes: torch.Tensor, kk: int, maxima: torch.Tensor | None = None) -> torch.Tensor:
    """The kk largest codes of each row of ``codes [..., N]``, descending (module docstring).

    ``codes``: int64 codes, or int32 words standing for the codes ``(word << 32) + N - 1 -
    position`` (the dense scorer's ``words`` output, half the bytes to read). ``maxima [..., n]``
    int64 (kk <= n, same leading dims): the maxima of n disjoint chunks of each row, e.g. written
    by the scorer (dsa_score_triton ``maxima``); computed here when None."""
    N = codes.shape[-1]
    if not 1 <= kk <= N:
        raise ValueError(f"kk: expected 1 <= kk <= N = {N}, got {kk}")
    if codes.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"codes: expected int64 codes or int32 words, got {codes.dtype}")
    lead = codes.shape[:-1]
    if not takes_threshold(codes.numel() // max(N, 1), N, kk, codes.device):
        if codes.dtype == torch.int32:
            codes = codes_of_words(codes)
        return torch.topk(codes, kk, dim=-1, largest=True, sorted=True).values
    rows = codes.reshape(-1, N)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    if maxima is None:
        maxima = chunk_maxima(rows, chunk_count(N, kk))
    else:
        if maxima.shape[:-1] != lead or maxima.shape[-1] < kk:
            raise ValueError(f"maxima: expected [{', '.join(map(str, lead))}, n] with n >= kk = {kk}, "
                             f"got {tuple(maxima.shape)}")
        maxima = maxima.reshape(-1, maxima.shape[-1])
        if maxima.stride(-1) != 1:
            maxima = maxima.contiguous()
    tau = kth_largest(maxima, kk)
    cand, count = compact(rows, tau, CANDIDATE_FACTOR * kk)
    out = top_candidates(cand, count, kk)
    select_top_codes(rows, count > cand.shape[1], kk, out=out)
    return out.reshape(*lead, kk)

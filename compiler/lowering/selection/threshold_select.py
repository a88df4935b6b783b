"""Exact top-kk of long rows of int64 order codes: a proven threshold, compaction, a short selection
(SPEC C.3).

``top_codes(codes, kk, maxima=None)``: codes [..., N] int64 distinct within a row (order codes
are), or the int32 high words the dense scorer writes (``score_dense(words=True)``), 1 <= kk <= N;
returns [..., kk], each row's kk largest codes descending: exactly ``torch.topk(codes, kk).values``,
with no host synchronisation and a fixed number of launches. ``maxima``: the rows' interleaved
chunk maxima when the scorer wrote them. Short rows and CUDA calls of few rows take ``torch.topk``
(``takes_threshold``); a row whose candidates overflow their buffer is selected from the whole row
by ``radix_select``. ``kth_largest`` and ``top_candidates`` are the steps, usable alone."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiler.lowering import defaults
from compiler.lowering.order_codes import INT32_MIN, INT64_MIN, codes_of_words, word_of_code
from compiler.lowering.selection.radix_select import row_codes_at, row_codes_at_least, select_top_codes
from compiler.lowering.host_ints import cdiv, next_power_of_2


@triton.jit
def _chunk_max_kernel(codes_ptr, out_ptr, N, n, stride_c, stride_o, BLOCK_J: tl.constexpr,
                      WORDS: tl.constexpr):
    """out[row, j] = max of codes[row, j + i n] over i (interleaved chunk j), for j < n <= N."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    jok = j < n
    m = tl.full([BLOCK_J], INT64_MIN, tl.int64)
    for t0 in range(0, N, n):
        t = t0 + j
        m = tl.maximum(m, row_codes_at(codes_ptr + row * stride_c, t, jok & (t < N), N, WORDS))
    tl.store(out_ptr + row * stride_o + j, m, mask=jok)


@triton.jit
def _compact_kernel(codes_ptr, tau_ptr, ends_ptr, cand_ptr, count_ptr, N, seg, stride_c, stride_t, stride_e,
                    stride_d, stride_n, TILE: tl.constexpr, STAGES: tl.constexpr, EVEN: tl.constexpr,
                    WORDS: tl.constexpr, ENDS: tl.constexpr):
    """Program (row, s) of a grid (R, G), one warp: the codes >= tau[row] of the tiles it owns (of
    32 TILE positions; in round b of G tiles, tile (s + b) % G), in position order, into segment s
    of the row's buffer, cand[row, s seg : s seg + seg] (the first seg of them if more); count[row,
    s] = how many (more than seg: the segment overflowed). EVEN: N is a multiple of G 32 TILE.
    ENDS: positions from ends[row] on hold hidden codes only; when tau is above every hidden code
    (its high word above INT32_MIN) the rounds wholly past ends[row] are skipped."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    G = tl.num_programs(1)
    tau = tl.load(tau_ptr + row * stride_t)
    limit = N
    if ENDS:
        end = tl.minimum(tl.load(ends_ptr + row * stride_e).to(tl.int64), N)
        limit = tl.where(word_of_code(tau) > INT32_MIN, end, N)
    codes = codes_ptr + row * stride_c
    out = cand_ptr + row * stride_d + s * seg
    lane_first = (tl.arange(0, 32) * TILE)[:, None] + tl.arange(0, TILE)[None, :]
    n = tl.zeros([], tl.int32)
    owned = s  # (s + b) % G, kept by increments
    for b in tl.range(0, tl.cdiv(limit, G * 32 * TILE), num_stages=STAGES):
        t = (b * G + owned) * (32 * TILE) + lane_first
        owned = tl.where(owned + 1 == G, 0, owned + 1)
        inside = (t == t) if EVEN else (t < N)
        code, keep = row_codes_at_least(codes, t, inside, N, tau, WORDS)
        k = keep.to(tl.int32)
        lane_n = tl.sum(k, 1)
        slot = n + (tl.cumsum(lane_n, 0) - lane_n)[:, None] + tl.cumsum(k, 1) - k
        tl.store(out + slot, code, mask=keep & (slot < seg))
        n += tl.sum(lane_n, 0)
    tl.store(count_ptr + row * stride_n + s, n)


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
    runs only when more than ``need`` values share h; otherwise it is their smallest low word."""
    uh = ((x >> 32).to(tl.int32) ^ INT32_MIN).to(tl.uint32, bitcast=True)
    h = _kth_word(uh, kk, uh == uh)
    tie = uh == h
    need = kk - tl.sum((uh > h).to(tl.int32), axis=0)
    ul = (x & 0xFFFFFFFF).to(tl.uint32)
    low = tl.min(tl.where(tie, ul, tl.full(ul.shape, 0xFFFFFFFF, tl.uint32)), axis=0)
    if tl.sum(tie.to(tl.int32), axis=0) > need:
        low = _kth_word(ul, need, tie)
    return ((h.to(tl.int32, bitcast=True) ^ INT32_MIN).to(tl.int64) << 32) | low.to(tl.int64)


@triton.jit
def _kth_largest_kernel(x_ptr, out_ptr, n, kk, stride_x, NP: tl.constexpr):
    """out[row] = the kk-th largest of x[row, :n] (int64, 1 <= kk <= n <= NP)."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, NP)
    x = tl.load(x_ptr + row * stride_x + j, mask=j < n, other=INT64_MIN)
    tl.store(out_ptr + row + tl.arange(0, 1), tl.zeros([1], tl.int64) + _kth_of(x, kk))


@triton.jit
def _top_window_kernel(cand_ptr, count_ptr, out_ptr, N, seg, kk, floor, stride_c, stride_n, stride_o,
                       NP: tl.constexpr):
    """Rows whose every segment (seg slots; its count at count[row, j // seg]) holds its codes, all
    within the window (count <= min(seg, NP)), and whose largest count is above ``floor``:
    out[row, :kk] = the kk largest of those codes (INT64_MIN for missing ones) as a multiset, in no
    particular order (those greater than the kk-th, then copies of it); other rows: nothing written,
    nothing computed."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, NP)
    count = tl.load(count_ptr + row * stride_n + j // seg, mask=j < N, other=0)
    top = tl.max(count, axis=0)
    if (top > floor) & (top <= tl.minimum(seg, NP)):
        x = tl.load(cand_ptr + row * stride_c + j, mask=j % seg < count, other=INT64_MIN)
        kth = _kth_of(x, kk)
        greater = x > kth
        equal = x == kth
        # One scan for both ranks: the greater ones counted from bit SHIFT, the equal ones below it
        # (fewer than kk <= NP greater ones: no int32 overflow for NP <= 2^15).
        SHIFT: tl.constexpr = 16 if NP <= 32768 else 32
        RANK: tl.constexpr = tl.int32 if NP <= 32768 else tl.int64
        ranks = tl.cumsum(tl.where(greater, 1 << SHIFT, 0).to(RANK) + equal.to(RANK), axis=0)
        slot = tl.where(greater, (ranks >> SHIFT) - 1,
                        tl.sum(greater.to(RANK), axis=0) + (ranks & ((1 << SHIFT) - 1)) - 1)
        tl.store(out_ptr + row * stride_o + slot, x, mask=(greater | equal) & (slot < kk))


@triton.jit
def _pad_tail_kernel(cand_ptr, count_ptr, gate_ptr, NP, N, stride_c, BLOCK: tl.constexpr):
    """Rows with NP < count[row] <= N: cand[row, count:N] = INT64_MIN and gate[row] = 1; other rows
    untouched, gate 0."""
    row = tl.program_id(0).to(tl.int64)
    count = tl.load(count_ptr + row)
    gated = (count > NP) & (count <= N)
    tl.store(gate_ptr + row + tl.arange(0, 1), tl.zeros([1], dtype=tl.int8) + gated.to(tl.int8))
    start = tl.where(gated, count, N)
    for t0 in range(start, N, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        tl.store(cand_ptr + row * stride_c + t, tl.full([BLOCK], INT64_MIN, tl.int64), mask=t < N)


def chunk_maxima(rows: torch.Tensor, n: int) -> torch.Tensor:
    """[R, n] int64: the largest code of each of the n interleaved chunks of ``rows [R, N]`` (codes
    or words, n <= N)."""
    R, N = rows.shape
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    maxima = torch.empty((R, n), dtype=torch.int64, device=rows.device)
    block_j = min(1024, next_power_of_2(n))
    _chunk_max_kernel[(R, cdiv(n, block_j))](rows, maxima, N, n, rows.stride(0), maxima.stride(0),
                                             BLOCK_J=block_j, WORDS=rows.dtype == torch.int32)
    return maxima


def kth_largest(x: torch.Tensor, kk: int) -> torch.Tensor:
    """[...] int64: the kk-th largest of each row of ``x [..., n]`` int64 (1 <= kk <= n), e.g. tau
    of SPEC C.3 from the chunk maxima. Rows of at most ``defaults.KTH_REGISTER_ROW`` values: one
    Triton program per row holding it in registers (``_kth_largest_kernel``); longer rows:
    ``torch.topk``."""
    n = x.shape[-1]
    if not 1 <= kk <= n:
        raise ValueError(f"kk: expected 1 <= kk <= n = {n}, got {kk}")
    if n > defaults.KTH_REGISTER_ROW:
        return torch.topk(x, kk, dim=-1, sorted=False).values.amin(-1)
    rows = x.reshape(-1, n)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], dtype=torch.int64, device=x.device)
    if rows.shape[0]:
        _kth_largest_kernel[(rows.shape[0],)](rows, out, n, kk, rows.stride(0),
                                              NP=next_power_of_2(n), num_warps=defaults.KTH_WARPS)
    return out.view(x.shape[:-1])


def window(N: int, kk: int, factor: int | None = None) -> int:
    """Codes of a candidate row that ``top_candidates`` selects in registers: the power of two
    >= ``factor`` * kk (None: defaults.WINDOW_FACTOR; at least kk), at most that of N."""
    factor = defaults.WINDOW_FACTOR if factor is None else factor
    return next_power_of_2(max(kk, min(N, factor * kk)))


def window_tiers(N: int, kk: int, G: int, np_: int) -> tuple[int, ...]:
    """The register windows ``top_candidates`` launches for rows of N slots in G segments under the
    window ``np_``, smallest first: an unsegmented buffer's rows of at most half the window take a
    program of half its size (half the registers and the work) when that still holds kk codes;
    otherwise the window alone."""
    return (np_ // 2, np_) if G == 1 and np_ // 2 >= kk else (np_,)


def window_warps(np_: int) -> int:
    """Warps of a window program of ``np_`` codes: defaults.KTH_WARPS, one more warp per 1024 codes
    past 4096, at most defaults.PROGRAM_MAX_WARPS (at 8192 codes over 4 warps the program spills:
    ptxas, sm_90a, 340 bytes at 255 registers; over 8, none; 65536 codes spill 66 KB over 4 warps,
    4.3 KB over 32)."""
    return min(defaults.PROGRAM_MAX_WARPS, max(defaults.KTH_WARPS, np_ // 1024))


def top_candidates(cand: torch.Tensor, count: torch.Tensor, kk: int, scratch: bool = False,
                   ordered: bool = True, window_factor: int | None = None) -> torch.Tensor:
    """[R, kk] int64: the kk largest codes of each candidate row ``cand [R, N]`` int64, descending
    (``torch.topk`` of the row's codes with INT64_MIN past them), for rows that hold all their codes;
    with ``ordered`` False the same codes in an unspecified order (the final sort is skipped).

    ``count``: [R] (int32/int64), a candidate row holding its count codes first; or [R, G], the row
    cut into G segments of N // G slots (``compact``'s buffers), segment g holding count[r, g]
    codes first. What follows a segment's codes is never read as a code (the buffer need not be
    filled: a row with fewer than kk codes gets INT64_MIN for the missing ones). A count above its
    segment (an overflowed buffer) leaves that row of the result unspecified, for the caller to
    answer (``overflowed``). Rows whose codes lie within the window (``window(N, kk, window_factor)``) get their
    kk largest, found in registers by one program per row (the kk-th by ``_kth_of``, then the codes
    above it and copies of it; a launch per ``window_tiers`` size, each row computed by the smallest
    that holds it), then ``torch.sort`` of the kk. When an unsegmented buffer is wider
    than the window, rows with a larger count get INT64_MIN written past their codes (one gated
    program per row, ``_pad_tail_kernel``) and take the row-gated selector over the whole row
    (``scratch``: the caller gives up ``cand``'s content, which lets that selector read such a row
    about twice instead of 17 times); a segmented buffer must fit the window. No host
    synchronisation."""
    R, N = cand.shape
    if not 1 <= kk <= N:
        raise ValueError(f"kk: expected 1 <= kk <= N = {N}, got {kk}")
    counts = count.reshape(R, -1)
    G = counts.shape[1]
    np_ = window(N, kk, window_factor)
    if N % G or (G > 1 and np_ < N):
        raise ValueError(f"count: expected [R] or [R, G] with G dividing N = {N} and, for G > 1, a buffer "
                         f"within the window {np_}; got {tuple(count.shape)}")
    out = torch.empty((R, kk), dtype=torch.int64, device=cand.device)
    if not R:
        return out
    if cand.stride(-1) != 1:
        cand = cand.contiguous()
    floor = -1
    for tier in window_tiers(N, kk, G, np_):
        _top_window_kernel[(R,)](cand, counts, out, N, N // G, kk, floor, cand.stride(0), counts.stride(0),
                                 out.stride(0), NP=tier, num_warps=window_warps(tier))
        floor = tier
    if ordered:
        out = torch.sort(out, dim=-1, descending=True).values
    if np_ < N:
        counts = counts.view(R).contiguous()
        gate = torch.empty(R, dtype=torch.int8, device=cand.device)
        _pad_tail_kernel[(R,)](cand, counts, gate, np_, N, cand.stride(0), BLOCK=1024)
        select_top_codes(cand, gate.view(torch.bool), kk, out=out, scratch=scratch)
    return out


def overflowed(count: torch.Tensor, cap: int) -> torch.Tensor:
    """[R] bool: the rows of a buffer of ``cap`` slots per row cut into the segments of ``count [R,
    G]`` (``compact``) with a segment that did not hold its codes."""
    return (count > cap // count.shape[-1]).any(-1)


def long_row(N: int, kk: int) -> bool:
    """Whether rows of N codes are long enough for the threshold path for kk."""
    return N > defaults.LONG_ROW_FACTOR * kk


def takes_threshold(rows: int, N: int, kk: int, device: torch.device | str) -> bool:
    """Whether ``rows`` rows of N codes on ``device`` take the threshold path (else ``torch.topk``):
    long rows, and on CUDA at least defaults.FEW_ROWS of them."""
    return long_row(N, kk) and (torch.device(device).type != "cuda" or rows >= defaults.FEW_ROWS)


def chunk_count(N: int, kk: int, multiple: int = 1) -> int:
    """Interleaved chunks per row of N codes: defaults.CHUNKS_PER_K * kk rounded up to a multiple of
    ``multiple`` (the scorer's key tile when it writes the maxima), at most N."""
    return min(N, -(-defaults.CHUNKS_PER_K * kk // multiple) * multiple)


def compact_segments(cap: int) -> int:
    """Segments of a candidate buffer of ``cap`` slots per row: the most of defaults.COMPACT_SEGMENTS, its
    halves, ..., 1 that divides cap into segments of at least defaults.MIN_SEGMENT slots (1 if none)."""
    G = defaults.COMPACT_SEGMENTS
    while G > 1 and (cap % G or cap // G < defaults.MIN_SEGMENT):
        G //= 2
    return G


def compact_tile(N: int, segments: int, device: torch.device | str) -> int:
    """Codes per lane of a compaction tile for rows of N codes in ``segments`` segments (speed
    only): defaults.COMPACT_TILE on CUDA; elsewhere (the interpreter) doubled from defaults.COMPACT_TILE up to
    defaults.INTERPRETER_TILE while every segment keeps at least 4 rounds of tiles."""
    tile = defaults.COMPACT_TILE
    if torch.device(device).type != "cuda":
        while tile < defaults.INTERPRETER_TILE and 32 * 2 * tile * segments * 4 <= N:
            tile *= 2
    return tile


def compact(rows: torch.Tensor, tau: torch.Tensor, cap: int, segments: int | None = None,
            tile: int | None = None, stages: int | None = None,
            ends: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cand [R, cap] int64, count [R, G] int32) for ``rows [R, N]`` (codes or words) and ``tau
    [R]`` int64: the buffer's G segments (``segments``, ``compact_segments(cap)`` when None; G must
    divide cap) of cap // G slots each; sum(count[r]) is how many codes of row r are >= tau[r], and
    segment g of row r holds min(count[r, g], cap // G) of them first, in position order, a
    partition of the row's positions deciding which segment takes which (count[r, g] > cap // G:
    the segment, and the row, overflowed; ``overflowed``); slots past them are unspecified.
    ``tile``: codes per lane of a tile, ``stages``: loads in flight (``compact_tile``,
    defaults.COMPACT_STAGES when None; speed only). ``ends`` [R] int32 (speed only): positions from
    ``ends[r]`` on hold hidden codes only (high word INT32_MIN); the result is the same."""
    R, N = rows.shape
    G = compact_segments(cap) if segments is None else segments
    if cap % G:
        raise ValueError(f"segments: expected a divisor of cap = {cap}, got {G}")
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    tile = compact_tile(N, G, rows.device) if tile is None else tile
    cand = torch.empty((R, cap), dtype=torch.int64, device=rows.device)
    count = torch.empty((R, G), dtype=torch.int32, device=rows.device)
    if R:
        _compact_kernel[(R, G)](rows, tau, tau if ends is None else ends, cand, count, N, cap // G, rows.stride(0),
                                tau.stride(0), 0 if ends is None else ends.stride(0), cand.stride(0),
                                count.stride(0), TILE=tile,
                                STAGES=defaults.COMPACT_STAGES if stages is None else stages,
                                EVEN=N % (G * 32 * tile) == 0, WORDS=rows.dtype == torch.int32,
                                ENDS=ends is not None, num_warps=1)
    return cand, count


def top_codes(codes: torch.Tensor, kk: int, maxima: torch.Tensor | None = None, ordered: bool = True,
              ends: torch.Tensor | None = None) -> torch.Tensor:
    """The kk largest codes of each row of ``codes [..., N]``, descending (module docstring); with
    ``ordered`` False the same codes per row in an unspecified order.

    ``codes``: int64 codes, or int32 words standing for the codes ``(word << 32) + N - 1 -
    position`` (the dense scorer's ``words`` output, half the bytes to read). ``maxima [..., n]``
    int64 (kk <= n, same leading dims): the maxima of n disjoint chunks of each row, e.g. written
    by the scorer (indexer_scores ``maxima``); computed here when None. ``ends [...]`` int32 (same
    leading dims; speed only): each row's positions from ``ends`` on hold hidden codes only (the
    mask's visible extent, ``indexer_scores.mask_bounds``), so compaction may stop there."""
    N = codes.shape[-1]
    if not 1 <= kk <= N:
        raise ValueError(f"kk: expected 1 <= kk <= N = {N}, got {kk}")
    if codes.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"codes: expected int64 codes or int32 words, got {codes.dtype}")
    lead = codes.shape[:-1]
    if not takes_threshold(codes.numel() // max(N, 1), N, kk, codes.device):
        if codes.dtype == torch.int32:
            codes = codes_of_words(codes)
        return torch.topk(codes, kk, dim=-1, largest=True, sorted=ordered).values
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
    if ends is not None:
        if ends.shape != lead or ends.dtype != torch.int32:
            raise ValueError(f"ends: expected int32 [{', '.join(map(str, lead))}], got {ends.dtype} "
                             f"{tuple(ends.shape)}")
        ends = ends.reshape(-1)
    cand, count = compact(rows, tau, defaults.THRESHOLD_BUFFER_K * kk, ends=ends)
    out = top_candidates(cand, count, kk, ordered=ordered)
    select_top_codes(rows, overflowed(count, cand.shape[1]), kk, out=out)
    return out.reshape(*lead, kk)

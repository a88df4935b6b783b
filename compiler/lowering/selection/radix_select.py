"""Row-gated exact top-K of int64 order codes, in Triton, without host synchronisation (SPEC C.4).

``select_top_codes(codes [R, N] int64, valid [R] bool, kk, out=None, out_rows=None, ...)``: for
every row i with ``valid[i]``, the kk largest values of ``codes[i]`` as a multiset (a repeated
kk-th value fills the tail), descending, are written to ``out[out_rows[i]]`` (``out[i]`` when
out_rows is None); a row with ``valid[i]`` False does no work and writes nothing. Codes may also be
int32 words, each standing for ``(word << 32) + N - 1 - position`` (``row_codes_at``). Any int64
value is allowed. With ``scratch`` the call may overwrite the codes; the destinations of valid rows
must be distinct. No value is read by the host: a call can be captured in a CUDA graph. The result
depends on neither the block size nor the programs per row (``default_splits``)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiler.autotune import interpreter_active, multiprocessor_count
from compiler.lowering import defaults
from compiler.lowering.order_codes import INT32_MIN, INT64_MIN, code_of_word, word_of_code
from compiler.lowering.host_ints import cdiv, next_power_of_2


@triton.jit
def row_codes_at(row_codes, idx, inside, N, WORDS: tl.constexpr):
    """The int64 codes at positions ``idx`` of a row of N (INT64_MIN where not ``inside``): the
    row's codes, or with WORDS its int32 words, the code at position t being (word << 32) + N - 1 - t."""
    if WORDS:
        word = tl.load(row_codes + idx, mask=inside, other=0)
        code = tl.where(inside, code_of_word(word, idx, N), INT64_MIN)
    else:
        code = tl.load(row_codes + idx, mask=inside, other=INT64_MIN)
    return code


@triton.jit
def row_codes_at_least(row_codes, idx, inside, N, tau, WORDS: tl.constexpr):
    """(codes, keep) at positions ``idx`` of a row of N codes (or words, WORDS): ``keep`` is
    ``inside & (code >= tau)`` (tau int64); ``codes`` equals ``row_codes_at``'s where ``inside``.
    With WORDS the comparison takes no int64 arithmetic per code: with tau = (h << 32) + l
    (0 <= l < 2^32), code >= tau iff word > h, or word == h and N - 1 - idx >= l, i.e. idx < N - l."""
    if WORDS:
        word = tl.load(row_codes + idx, mask=inside, other=INT32_MIN)
        high = word_of_code(tau)
        cut = tl.maximum(N - (tau & 0xFFFFFFFF), 0).to(tl.int32)
        keep = inside & ((word > high) | ((word == high) & (idx < cut)))
        code = code_of_word(word, idx, N)
    else:
        code = tl.load(row_codes + idx, mask=inside, other=INT64_MIN)
        keep = inside & (code >= tau)
    return code, keep


@triton.jit
def _destination(valid_ptr, out_rows_ptr, row, out_num_rows, HAS_OUT_ROWS: tl.constexpr):
    """(destination in out of codes row ``row``, whether the row is valid and that destination
    lies in out)."""
    if HAS_OUT_ROWS:
        dst = tl.load(out_rows_ptr + row)
    else:
        dst = row.to(tl.int64)
    live = (tl.load(valid_ptr + row) != 0) & (dst >= 0) & (dst < out_num_rows)
    return dst, live


@triton.jit
def _count_digits(row_codes, N, lo, hi, prefix, prefix_mask, shift, BLOCK: tl.constexpr,
                  WORDS: tl.constexpr):
    """[16] int32: per value of the 4-bit digit of u at ``shift``, the elements of codes[lo:hi]
    whose u matches ``prefix`` on the bits of ``prefix_mask`` (a row of N codes or words)."""
    offs = tl.arange(0, BLOCK)
    digits = tl.arange(0, 16)
    counts = tl.zeros([16], dtype=tl.int32)
    for start in range(lo, hi, BLOCK):
        idx = start + offs
        inside = idx < hi
        u = row_codes_at(row_codes, idx, inside, N, WORDS) ^ INT64_MIN
        match = inside & ((u & prefix_mask) == prefix)
        digit = ((u >> shift) & 15).to(tl.int32)
        hit = match[:, None] & (digit[:, None] == digits[None, :])
        counts += tl.sum(hit.to(tl.int32), axis=0)
    return counts


@triton.jit
def _choose_digit(counts, rank):
    """(the digit of the rank-th largest matching element, its rank among that digit's elements)."""
    digits = tl.arange(0, 16)
    # at_or_above[d] = number of matching elements whose digit is >= d (non-increasing in d).
    at_or_above = tl.sum(tl.where(digits[None, :] >= digits[:, None], counts[None, :], 0), axis=1)
    chosen = tl.sum((at_or_above >= rank).to(tl.int32), axis=0) - 1
    rank -= tl.sum(tl.where(digits > chosen, counts, 0), axis=0)
    return chosen, rank


@triton.jit
def _state_after(tally_row, state_row, q, kk):
    """(prefix, prefix_mask, rank) after the digit choice of pass ``q``: from the state after pass
    q - 1 (``state_row[2 (q-1)]`` prefix, ``[2 (q-1) + 1]`` rank; the start state (0, kk) when
    q == 0) and the per-digit counts of pass q, ``tally_row[16 q + d]``."""
    shift = 60 - 4 * q
    earlier = q > 0
    prefix = tl.load(state_row + 2 * (q - 1), mask=earlier, other=0)
    rank = tl.load(state_row + 2 * (q - 1) + 1, mask=earlier, other=0)
    rank = tl.where(earlier, rank, kk).to(tl.int32)
    chosen, rank = _choose_digit(tl.load(tally_row + 16 * q + tl.arange(0, 16)), rank)
    prefix = prefix | (chosen.to(tl.int64) << shift)
    prefix_mask = -(tl.full([], 1, tl.int64) << shift)  # bits `shift`..63 of u: passes 0..q
    return prefix, prefix_mask, rank


@triton.jit
def _complete_and_sort(row_out, stride_oc, live, kth, num_greater, kk, KP: tl.constexpr):
    """Stage 3 when ``live``: slots num_greater..kk-1 := kth, the first kk slots of the row sorted
    descending. A dead row branches past it (no loads, sort or stores)."""
    if live:
        slots = tl.arange(0, KP)
        top = tl.load(row_out + slots.to(tl.int64) * stride_oc, mask=slots < num_greater, other=0,
                      cache_modifier=".cg")
        top = tl.where(slots < num_greater, top, tl.where(slots < kk, kth, INT64_MIN))
        top = tl.sort(top, descending=True)
        tl.store(row_out + slots.to(tl.int64) * stride_oc, top, mask=slots < kk)


@triton.jit
def _select_row(row_codes, N, row_out, stride_oc, live, kk, BLOCK: tl.constexpr, KP: tl.constexpr,
                WORDS: tl.constexpr):
    """Stages 1-3 in one program: the top kk of the row's N codes (or words, WORDS), descending,
    into ``row_out`` (slots 0..kk-1, stride ``stride_oc``); nothing read or written unless ``live``."""
    n_live = tl.where(live, N, 0)
    passes = tl.where(live, 16, 0)
    offs = tl.arange(0, BLOCK)

    # Stage 1: radix select of the kk-th largest value (on u = c ^ INT64_MIN, see module doc).
    prefix = tl.zeros([], dtype=tl.int64)       # u-bits of the digits chosen so far
    prefix_mask = tl.zeros([], dtype=tl.int64)  # which bits of u those are
    rank = tl.zeros([], dtype=tl.int32) + kk    # rank of the kk-th largest among matching elements
    for p in range(0, passes):
        shift = 60 - 4 * p
        counts = _count_digits(row_codes, N, 0, n_live, prefix, prefix_mask, shift, BLOCK, WORDS)
        chosen, rank = _choose_digit(counts, rank)
        prefix = prefix | (chosen.to(tl.int64) << shift)
        prefix_mask = prefix_mask | (tl.full([], 15, tl.int64) << shift)
    kth = prefix ^ INT64_MIN

    # Stage 2: compact the values strictly greater than kth (fewer than kk of them).
    written = tl.zeros([], dtype=tl.int32)
    for start in range(0, n_live, BLOCK):
        idx = start + offs
        inside = idx < N
        c = row_codes_at(row_codes, idx, inside, N, WORDS)
        greater = inside & (c > kth)
        pos = written + tl.cumsum(greater.to(tl.int32), axis=0) - 1
        tl.store(row_out + pos.to(tl.int64) * stride_oc, c, mask=greater)
        written += tl.sum(greater.to(tl.int32), axis=0)
    # The compacted values are read back by other threads of the program: a barrier, and loads
    # that bypass L1 (".cg").
    tl.debug_barrier()

    _complete_and_sort(row_out, stride_oc, live, kth, kk - rank, kk, KP)


@triton.jit
def _select_top_codes_kernel(codes_ptr, valid_ptr, out_ptr, out_rows_ptr,
                             N, kk, out_num_rows,
                             stride_cr, stride_or, stride_oc,
                             HAS_OUT_ROWS: tl.constexpr, BLOCK: tl.constexpr, KP: tl.constexpr,
                             WORDS: tl.constexpr):
    """One program: row ``program_id(0)`` of codes -> its top kk, descending, in its out row."""
    row = tl.program_id(0)
    dst, live = _destination(valid_ptr, out_rows_ptr, row, out_num_rows, HAS_OUT_ROWS)
    _select_row(codes_ptr + row.to(tl.int64) * stride_cr, N, out_ptr + tl.where(live, dst, 0) * stride_or,
                stride_oc, live, kk, BLOCK, KP, WORDS)


@triton.jit
def _compact_pass(row_codes, row_out, stride_oc, m, written, chosen, shift, next_shift,
                  BLOCK: tl.constexpr):
    """One read of ``codes[0:m]`` (all matching the prefix before pass ``shift``): the elements
    whose digit at ``shift`` is above ``chosen`` go to ``out[written:]``, those equal to it are
    moved, in row order, to ``codes[0:kept]``. Returns (per-digit counts at ``next_shift`` of the
    kept elements, written after the pass)."""
    offs = tl.arange(0, BLOCK)
    digits = tl.arange(0, 16)
    counts = tl.zeros([16], dtype=tl.int32)
    kept = tl.zeros([], dtype=tl.int32)
    for start in range(0, m, BLOCK):
        idx = start + offs
        inside = idx < m
        c = tl.load(row_codes + idx, mask=inside, other=0, cache_modifier=".cg")
        u = c ^ INT64_MIN
        digit = ((u >> shift) & 15).to(tl.int32)
        above = inside & (digit > chosen)
        keep = inside & (digit == chosen)
        out_pos = written + tl.cumsum(above.to(tl.int32), axis=0) - 1
        keep_pos = kept + tl.cumsum(keep.to(tl.int32), axis=0) - 1
        # Every thread's loads of this block are done before any thread stores into it.
        tl.debug_barrier()
        tl.store(row_out + out_pos.to(tl.int64) * stride_oc, c, mask=above)
        tl.store(row_codes + keep_pos, c, mask=keep & (keep_pos != idx))
        next_digit = ((u >> next_shift) & 15).to(tl.int32)
        counts += tl.sum((keep[:, None] & (next_digit[:, None] == digits[None, :])).to(tl.int32),
                         axis=0)
        written += tl.sum(above.to(tl.int32), axis=0)
        kept += tl.sum(keep.to(tl.int32), axis=0)
    return counts, written


@triton.jit
def _select_top_codes_compacting_kernel(codes_ptr, valid_ptr, out_ptr, out_rows_ptr,
                                        N, kk, out_num_rows,
                                        stride_cr, stride_or, stride_oc,
                                        HAS_OUT_ROWS: tl.constexpr, BLOCK: tl.constexpr,
                                        KP: tl.constexpr):
    """One program: row ``program_id(0)`` of codes -> its top kk, descending, in its out row,
    overwriting the row of codes (``scratch=True``, see module doc)."""
    row = tl.program_id(0)
    dst, live = _destination(valid_ptr, out_rows_ptr, row, out_num_rows, HAS_OUT_ROWS)
    row_codes = codes_ptr + row.to(tl.int64) * stride_cr
    row_out = out_ptr + tl.where(live, dst, 0) * stride_or
    m = tl.where(live, N, 0)             # candidates: codes[0:m] match the prefix so far
    passes = tl.where(live, 16, 0)
    digits = tl.arange(0, 16)

    counts = _count_digits(row_codes, N, 0, m, 0, 0, 60, BLOCK, False)
    prefix = tl.zeros([], dtype=tl.int64)
    rank = tl.zeros([], dtype=tl.int32) + kk
    written = tl.zeros([], dtype=tl.int32)  # candidates dropped as above the prefix range
    for p in range(0, passes):
        shift = 60 - 4 * p
        chosen, rank = _choose_digit(counts, rank)
        prefix = prefix | (chosen.to(tl.int64) << shift)
        kept = tl.sum(tl.where(digits == chosen, counts, 0), axis=0)
        counts, written = _compact_pass(row_codes, row_out, stride_oc, m, written, chosen, shift,
                                        tl.maximum(shift - 4, 0), BLOCK)
        m = kept
        # The next pass reads codes[0:m] stored by other threads: a barrier, and ".cg" loads.
        tl.debug_barrier()

    _complete_and_sort(row_out, stride_oc, live, prefix ^ INT64_MIN, written, kk, KP)


TALLY_ROW = 17 * 16
"""int32 entries per row of the split layout's tally: 16 passes x 16 digits, then the counter of
values written by the collect launch (at 16 * 16) and 15 unused entries."""


@triton.jit(do_not_specialize=["pass_index"])
def _count_chunk_kernel(codes_ptr, valid_ptr, out_rows_ptr, tally_ptr, state_ptr,
                        N, kk, out_num_rows, stride_cr, stride_tr, chunk, pass_index,
                        HAS_OUT_ROWS: tl.constexpr, BLOCK: tl.constexpr, WORDS: tl.constexpr):
    """Program (row, part): add the digit counts of pass ``pass_index`` over chunk ``part`` of the
    row to ``tally[row, pass_index]``; part 0 also stores the state after pass pass_index - 1."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    _, live = _destination(valid_ptr, out_rows_ptr, row, out_num_rows, HAS_OUT_ROWS)
    tally_row = tally_ptr + row.to(tl.int64) * stride_tr
    state_row = state_ptr + row.to(tl.int64) * 32
    prefix = tl.zeros([], dtype=tl.int64)
    prefix_mask = tl.zeros([], dtype=tl.int64)
    if pass_index > 0:
        prefix, prefix_mask, rank = _state_after(tally_row, state_row, pass_index - 1, kk)
        keeper = live & (part == 0)
        tl.store(state_row + 2 * (pass_index - 1), prefix, mask=keeper)
        tl.store(state_row + 2 * (pass_index - 1) + 1, rank.to(tl.int64), mask=keeper)
    lo = part * chunk
    hi = tl.where(live, tl.minimum(lo + chunk, N), lo)
    counts = _count_digits(codes_ptr + row.to(tl.int64) * stride_cr, N, lo, hi, prefix, prefix_mask,
                           60 - 4 * pass_index, BLOCK, WORDS)
    tl.atomic_add(tally_row + pass_index * 16 + tl.arange(0, 16), counts, mask=counts > 0)


@triton.jit
def _collect_chunk_kernel(codes_ptr, valid_ptr, out_ptr, out_rows_ptr, tally_ptr, state_ptr,
                          N, kk, out_num_rows, stride_cr, stride_tr, stride_or, stride_oc, chunk,
                          HAS_OUT_ROWS: tl.constexpr, BLOCK: tl.constexpr, WORDS: tl.constexpr):
    """Program (row, part): the values of chunk ``part`` greater than the row's kk-th largest, into
    out row slots reserved on the row's counter ``tally[row, 16, 0]``."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    dst, live = _destination(valid_ptr, out_rows_ptr, row, out_num_rows, HAS_OUT_ROWS)
    tally_row = tally_ptr + row.to(tl.int64) * stride_tr
    prefix, _, _ = _state_after(tally_row, state_ptr + row.to(tl.int64) * 32, 15, kk)
    kth = prefix ^ INT64_MIN
    row_codes = codes_ptr + row.to(tl.int64) * stride_cr
    row_out = out_ptr + tl.where(live, dst, 0) * stride_or
    lo = part * chunk
    hi = tl.where(live, tl.minimum(lo + chunk, N), lo)
    offs = tl.arange(0, BLOCK)
    for start in range(lo, hi, BLOCK):
        idx = start + offs
        inside = idx < hi
        c = row_codes_at(row_codes, idx, inside, N, WORDS)
        greater = inside & (c > kth)
        num = tl.sum(greater.to(tl.int32), axis=0)
        base = tl.atomic_add(tally_row + 16 * 16, num, mask=num > 0)
        pos = base + tl.cumsum(greater.to(tl.int32), axis=0) - 1
        tl.store(row_out + pos.to(tl.int64) * stride_oc, c, mask=greater)


@triton.jit
def _finish_row_kernel(valid_ptr, out_ptr, out_rows_ptr, tally_ptr, state_ptr,
                       kk, out_num_rows, stride_tr, stride_or, stride_oc,
                       HAS_OUT_ROWS: tl.constexpr, KP: tl.constexpr):
    """Program row: stage 3 on the row's destination, from the state after pass 15."""
    row = tl.program_id(0)
    dst, live = _destination(valid_ptr, out_rows_ptr, row, out_num_rows, HAS_OUT_ROWS)
    prefix, _, rank = _state_after(tally_ptr + row.to(tl.int64) * stride_tr,
                                   state_ptr + row.to(tl.int64) * 32, 15, kk)
    _complete_and_sort(out_ptr + tl.where(live, dst, 0) * stride_or, stride_oc, live,
                       prefix ^ INT64_MIN, kk - rank, kk, KP)


def _check_tensor(name: str, value, dtype: torch.dtype | tuple[torch.dtype, ...], dim: int) -> None:
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {value.dtype}")
    if value.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(value.shape)}")


def _check_arguments(codes, valid, kk, out, out_rows, block, splits) -> None:
    """TypeError/ValueError naming the argument for anything outside the module contract."""
    _check_tensor("codes", codes, (torch.int64, torch.int32), 2)
    rows, n = codes.shape
    if n > 1 and codes.stride(1) != 1:
        raise ValueError(f"codes must be contiguous in its last dim, got strides {codes.stride()}")
    if codes.device.type != "cuda" and not interpreter_active():
        raise ValueError(f"codes must be a CUDA tensor (or run with TRITON_INTERPRET=1), "
                         f"got device {codes.device}")
    _check_tensor("valid", valid, torch.bool, 1)
    if valid.shape[0] != rows:
        raise ValueError(f"valid must have shape ({rows},) = codes.shape[:1], got {tuple(valid.shape)}")
    if isinstance(kk, bool) or not isinstance(kk, int):
        raise TypeError(f"kk must be an int, got {type(kk).__name__}")
    if not 1 <= kk <= n:
        raise ValueError(f"kk must satisfy 1 <= kk <= N = codes.shape[1] = {n}, got {kk}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16, got {block!r}")
    if splits is not None:
        if isinstance(splits, bool) or not isinstance(splits, int):
            raise TypeError(f"splits must be an int or None, got {type(splits).__name__}")
        if splits < 1:
            raise ValueError(f"splits must be >= 1, got {splits}")
    if out is None:
        if out_rows is not None:
            raise ValueError("out must be given when out_rows is given")
    else:
        _check_tensor("out", out, torch.int64, 2)
        if out.shape[1] != kk:
            raise ValueError(f"out must have {kk} (= kk) columns, got shape {tuple(out.shape)}")
        if out_rows is None and out.shape[0] != rows:
            raise ValueError(f"out must have {rows} (= codes.shape[0]) rows when out_rows is None, "
                             f"got shape {tuple(out.shape)}")
    if out_rows is not None:
        _check_tensor("out_rows", out_rows, torch.int64, 1)
        if out_rows.shape[0] != rows:
            raise ValueError(f"out_rows must have shape ({rows},) = codes.shape[:1], "
                             f"got {tuple(out_rows.shape)}")
    for name, tensor in (("valid", valid), ("out", out), ("out_rows", out_rows)):
        if tensor is not None and tensor.device != codes.device:
            raise ValueError(f"{name} must be on codes' device {codes.device}, got {tensor.device}")


def default_splits(busy_rows: int, n: int, block: int, device: torch.device) -> int:
    """Programs per row for ``busy_rows`` rows that do work, rows of ``n`` codes, chunks of whole
    ``block``s: about defaults.RADIX_PROGRAMS_PER_SM programs per SM in all, at least 1, at most one per block.
    1 off CUDA (the interpreter). Reads device properties only, never tensor values."""
    if torch.device(device).type != "cuda":
        return 1
    sms = multiprocessor_count(torch.device(device))
    return max(1, min(cdiv(defaults.RADIX_PROGRAMS_PER_SM * sms, max(busy_rows, 1)), cdiv(n, block)))


def select_top_codes(codes: torch.Tensor, valid: torch.Tensor, kk: int,
                     out: torch.Tensor | None = None, out_rows: torch.Tensor | None = None,
                     *, block: int = defaults.RADIX_BLOCK, splits: int | None = None,
                     scratch: bool = False) -> torch.Tensor:
    """Top kk of each valid row of ``codes [R, N]`` int64, descending, into ``out``; returns out.
    ``codes`` may be int32 *words* instead: row i's codes are then ``(codes[i, t] << 32) + N - 1 -
    t`` (the dense scorer's ``words`` output; ``scratch`` must be False).

    ``valid [R]`` bool gates the rows; ``out [R', kk]`` int64 (allocated as ``[R, kk]`` when None,
    its invalid rows then left uninitialised); ``out_rows [R]`` int64 maps row i to
    ``out[out_rows[i]]`` (identity when None; only valid rows' entries are read, they must be
    distinct and in ``[0, R')`` — a valid row mapped outside ``out`` writes nothing, since checking
    would need the host). ``block`` (a power of two >= 16) is the chunk length of the passes over a
    row; ``splits`` (an int >= 1) the programs per row; when None, 1 for a ``scratch`` call of
    more than defaults.SCRATCH_SPLIT_MAX_ROWS rows, else ``default_splits(R, N, block, device)``: 1 is one
    launch, P > 1 is 19 launches (a zeroed tally, 16 count passes, collect,
    finish) over P chunks of each row. ``scratch=True`` lets a one-program call (splits == 1)
    overwrite the codes rows of valid rows (their content afterwards is unspecified; invalid
    rows are not touched) to read each row about twice instead of 17 times; it is ignored when
    splits > 1. All three change speed only. Exact for every int64 value; no
    host synchronisation, a fixed number of launches (capturable in a CUDA graph). CUDA tensors,
    or CPU tensors under ``TRITON_INTERPRET=1``. Bad arguments raise TypeError/ValueError naming
    the argument.
    """
    _check_arguments(codes, valid, kk, out, out_rows, block, splits)
    if not isinstance(scratch, bool):
        raise TypeError(f"scratch must be a bool, got {type(scratch).__name__}")
    words = codes.dtype == torch.int32
    if scratch and words:
        raise ValueError("scratch must be False for int32 words (their rows cannot hold codes)")
    rows, n = codes.shape
    if out is None:
        out = torch.empty((rows, kk), dtype=torch.int64, device=codes.device)
    if rows == 0:
        return out
    if splits is None:
        splits = (1 if scratch and rows > defaults.SCRATCH_SPLIT_MAX_ROWS
                  else default_splits(rows, n, block, codes.device))
    rows_arg = out_rows if out_rows is not None else valid
    has_out_rows = out_rows is not None
    kp = next_power_of_2(kk)
    if splits == 1:
        kernel = _select_top_codes_compacting_kernel if scratch else _select_top_codes_kernel
        kernel[(rows,)](
            codes, valid, out, rows_arg, n, kk, out.shape[0],
            codes.stride(0), out.stride(0), out.stride(1),
            HAS_OUT_ROWS=has_out_rows, BLOCK=block, KP=kp, num_warps=defaults.RADIX_WARPS,
            **({} if scratch else {"WORDS": words}))
        return out
    chunk = cdiv(cdiv(n, block), splits) * block
    tally = torch.zeros((rows, TALLY_ROW), dtype=torch.int32, device=codes.device)
    state = torch.empty((rows, 16, 2), dtype=torch.int64, device=codes.device)
    for pass_index in range(16):
        _count_chunk_kernel[(rows, splits)](
            codes, valid, rows_arg, tally, state, n, kk, out.shape[0],
            codes.stride(0), tally.stride(0), chunk, pass_index,
            HAS_OUT_ROWS=has_out_rows, BLOCK=block, WORDS=words, num_warps=defaults.RADIX_WARPS)
    _collect_chunk_kernel[(rows, splits)](
        codes, valid, out, rows_arg, tally, state, n, kk, out.shape[0],
        codes.stride(0), tally.stride(0), out.stride(0), out.stride(1), chunk,
        HAS_OUT_ROWS=has_out_rows, BLOCK=block, WORDS=words, num_warps=defaults.RADIX_WARPS)
    _finish_row_kernel[(rows,)](
        valid, out, rows_arg, tally, state, kk, out.shape[0],
        tally.stride(0), out.stride(0), out.stride(1),
        HAS_OUT_ROWS=has_out_rows, KP=kp, num_warps=defaults.RADIX_WARPS)
    return out

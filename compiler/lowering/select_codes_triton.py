"""Row-gated exact top-K of int64 order codes, in Triton, without host synchronisation.

Contract of ``select_top_codes(codes [R, N] int64, valid [R] bool, kk, out=None, out_rows=None)``:
for every row i with ``valid[i]``, the kk largest values of ``codes[i]`` as a multiset (a repeated
kk-th value fills the tail with copies of itself), in descending order, are written to
``out[out_rows[i]]`` (``out[i]`` when out_rows is None). A row with ``valid[i]`` False does no work
and writes nothing. Any int64 value is allowed, INT64_MIN and INT64_MAX included. No value is read
by the host, so a call can be captured in a CUDA graph.

Kernel: one program per row, three stages, all exact integer arithmetic.

1. The kk-th largest value ``kth`` by most-significant-digit radix select. ``u = c ^ INT64_MIN``
   flips the sign bit, so that the unsigned order of the bit patterns of u is the signed order of
   c. Sixteen passes over the row, 4-bit digits from the top: pass p counts, per digit value, the
   elements whose higher digits equal the prefix chosen so far; the chosen digit is the largest
   one whose count of candidates with that digit or above is at least the remaining rank ``k``,
   and ``k`` drops by the candidates above it. Invariant: the kk-th largest element matches the
   prefix and is the k-th largest among the matching ones. After 16 digits the prefix is u of the
   kk-th largest, and ``k`` is how many copies of it belong to the top kk.
2. One pass compacting the ``kk - k`` values strictly greater than ``kth`` into the destination
   row (running offset plus an in-block cumulative sum); positions ``kk - k .. kk-1`` are ``kth``.
3. The destination row is read back into a power-of-two ``[KP]`` register tile (tail padded with
   INT64_MIN, which sorts last and never displaces a real value), sorted descending by ``tl.sort``
   and its first kk entries stored.

Gating: a program whose row is not valid (or whose destination row lies outside ``out``) runs its
loops zero times (loop bounds are zero through ``tl.where`` on the loaded flag) and masks every
store. The destinations of valid rows must be distinct (two valid rows writing one row race).
Launch configuration: one fixed config (``BLOCK`` elements per chunk, 8 warps), not tuned; the
result does not depend on it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

NUM_WARPS = 8
DEFAULT_BLOCK = 1024


@triton.jit
def _select_top_codes_kernel(codes_ptr, valid_ptr, out_ptr, out_rows_ptr,
                             N, kk, out_num_rows,
                             stride_cr, stride_or, stride_oc,
                             HAS_OUT_ROWS: tl.constexpr, BLOCK: tl.constexpr, KP: tl.constexpr):
    """One program: row ``program_id(0)`` of codes -> its top kk, descending, in its out row."""
    row = tl.program_id(0)
    if HAS_OUT_ROWS:
        dst = tl.load(out_rows_ptr + row)
    else:
        dst = row.to(tl.int64)
    live = (tl.load(valid_ptr + row) != 0) & (dst >= 0) & (dst < out_num_rows)
    row_codes = codes_ptr + row.to(tl.int64) * stride_cr
    row_out = out_ptr + tl.where(live, dst, 0) * stride_or
    n_live = tl.where(live, N, 0)
    passes = tl.where(live, 16, 0)
    offs = tl.arange(0, BLOCK)
    digits = tl.arange(0, 16)

    # Stage 1: radix select of the kk-th largest value (on u = c ^ INT64_MIN, see module doc).
    prefix = tl.zeros([], dtype=tl.int64)       # u-bits of the digits chosen so far
    prefix_mask = tl.zeros([], dtype=tl.int64)  # which bits of u those are
    rank = kk                                   # rank of the k-th largest among matching elements
    for p in range(0, passes):
        shift = 60 - 4 * p
        counts = tl.zeros([16], dtype=tl.int32)
        for start in range(0, n_live, BLOCK):
            idx = start + offs
            inside = idx < N
            u = tl.load(row_codes + idx, mask=inside, other=0) ^ -9223372036854775808
            match = inside & ((u & prefix_mask) == prefix)
            digit = ((u >> shift) & 15).to(tl.int32)
            hit = match[:, None] & (digit[:, None] == digits[None, :])
            counts += tl.sum(hit.to(tl.int32), axis=0)
        # at_or_above[d] = number of matching elements whose digit is >= d (non-increasing in d).
        at_or_above = tl.sum(tl.where(digits[None, :] >= digits[:, None], counts[None, :], 0), axis=1)
        chosen = tl.sum((at_or_above >= rank).to(tl.int32), axis=0) - 1
        rank -= tl.sum(tl.where(digits > chosen, counts, 0), axis=0)
        prefix = prefix | (chosen.to(tl.int64) << shift)
        prefix_mask = prefix_mask | (tl.full([], 15, tl.int64) << shift)
    kth = prefix ^ -9223372036854775808
    num_greater = kk - rank

    # Stage 2: compact the values strictly greater than kth (fewer than kk of them).
    written = tl.zeros([], dtype=tl.int32)
    for start in range(0, n_live, BLOCK):
        idx = start + offs
        inside = idx < N
        c = tl.load(row_codes + idx, mask=inside, other=0)
        greater = inside & (c > kth)
        pos = written + tl.cumsum(greater.to(tl.int32), axis=0) - 1
        tl.store(row_out + pos.to(tl.int64) * stride_oc, c, mask=greater)
        written += tl.sum(greater.to(tl.int32), axis=0)
    # The compacted values are read back below by other threads of the program: a barrier, and
    # loads that bypass L1 (".cg").
    tl.debug_barrier()

    # Stage 3: complete with copies of kth, sort descending, store the first kk.
    slots = tl.arange(0, KP)
    top = tl.load(row_out + slots.to(tl.int64) * stride_oc, mask=live & (slots < num_greater),
                  other=0, cache_modifier=".cg")
    top = tl.where(slots < num_greater, top, tl.where(slots < kk, kth, -9223372036854775808))
    top = tl.sort(top, descending=True)
    tl.store(row_out + slots.to(tl.int64) * stride_oc, top, mask=live & (slots < kk))


_INTERPRETED = isinstance(_select_top_codes_kernel, InterpretedFunction)
"""True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 at import)."""


def _check_tensor(name: str, value, dtype: torch.dtype, dim: int) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {value.dtype}")
    if value.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(value.shape)}")


def _check_arguments(codes, valid, kk, out, out_rows, block) -> None:
    """TypeError/ValueError naming the argument for anything outside the module contract."""
    _check_tensor("codes", codes, torch.int64, 2)
    rows, n = codes.shape
    if n > 1 and codes.stride(1) != 1:
        raise ValueError(f"codes must be contiguous in its last dim, got strides {codes.stride()}")
    if codes.device.type != "cuda" and not _INTERPRETED:
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


def select_top_codes(codes: torch.Tensor, valid: torch.Tensor, kk: int,
                     out: torch.Tensor | None = None, out_rows: torch.Tensor | None = None,
                     *, block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """Top kk of each valid row of ``codes [R, N]`` int64, descending, into ``out``; returns out.

    ``valid [R]`` bool gates the rows; ``out [R', kk]`` int64 (allocated as ``[R, kk]`` when None,
    its invalid rows then left uninitialised); ``out_rows [R]`` int64 maps row i to
    ``out[out_rows[i]]`` (identity when None; only valid rows' entries are read, they must be
    distinct and in ``[0, R')`` — a valid row mapped outside ``out`` writes nothing, since checking
    would need the host). ``block`` (a power of two >= 16) is the chunk length of the passes over a
    row; it changes speed only. Exact for every int64 value; no host synchronisation. CUDA tensors,
    or CPU tensors under ``TRITON_INTERPRET=1``. Bad arguments raise TypeError/ValueError naming
    the argument.
    """
    _check_arguments(codes, valid, kk, out, out_rows, block)
    rows, n = codes.shape
    if out is None:
        out = torch.empty((rows, kk), dtype=torch.int64, device=codes.device)
    if rows == 0:
        return out
    _select_top_codes_kernel[(rows,)](
        codes, valid, out, out_rows if out_rows is not None else valid,
        n, kk, out.shape[0], codes.stride(0), out.stride(0), out.stride(1),
        HAS_OUT_ROWS=out_rows is not None, BLOCK=block, KP=triton.next_power_of_2(kk),
        num_warps=NUM_WARPS)
    return out

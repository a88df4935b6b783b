"""Exact top-kk of a few long rows of order codes, decoded, in one launch: the decode path's
selection (SPEC C.3), and the dense redo's for its first flagged rows.

``few_rows_topk(codes [R, N] int64, maxima [R, n] int64, kk, T)`` returns (values [R, kk] fp32,
indices [R, kk] int64) equal to ``decode_codes(torch.topk(codes, kk).values, T)``. Requirements:
codes distinct within a row; ``maxima[r, j]`` the largest code of row r's interleaved chunk j, as
``score_dense(maxima=...)`` writes them; 1 <= kk <= n <= min(N, ``defaults.KTH_REGISTER_ROW``). The
codes are scratch. Two launches, no host synchronisation; the order of the atomics does not show.
``takes_few_rows`` says when a call takes this path (CUDA, fewer than ``defaults.FEW_ROWS`` rows):
a decode call is bound by host time, and ``torch.topk`` over codes costs many more launches.
``few_rows_top_codes`` is the row-gated form (``valid``, ``out_rows`` as ``select_top_codes`` takes
them) writing each valid row's top kk codes, descending, where ``top_codes`` would: each row over
many programs where ``select_top_codes`` gives a long row one."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiler.autotune import multiprocessor_count
from compiler.lowering.order_codes import INT64_MIN, decode_code
from compiler.lowering.selection.radix_select import _complete_and_sort, _destination, _select_row
from compiler.lowering.selection.threshold_select import _kth_of, window
from compiler.lowering import defaults
from compiler.lowering.host_ints import cdiv, next_power_of_2


@triton.jit
def _few_rows_kernel(codes_ptr, maxima_ptr, cand_ptr, counters_ptr, values_ptr, idx_ptr, valid_ptr, out_ptr,
                     out_rows_ptr, N, n, kk, T, chunk, out_num_rows, stride_c, stride_m, stride_d, stride_o,
                     NP: tl.constexpr, BLOCK: tl.constexpr, WINDOW: tl.constexpr, KP: tl.constexpr,
                     GATED: tl.constexpr):
    """Program (row, part): the row's codes of chunk ``part`` at least tau (the kk-th largest chunk
    maximum) into its candidates; the row's last program to finish selects their top kk. GATED: a
    row of ``valid`` False does nothing, a valid row's top kk codes go, descending, to
    ``out[out_rows[row]]``; else they are decoded into values and idx."""
    row = tl.program_id(0).to(tl.int64)
    live = True
    dst = row
    if GATED:
        dst, live = _destination(valid_ptr, out_rows_ptr, row, out_num_rows, True)
    j = tl.arange(0, NP)
    tau = _kth_of(tl.load(maxima_ptr + row * stride_m + j, mask=(j < n) & live, other=INT64_MIN), kk)
    row_codes = codes_ptr + row * stride_c
    row_cand = cand_ptr + row * stride_d
    count_ptr = counters_ptr + 2 * row
    offs = tl.arange(0, BLOCK)
    lo = tl.program_id(1) * chunk
    hi = tl.where(live, tl.minimum(lo + chunk, N), lo)
    for start in range(lo, hi, BLOCK):
        t = start + offs
        c = tl.load(row_codes + t, mask=t < hi, other=INT64_MIN)
        keep = ((t < hi) & (c >= tau)).to(tl.int32)
        base = tl.atomic_add(count_ptr, tl.sum(keep, axis=0))
        tl.store(row_cand + base + tl.cumsum(keep, axis=0) - 1, c, mask=keep != 0)
    if live:
        ticket = tl.atomic_add(count_ptr + 1, 1, sem="acq_rel")
        if ticket == tl.num_programs(1) - 1:
            # The top kk go to the row's own codes (scratch), or GATED straight to its out row.
            row_top = out_ptr + dst * stride_o if GATED else row_codes
            count = tl.atomic_add(count_ptr, 0, sem="acquire")
            some = count > 0
            if count <= WINDOW:
                w = tl.arange(0, WINDOW)
                x = tl.load(row_cand + w, mask=w < count, other=INT64_MIN, cache_modifier=".cg")
                kth = _kth_of(x, kk)
                greater = (x > kth).to(tl.int32)
                tl.store(row_top + tl.cumsum(greater, axis=0) - 1, x, mask=greater != 0)
                tl.debug_barrier()
                _complete_and_sort(row_top, 1, some, kth, tl.sum(greater, axis=0), kk, KP)
            else:
                _select_row(row_cand, count, row_top, 1, some, kk, BLOCK, KP, False)
            if not GATED:
                tl.debug_barrier()
                s = tl.arange(0, KP)
                value, key = decode_code(tl.load(row_top + s, mask=s < kk, other=0, cache_modifier=".cg"), T)
                tl.store(values_ptr + row * stride_o + s, value, mask=s < kk)
                tl.store(idx_ptr + row * stride_o + s, key, mask=s < kk)


def few_rows_fit(N: int, kk: int, n: int) -> bool:
    """Whether rows of N codes with n chunk maxima each meet the module contract's sizes: 1 <= kk <=
    n <= min(N, defaults.KTH_REGISTER_ROW)."""
    return 1 <= kk <= n <= min(N, defaults.KTH_REGISTER_ROW)


def takes_few_rows(rows: int, N: int, kk: int, n: int, device: torch.device | str) -> bool:
    """Whether ``rows`` rows of N codes with n chunk maxima each take ``few_rows_topk``: CUDA and
    fewer than threshold_select's defaults.FEW_ROWS rows (more take its many-row path), rows of any length
    with kk <= n <= min(N, defaults.KTH_REGISTER_ROW). A row of at most WINDOW codes is selected in
    registers whatever tau leaves; the alternative, ``torch.topk``, costs ~30 launches."""
    return torch.device(device).type == "cuda" and rows < defaults.FEW_ROWS and few_rows_fit(N, kk, n)


def _check_rows(codes: torch.Tensor, maxima: torch.Tensor, kk: int) -> None:
    """ValueError naming kk or maxima unless codes [R, N] and maxima [R, n] meet the module contract."""
    R, N = codes.shape
    n = maxima.shape[1]
    if not few_rows_fit(N, kk, n):
        raise ValueError(f"kk, maxima: expected 1 <= kk <= n <= min(N, {defaults.KTH_REGISTER_ROW}) with n = "
                         f"{n}, N = {N}, got kk = {kk}")
    if maxima.shape[0] != R or codes.stride(1) != 1 or maxima.stride(1) != 1:
        raise ValueError(f"codes, maxima: expected [R, N] and [R, n] with contiguous last dims, got "
                         f"{tuple(codes.shape)} and {tuple(maxima.shape)}")


def _launch(codes, maxima, kk, T, values, idx, gate) -> None:
    """One launch of ``_few_rows_kernel`` over the R rows of checked codes and maxima: each row split
    into about defaults.FEW_ROWS_PROGRAMS_PER_SM programs per SM in all; ``gate`` None (decode into
    values and idx) or (valid, out, out_rows)."""
    R, N = codes.shape
    n = maxima.shape[1]
    cand = torch.empty((R, N), dtype=torch.int64, device=codes.device)
    counters = torch.zeros((R, 2), dtype=torch.int32, device=codes.device)
    blocks = cdiv(N, defaults.FEW_ROWS_BLOCK)
    programs = (defaults.FEW_ROWS_PROGRAMS_PER_SM * multiprocessor_count(codes.device) if codes.device.type == "cuda"
                else defaults.FEW_ROWS_INTERPRETER_PROGRAMS)
    chunk = cdiv(blocks, max(1, min(blocks, cdiv(programs, R)))) * defaults.FEW_ROWS_BLOCK
    valid, out, out_rows = (codes, values, codes) if gate is None else gate
    _few_rows_kernel[(R, cdiv(N, chunk))](
        codes, maxima, cand, counters, values, idx, valid, out, out_rows, N, n, kk, T, chunk, out.shape[0],
        codes.stride(0), maxima.stride(0), cand.stride(0), out.stride(0),
        NP=next_power_of_2(n), BLOCK=defaults.FEW_ROWS_BLOCK, WINDOW=window(N, kk), KP=next_power_of_2(kk),
        GATED=gate is not None, num_warps=defaults.FEW_ROWS_WARPS)


def few_rows_topk(codes: torch.Tensor, maxima: torch.Tensor, kk: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [R, kk] fp32, indices [R, kk] int64): the module docstring's contract. codes [R, N]
    and maxima [R, n] int64, last dims contiguous; ``T``: the key count the codes were made with."""
    _check_rows(codes, maxima, kk)
    R = codes.shape[0]
    values = torch.empty((R, kk), dtype=torch.float32, device=codes.device)
    idx = torch.empty((R, kk), dtype=torch.int64, device=codes.device)
    if R:
        _launch(codes, maxima, kk, T, values, idx, None)
    return values, idx


def few_rows_top_codes(codes: torch.Tensor, maxima: torch.Tensor, kk: int, valid: torch.Tensor, out: torch.Tensor,
                       out_rows: torch.Tensor) -> torch.Tensor:
    """Row-gated: for every row i of codes [R, N] with ``valid[i]`` ([R] bool), its top kk codes,
    descending, into ``out[out_rows[i]]`` (out [R', kk] int64, out_rows [R] int64; the destinations
    of valid rows distinct and in [0, R'), one outside writes nothing); invalid rows cost one
    program each and write nothing. codes and maxima as for ``few_rows_topk`` (scratch); one launch
    after a zeroed counter, no host synchronisation. Returns out."""
    _check_rows(codes, maxima, kk)
    R = codes.shape[0]
    if valid.shape != (R,) or valid.dtype != torch.bool or out_rows.shape != (R,) or out_rows.dtype != torch.int64:
        raise ValueError(f"valid, out_rows: expected bool and int64 [{R}], got {valid.dtype} {tuple(valid.shape)} "
                         f"and {out_rows.dtype} {tuple(out_rows.shape)}")
    if out.dtype != torch.int64 or out.dim() != 2 or out.shape[1] != kk or out.stride(1) != 1:
        raise ValueError(f"out: expected int64 [R', kk={kk}] with a contiguous last dim, got {out.dtype} "
                         f"{tuple(out.shape)}")
    if R:
        _launch(codes, maxima, kk, 0, out, out, (valid, out, out_rows))
    return out

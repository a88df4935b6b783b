"""The DSA indexer scorer on the GPU: dense, key-list and compacted scoring into order codes (SPEC C.1).

``score_dense(q, w, k, mask=...)`` writes the order code (or its int32 high word) of every key
of every query row, and optionally the rows' interleaved chunk maxima; ``score_keys`` scores the
keys of per-tile lists (an overflowed list is rescanned densely) and, in compact mode, writes only
visible keys with ``not (score < tau)``. q [B,S,H,D], k [B,T,D] (bf16/fp16/fp32), w [B,S,H] fp32,
mask None, bool or additive [B,S,T] (``mask_operand``). A key's code is bitwise the same whichever
kernel scored it: one tile function, one launch config per operand dtype
(``defaults.SCORER_CONFIG``, ``defaults.FP32_SCORER_CONFIG``), never tuned, and for the refine one
of the same head-sum order (``scorer_config``). Under
``TRITON_INTERPRET=1`` the dot and the head sum use ``tile_arith``'s sequential form: exactly
``runtime.dense_scorer``'s scorer. fp32 operands are multiplied as tf32 (``tf32_scores``). The FP8
scorer (``k_scale`` given, q and k float8_e4m3fn, ``check_fp8``; SPEC A.10): E4M3 products on the
FP8 tensor cores, promoted to fp32 every ``fp8_interval(D)`` products, then ``scale_and_bias``; launched with
``defaults.FP8_SCORER_CONFIG``. The codes are ``compiler.lowering.order_codes``'s."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiler.autotune import LaunchConfig, device_capability, interpreter_active, multiprocessor_count
from compiler.lowering.order_codes import INT64_MIN, order_code, word_of_code
from compiler.lowering.scoring.tile_arith import sequential_dot, sequential_group_sum
from compiler.lowering import defaults
from runtime.order_codes import PADDING
from compiler.lowering.host_ints import cdiv, next_power_of_2

INTERPRET = interpreter_active()

MASK_NONE = 0
MASK_BOOL = 1
MASK_ADDITIVE = 2
FP8_PROMOTE = 128
"""FP8 operands: products summed in the tensor cores before each promotion of the partial sum to
fp32 registers (``tl.dot``'s ``max_num_imprecise_acc``), or D when D is smaller (``fp8_interval``):
at D = 128 one key tile's whole dot, as DeepSeek-V3 promotes (promoting every 32 products, one sm_90
FP8 instruction, adds an fp32 add per accumulator element and spills registers:
benchmarks/results/fp8_promotion_h200.json). The GPU margin's model of FP8 accumulation counts on
it (topk_pipeline.fp8_dot_error, SPEC A.10)."""
_FP8_PROMOTE = tl.constexpr(FP8_PROMOTE)
FP8_MIN_HEAD_DIM = 32
"""Smallest head dimension of the FP8 scorer on the GPU: one sm_90 FP8 tensor-core K step."""


def fp8_interval(D: int) -> int:
    """Products per promotion interval of the FP8 scorer's D-term dot (FP8_PROMOTE, or D when smaller)."""
    return min(D, FP8_PROMOTE)


@triton.jit
def scale_and_bias(score, scale, bias, SEQUENTIAL: tl.constexpr):
    """FP8 scoring's last step, ``score * scale[None, :] + bias`` (fp32): one fused multiply-add on
    the GPU; under the interpreter a multiply, then an add (runtime.dense_scorer's two roundings).
    The scorer and the screen both use it, so a bound u >= s gives scale_and_bias(u) >=
    scale_and_bias(s) for a positive scale (rounding is monotone)."""
    if SEQUENTIAL:
        out = score * scale[None, :] + bias
    else:
        out = tl.fma(score, scale[None, :], bias)
    return out


@triton.jit
def load_mask_tile(mask_ptr, b, rows, keys, ok, msb, mss, mst, MASK_KIND: tl.constexpr):
    """(visible, bias) for a [rows, keys] tile; bias is the finite additive part (0 if hidden)."""
    if MASK_KIND == 1:
        m = tl.load(mask_ptr + b * msb + rows.to(tl.int64)[:, None] * mss + keys[None, :] * mst,
                    mask=ok, other=0)
        visible = ok & (m != 0)
        bias = tl.zeros(visible.shape, dtype=tl.float32)
    elif MASK_KIND == 2:
        m = tl.load(mask_ptr + b * msb + rows.to(tl.int64)[:, None] * mss + keys[None, :] * mst,
                    mask=ok, other=float("-inf")).to(tl.float32)
        visible = ok & (m != float("-inf"))
        bias = tl.where(visible, m, 0.0)
    else:
        visible = ok
        bias = tl.zeros(ok.shape, dtype=tl.float32)
    return visible, bias


@triton.jit
def mask_unclear(visible, bias, ok):
    """Entries of a mask tile in range (``ok``) that are not clear, i.e. not visible with bias 0."""
    return ok & ~(visible & (bias == 0.0))


@triton.jit
def _mask_bounds_kernel(mask_ptr, rows_ptr, out_ptr, S, T, n_slots, n_blocks, msb, mss, mst, srb,
                        MASK_KIND: tl.constexpr, ROWS: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr):
    """out[b, j] = (the first key whose mask entry is not clear, or T; one past the last key the
    mask shows, or 0) of query row j (``rows[b, j]`` with ROWS; an empty slot -1 gets (T, 0)):
    program (b, block) takes R slots, one read of their mask rows in steps of BLOCK positions. Per
    lane (offset within a step) it keeps the start of the last step where the lane's entry is
    visible and of the first where it is not clear (``mask_unclear``); the positions (start + lane)
    and the row's extremes are formed once, at the end."""
    pid = tl.program_id(0)
    b = (pid // n_blocks).to(tl.int64)
    slot = (pid % n_blocks) * R + tl.arange(0, R)
    in_range = slot < n_slots
    if ROWS:
        row = tl.load(rows_ptr + b * srb + slot, mask=in_range, other=-1).to(tl.int64)
    else:
        row = slot.to(tl.int64)
    live = in_range & (row >= 0) & (row < S)
    lane = tl.arange(0, BLOCK)
    last = tl.full([R, BLOCK], -1, tl.int32)  # start of the lane's last step showing it, or -1
    first = tl.full([R, BLOCK], 0, tl.int32) + T  # start of its first step not clear, or T
    for p0 in range(0, tl.where(tl.max(live.to(tl.int32), axis=0) > 0, T, 0), BLOCK):
        pos = p0 + lane
        ok = live[:, None] & (pos < T)[None, :]
        visible, bias = load_mask_tile(mask_ptr, b, row, pos, ok, msb, mss, mst, MASK_KIND)
        last = tl.where(visible, p0, last)
        first = tl.minimum(first, tl.where(mask_unclear(visible, bias, ok), p0, T))
    out = out_ptr + (b * n_slots + slot.to(tl.int64)) * 2
    tl.store(out, tl.min(tl.where(first < T, first + lane[None, :], T), axis=1), mask=in_range)
    tl.store(out + 1, tl.max(tl.where(last >= 0, last + lane[None, :] + 1, 0), axis=1), mask=in_range)


@triton.jit
def _tile_scores(qt, wt, q_ptr, q_off, rok, k_ptr, k_off, pok, H, BLOCK_S: tl.constexpr,
                 HP: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, SEQUENTIAL: tl.constexpr,
                 TF32: tl.constexpr, TO_FP32: tl.constexpr, FP8: tl.constexpr):
    """[BLOCK_S, BLOCK_T] fp32 ``sum_h w_h relu(q_h . k)`` of the program's query rows (``qt``
    [BLOCK_S * HP, D], ``wt`` [BLOCK_S * HP]) against one key tile (rows ``k_ptr + k_off``, ``pok``).
    FP8: E4M3 operands, the tensor cores' sums promoted to fp32 every ``fp8_interval(D)`` products."""
    if SEQUENTIAL:
        x = sequential_dot(q_ptr, q_off, rok, k_ptr, k_off, pok, D, BLOCK_S * HP, BLOCK_T)
        x = tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL) * wt[:, None]
        score = sequential_group_sum(x, H, BLOCK_S, HP, BLOCK_T)
    else:
        kt = tl.load(k_ptr + k_off[:, None] + tl.arange(0, D)[None, :], mask=pok[:, None], other=0.0)
        if TO_FP32:
            kt = kt.to(tl.float32)
        if TF32:
            xt = tl.dot(kt, tl.trans(qt), input_precision="tf32")
        elif FP8:
            xt = tl.dot(kt, tl.trans(qt), max_num_imprecise_acc=_FP8_PROMOTE if D >= _FP8_PROMOTE else D)
        else:
            xt = tl.dot(kt, tl.trans(qt))
        xt = tl.maximum(xt, 0.0, propagate_nan=tl.PropagateNan.ALL) * wt[None, :]
        score = tl.trans(tl.sum(tl.reshape(xt, (BLOCK_T, BLOCK_S, HP)), axis=2))
    return score


@triton.jit
def _query_tile(q_ptr, w_ptr, rows_ptr, b, tile, S, H, n_slots, sqb, sqs, sqh, swb, sws, srb,
                BLOCK_S: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr,
                TO_FP32: tl.constexpr):
    """The program's query rows: (qt [BLOCK_S * HP, D], wt [BLOCK_S * HP] fp32, q_off, rok, slots,
    rows [BLOCK_S] int64, row_ok). Slots are ``tile * BLOCK_S ..``; rows = slots, or ``rows_ptr``'s
    entries with ROWS (-1: empty slot)."""
    r = tl.arange(0, BLOCK_S * HP)
    head = r % HP
    slots = (tile * BLOCK_S + tl.arange(0, BLOCK_S)).to(tl.int64)
    if ROWS:
        slot_r = tile * BLOCK_S + r // HP
        qrow = tl.load(rows_ptr + b * srb + slot_r, mask=slot_r < n_slots, other=-1)
        rows = tl.load(rows_ptr + b * srb + slots, mask=slots < n_slots, other=-1).to(tl.int64)
    else:
        qrow = tile * BLOCK_S + r // HP
        rows = slots
    rok = (qrow >= 0) & (qrow < S) & (head < H)
    q_off = b * sqb + qrow * sqs + head * sqh
    qt = tl.load(q_ptr + q_off[:, None] + tl.arange(0, D)[None, :], mask=rok[:, None], other=0.0)
    if TO_FP32:
        qt = qt.to(tl.float32)
    wt = tl.load(w_ptr + b * swb + qrow * sws + head, mask=rok, other=0.0).to(tl.float32)
    return qt, wt, q_off, rok, slots, rows, (rows >= 0) & (rows < S)


@triton.jit
def _key_tile(key, pok, key_clear, qt, wt, q_ptr, q_off, rok, k_ptr, ks_ptr, mask_ptr, b, rows, row_ok,
              T, H, skb, skt, ssb, msb, mss, mst, BLOCK_S: tl.constexpr, HP: tl.constexpr,
              D: tl.constexpr, BLOCK_T: tl.constexpr, MASK_KIND: tl.constexpr, TO_FP32: tl.constexpr,
              SEQUENTIAL: tl.constexpr, TF32: tl.constexpr, FP8: tl.constexpr, MASK_READ: tl.constexpr):
    """Scores of the keys ``key`` [BLOCK_T] (``pok``: in range) for the program's rows: (ok
    [BLOCK_S, BLOCK_T], score (times the key's scale with FP8) + bias, visible, order code).
    MASK_READ: 0 the tile is clear (visible = in range, bias 0; no mask read), 1 the mask is read
    unless every key of the tile lies below ``key_clear``, 2 the mask is read."""
    ok = row_ok[:, None] & pok[None, :]
    score = _tile_scores(qt, wt, q_ptr, q_off, rok, k_ptr, b * skb + key * skt, pok, H, BLOCK_S, HP,
                         D, BLOCK_T, SEQUENTIAL, TF32, TO_FP32, FP8)
    clear = MASK_READ == 0
    if MASK_READ == 1:
        clear = tl.max(tl.where(pok, key, 0), axis=0) < key_clear
    if clear:  # every entry of the tile visible with bias 0: no mask to read
        visible = ok
        bias = tl.zeros((BLOCK_S, BLOCK_T), dtype=tl.float32)
    else:
        visible, bias = load_mask_tile(mask_ptr, b, rows, key, ok, msb, mss, mst, MASK_KIND)
    if FP8:
        score = scale_and_bias(score, tl.load(ks_ptr + b * ssb + key, mask=pok, other=1.0), bias, SEQUENTIAL)
    else:
        score = score + bias
    return ok, score, visible, order_code(score, visible, key[None, :], T)


@triton.jit
def _hidden_tile(key, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr, T):
    """[BLOCK_S, BLOCK_T] order codes of the keys ``key`` as hidden keys (no product)."""
    return order_code(tl.zeros((BLOCK_S, BLOCK_T), dtype=tl.float32),
                      tl.zeros((BLOCK_S, BLOCK_T), dtype=tl.int1), key[None, :], T)


@triton.jit
def _store_codes(ptr, code, mask, WORDS: tl.constexpr):
    """Dense scoring's store of int64 order codes: the codes, or with WORDS their high words
    (int32; the low word is ``T - 1 - key``, implied by the position)."""
    if WORDS:
        tl.store(ptr, word_of_code(code), mask=mask)
    else:
        tl.store(ptr, code, mask=mask)


@triton.jit
def _dense_tile(key, best, out_rows, qt, wt, q_ptr, q_off, rok, k_ptr, ks_ptr, mask_ptr, b, rows, row_ok, T, H,
                skb, skt, ssb, msb, mss, mst, BLOCK_S: tl.constexpr, HP: tl.constexpr, D: tl.constexpr,
                BLOCK_T: tl.constexpr, MASK_KIND: tl.constexpr, TO_FP32: tl.constexpr,
                SEQUENTIAL: tl.constexpr, TF32: tl.constexpr, FP8: tl.constexpr, MAXIMA: tl.constexpr,
                MASK_READ: tl.constexpr, WORDS: tl.constexpr):
    """Dense scoring of the key tile ``key`` [BLOCK_T]: codes (their high words with WORDS) stored
    at ``out_rows + key``; returns the running chunk maxima ``best`` [BLOCK_S, BLOCK_T] updated
    lane by lane (with MAXIMA)."""
    ok, score, visible, code = _key_tile(
        key, key < T, 0, qt, wt, q_ptr, q_off, rok, k_ptr, ks_ptr, mask_ptr, b, rows, row_ok, T, H, skb,
        skt, ssb, msb, mss, mst, BLOCK_S, HP, D, BLOCK_T, MASK_KIND, TO_FP32, SEQUENTIAL, TF32, FP8, MASK_READ)
    _store_codes(out_rows + key[None, :], code, ok, WORDS)
    if MAXIMA:
        best = tl.maximum(best, tl.where(ok, code, INT64_MIN))
    return best


@triton.jit
def _indexer_score_kernel(
    q_ptr, w_ptr, k_ptr, ks_ptr, ids_ptr, count_ptr, tau_ptr, mask_ptr, bounds_ptr, out_ptr, out_count_ptr,
    rows_ptr, S, T, H, cap, cap_out, tiles_per_list, n_tiles, n_slots,
    sqb, sqs, sqh, swb, sws, skb, skt, ssb, sib, sil, scb, msb, mss, mst, sob, sos, srb,
    BLOCK_S: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
    MASK_KIND: tl.constexpr, COMPACT: tl.constexpr, TO_FP32: tl.constexpr, ATOMIC: tl.constexpr,
    ROWS: tl.constexpr, SEQUENTIAL: tl.constexpr, TF32: tl.constexpr, FP8: tl.constexpr,
):
    """Key lists (seeds, refine): program (query tile, split) scores its split of the tile's list.
    Under a mask, the slots' ``mask_bounds`` tell which key tiles need no mask read (every key below
    each row's first unclear key) and, for an overflowed list (position = key), where hidden keys
    begin for every row (no products there)."""
    pid = tl.program_id(0)
    b = (pid // n_tiles).to(tl.int64)  # b * (stride of a batch row) can pass 2^31
    tile = pid % n_tiles
    lst = (tile // tiles_per_list).to(tl.int64)
    qt, wt, q_off, rok, slots, rows, row_ok = _query_tile(
        q_ptr, w_ptr, rows_ptr, b, tile, S, H, n_slots, sqb, sqs, sqh, swb, sws, srb, BLOCK_S, HP, D,
        ROWS, TO_FP32)
    if COMPACT:
        tau = tl.load(tau_ptr + b * S + rows, mask=row_ok, other=float("inf"))

    n = tl.load(count_ptr + b * scb + lst)
    overflow = n > cap
    n = tl.where(overflow, T, n)
    if ROWS:
        n = tl.where(tl.max(row_ok.to(tl.int32), axis=0) > 0, n, 0)
    chunk = tl.cdiv(tl.cdiv(n, tl.num_programs(1)), BLOCK_T) * BLOCK_T
    p_lo = tl.program_id(1) * chunk
    p_hi = tl.minimum(p_lo + chunk, n)
    running = tl.zeros([BLOCK_S], dtype=tl.int32)
    p_end = p_hi
    key_clear = 0
    if MASK_KIND != 0:
        at = bounds_ptr + (b * n_slots + slots) * 2
        key_clear = tl.min(tl.load(at, mask=row_ok, other=2147483647), axis=0)
        key_end = tl.max(tl.load(at + 1, mask=row_ok, other=0), axis=0)
        p_end = tl.where(overflow, tl.minimum(p_hi, tl.maximum(p_lo, key_end)), p_hi)
    for p0 in range(p_lo, p_end, BLOCK_T):
        pos = p0 + tl.arange(0, BLOCK_T)
        pok = pos < p_hi
        listed = tl.load(ids_ptr + b * sib + lst * sil + pos, mask=pok & (pos < cap), other=0)
        key = tl.where(overflow, pos, listed)
        ok, score, visible, code = _key_tile(
            key, pok, key_clear, qt, wt, q_ptr, q_off, rok, k_ptr, ks_ptr, mask_ptr, b, rows, row_ok, T, H,
            skb, skt, ssb, msb, mss, mst, BLOCK_S, HP, D, BLOCK_T, MASK_KIND, TO_FP32, SEQUENTIAL, TF32, FP8,
            1 if MASK_KIND != 0 else 0)
        if COMPACT:
            keep = visible & ~(score < tau[:, None])
            keep_i = keep.to(tl.int32)
            if ATOMIC:
                base = tl.atomic_add(out_count_ptr + b * S + rows, tl.sum(keep_i, axis=1), mask=row_ok)
            else:
                base = running
                running += tl.sum(keep_i, axis=1)
            slot = base[:, None] + tl.cumsum(keep_i, axis=1) - 1
            tl.store(out_ptr + b * sob + rows[:, None] * sos + slot, code, mask=keep & (slot < cap_out))
        else:
            tl.store(out_ptr + b * sob + slots[:, None] * sos + pos[None, :], code, mask=ok)
    if COMPACT and not ATOMIC:
        tl.store(out_count_ptr + b * S + rows, running, mask=row_ok)


@triton.jit
def _dense_score_kernel(
    q_ptr, w_ptr, k_ptr, ks_ptr, mask_ptr, bounds_ptr, out_ptr, max_ptr, rows_ptr,
    S, T, H, n_tiles, n_slots, n_groups,
    sqb, sqs, sqh, swb, sws, skb, skt, ssb, msb, mss, mst, sob, sos, srb, smb, sms,
    BLOCK_S: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
    MASK_KIND: tl.constexpr, TO_FP32: tl.constexpr, ROWS: tl.constexpr, SEQUENTIAL: tl.constexpr,
    TF32: tl.constexpr, FP8: tl.constexpr, MAXIMA: tl.constexpr, WORDS: tl.constexpr,
):
    """Every key 0..T-1 (dense scoring), in groups (SPEC C.1): program (query tile, split)
    takes the split's share of the n_groups groups."""
    pid = tl.program_id(0)
    b = (pid // n_tiles).to(tl.int64)  # b * (stride of a batch row) can pass 2^31
    tile = pid % n_tiles
    qt, wt, q_off, rok, slots, rows, row_ok = _query_tile(
        q_ptr, w_ptr, rows_ptr, b, tile, S, H, n_slots, sqb, sqs, sqh, swb, sws, srb, BLOCK_S, HP, D,
        ROWS, TO_FP32)
    n_key_tiles = tl.cdiv(T, BLOCK_T)
    scored_tiles = n_key_tiles
    clear_tiles = 0
    if MASK_KIND != 0:  # tiles from scored_tiles on hold hidden keys only; those before clear_tiles are clear
        at = bounds_ptr + (b * n_slots + slots) * 2
        first = tl.load(at, mask=row_ok, other=2147483647)
        end = tl.load(at + 1, mask=row_ok, other=0)
        scored_tiles = tl.cdiv(tl.minimum(tl.max(end, axis=0), T), BLOCK_T)
        clear_tiles = tl.minimum(tl.min(first, axis=0), T) // BLOCK_T
    any_row = tl.max(row_ok.to(tl.int32), axis=0) > 0  # a tile of empty slots reads no key
    n_key_tiles = tl.where(any_row, n_key_tiles, 0)
    scored_tiles = tl.where(any_row, scored_tiles, 0)
    per = tl.cdiv(n_groups, tl.num_programs(1))
    g_lo = tl.program_id(1) * per
    g_hi = tl.minimum(g_lo + per, n_groups)
    lanes = tl.arange(0, BLOCK_T)
    out_rows = out_ptr + b * sob + slots[:, None] * sos
    for g in range(g_lo, g_hi):
        # Group g: the key tiles g, g + n_groups, g + 2 n_groups, ...; clear ones, then masked
        # ones, then hidden ones.
        n_scored = tl.cdiv(tl.maximum(scored_tiles - g, 0), n_groups)
        n_clear = tl.minimum(tl.cdiv(tl.maximum(clear_tiles - g, 0), n_groups), n_scored)
        best = tl.full((BLOCK_S, BLOCK_T), INT64_MIN, tl.int64)
        for i in range(0, n_clear):
            best = _dense_tile((g + i * n_groups) * BLOCK_T + lanes, best, out_rows, qt, wt, q_ptr, q_off,
                               rok, k_ptr, ks_ptr, mask_ptr, b, rows, row_ok, T, H, skb, skt, ssb, msb, mss,
                               mst, BLOCK_S, HP, D, BLOCK_T, MASK_KIND, TO_FP32, SEQUENTIAL, TF32, FP8, MAXIMA,
                               0, WORDS)
        for i in range(n_clear, n_scored):
            best = _dense_tile((g + i * n_groups) * BLOCK_T + lanes, best, out_rows, qt, wt, q_ptr, q_off,
                               rok, k_ptr, ks_ptr, mask_ptr, b, rows, row_ok, T, H, skb, skt, ssb, msb, mss,
                               mst, BLOCK_S, HP, D, BLOCK_T, MASK_KIND, TO_FP32, SEQUENTIAL, TF32, FP8, MAXIMA,
                               2, WORDS)
        if MAXIMA:
            # Per lane, the group's first hidden-only tile holds its largest hidden code.
            key = (g + n_scored * n_groups) * BLOCK_T + lanes
            best = tl.maximum(best, tl.where((key < T)[None, :], _hidden_tile(key, BLOCK_S, BLOCK_T, T),
                                             INT64_MIN))
            tl.store(max_ptr + b * smb + slots[:, None] * sms + g * BLOCK_T + lanes[None, :], best,
                     mask=row_ok[:, None])
        for i in range(n_scored, tl.cdiv(tl.maximum(n_key_tiles - g, 0), n_groups)):
            key = (g + i * n_groups) * BLOCK_T + lanes
            _store_codes(out_rows + key[None, :], _hidden_tile(key, BLOCK_S, BLOCK_T, T),
                         row_ok[:, None] & (key < T)[None, :], WORDS)


SEQUENTIAL = INTERPRET
"""Scores by tile_arith's sequential form (the CPU interpreter's arithmetic) instead of tl.dot."""


def check_fp8(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor | None) -> bool:
    """True for the FP8 scorer (``k_scale`` given: q and k float8_e4m3fn, k_scale [B,T] fp32 with
    stride 1 along T, D a power of two >= FP8_MIN_HEAD_DIM); False without ``k_scale`` (q and k must
    not be FP8 then). ValueError / TypeError naming the argument otherwise."""
    fp8 = torch.float8_e4m3fn
    if k_scale is None:
        if q.dtype == fp8 or k.dtype == fp8:
            raise TypeError("k_scale: float8_e4m3fn q and k are scored with their key scales, got none")
        return False
    if q.dtype != fp8 or k.dtype != fp8:
        raise TypeError(f"q, k: expected float8_e4m3fn with k_scale, got {q.dtype} and {k.dtype}")
    B, T, D = k.shape
    if k_scale.dtype != torch.float32 or tuple(k_scale.shape) != (B, T) or (T > 1 and k_scale.stride(1) != 1):
        raise ValueError(f"k_scale: expected float32 [{B}, {T}] with stride 1 along keys, got "
                         f"{k_scale.dtype} {tuple(k_scale.shape)} strides {k_scale.stride()}")
    check_fp8_head_dim(D)
    return True


def check_fp8_head_dim(D: int) -> None:
    """ValueError unless the FP8 scorer takes head dimension D: a power of two >= FP8_MIN_HEAD_DIM."""
    if D < FP8_MIN_HEAD_DIM or D & (D - 1):
        raise ValueError(f"q, k: the FP8 scorer on the GPU takes a head dimension D that is a power of two "
                         f">= {FP8_MIN_HEAD_DIM}, got D={D}")


def tf32_scores(dtype: torch.dtype) -> bool:
    """True when operands of ``dtype`` are multiplied as tf32 on tensor cores (fp32 on the GPU,
    SPEC C.1). The certificate's rounding margins assume exact products of the operands,
    so the certified top-K scores such calls densely."""
    return dtype == torch.float32 and not SEQUENTIAL


def scorer_config(dtype: torch.dtype, refine: bool = False, device=None) -> LaunchConfig:
    """The launch config of the scorer for operands of ``dtype``: one per dtype, and for the refine
    (``refine``: key lists with a threshold, programs of at most defaults.REFINE_COLUMNS product
    columns) of bf16/fp16 operands on a Hopper ``device`` or under the interpreter
    ``defaults.REFINE_CONFIG``. That one differs from ``defaults.SCORER_CONFIG`` in
    its key rows alone, and both keep their 4 warps along the key rows (one warpgroup, 64 or 128
    rows): the columns a thread holds, and so each score's head-sum order, are the same (SPEC C.1)."""
    if dtype == torch.float8_e4m3fn:
        return defaults.FP8_SCORER_CONFIG
    if dtype == torch.float32:
        return defaults.FP32_SCORER_CONFIG
    if refine and (INTERPRET or (device is not None and device.type == "cuda"
                                 and device_capability(device)[0] == 9)):
        return defaults.REFINE_CONFIG
    return defaults.SCORER_CONFIG


def scorer_launch(dtype: torch.dtype, refine: bool = False, device=None) -> dict:
    """Launch keywords of both scorer kernels: ``scorer_config(dtype, refine, device)``, compiled
    without fusing multiplies into adds (``enable_fp_fusion=False``): which head's product a fused
    multiply-add keeps exact depends on how the compiler schedules a kernel's code, so with fusion
    a key scored by the dense and by the key-list kernel could differ in its last bit."""
    return {**scorer_config(dtype, refine, device).kwargs(), "enable_fp_fusion": False}


def score_tile_shape(H: int, dtype: torch.dtype | None = None) -> tuple[int, int]:
    """(BLOCK_S, HP): queries per program and heads padded to a power of two; BLOCK_S * HP =
    defaults.FP8_PRODUCT_COLUMNS for float8_e4m3fn operands (``dtype``), else defaults.PRODUCT_COLUMNS
    (at least HP)."""
    hp = next_power_of_2(max(H, 1))
    columns = defaults.FP8_PRODUCT_COLUMNS if dtype == torch.float8_e4m3fn else defaults.PRODUCT_COLUMNS
    return max(1, columns // hp), hp


def key_splits(programs: int, keys: int, block_t: int = 128) -> int:
    """Programs per key list so that at least ~2 programs per SM run (1 on the CPU); a split gets
    at least 4 * ``block_t`` keys (128 by default, whatever the launch's tile)."""
    if INTERPRET or not torch.cuda.is_available():
        return 1
    sms = multiprocessor_count()
    return max(1, min(cdiv(2 * sms, max(programs, 1)), cdiv(keys, 4 * block_t)))


def mask_operand(mask: torch.Tensor | None, B: int, S: int, T: int):
    """(kind, tensor, strides) for the kernels; bool masks are read as bytes, no copy."""
    if mask is None:
        return MASK_NONE, None, (0, 0, 0)
    if mask.dtype == torch.bool:
        m = mask.view(torch.uint8)
        kind = MASK_BOOL
    else:
        m = mask
        kind = MASK_ADDITIVE
    m = m.expand(B, S, T)
    return kind, m, tuple(m.stride())


def _launch_shape(q, k, rows, block_s=None, dtype=None):
    """(B, S, H, D, T, BLOCK_S, HP, slots, query tiles) of a scorer launch; ``block_s``: queries per
    program (None: ``score_tile_shape(H, dtype)``'s)."""
    B, S, H, D = q.shape
    tile_s, hp = score_tile_shape(H, dtype)
    block_s = tile_s if block_s is None else block_s
    n_slots = S if rows is None else rows.shape[1]
    return B, S, H, D, k.shape[1], block_s, hp, n_slots, cdiv(n_slots, block_s)


def score_keys(q, w, k, ids, counts, *, cap, tiles_per_list, mask=None, tau=None, out=None,
               out_count=None, splits=1, fill=False, rows=None, k_scale=None, block_s=None, bounds=None):
    """Run the scorer over key lists (SPEC C.1).

    q [B,S,H,D] (bf16/fp16/fp32, or float8_e4m3fn with ``k_scale``; last dim contiguous), w [B,S,H]
    fp32, k [B,T,D] same dtype as q, k_scale None or [B,T] fp32 (the FP8 scorer, ``check_fp8``),
    ids [B,L,cap] int32, counts [B,L] int32, mask None | [B,S,T] bool/float (broadcast views ok).
    Without ``tau``: returns codes [B,S,cap'] int64 with cap' = ids.shape[-1] (position p of the
    list). With ``tau`` [B,S] fp32: writes into ``out`` [B,S,cap_out] int64 (pre-filled by the
    caller) and ``out_count`` [B,S] int32 (zeroed by the caller), compacting kept keys.
    ``splits`` programs share each key list (non-compact mode: positions stay fixed). ``fill``:
    pre-fill the non-compact output with the lowest code (lists shorter than their buffer).
    ``rows`` [B,R] int64 (non-compact mode only): score the query rows ``rows[b, j]`` instead of
    0..S-1 and write query row ``rows[b, j]`` to ``out[b, j]`` (codes [B,R,cap']); ``-1`` marks an
    empty slot (nothing written; a tile of empty slots reads no key). Tiles are over slots.
    ``block_s``: query rows per program, a power of two (None: ``score_tile_shape(H)``'s, in every
    dtype: the tile the callers' key lists are shared by); every head of
    a row lies in one program whatever it is, and a row's columns of the tile are laid out alike, so a
    key's code is the same.
    Launched with ``scorer_launch(q.dtype, refine, q.device)``, refine: with ``tau``, programs of at
    most defaults.REFINE_COLUMNS product columns.
    """
    B, S, H, D, T, block_s, hp, n_slots, n_tiles = _launch_shape(q, k, rows, block_s)
    kind, m, (msb, mss, mst) = mask_operand(mask, B, S, T)
    fp8 = check_fp8(q, k, k_scale)
    compact = tau is not None
    if rows is not None and compact:
        raise ValueError("rows: only the non-compact mode (tau=None) takes a row list")
    if not compact:
        shape = (B, n_slots, ids.shape[-1])
        out = (torch.full(shape, PADDING, dtype=torch.int64, device=q.device)
               if fill else torch.empty(shape, dtype=torch.int64, device=q.device))
    if kind != MASK_NONE and bounds is None:
        bounds = mask_bounds(mask, B, S, T, rows)
    # Operands a variant never reads (tau and out_count without COMPACT, mask and bounds with MASK_NONE) are
    # passed as any tensor of the call: the kernel's constexpr branches skip them.
    _indexer_score_kernel[(B * n_tiles, splits)](
        q, w, k, w if k_scale is None else k_scale, ids, counts, w if tau is None else tau,
        q if m is None else m, counts if bounds is None else bounds, out, counts if out_count is None else out_count,
        counts if rows is None else rows,
        S, T, H, cap, out.shape[-1], tiles_per_list, n_tiles, n_slots,
        q.stride(0), q.stride(1), q.stride(2), w.stride(0), w.stride(1), k.stride(0), k.stride(1),
        0 if k_scale is None else k_scale.stride(0),
        ids.stride(0), ids.stride(1), counts.stride(0), msb, mss, mst, out.stride(0), out.stride(1),
        0 if rows is None else rows.stride(0),
        BLOCK_S=block_s, HP=hp, D=D, MASK_KIND=kind, COMPACT=compact, TO_FP32=INTERPRET and not fp8,
        ATOMIC=compact and splits > 1, ROWS=rows is not None, SEQUENTIAL=SEQUENTIAL,
        TF32=tf32_scores(q.dtype), FP8=fp8,
        **scorer_launch(q.dtype, refine=compact and block_s * hp <= defaults.REFINE_COLUMNS, device=q.device),
    )
    return out


def mask_bounds(mask, B: int, S: int, T: int, rows=None) -> torch.Tensor | None:
    """[B, R, 2] int32 per query row j of a ``[B, S, T]`` mask (broadcast views ok; R = S, or the slots
    of ``rows`` [B, R] int64, -1 an empty slot, which gets (T, 0)): (the first key whose entry is not
    clear, i.e. visible with bias 0, or T; one past the last visible key, or 0), from one pass over
    the mask rows (``_mask_bounds_kernel``). None without a mask."""
    kind, m, (msb, mss, mst) = mask_operand(mask, B, S, T)
    if kind == MASK_NONE:
        return None
    n_slots = S if rows is None else rows.shape[1]
    bounds = torch.empty((B, n_slots, 2), dtype=torch.int32, device=m.device)
    n_blocks = cdiv(n_slots, defaults.BOUNDS_ROWS)
    _mask_bounds_kernel[(B * n_blocks,)](m, bounds if rows is None else rows, bounds, S, T, n_slots,
                                         n_blocks, msb, mss, mst, 0 if rows is None else rows.stride(0),
                                         MASK_KIND=kind, ROWS=rows is not None, R=defaults.BOUNDS_ROWS,
                                         BLOCK=defaults.BOUNDS_BLOCK, num_warps=4)
    return bounds


def score_dense(q, w, k, *, mask=None, splits=1, rows=None, maxima=None, words=False, k_scale=None, bounds=None):
    """Dense scoring: codes [B,R,T] int64, ``codes[b, j, t]`` the order code of key t for query row
    j (R = S), or for row ``rows[b, j]`` (``rows`` [B,R] int64, -1 an empty slot: nothing written);
    bitwise the codes ``score_keys`` gives the same keys (module docstring). ``words``: int32
    [B,R,T] instead, each code's high word (``code >> 32``; the code is ``(word << 32) + T - 1 -
    t``, half the bytes to write and to read back).

    q, w, k, mask, k_scale as for ``score_keys``. ``splits``: programs per query tile (at most one per key
    group). ``maxima`` [B,R,n] int64 (n a multiple of ``chunk_multiple(q.dtype)``): also written,
    ``maxima[b, j, c]`` = the largest code of chunk c = keys c, c + n, c + 2n, ... of that row
    (interleaved chunks, as threshold_select takes them). With a mask the scorer reads each row's
    ``mask_bounds`` (``bounds``: the caller's, else computed here).
    Programs take ``score_tile_shape(H, q.dtype)``'s query rows; always launched with
    ``scorer_launch(q.dtype)``.
    """
    B, S, H, D, T, block_s, hp, n_slots, n_tiles = _launch_shape(q, k, rows, dtype=q.dtype)
    kind, m, (msb, mss, mst) = mask_operand(mask, B, S, T)
    fp8 = check_fp8(q, k, k_scale)
    n_groups = max(1, splits)
    if maxima is not None:
        multiple = chunk_multiple(q.dtype)
        if (maxima.dtype != torch.int64 or maxima.dim() != 3 or maxima.shape[:2] != (B, n_slots)
                or maxima.shape[-1] % multiple or not 0 < maxima.shape[-1] <= T):
            raise ValueError(f"maxima: expected int64 [{B}, {n_slots}, n] with 0 < n <= T = {T} a "
                             f"multiple of {multiple}, got {maxima.dtype} {tuple(maxima.shape)}")
        n_groups = maxima.shape[-1] // multiple
    splits = max(1, min(splits, n_groups))
    out = torch.empty((B, n_slots, T), dtype=torch.int32 if words else torch.int64, device=q.device)
    if kind != MASK_NONE and bounds is None:
        bounds = mask_bounds(mask, B, S, T, rows)
    _dense_score_kernel[(B * n_tiles, splits)](
        q, w, k, w if k_scale is None else k_scale, q if m is None else m, out if bounds is None else bounds,
        out, out if maxima is None else maxima, out if rows is None else rows,
        S, T, H, n_tiles, n_slots, n_groups,
        q.stride(0), q.stride(1), q.stride(2), w.stride(0), w.stride(1), k.stride(0), k.stride(1),
        0 if k_scale is None else k_scale.stride(0),
        msb, mss, mst, out.stride(0), out.stride(1), 0 if rows is None else rows.stride(0),
        0 if maxima is None else maxima.stride(0), 0 if maxima is None else maxima.stride(1),
        BLOCK_S=block_s, HP=hp, D=D, MASK_KIND=kind, TO_FP32=INTERPRET and not fp8, ROWS=rows is not None,
        SEQUENTIAL=SEQUENTIAL, TF32=tf32_scores(q.dtype), FP8=fp8, MAXIMA=maxima is not None, WORDS=words,
        **scorer_launch(q.dtype),
    )
    return out


def chunk_multiple(dtype: torch.dtype) -> int:
    """The chunk counts the scorer's ``maxima`` output takes are multiples of this (its key tile)."""
    return dict(scorer_config(dtype).meta)["BLOCK_T"]


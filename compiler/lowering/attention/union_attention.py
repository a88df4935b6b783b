"""DSA sparse attention in Triton, the union form: every query attends to its selected keys only, a
tile of queries walking the union of their selections.

Contract: ``runtime.union_attention.sparse_attention`` (visible keys = the distinct in-range
indices of the query's row that the bool mask shows; rows without one get 0 or the mean of v).
q ``[B, Hq, S, Dqk]``, k ``[B, Hkv, T, Dqk]``, v ``[B, Hkv, T, Dv]`` (bf16, fp16 or fp32, one
dtype), indices ``[B, S, K]`` int32/int64, mask None or bool broadcastable to ``[B, 1, S, T]``.
Returns o ``[B, Hq, S, Dv]`` in q's dtype and lse ``[B, Hq, S]`` fp32 (natural log).

Why tiles of queries. In transformers' (non-absorbed) MLA form every head has its own K/V rows, so
a query gathering K keys for H heads reads K·H·(Dqk+Dv)·2 bytes (168 MB at DeepSeek-V3.2's
K=2048, H=128, 192+128 dims) and a program per (query, head) does one multiply-add per loaded
element. Neighbouring queries of a DSA layer select mostly the same keys (their recent window and
the same far topics), so a program takes a tile of ``BLOCK_M`` queries of one head and walks the
*union* of their selections: each gathered K/V row serves the tile's queries that selected it
(a per-key bit word says which), and the scores of the others are masked. Programs are launched
tile-fastest, so the ones running together share a head and neighbouring tiles, and their union
rows come from L2. The work of a tile is ``BLOCK_M × |union|`` scores against the
``Σ_rows |selection|`` useful ones: near 1 for overlapping selections; for uniformly random
indices the union covers most visible keys and the cost approaches dense attention over them.

One memset of the workspace and three kernels (a fourth when unions are split), no host
synchronisation, static shapes (the op can be captured in a CUDA graph after one warm-up call,
which tunes the attention kernel):

1. ``_build_union_kernel``: for every (row, index) with an in-range, mask-visible key, set the
   row's bit in the key's int64 word of the row's tile (``atomic_or``). The lane that turns a
   word from 0 to non-zero (the old value says so) counts the key into its tile's key range.
   Duplicated indices set the same bit: the selection is a set.
2. ``_compact_union_kernel``: one program per (tile, key range) lists the range's keys with a
   non-zero word, in key order, after the keys of the earlier ranges (offsets from the counts).
3. ``_sparse_attention_kernel``: one program per (tile, split, head, batch) gathers BLOCK_N union
   keys at a time (K rows split in a power-of-two head and a padded tail, e.g. 192 = 128 + 64),
   scores the tile against them on the tensor cores, masks non-members and runs the online
   softmax in base 2 with fp32 accumulators. When the grid would be too small to fill the GPU
   (decode), each tile's union is split over several programs that write partial
   ``(o, lse)``, and ``_merge_splits_kernel`` combines them by log-sum-exp.

Rows with no visible key get o = 0, or for ``masked_rows="mean"`` the mean of v over all T keys
(read only by tiles that hold such a row). Workspace: the key words ``B·ceil(S/BLOCK_M)·T·8``
bytes (one bit per (query, key)) and the union lists ``B·ceil(S/BLOCK_M)·min(T, BLOCK_M·K)·4``;
a call whose workspace exceeds the device's memory is refused before anything is allocated.

Non-finite values. A union key is gathered for every row of the tile, also for rows that do not
attend to it (weight p = 0), and 0 · inf is NaN inside a matrix product. A program whose
accumulator ends with a non-finite entry (only possible when a value it gathered is not
finite) therefore walks its share of the union once more (``_attend`` with NONFINITE), with the
non-finite values zeroed in the product and what they give the rows that attend to their keys
added apart (``_nonfinite_part``: +inf, -inf or NaN per column). A key a row does not attend to
thus contributes exactly 0 to it, as in the reference; on finite values the second walk never
runs and the first is the plain loop (its register use unchanged).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from compiler.autotune import LaunchConfig, choose_config, interpreter_active, length_bucket
from compiler.lowering.attention.online_softmax import LOG2_E, attention_splits, merge_split_partials, split_partials
from runtime.union_attention import check_sparse_attention_inputs
from runtime.workspace import check_workspace
from compiler.lowering.host_ints import cdiv, next_power_of_2

_INTERPRETED = interpreter_active()

BUILD_LANES = 4096
"""(row, index) pairs per build program."""
COMPACT_BLOCK = 1024
"""Keys per step of the compaction scan; a key range is a multiple of it."""
MIN_RANGE = 8192
"""Smallest key range per compaction program (ranges only split T when tiles are few)."""


def tile_rows(seq_q: int) -> int:
    """Queries per tile: 16, 32 or 64 (one bit each in an int64 word), the smallest >= S up to 64."""
    return 16 if seq_q <= 16 else 32 if seq_q <= 32 else 64


@triton.jit
def _build_union_kernel(idx_ptr, mask_ptr, words_ptr, counts_ptr,
                        stride_ib, stride_is, stride_ik, stride_mb, stride_ms, stride_mt,
                        seq_q, seq_k, width, num_tiles, num_ranges, range_len,
                        HAS_MASK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program: BLOCK_K indices of each of the BLOCK_M rows of one tile."""
    pid_k = tl.program_id(0)
    tile = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    local = tl.arange(0, BLOCK_M)
    rows = (tile * BLOCK_M + local).to(tl.int64)
    slots = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    ok = (rows < seq_q)[:, None] & (slots < width)[None, :]
    key = tl.load(idx_ptr + batch * stride_ib + rows[:, None] * stride_is + slots[None, :] * stride_ik,
                  mask=ok, other=-1).to(tl.int64)
    ok = ok & (key >= 0) & (key < seq_k)
    key = tl.where(ok, key, 0)
    if HAS_MASK:
        seen = tl.load(mask_ptr + batch * stride_mb + rows[:, None] * stride_ms + key * stride_mt,
                       mask=ok, other=0)
        ok = ok & (seen != 0)
    tile_id = batch * num_tiles + tile
    bit = tl.full([BLOCK_M, BLOCK_K], 1, tl.int64) << local.to(tl.int64)[:, None]
    old = tl.atomic_or(words_ptr + tile_id * seq_k + key, bit, mask=ok)
    fresh = ok & (old == 0)
    tl.atomic_add(counts_ptr + tile_id * num_ranges + key // range_len, 1, mask=fresh)


@triton.jit
def _compact_union_kernel(words_ptr, counts_ptr, keys_ptr, sizes_ptr,
                          seq_k, num_ranges, range_len, union_cap,
                          BLOCK: tl.constexpr, RANGES: tl.constexpr):
    """One program: the union keys of one key range of one tile, in key order."""
    rng = tl.program_id(0)
    tile_id = tl.program_id(1)
    before = tl.arange(0, RANGES)
    counts = tl.load(counts_ptr + tile_id * num_ranges + before, mask=before < num_ranges, other=0)
    offset = tl.sum(tl.where(before < rng, counts, 0), axis=0)
    if rng == num_ranges - 1:
        tl.store(sizes_ptr + tile_id, offset + tl.sum(tl.where(before == rng, counts, 0), axis=0))
    start = rng * range_len
    stop = tl.minimum(start + range_len, seq_k)
    words = words_ptr + tile_id.to(tl.int64) * seq_k
    out = keys_ptr + tile_id.to(tl.int64) * union_cap
    for key0 in range(start, stop, BLOCK):
        keys = key0 + tl.arange(0, BLOCK)
        member = tl.load(words + keys, mask=keys < stop, other=0) != 0
        position = offset + tl.cumsum(member.to(tl.int32), axis=0) - 1
        tl.store(out + position, keys, mask=member)
        offset += tl.sum(member.to(tl.int32), axis=0)


@triton.jit
def _write_rows(o, lse2, batch, head, kv_head, rows, row_ok, offs_dv, dv_ok, v_ptr, o_ptr, lse_ptr,
                stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh, stride_os, stride_od,
                stride_lb, stride_lh, stride_ls, seq_k,
                MEAN_ROWS: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store the tile's normalised rows ``o`` and base-2 ``lse2``; rows with lse2 = -inf get 0,
    or the mean of v over all keys for MEAN_ROWS (read only when the tile holds such a row)."""
    if MEAN_ROWS:
        empty = row_ok & (lse2 == float("-inf"))
        num_keys = tl.where(tl.max(empty.to(tl.int32), axis=0) > 0, seq_k, 0)
        total = tl.zeros([BLOCK_DV], dtype=tl.float32)
        v_head = v_ptr + batch * stride_vb + kv_head * stride_vh
        for key0 in range(0, num_keys, BLOCK_N):
            keys = (key0 + tl.arange(0, BLOCK_N)).to(tl.int64)
            vt = tl.load(v_head + keys[:, None] * stride_vs + offs_dv[None, :] * stride_vd,
                         mask=(keys < seq_k)[:, None] & dv_ok[None, :], other=0.0)
            total += tl.sum(vt.to(tl.float32), axis=0)
        o = tl.where(empty[:, None], (total / seq_k)[None, :], o)
    tl.store(o_ptr + batch * stride_ob + head * stride_oh + rows[:, None] * stride_os + offs_dv[None, :] * stride_od,
             o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])
    tl.store(lse_ptr + batch * stride_lb + head * stride_lh + rows * stride_ls, lse2 * 0.6931471805599453,
             mask=row_ok)


@triton.jit
def _nonfinite_part(member, vt):
    """[BLOCK_M, BLOCK_DV] fp32: what the non-finite entries of the value tile ``vt`` [BLOCK_N,
    BLOCK_DV] give the rows that attend to their keys (``member`` [BLOCK_M, BLOCK_N]): per column,
    NaN when one is NaN or +inf meets -inf, else +inf or -inf, else 0. Coded +inf 1, -inf 256,
    NaN 257 (both), exact in fp16; one product with the member bits counts them exactly (fp32
    sums below 2^16 for BLOCK_N <= 255)."""
    v = vt.to(tl.float32)
    code = tl.where(v != v, 257.0, tl.where(v == float("inf"), 1.0, tl.where(v == float("-inf"), 256.0, 0.0)))
    hits = tl.dot(member.to(tl.float16), code.to(tl.float16)).to(tl.int32)
    up = (hits & 255) > 0
    down = (hits >> 8) > 0
    return tl.where(up & down, float("nan"), tl.where(up, float("inf"), tl.where(down, float("-inf"), 0.0)))


@triton.jit
def _attend(q1, q2, k_head, v_head, tile_keys, tile_words, local, start, stop, offs_d1, offs_d2, offs_dv, d1_ok,
            d2_ok, dv_ok, stride_ks, stride_kd, stride_vs, stride_vd, qk_scale_log2,
            HAS_D2: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr, NONFINITE: tl.constexpr):
    """(acc [BLOCK_M, BLOCK_DV], running max m, running sum l) of the online softmax (base 2) of the
    tile's rows over the union keys ``start..stop``; NONFINITE: non-finite values are kept out of the
    product and added apart, for the rows that attend to their keys (module docstring)."""
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for u0 in range(start, stop, BLOCK_N):
        offs_u = u0 + tl.arange(0, BLOCK_N)
        live = offs_u < stop
        keys = tl.load(tile_keys + offs_u, mask=live, other=0).to(tl.int64)
        words = tl.load(tile_words + keys, mask=live, other=0)
        member = ((words[None, :] >> local.to(tl.int64)[:, None]) & 1) != 0
        k1 = tl.load(k_head + keys[:, None] * stride_ks + offs_d1[None, :] * stride_kd,
                     mask=live[:, None] & d1_ok[None, :], other=0.0)
        if UPCAST:
            k1 = k1.to(tl.float32)
        scores = tl.dot(q1, tl.trans(k1), input_precision=DOT_PRECISION)
        if HAS_D2:
            k2 = tl.load(k_head + keys[:, None] * stride_ks + offs_d2[None, :] * stride_kd,
                         mask=live[:, None] & d2_ok[None, :], other=0.0)
            if UPCAST:
                k2 = k2.to(tl.float32)
            scores += tl.dot(q2, tl.trans(k2), input_precision=DOT_PRECISION)
        scores = tl.where(member, scores * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        # Rows that have seen no member yet keep m = -inf; shifting them by 0 keeps exp2 at 0.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_shift)
        p = tl.exp2(scores - m_shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vt = tl.load(v_head + keys[:, None] * stride_vs + offs_dv[None, :] * stride_vd,
                     mask=live[:, None] & dv_ok[None, :], other=0.0)
        if UPCAST:
            vt = vt.to(tl.float32)
        if NONFINITE:
            bad = (vt != vt) | (tl.abs(vt) == float("inf"))
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), tl.where(bad, tl.zeros_like(vt), vt),
                                                input_precision=DOT_PRECISION)
            acc += _nonfinite_part(member, vt)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _sparse_attention_kernel(
        q_ptr, k_ptr, v_ptr, words_ptr, keys_ptr, sizes_ptr, o_ptr, lse_ptr, part_o_ptr, part_lse_ptr,
        stride_qb, stride_qh, stride_qs, stride_qd,
        stride_kb, stride_kh, stride_ks, stride_kd,
        stride_vb, stride_vh, stride_vs, stride_vd,
        stride_ob, stride_oh, stride_os, stride_od,
        stride_lb, stride_lh, stride_ls,
        num_q_heads, group, seq_q, seq_k, num_tiles, num_splits, split_len, union_cap, qk_scale_log2,
        qk_dim: tl.constexpr, v_dim: tl.constexpr, BLOCK_D1: tl.constexpr, BLOCK_D2: tl.constexpr,
        HAS_D2: tl.constexpr, BLOCK_DV: tl.constexpr,
        SPLIT: tl.constexpr, MEAN_ROWS: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: the tile's BLOCK_M queries of one head against its share of the tile's union."""
    tile = tl.program_id(0) // num_splits
    split = tl.program_id(0) % num_splits
    head = tl.program_id(1).to(tl.int64)
    batch = tl.program_id(2).to(tl.int64)
    kv_head = head // group
    tile_id = batch * num_tiles + tile

    local = tl.arange(0, BLOCK_M)
    rows = (tile * BLOCK_M + local).to(tl.int64)
    row_ok = rows < seq_q
    offs_d1 = tl.arange(0, BLOCK_D1)
    offs_d2 = BLOCK_D1 + tl.arange(0, BLOCK_D2)
    offs_dv = tl.arange(0, BLOCK_DV)
    d1_ok = offs_d1 < qk_dim
    d2_ok = offs_d2 < qk_dim
    dv_ok = offs_dv < v_dim

    q_rows = q_ptr + batch * stride_qb + head * stride_qh + rows[:, None] * stride_qs
    q1 = tl.load(q_rows + offs_d1[None, :] * stride_qd, mask=row_ok[:, None] & d1_ok[None, :], other=0.0)
    if UPCAST:
        q1 = q1.to(tl.float32)
    q2 = q1  # unread without HAS_D2
    if HAS_D2:
        q2 = tl.load(q_rows + offs_d2[None, :] * stride_qd, mask=row_ok[:, None] & d2_ok[None, :], other=0.0)
        if UPCAST:
            q2 = q2.to(tl.float32)
    k_head = k_ptr + batch * stride_kb + kv_head * stride_kh
    v_head = v_ptr + batch * stride_vb + kv_head * stride_vh
    tile_words = words_ptr + tile_id * seq_k
    tile_keys = keys_ptr + tile_id * union_cap

    start = split * split_len
    stop = tl.minimum(tl.load(sizes_ptr + tile_id), start + split_len)
    acc, m_i, l_i = _attend(q1, q2, k_head, v_head, tile_keys, tile_words, local, start, stop, offs_d1, offs_d2,
                            offs_dv, d1_ok, d2_ok, dv_ok, stride_ks, stride_kd, stride_vs, stride_vd, qk_scale_log2,
                            HAS_D2, UPCAST, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_DV, False)
    if tl.max(tl.max(((acc != acc) | (tl.abs(acc) == float("inf"))).to(tl.int32), axis=1), axis=0) > 0:
        acc, m_i, l_i = _attend(q1, q2, k_head, v_head, tile_keys, tile_words, local, start, stop, offs_d1,
                                offs_d2, offs_dv, d1_ok, d2_ok, dv_ok, stride_ks, stride_kd, stride_vs, stride_vd,
                                qk_scale_log2, HAS_D2, UPCAST, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_DV, True)
    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    if SPLIT:
        part = ((split * tl.num_programs(2) + batch) * num_q_heads + head) * seq_q + rows
        tl.store(part_o_ptr + part[:, None] * BLOCK_DV + offs_dv[None, :], o, mask=row_ok[:, None])
        tl.store(part_lse_ptr + part, lse2, mask=row_ok)
    else:
        _write_rows(o, lse2, batch, head, kv_head, rows, row_ok, offs_dv, dv_ok, v_ptr, o_ptr, lse_ptr,
                    stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh, stride_os, stride_od,
                    stride_lb, stride_lh, stride_ls, seq_k, MEAN_ROWS, BLOCK_DV, BLOCK_N)


@triton.jit
def _merge_splits_kernel(part_o_ptr, part_lse_ptr, v_ptr, o_ptr, lse_ptr,
                         stride_vb, stride_vh, stride_vs, stride_vd,
                         stride_ob, stride_oh, stride_os, stride_od,
                         stride_lb, stride_lh, stride_ls,
                         num_batch, num_q_heads, group, seq_q, seq_k, num_splits, v_dim: tl.constexpr,
                         BLOCK_DV: tl.constexpr, MEAN_ROWS: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: the tile's rows of one head, merged over the splits by log-sum-exp (base 2)."""
    tile = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    batch = tl.program_id(2).to(tl.int64)
    rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = rows < seq_q
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < v_dim
    o, _, lse2 = merge_split_partials(part_o_ptr, part_lse_ptr, (batch * num_q_heads + head) * seq_q + rows,
                                      num_batch * num_q_heads * seq_q, num_splits, row_ok, offs_dv, BLOCK_DV)
    _write_rows(o, lse2, batch, head, head // group, rows, row_ok, offs_dv, dv_ok, v_ptr, o_ptr, lse_ptr,
                stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh, stride_os, stride_od,
                stride_lb, stride_lh, stride_ls, seq_k, MEAN_ROWS, BLOCK_DV, BLOCK_N)


def _launch_configs(dtype: torch.dtype, block_m: int) -> list[LaunchConfig]:
    """Candidate (BLOCK_N, warps, stages): one under the interpreter; on GPU a short list that
    compiles for sm_90 at 192 + 128 head dims without register spills and with the gathered K/V
    loads pipelined (fp32 products run on CUDA cores: short key tiles)."""
    if _INTERPRETED:
        return [LaunchConfig.of(num_warps=1, num_stages=1, BLOCK_N=16)]
    if dtype == torch.float32:
        return [LaunchConfig.of(num_warps=8, num_stages=2, BLOCK_N=16),
                LaunchConfig.of(num_warps=8, num_stages=1, BLOCK_N=16)]
    if block_m == 64:
        return [LaunchConfig.of(num_warps=8, num_stages=2, BLOCK_N=64),
                LaunchConfig.of(num_warps=4, num_stages=3, BLOCK_N=64),
                LaunchConfig.of(num_warps=8, num_stages=3, BLOCK_N=64),
                LaunchConfig.of(num_warps=4, num_stages=3, BLOCK_N=32)]
    return [LaunchConfig.of(num_warps=4, num_stages=2, BLOCK_N=64),
            LaunchConfig.of(num_warps=4, num_stages=3, BLOCK_N=64),
            LaunchConfig.of(num_warps=4, num_stages=2, BLOCK_N=32),
            LaunchConfig.of(num_warps=4, num_stages=2, BLOCK_N=128)]


def workspace_bytes(q, k, v, indices) -> int:
    """Bytes the kernels allocate for a call (module docstring): key words, union lists, outputs."""
    b, hq, s, _ = q.shape
    seq_k, width = k.shape[2], indices.shape[2]
    block_m = tile_rows(s)
    tiles = b * cdiv(s, block_m)
    cap = max(1, min(seq_k, min(s, block_m) * width))
    outputs = b * hq * s * (v.shape[3] * q.element_size() + 4)
    return 8 * (tiles * (seq_k + 1) + 1024) + 4 * tiles * (cap + 1) + outputs


def _check_kernel_inputs(q, k, v, indices) -> None:
    """Raise ValueError for inputs the kernels cannot take beyond the shared checks (grid, workspace)."""
    if q.shape[0] > 65535 or q.shape[1] > 65535:
        raise ValueError(f"q must have batch and heads <= 65535 (grid axes), got {tuple(q.shape[:2])}")
    check_workspace(workspace_bytes(q, k, v, indices), q.device, "q, k, indices",
                    f"B={q.shape[0]}, S={q.shape[2]}, T={k.shape[2]}")


def _split_head_dim(qk_dim: int) -> tuple[int, int, bool]:
    """(BLOCK_D1, BLOCK_D2, HAS_D2): a power-of-two head of the qk dim and a padded tail, >= 16 each."""
    head = max(16, 1 << (qk_dim.bit_length() - 1))
    tail = qk_dim - head
    return head, max(16, next_power_of_2(tail)) if tail > 0 else 16, tail > 0


def build_union(indices: torch.Tensor, mask: Optional[torch.Tensor], seq_k: int,
                block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Per tile of ``block_m`` rows: ``(words [B·tiles, T] int64, keys [B·tiles, cap] int32,
    sizes [B·tiles] int32, cap)``: bit i of ``words[tile, t]`` says that row i of the tile sees
    key t; ``keys[tile, :sizes[tile]]`` lists the keys with a non-zero word, ascending."""
    b, s, width = indices.shape
    tiles = cdiv(s, block_m)
    cap = max(1, min(seq_k, min(s, block_m) * width))
    ranges = max(1, min(cdiv(seq_k, MIN_RANGE), cdiv(1024, b * tiles)))
    range_len = cdiv(cdiv(seq_k, ranges), COMPACT_BLOCK) * COMPACT_BLOCK
    ranges = cdiv(seq_k, range_len)
    workspace = torch.zeros(b * tiles * (seq_k + ranges), dtype=torch.int64, device=indices.device)
    words = workspace[:b * tiles * seq_k].view(b * tiles, seq_k)
    counts = workspace[b * tiles * seq_k:].view(torch.int32)[:b * tiles * ranges]
    keys = torch.empty((b * tiles, cap), dtype=torch.int32, device=indices.device)
    sizes = torch.empty((b * tiles,), dtype=torch.int32, device=indices.device)
    if mask is None:
        mask_arg, mask_strides = words, (0, 0, 0)
    else:
        expanded = mask.expand(b, 1, s, seq_k)
        mask_arg, mask_strides = expanded, (expanded.stride(0), expanded.stride(2), expanded.stride(3))
    block_k = max(16, min(next_power_of_2(width), BUILD_LANES // block_m))
    _build_union_kernel[(cdiv(width, block_k), tiles, b)](
        indices, mask_arg, words, counts, *indices.stride(), *mask_strides,
        s, seq_k, width, tiles, ranges, range_len,
        HAS_MASK=mask is not None, BLOCK_M=block_m, BLOCK_K=block_k, num_warps=4)
    _compact_union_kernel[(ranges, b * tiles)](
        words, counts, keys, sizes, seq_k, ranges, range_len, cap,
        BLOCK=COMPACT_BLOCK, RANGES=max(16, next_power_of_2(ranges)), num_warps=4)
    return words, keys, sizes, cap


def _launch(q, k, v, indices, mask, scale: float, masked_rows: str, splits: Optional[int]):
    """Allocate (o, lse), build the tiles' unions and run the attention (and merge) kernels."""
    b, hq, s, qk_dim = q.shape
    hkv, seq_k, v_dim = k.shape[1], k.shape[2], v.shape[3]
    o = torch.empty((b, hq, s, v_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, hq, s), dtype=torch.float32, device=q.device)
    if lse.numel() == 0 or v_dim == 0 or seq_k == 0:
        return o.zero_(), lse.fill_(float("-inf"))
    block_m = tile_rows(s)
    tiles = cdiv(s, block_m)
    if indices.shape[2] == 0:
        indices = indices.new_full((b, s, 1), -1)
    words, keys, sizes, cap = build_union(indices, mask, seq_k, block_m)
    block_d1, block_d2, has_d2 = _split_head_dim(qk_dim)
    block_dv = max(16, next_power_of_2(v_dim))
    common = dict(BLOCK_D1=block_d1, BLOCK_D2=block_d2, HAS_D2=has_d2, BLOCK_DV=block_dv,
                  MEAN_ROWS=masked_rows == "mean", UPCAST=_INTERPRETED,
                  DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", BLOCK_M=block_m)
    strides = (*q.stride(), *k.stride(), *v.stride(), *o.stride(), *lse.stride())

    def run(config: LaunchConfig) -> None:
        block_n = dict(config.meta)["BLOCK_N"]
        n_split, split_len = attention_splits(tiles * hq * b, cap, block_n, q.device, splits)
        part_o, part_lse = split_partials(n_split, (b, hq, s), block_dv, q.device, lse)
        _sparse_attention_kernel[(tiles * n_split, hq, b)](
            q, k, v, words, keys, sizes, o, lse, part_o, part_lse, *strides,
            hq, hq // hkv, s, seq_k, tiles, n_split, split_len, cap, scale * LOG2_E,
            qk_dim=qk_dim, v_dim=v_dim, SPLIT=n_split > 1, **common, **config.kwargs())
        if n_split > 1:
            _merge_splits_kernel[(tiles, hq, b)](
                part_o, part_lse, v, o, lse, *v.stride(), *o.stride(), *lse.stride(),
                b, hq, hq // hkv, s, seq_k, n_split, v_dim=v_dim,
                BLOCK_DV=block_dv, MEAN_ROWS=common["MEAN_ROWS"], BLOCK_M=block_m,
                BLOCK_N=block_n, num_warps=4)

    config = choose_config(
        "sparse_attention", _launch_configs(q.dtype, block_m), run, device=q.device, length=s,
        shape={"qk_dim": qk_dim, "v_dim": v_dim, "itemsize": q.element_size(), "block_m": block_m,
               "union_bucket": length_bucket(cap), "heads": hq},
        work=b * hq * tiles * block_m * cap * (qk_dim + v_dim))
    run(config)
    return o, lse


def sparse_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                            mask: Optional[torch.Tensor] = None, *, scale: float, masked_rows: str = "zero",
                            splits: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse attention ``(o, lse)`` through the Triton kernels (contract in the module doc).

    Runs on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1``. ``splits`` forces the
    number of programs each tile's union is split over (default: enough to fill the GPU).
    Raises TypeError/ValueError naming the argument for a bad shape, dtype, device or scalar.
    """
    check_sparse_attention_inputs(q, k, v, indices, mask, scale, masked_rows)
    _check_kernel_inputs(q, k, v, indices)
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
        raise ValueError(f"splits must be None or an int >= 1, got {splits!r}")
    return _launch(q, k, v, indices, mask, float(scale), masked_rows, splits)

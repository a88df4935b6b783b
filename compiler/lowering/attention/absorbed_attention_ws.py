"""The absorbed sparse attention's latent kernel for Hopper, warp-specialised in Gluon.

Same contract as ``absorbed_attention._absorbed_attention_kernel``: one program takes BLOCK_H heads of
one query; o_lat [B, H, n, Dc] (q's dtype) is the softmax over the query's counted indices of the
latent rows, rows without a counted key 0 or the mean row. Split (decode-sized grids): program
(head block, split) takes the split's ``split_len`` indices of the row and writes that partial's
fp32 o and base-2 lse in ``online_softmax.split_partials``' layout instead, for
``absorbed_attention._merge_splits_kernel`` to merge.

Three partitions share a program, and the tiles go in pairs: tile 2i to buffer 0, tile 2i+1 to
buffer 1. Each buffer is two halves with their own ready and free barriers: the *low* half (the
latent's first Dc/2 columns) and the *high* half (the other Dc/2 columns and the rope rows).

- The producer (the default partition, PRODUCER_WARPS warps) gathers halves with ``cp.async`` in the
  order they are freed: buffer 0 low, buffer 1 high, buffer 0 high, buffer 1 low, so the next pair
  starts loading while the current one is still being multiplied. It reads both tiles' indices of a
  pair at once, before its first wait, so that a pair costs it one index-load latency, not four
  (read before each half, they left the consumers waiting for their tiles).
- Two consumer warpgroups each own half of the Dc output columns and score one tile of the pair (the
  heads are the wgmma rows): the even warpgroup tile 2i into the low columns, the odd one tile 2i+1
  into the high columns. The even one folds its tile in at its new row max and publishes P (over its
  tile's rope rows, which the scores no longer need) and that max; the odd one adds that P·c while its
  own scores are in flight, folds its tile in at the pair's max (the larger of the two) and publishes
  its P (in a buffer of its own: its high half is freed before the even warpgroup reads that P) and
  the pair's max. The even warpgroup queues the next pair's scores behind its product with the odd
  P, so its wgmma stays busy while it waits.

The consumers index their buffers and q through ``_opaque_one(i)``, so that the wgmma descriptors are
built inside the pair loop rather than hoisted out of it, where they outgrow the registers and
spill. A consumer fences the async proxy after each half's ready barrier before its wgmma reads the half
(``cp.async`` writes through the generic proxy), as the P tiles' writers do after storing them.
No reduction crosses warpgroups inside a tile; at the end the two row sums (both at the last pair's
max) are added through shared memory. Takes bf16 or fp16 operands, Dc = 512 and Dr = 64, on sm_90
only (``usable``).
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)

from compiler.autotune import device_capability
from compiler.lowering.defaults import ABSORBED_BLOCK_HEADS
from compiler.lowering.host_ints import cdiv

BLOCK_H = ABSORBED_BLOCK_HEADS
"""Heads a program: the rows of every warpgroup product."""
BLOCK_N = 64
"""Indices per tile; a P tile [BLOCK_H, BLOCK_N] has the shape of a tile's rope rows [BLOCK_N, ROPE_DIM]."""
LAT_DIM = 512
ROPE_DIM = 64
"""The latent and rope widths the kernel is built and measured for (DeepSeek-V3.2's MLA; shared
memory holds q, two tiles and the odd P tile at these widths: (3 x 64 x 576 + 64 x 64) x 2 bytes)."""
CONSUMER_REGISTERS = 232
"""Registers a consumer thread asks for (setmaxnreg): its half of the fp32 accumulator takes 128."""
PRODUCER_WARPS = 4
"""Warps of the producer partition (the kernel's ``num_warps``); each consumer is one warpgroup."""


@gluon.jit
def _tile_keys(idx_row, t, width, seq_k, stride_ik, BLOCK_N: gl.constexpr, WIDE_OFFSETS: gl.constexpr,
               layout: gl.constexpr):
    """Tile t's indices as (row to read, counted): an index outside [0, T), or a position past the
    query's width, reads row 0 and does not count. Rows are int64 with WIDE_OFFSETS, else int32 (a
    row times its stride fits)."""
    pos = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=layout)
    key = gl.load(idx_row + pos * stride_ik, mask=pos < width, other=-1)
    ok = (key >= 0) & (key < seq_k)
    key = gl.where(ok, key, 0)
    if WIDE_OFFSETS:
        key = key.to(gl.int64)
    else:
        key = key.to(gl.int32)
    return key, ok


@gluon.jit
def _gather(buf, rows, offset, ok, offs):
    """Rows at element ``offset`` of ``rows`` (columns ``offs``) into ``buf`` as asynchronous copies;
    rows not ``ok`` are not read (their shared rows are zero)."""
    async_copy.async_copy_global_to_shared(buf, rows + offset[:, None] + offs[None, :], mask=ok[:, None])


@gluon.jit
def _gather_tiles(lat_rows, rope_rows, idx_row, lo_bufs, hi_bufs, r_bufs, lo_ready, hi_ready, lo_free, hi_free,
                  width, seq_k, stride_lt, stride_kt, stride_ik, HALF: gl.constexpr, ROPE_DIM: gl.constexpr,
                  BLOCK_N: gl.constexpr, WIDE_OFFSETS: gl.constexpr, WARPS: gl.constexpr):
    """Producer: each pair's four halves, each once its consumer freed it, in the order they are freed
    (module docstring); a padding tile past the width counts nothing."""
    # 16-byte pieces, a warp's 32 lanes over 4 rows of 128 bytes: a lane addresses few distinct rows.
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    offs_c = gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
    offs_r = gl.arange(0, ROPE_DIM, layout=gl.SliceLayout(0, layout))
    rows: gl.constexpr = gl.SliceLayout(1, layout)
    for i in range(gl.cdiv(width, 2 * BLOCK_N)):
        phase = (i & 1) ^ 1
        # both tiles' indices at once, before the first wait: one load latency a pair
        key0, ok0 = _tile_keys(idx_row, 2 * i, width, seq_k, stride_ik, BLOCK_N, WIDE_OFFSETS, rows)
        key1, ok1 = _tile_keys(idx_row, 2 * i + 1, width, seq_k, stride_ik, BLOCK_N, WIDE_OFFSETS, rows)
        mbarrier.wait(lo_free.index(0), phase)
        _gather(lo_bufs.index(0), lat_rows, key0 * stride_lt, ok0, offs_c)
        async_copy.mbarrier_arrive(lo_ready.index(0), increment_count=False)
        mbarrier.wait(hi_free.index(1), phase)
        _gather(hi_bufs.index(1), lat_rows + HALF, key1 * stride_lt, ok1, offs_c)
        _gather(r_bufs.index(1), rope_rows, key1 * stride_kt, ok1, offs_r)
        async_copy.mbarrier_arrive(hi_ready.index(1), increment_count=False)
        mbarrier.wait(hi_free.index(0), phase)
        _gather(hi_bufs.index(0), lat_rows + HALF, key0 * stride_lt, ok0, offs_c)
        _gather(r_bufs.index(0), rope_rows, key0 * stride_kt, ok0, offs_r)
        async_copy.mbarrier_arrive(hi_ready.index(0), increment_count=False)
        mbarrier.wait(lo_free.index(1), phase)
        _gather(lo_bufs.index(1), lat_rows, key1 * stride_lt, ok1, offs_c)
        async_copy.mbarrier_arrive(lo_ready.index(1), increment_count=False)


@gluon.jit
def _counted_scores(s, t, idx_row, width, seq_k, stride_ik, BLOCK_N: gl.constexpr):
    """Tile t's raw scores with -inf where the index is outside [0, T) or past the width (the indices
    read one per thread of the warpgroup, then spread to the scores' columns)."""
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    pos = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=flat)
    key = gl.load(idx_row + pos * stride_ik, mask=pos < width, other=-1)
    ok = gl.convert_layout(((key >= 0) & (key < seq_k)).to(gl.int8), gl.SliceLayout(0, s.type.layout))
    return gl.where((ok != 0)[None, :], s, float("-inf"))


@gluon.jit
def _opaque_one(i):
    """1, from an instruction the compiler cannot see through, taking ``i`` so that it is made anew in
    each iteration of a loop over i: a shared buffer indexed by it has its wgmma descriptor built
    where it is used instead of hoisted out of the loop (where 20 of them outgrow the registers)."""
    return gl.inline_asm_elementwise("mov.u32 $0, 1;", "=r,r", [i], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _shifted(m):
    """The row max subtracted before exp2: rows with no counted key yet use 0."""
    return gl.where(m == float("-inf"), 0.0, m)


@gluon.jit
def _low_scores(q_lo, lo, ready, phase, acc, use_acc: gl.constexpr):
    """Once the low half ``lo`` is ready (``phase``), issue (asynchronously) acc + q_lo·loᵀ, the
    scores' low-column part (``use_acc`` False: acc's value is not read)."""
    mbarrier.wait(ready, phase)
    fence_async_shared()
    return warpgroup_mma(q_lo, lo.permute((1, 0)), acc, use_acc=use_acc, is_async=True)


@gluon.jit
def _high_scores(q_hi, q_r, hi, r, ready, phase, acc, use_acc: gl.constexpr):
    """Once the high half (``hi`` and the rope rows ``r``) is ready, issue (asynchronously)
    acc + q_hi·hiᵀ + q_rope·rᵀ, the scores' high-column and rope part."""
    mbarrier.wait(ready, phase)
    fence_async_shared()
    acc = warpgroup_mma(q_hi, hi.permute((1, 0)), acc, use_acc=use_acc, is_async=True)
    return warpgroup_mma(q_r, r.permute((1, 0)), acc, is_async=True)


@gluon.jit
def _signal(signal):
    """Arrive on ``signal`` once every thread of this warpgroup has done what came before."""
    gl.thread_barrier()
    mbarrier.arrive(signal)


@gluon.jit
def _publish(p, m, p_smem, m_smem, signal):
    """This warpgroup's P tile and row max, stored for the other warpgroup, then ``signal`` arrived."""
    p_smem.store(p)
    m_smem.store(m)
    fence_async_shared()
    _signal(signal)


@gluon.jit
def _consumer_start(BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr):
    """A consumer warpgroup's state before its first tile, in its wgmma layouts: (row max -inf, row
    sum 0, zero scores [BLOCK_H, BLOCK_N] to start a tile's products, accumulator [BLOCK_H, HALF] 0)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    return (gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout)),
            gl.zeros([BLOCK_H], dtype=gl.float32, layout=gl.SliceLayout(1, s_layout)),
            gl.zeros([BLOCK_H, BLOCK_N], dtype=gl.float32, layout=s_layout),
            gl.zeros([BLOCK_H, HALF], dtype=gl.float32, layout=o_layout))


@gluon.jit
def _probabilities(s, m_ref, scale_log2):
    """exp2(s·scale_log2 - m_ref) of raw scores s at the base-2 row max m_ref (one fused multiply-add)."""
    return gl.exp2(s * scale_log2 - _shifted(m_ref)[:, None])


@gluon.jit
def _rescaled(acc, factor):
    """The accumulator's rows times ``factor`` (one per row, in the scores' row layout)."""
    return acc * gl.convert_layout(factor, gl.SliceLayout(1, acc.type.layout))[:, None]


@gluon.jit
def _add_own_pc(p, c, acc):
    """Issue (asynchronously) acc + P·c with this warpgroup's P from registers."""
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    return warpgroup_mma(gl.convert_layout(p, p_layout), c, acc, is_async=True)


@gluon.jit
def _store_half(acc, m_i, l_i, l_mine, l_other, l_ready, mine: gl.constexpr, mean_row, o_rows, stride_oh, heads,
                head_block, part_o_ptr, part_lse_ptr, part_row, seq_q, HALF: gl.constexpr, MEAN_ROWS: gl.constexpr,
                SPLIT: gl.constexpr, BLOCK_H: gl.constexpr):
    """o_lat's columns [mine·HALF, (mine+1)·HALF) of the program's heads: the two warpgroups' row sums
    (both at the last pair's max m_i) exchanged and added, rows with no counted key 0 or the mean row;
    under SPLIT the fp32 partial o at partial row ``part_row`` + head·seq_q instead, and the even
    warpgroup writes its lse m_i + log2(sum) (-inf for a row with no counted key)."""
    layout: gl.constexpr = acc.type.layout
    l_mine.store(l_i)
    _signal(l_ready.index(mine))
    mbarrier.wait(l_ready.index(1 - mine), 0)
    l_sum = gl.convert_layout(l_i + l_other.load(l_i.type.layout), gl.SliceLayout(1, layout))
    empty = l_sum == 0.0
    o = acc / gl.where(empty, 1.0, l_sum)[:, None]
    offs_h = (head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, layout))).to(gl.int64)
    offs_c = mine * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
    h_ok = offs_h < heads
    if SPLIT:
        part = part_row + offs_h * seq_q
        gl.store(part_o_ptr + part[:, None] * (2 * HALF) + offs_c[None, :], o, mask=h_ok[:, None])
        if mine == 0:
            m = gl.convert_layout(m_i, l_sum.type.layout)
            gl.store(part_lse_ptr + part, gl.where(empty, float("-inf"), m + gl.log2(gl.where(empty, 1.0, l_sum))),
                     mask=h_ok)
    else:
        if MEAN_ROWS:
            mean = gl.load(mean_row + offs_c)
            o = gl.where(empty[:, None], mean[None, :], o)
        gl.store(o_rows + offs_h[:, None] * stride_oh + offs_c[None, :], o.to(o_rows.dtype.element_ty),
                 mask=h_ok[:, None])


@gluon.jit
def _attend_even(q_halves, q_r, lo_bufs, hi_bufs, r_bufs, p_odd, m_even_smem, m_odd_smem, l_even, l_odd,
                 lo_ready, hi_ready, lo_free, hi_free, p_ready, l_ready, idx_row, width, seq_k, stride_ik,
                 qk_scale_log2, mean_row, o_rows, stride_oh, heads, head_block, part_o_ptr, part_lse_ptr, part_row,
                 seq_q, HALF: gl.constexpr, MEAN_ROWS: gl.constexpr, SPLIT: gl.constexpr, BLOCK_H: gl.constexpr,
                 BLOCK_N: gl.constexpr):
    """Even warpgroup: folds tile 2i in at its new row max, publishes P and that max (P over buffer
    0's rope rows), adds its P·c into the low columns and frees buffer 0's low half; then rescales to
    the pair's max the odd warpgroup published, adds the odd P·c and issues tile 2i+2's scores behind
    it."""
    dtype: gl.constexpr = lo_bufs.dtype
    m_i, l_i, zero_s, acc = _consumer_start(BLOCK_H, BLOCK_N, HALF)
    n_pairs = gl.cdiv(width, 2 * BLOCK_N)
    s = zero_s
    if n_pairs > 0:
        s = _low_scores(q_halves.index(0), lo_bufs.index(0), lo_ready.index(0), 0, zero_s, False)
        s = _high_scores(q_halves.index(1), q_r.index(0), hi_bufs.index(0), r_bufs.index(0), hi_ready.index(0), 0, s,
                         True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    for i in range(n_pairs):
        one = _opaque_one(i)
        zero = one - 1
        lo0, lo1, hi0, r0 = lo_bufs.index(zero), lo_bufs.index(one), hi_bufs.index(zero), r_bufs.index(zero)
        s = _counted_scores(s, 2 * i, idx_row, width, seq_k, stride_ik, BLOCK_N)
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale_log2)
        alpha = gl.exp2(m_i - _shifted(m_new))
        p = _probabilities(s, m_new, qk_scale_log2)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        p = p.to(dtype)
        _publish(p, m_new, r0, m_even_smem, p_ready.index(0))
        acc = _add_own_pc(p, lo0, _rescaled(acc, alpha))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(lo_free.index(0))
        mbarrier.wait(p_ready.index(1), i & 1)
        m_pair = m_odd_smem.load(m_i.type.layout)
        beta = gl.exp2(m_new - _shifted(m_pair))
        l_i = l_i * beta
        acc = _rescaled(acc, beta)
        if i + 1 < n_pairs:
            acc = warpgroup_mma(p_odd.index(zero), lo1, acc, is_async=True)
            s = _low_scores(q_halves.index(zero), lo0, lo_ready.index(0), (i + 1) & 1, zero_s, False)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(lo_free.index(1))
            s = _high_scores(q_halves.index(one), q_r.index(zero), hi0, r0, hi_ready.index(0), (i + 1) & 1, s, True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        else:
            acc = warpgroup_mma(p_odd.index(zero), lo1, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(lo_free.index(1))
        m_i = m_pair
    _store_half(acc, m_i, l_i, l_even, l_odd, l_ready, 0, mean_row, o_rows, stride_oh, heads, head_block, part_o_ptr,
                part_lse_ptr, part_row, seq_q, HALF, MEAN_ROWS, SPLIT, BLOCK_H)


@gluon.jit
def _attend_odd(q_halves, q_r, lo_bufs, hi_bufs, r_bufs, p_odd, m_even_smem, m_odd_smem, l_even, l_odd,
                lo_ready, hi_ready, lo_free, hi_free, p_ready, l_ready, idx_row, width, seq_k, stride_ik,
                qk_scale_log2, mean_row, o_rows, stride_oh, heads, head_block, part_o_ptr, part_lse_ptr, part_row,
                seq_q, HALF: gl.constexpr, MEAN_ROWS: gl.constexpr, SPLIT: gl.constexpr, BLOCK_H: gl.constexpr,
                BLOCK_N: gl.constexpr):
    """Odd warpgroup: issues tile 2i+1's scores (high half first, the order it lands in), adds the even
    P·c at the even max into the high columns meanwhile and frees buffer 0's high half; then folds its
    tile in at the pair's max, publishes its P (in its own buffer) and that max, adds its own P·c and
    frees buffer 1's high half."""
    dtype: gl.constexpr = lo_bufs.dtype
    m_i, l_i, zero_s, acc = _consumer_start(BLOCK_H, BLOCK_N, HALF)
    for i in range(gl.cdiv(width, 2 * BLOCK_N)):
        one = _opaque_one(i)
        zero = one - 1
        hi0, hi1 = hi_bufs.index(zero), hi_bufs.index(one)
        s = _high_scores(q_halves.index(one), q_r.index(zero), hi1, r_bufs.index(one), hi_ready.index(1), i & 1,
                         zero_s, False)
        s = _low_scores(q_halves.index(zero), lo_bufs.index(one), lo_ready.index(1), i & 1, s, True)
        mbarrier.wait(p_ready.index(0), i & 1)
        m_even = m_even_smem.load(m_i.type.layout)
        alpha = gl.exp2(m_i - _shifted(m_even))
        l_i = l_i * alpha
        acc = warpgroup_mma(r_bufs.index(zero), hi0, _rescaled(acc, alpha), is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
        s = _counted_scores(s, 2 * i + 1, idx_row, width, seq_k, stride_ik, BLOCK_N)
        m_pair = gl.maximum(m_even, gl.max(s, axis=1) * qk_scale_log2)
        beta = gl.exp2(m_even - _shifted(m_pair))
        p = _probabilities(s, m_pair, qk_scale_log2)
        l_i = l_i * beta + gl.sum(p, axis=1)
        p = p.to(dtype)
        _publish(p, m_pair, p_odd.index(zero), m_odd_smem, p_ready.index(1))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(hi_free.index(0))
        acc = _add_own_pc(p, hi1, _rescaled(acc, beta))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(hi_free.index(1))
        m_i = m_pair
    _store_half(acc, m_i, l_i, l_odd, l_even, l_ready, 1, mean_row, o_rows, stride_oh, heads, head_block, part_o_ptr,
                part_lse_ptr, part_row, seq_q, HALF, MEAN_ROWS, SPLIT, BLOCK_H)


@gluon.jit(do_not_specialize=["seq_k", "num_splits", "split_len"])  # one build as a decode's cache grows
def _absorbed_attention_ws_kernel(
        qlat_ptr, qrope_ptr, lat_ptr, rope_ptr, idx_ptr, mean_ptr, o_ptr, part_o_ptr, part_lse_ptr,
        stride_qb, stride_qh, stride_qs, stride_rb, stride_rh, stride_rs, stride_lb, stride_lt,
        stride_kb, stride_kt, stride_ib, stride_is, stride_ik, stride_ob, stride_oh, stride_os,
        heads, seq_k, width, num_splits, split_len, qk_scale_log2,
        LAT_DIM: gl.constexpr, ROPE_DIM: gl.constexpr, MEAN_ROWS: gl.constexpr, SPLIT: gl.constexpr,
        WIDE_OFFSETS: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, CONSUMER_REGISTERS: gl.constexpr,
        num_warps: gl.constexpr):
    """One program: BLOCK_H heads of one query against all of its indices, or under SPLIT against
    indices [split·split_len, (split+1)·split_len) of them (unit inner strides)."""
    row = gl.program_id(1).to(gl.int64)
    batch = gl.program_id(2).to(gl.int64)
    seq_q = gl.num_programs(1)
    idx_row = idx_ptr + batch * stride_ib + row * stride_is
    if SPLIT:
        head_block = gl.program_id(0) // num_splits
        split = gl.program_id(0) % num_splits
        idx_row += split * split_len * stride_ik
        width = gl.minimum(width - split * split_len, split_len)
        part_row = ((split * gl.num_programs(2) + batch) * heads) * seq_q + row
    else:
        head_block = gl.program_id(0)
        part_row = row
    dtype: gl.constexpr = qlat_ptr.dtype.element_ty
    HALF: gl.constexpr = LAT_DIM // 2

    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    qr_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HALF], dtype)
    rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE_DIM], dtype)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], dtype)
    q_half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, HALF], dtype)
    q_rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, ROPE_DIM], dtype)
    row_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])

    offs_h = (head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, q_layout))).to(gl.int64)
    offs_c = gl.arange(0, HALF, layout=gl.SliceLayout(0, q_layout))
    q_half = qlat_ptr + batch * stride_qb + offs_h[:, None] * stride_qh + row * stride_qs + offs_c[None, :]
    h_ok = (offs_h < heads)[:, None]
    q_halves = gl.allocate_shared_memory(dtype, [2, BLOCK_H, HALF], q_half_layout)
    q_halves.index(0).store(gl.load(q_half, mask=h_ok, other=0.0))
    q_halves.index(1).store(gl.load(q_half + HALF, mask=h_ok, other=0.0))
    offs_hr = (head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, qr_layout))).to(gl.int64)
    offs_r = gl.arange(0, ROPE_DIM, layout=gl.SliceLayout(0, qr_layout))
    qr = gl.load(qrope_ptr + batch * stride_rb + offs_hr[:, None] * stride_rh + row * stride_rs + offs_r[None, :],
                 mask=(offs_hr < heads)[:, None], other=0.0)
    q_r = gl.allocate_shared_memory(dtype, [1, BLOCK_H, ROPE_DIM], q_rope_layout)
    q_r.index(0).store(qr)

    lo_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HALF], half_layout)
    hi_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HALF], half_layout)
    r_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_N, ROPE_DIM], rope_layout)
    p_odd = gl.allocate_shared_memory(dtype, [1, BLOCK_H, BLOCK_N], p_layout)
    m_even = gl.allocate_shared_memory(gl.float32, [BLOCK_H], row_layout)
    m_odd = gl.allocate_shared_memory(gl.float32, [BLOCK_H], row_layout)
    l_even = gl.allocate_shared_memory(gl.float32, [BLOCK_H], row_layout)
    l_odd = gl.allocate_shared_memory(gl.float32, [BLOCK_H], row_layout)
    lo_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    hi_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    lo_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    hi_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    l_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(lo_ready.index(i), count=num_warps * 32)
        mbarrier.init(hi_ready.index(i), count=num_warps * 32)
        mbarrier.init(lo_free.index(i), count=1)
        mbarrier.init(hi_free.index(i), count=1)
        mbarrier.init(p_ready.index(i), count=1)
        mbarrier.init(l_ready.index(i), count=1)
    fence_async_shared()

    mean_row = mean_ptr + batch * LAT_DIM
    o_rows = o_ptr + batch * stride_ob + row * stride_os
    gl.warp_specialize([
        (_gather_tiles, (lat_ptr + batch * stride_lb, rope_ptr + batch * stride_kb, idx_row, lo_bufs, hi_bufs,
                         r_bufs, lo_ready, hi_ready, lo_free, hi_free, width, seq_k, stride_lt, stride_kt, stride_ik,
                         HALF, ROPE_DIM, BLOCK_N, WIDE_OFFSETS, num_warps)),
        (_attend_even, (q_halves, q_r, lo_bufs, hi_bufs, r_bufs, p_odd, m_even, m_odd, l_even, l_odd,
                        lo_ready, hi_ready, lo_free, hi_free, p_ready, l_ready, idx_row, width, seq_k, stride_ik,
                        qk_scale_log2, mean_row, o_rows, stride_oh, heads, head_block, part_o_ptr, part_lse_ptr,
                        part_row, seq_q, HALF, MEAN_ROWS, SPLIT, BLOCK_H, BLOCK_N)),
        (_attend_odd, (q_halves, q_r, lo_bufs, hi_bufs, r_bufs, p_odd, m_even, m_odd, l_even, l_odd,
                       lo_ready, hi_ready, lo_free, hi_free, p_ready, l_ready, idx_row, width, seq_k, stride_ik,
                       qk_scale_log2, mean_row, o_rows, stride_oh, heads, head_block, part_o_ptr, part_lse_ptr,
                       part_row, seq_q, HALF, MEAN_ROWS, SPLIT, BLOCK_H, BLOCK_N)),
    ], [4, 4], [CONSUMER_REGISTERS, CONSUMER_REGISTERS])


def supports(device: torch.device, dtype: torch.dtype, lat_dim: int, rope_dim: int) -> bool:
    """Whether this kernel is built for the device, dtype and widths: CUDA sm_90, bf16/fp16,
    Dc = LAT_DIM, Dr = ROPE_DIM."""
    return (device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and lat_dim == LAT_DIM
            and rope_dim == ROPE_DIM and device_capability(device) == (9, 0))


def usable(q_lat: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor, rope_key: torch.Tensor,
           o_lat: torch.Tensor) -> bool:
    """Whether this kernel takes the call: ``supports`` its device, dtype and widths, one dtype
    throughout, unit inner strides."""
    tensors = (q_lat, q_rope, latent, rope_key, o_lat)
    return (supports(q_lat.device, q_lat.dtype, latent.shape[2], rope_key.shape[2])
            and all(x.dtype == q_lat.dtype and x.stride(-1) == 1 for x in tensors))


def wide_offsets(latent: torch.Tensor, rope_key: torch.Tensor) -> bool:
    """Whether a latent or rope row's element offset (row index times row stride) may reach 2^31."""
    return latent.shape[1] * max(latent.stride(1), rope_key.stride(1), 1) >= 2 ** 31


def attend_latent_ws(q_lat, q_rope, latent, rope_key, indices, mean, o_lat, scale_log2: float,
                     partials: tuple[torch.Tensor, torch.Tensor, int] | None = None) -> None:
    """o_lat ``[B, H, n, Dc]`` of n queries (``usable`` inputs; q_rope ``[B, H, n, Dr]`` with unit inner
    stride, indices ``[B, n, K]`` where -1 or out of range means not counted). ``partials`` = (part_o
    ``[splits, B, H, n, Dc]`` fp32, part_lse ``[splits, B, H, n]`` fp32, split_len): each row's indices
    run in splits of split_len, whose partials are written there instead of o_lat (mean unused)."""
    b, heads, n, lat_dim = q_lat.shape
    mean_arg = mean if mean is not None else o_lat
    part_o, part_lse, split_len = partials if partials is not None else (o_lat, o_lat, indices.shape[2])
    num_splits = cdiv(indices.shape[2], split_len)
    _absorbed_attention_ws_kernel[(cdiv(heads, BLOCK_H) * num_splits, n, b)](
        q_lat, q_rope, latent, rope_key, indices, mean_arg, o_lat, part_o, part_lse,
        q_lat.stride(0), q_lat.stride(1), q_lat.stride(2), q_rope.stride(0), q_rope.stride(1), q_rope.stride(2),
        latent.stride(0), latent.stride(1), rope_key.stride(0), rope_key.stride(1),
        indices.stride(0), indices.stride(1), indices.stride(2), o_lat.stride(0), o_lat.stride(1), o_lat.stride(2),
        heads, latent.shape[1], indices.shape[2], num_splits, split_len, scale_log2,
        LAT_DIM=lat_dim, ROPE_DIM=rope_key.shape[2], MEAN_ROWS=mean is not None, SPLIT=partials is not None,
        WIDE_OFFSETS=wide_offsets(latent, rope_key), BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N,
        CONSUMER_REGISTERS=CONSUMER_REGISTERS, num_warps=PRODUCER_WARPS)

"""The absorbed sparse attention's latent kernel for Hopper, warp-specialised in Gluon.

Same contract and numerics as ``absorbed_attention._absorbed_attention_kernel`` without splits:
one program takes BLOCK_H = 64 heads of one query; o_lat [B, H, n, Dc] (q's dtype) is the softmax
over the query's counted indices of the latent rows, rows without a counted key 0 or the mean row.

Why a second kernel. Triton's warp specialisation does not take gathered loads, so its kernel
issues each tile's gather from the warps that then multiply it. Here a producer partition (the
default one, PRODUCER_WARPS warps) gathers each tile's BLOCK_N latent rows (Dc + Dr values) with
``cp.async``, one copy of the whole tile, into one of NUM_BUFFERS shared-memory buffers and signals
it on an mbarrier, reading the next tile's indices meanwhile; two consumer warpgroups (a worker
partition of CONSUMER_WARPS warps) score the tile with wgmma (the heads are the rows, each
warpgroup takes half of the keys), fold it into the online softmax, accumulate P·c (each warpgroup
half of the Dc columns) and hand the buffer back.

Takes bf16 or fp16 operands, Dc = 512 and Dr = 64, on sm_90 only (``usable``).
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)

BLOCK_H = 64
"""Heads a program: the rows of every warpgroup product (Hopper's wgmma takes 64)."""
BLOCK_N = 64
"""Indices per tile."""
LAT_DIM = 512
ROPE_DIM = 64
"""The latent and rope widths the kernel is built and measured for (DeepSeek-V3.2's MLA; shared
memory holds q and two tiles at these widths)."""
NUM_BUFFERS = 2
"""Gathered tiles in flight: 2 x 64 x 576 x 2 bytes beside q's 64 x 576 x 2."""
CONSUMER_WARPS = 8
"""Two warpgroups: the keys of a tile's scores and the columns of P·c are split between them."""
CONSUMER_REGISTERS = 232
"""Registers a consumer thread asks for (setmaxnreg): the fp32 accumulator alone takes 128."""
PRODUCER_WARPS = 4
"""Warps of the producer partition (the kernel's ``num_warps``)."""


@gluon.jit
def _tile_keys(idx_row, t, start, stop, seq_k, stride_ik, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """Tile t's indices as (row to read, counted): an index outside [0, T) reads row 0 and does not count."""
    pos = start + t * BLOCK_N + gl.arange(0, BLOCK_N, layout=layout)
    key = gl.load(idx_row + pos * stride_ik, mask=pos < stop, other=-1).to(gl.int64)
    ok = (key >= 0) & (key < seq_k)
    return gl.where(ok, key, 0), ok


@gluon.jit
def _gather_tiles(lat_rows, rope_rows, idx_row, c_bufs, r_bufs, ready, empty, start, stop, seq_k,
                  stride_lt, stride_kt, stride_ik, LAT_DIM: gl.constexpr, ROPE_DIM: gl.constexpr,
                  BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, WARPS: gl.constexpr):
    """Producer: tile t's latent and rope rows into buffer t % NUM_BUFFERS, once the consumers freed
    it, each as one asynchronous copy; tile t+1's indices are read while tile t's rows arrive."""
    # 16-byte pieces, a warp's 32 lanes over 4 rows of 128 bytes: a lane addresses few distinct rows.
    # The latent and rope tiles share the layout, so one read of a tile's indices serves both copies.
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    offs_c = gl.arange(0, LAT_DIM, layout=gl.SliceLayout(0, layout))
    offs_r = gl.arange(0, ROPE_DIM, layout=gl.SliceLayout(0, layout))
    n_tiles = gl.cdiv(stop - start, BLOCK_N)
    key, ok = _tile_keys(idx_row, 0, start, stop, seq_k, stride_ik, BLOCK_N, gl.SliceLayout(1, layout))
    for t in range(n_tiles):
        slot = t % NUM_BUFFERS
        mbarrier.wait(empty.index(slot), ((t // NUM_BUFFERS) & 1) ^ 1)
        async_copy.async_copy_global_to_shared(
            c_bufs.index(slot), lat_rows + key[:, None] * stride_lt + offs_c[None, :], mask=ok[:, None])
        async_copy.async_copy_global_to_shared(
            r_bufs.index(slot), rope_rows + key[:, None] * stride_kt + offs_r[None, :], mask=ok[:, None])
        async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)
        key, ok = _tile_keys(idx_row, t + 1, start, stop, seq_k, stride_ik, BLOCK_N, gl.SliceLayout(1, layout))


@gluon.jit
def _score_tile(q_smem, qr_smem, c_bufs, r_bufs, ready, t, zero_s, NUM_BUFFERS: gl.constexpr):
    """Issue (asynchronously) tile t's scores q_lat·cᵀ + q_rope·krᵀ once its buffer is filled."""
    slot = t % NUM_BUFFERS
    mbarrier.wait(ready.index(slot), (t // NUM_BUFFERS) & 1)
    fence_async_shared()
    s = warpgroup_mma(qr_smem, r_bufs.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    return warpgroup_mma(q_smem, c_bufs.index(slot).permute((1, 0)), s, is_async=True)


@gluon.jit
def _softmax_tile(s, t, idx_row, start, stop, seq_k, stride_ik, qk_scale_log2, m_i, l_i, BLOCK_N: gl.constexpr):
    """Tile t's scores folded into the running row max and sum: (p, alpha, m, l), base 2; an index
    outside [0, T) scores -inf."""
    pos = start + t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout))
    key = gl.load(idx_row + pos * stride_ik, mask=pos < stop, other=-1)
    s = gl.where(((key >= 0) & (key < seq_k))[None, :], s * qk_scale_log2, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no counted key yet stay at 0
    alpha = gl.exp2(m_i - m_shift)
    p = gl.exp2(s - m_shift[:, None])
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _attend_tiles(q_smem, qr_smem, c_bufs, r_bufs, ready, empty, idx_row, start, stop, seq_k, stride_ik,
                  qk_scale_log2, mean_row, o_rows, stride_oh, heads, head_block,
                  LAT_DIM: gl.constexpr, MEAN_ROWS: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                  NUM_BUFFERS: gl.constexpr, WARPS: gl.constexpr):
    """Consumers: the query's tiles folded into the online softmax, then o_lat of its BLOCK_H heads
    stored."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WARPS // 4],
                                                       instr_shape=[16, BLOCK_N // (WARPS // 4), 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WARPS // 4],
                                                       instr_shape=[16, LAT_DIM // (WARPS // 4), 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    dtype: gl.constexpr = c_bufs.dtype
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], dtype=gl.float32, layout=gl.SliceLayout(1, s_layout))
    zero_s = gl.zeros([BLOCK_H, BLOCK_N], dtype=gl.float32, layout=s_layout)
    n_tiles = gl.cdiv(stop - start, BLOCK_N)
    acc = gl.zeros([BLOCK_H, LAT_DIM], dtype=gl.float32, layout=o_layout)
    for t in range(n_tiles):
        s = _score_tile(q_smem, qr_smem, c_bufs, r_bufs, ready, t, zero_s, NUM_BUFFERS)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        p, alpha, m_i, l_i = _softmax_tile(s, t, idx_row, start, stop, seq_k, stride_ik, qk_scale_log2, m_i,
                                           l_i, BLOCK_N)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), c_bufs.index(t % NUM_BUFFERS), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index(t % NUM_BUFFERS))
    empty_row = gl.convert_layout(l_i == 0.0, gl.SliceLayout(1, o_layout))
    o = acc / gl.convert_layout(gl.where(l_i == 0.0, 1.0, l_i), gl.SliceLayout(1, o_layout))[:, None]
    offs_h = (head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))).to(gl.int64)
    offs_c = gl.arange(0, LAT_DIM, layout=gl.SliceLayout(0, o_layout))
    if MEAN_ROWS:
        mean = gl.load(mean_row + offs_c)
        o = gl.where(empty_row[:, None], mean[None, :], o)
    gl.store(o_rows + offs_h[:, None] * stride_oh + offs_c[None, :], o.to(o_rows.dtype.element_ty),
             mask=(offs_h < heads)[:, None])


@gluon.jit
def _absorbed_attention_ws_kernel(
        qlat_ptr, qrope_ptr, lat_ptr, rope_ptr, idx_ptr, mean_ptr, o_ptr,
        stride_qb, stride_qh, stride_qs, stride_rb, stride_rh, stride_rs, stride_lb, stride_lt,
        stride_kb, stride_kt, stride_ib, stride_is, stride_ik, stride_ob, stride_oh, stride_os,
        heads, seq_k, width, qk_scale_log2,
        LAT_DIM: gl.constexpr, ROPE_DIM: gl.constexpr, MEAN_ROWS: gl.constexpr,
        BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr,
        CONSUMER_WARPS: gl.constexpr, CONSUMER_REGISTERS: gl.constexpr, num_warps: gl.constexpr):
    """One program: BLOCK_H heads of one query against all of its indices (unit inner strides)."""
    head_block = gl.program_id(0)
    row = gl.program_id(1).to(gl.int64)
    batch = gl.program_id(2).to(gl.int64)
    dtype: gl.constexpr = qlat_ptr.dtype.element_ty

    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    qr_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    c_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, LAT_DIM], dtype)
    r_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE_DIM], dtype)
    q_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, LAT_DIM], dtype)
    qr_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, ROPE_DIM], dtype)

    offs_h = (head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, q_layout))).to(gl.int64)
    offs_c = gl.arange(0, LAT_DIM, layout=gl.SliceLayout(0, q_layout))
    q = gl.load(qlat_ptr + batch * stride_qb + offs_h[:, None] * stride_qh + row * stride_qs + offs_c[None, :],
                mask=(offs_h < heads)[:, None], other=0.0)
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, LAT_DIM], q_smem_layout, q)
    offs_hr = (head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, qr_layout))).to(gl.int64)
    offs_r = gl.arange(0, ROPE_DIM, layout=gl.SliceLayout(0, qr_layout))
    qr = gl.load(qrope_ptr + batch * stride_rb + offs_hr[:, None] * stride_rh + row * stride_rs + offs_r[None, :],
                 mask=(offs_hr < heads)[:, None], other=0.0)
    qr_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, ROPE_DIM], qr_smem_layout, qr)
    fence_async_shared()

    c_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS, BLOCK_N, LAT_DIM], c_smem_layout)
    r_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS, BLOCK_N, ROPE_DIM], r_smem_layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUFFERS):
        mbarrier.init(ready.index(i), count=num_warps * 32)
        mbarrier.init(empty.index(i), count=1)

    idx_row = idx_ptr + batch * stride_ib + row * stride_is
    lat_rows = lat_ptr + batch * stride_lb
    rope_rows = rope_ptr + batch * stride_kb
    gl.warp_specialize([
        (_gather_tiles, (lat_rows, rope_rows, idx_row, c_bufs, r_bufs, ready, empty, 0, width, seq_k,
                         stride_lt, stride_kt, stride_ik, LAT_DIM, ROPE_DIM, BLOCK_N, NUM_BUFFERS, num_warps)),
        (_attend_tiles, (q_smem, qr_smem, c_bufs, r_bufs, ready, empty, idx_row, 0, width, seq_k, stride_ik,
                         qk_scale_log2, mean_ptr + batch * LAT_DIM, o_ptr + batch * stride_ob + row * stride_os,
                         stride_oh, heads, head_block, LAT_DIM, MEAN_ROWS, BLOCK_H, BLOCK_N, NUM_BUFFERS,
                         CONSUMER_WARPS)),
    ], [CONSUMER_WARPS], [CONSUMER_REGISTERS])


def usable(q_lat: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor, rope_key: torch.Tensor,
           o_lat: torch.Tensor) -> bool:
    """Whether this kernel takes the call: CUDA sm_90, bf16/fp16 throughout, Dc = LAT_DIM, Dr = ROPE_DIM,
    unit inner strides."""
    if q_lat.device.type != "cuda" or torch.cuda.get_device_capability(q_lat.device) != (9, 0):
        return False
    tensors = (q_lat, q_rope, latent, rope_key, o_lat)
    return (q_lat.dtype in (torch.bfloat16, torch.float16) and all(x.dtype == q_lat.dtype for x in tensors)
            and all(x.stride(-1) == 1 for x in tensors) and latent.shape[2] == LAT_DIM
            and rope_key.shape[2] == ROPE_DIM)


def attend_latent_ws(q_lat, q_rope, latent, rope_key, indices, mean, o_lat, scale_log2: float) -> None:
    """o_lat ``[B, H, n, Dc]`` of n queries (``usable`` inputs; q_rope ``[B, H, n, Dr]`` with unit inner
    stride, indices ``[B, n, K]`` where -1 or out of range means not counted)."""
    b, heads, n, lat_dim = q_lat.shape
    mean_arg = mean if mean is not None else o_lat
    _absorbed_attention_ws_kernel[(triton.cdiv(heads, BLOCK_H), n, b)](
        q_lat, q_rope, latent, rope_key, indices, mean_arg, o_lat,
        q_lat.stride(0), q_lat.stride(1), q_lat.stride(2), q_rope.stride(0), q_rope.stride(1), q_rope.stride(2),
        latent.stride(0), latent.stride(1), rope_key.stride(0), rope_key.stride(1),
        indices.stride(0), indices.stride(1), indices.stride(2), o_lat.stride(0), o_lat.stride(1), o_lat.stride(2),
        heads, latent.shape[1], indices.shape[2], scale_log2,
        LAT_DIM=lat_dim, ROPE_DIM=rope_key.shape[2], MEAN_ROWS=mean is not None, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N,
        NUM_BUFFERS=NUM_BUFFERS, CONSUMER_WARPS=CONSUMER_WARPS,
        CONSUMER_REGISTERS=CONSUMER_REGISTERS, num_warps=PRODUCER_WARPS)

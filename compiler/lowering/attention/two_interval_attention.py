"""Two-interval flash attention in Triton, returning log-sum-exp (SPEC B.3, C.6).

Contract: ``runtime.attention_reference.two_interval_attention``'s. Query p sees key j iff
``j < Sk`` and (``j < prefix_end[p]`` or ``segment_start[p] <= j <= q_start + p``). q [B,Hq,Sq,D],
k/v [B,Hkv,Sk,D] (bf16, fp16 or fp32, one dtype; ``Hq % Hkv == 0``), prefix_end/segment_start
[B,Sq] int32/int64. Returns o [B,Hq,Sq,D] in q's dtype and lse [B,Hq,Sq] fp32 (natural log); a
query with no visible key gets o = 0 and lse = -inf; keys outside every interval are never read.
``torch.ops.pulsar_dosa.two_interval_attention_triton`` (a custom op with a fake kernel) launches
the kernel on CUDA and under ``TRITON_INTERPRET=1``, else runs the reference. Importing this module
registers it as the CUDA kernel of Pulsar layouts (the package's ``pulsar_dosa.attention_kernels``
entry point names this module)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiler.autotune import LaunchConfig, choose_config, interpreter_active, length_bucket
from compiler.lowering.attention.online_softmax import LOG2_E, online_softmax_step
from runtime.attention_layout import register_attention_kernel
from runtime.attention_reference import check_attention_inputs, two_interval_attention
from compiler.lowering.host_ints import cdiv, next_power_of_2


@triton.jit
def _attend_key_tile(acc, m_i, l_i, q, k_head, v_head, start_n, offs_d, d_ok,
                     prefix_end, segment_start, last_key, seq_k, qk_scale_log2,
                     stride_ks, stride_kd, stride_vs, stride_vd,
                     BLOCK_N: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr,
                     UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold one key tile into the running (acc, row max m_i in log2 units, row sum l_i).

    MASKED=False only for tiles every row of the query tile sees entirely (no rule applied,
    no bound check on keys)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k_ptrs = k_head + offs_n[:, None] * stride_ks + offs_d[None, :] * stride_kd
    v_ptrs = v_head + offs_n[:, None] * stride_vs + offs_d[None, :] * stride_vd
    if MASKED:
        key_ok = offs_n < seq_k
        k = tl.load(k_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
    elif EVEN_D:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=d_ok[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
    if MASKED:
        in_prefix = offs_n[None, :] < prefix_end[:, None]
        in_segment = (offs_n[None, :] >= segment_start[:, None]) & (offs_n[None, :] <= last_key[:, None])
        visible = (in_prefix | in_segment) & key_ok[None, :]
        scores = tl.where(visible, scores, float("-inf"))
    return online_softmax_step(scores, v, acc, m_i, l_i, DOT_PRECISION)


_INTERPRETED = interpreter_active()
"""True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 at import)."""


def _launch_configs(dtype: torch.dtype) -> list[LaunchConfig]:
    """Candidate tiles: one under the interpreter (small tiles); on GPU, a short list that fits
    Hopper's shared memory at head dim 128 for the dtype (fp32 tiles are half as long)."""
    if _INTERPRETED:
        return [LaunchConfig.of(num_warps=1, num_stages=1, BLOCK_M=16, BLOCK_N=16)]
    if dtype == torch.float32:
        return [LaunchConfig.of(num_warps=4, num_stages=2, BLOCK_M=64, BLOCK_N=32),
                LaunchConfig.of(num_warps=8, num_stages=2, BLOCK_M=128, BLOCK_N=32),
                LaunchConfig.of(num_warps=4, num_stages=2, BLOCK_M=32, BLOCK_N=64)]
    return [LaunchConfig.of(num_warps=8, num_stages=3, BLOCK_M=128, BLOCK_N=64),
            LaunchConfig.of(num_warps=8, num_stages=2, BLOCK_M=128, BLOCK_N=128),
            LaunchConfig.of(num_warps=4, num_stages=3, BLOCK_M=64, BLOCK_N=64),
            LaunchConfig.of(num_warps=4, num_stages=3, BLOCK_M=128, BLOCK_N=32)]


@triton.jit
def _two_interval_attention_kernel(
        q_ptr, k_ptr, v_ptr, prefix_end_ptr, segment_start_ptr, o_ptr, lse_ptr,
        stride_qb, stride_qh, stride_qs, stride_qd,
        stride_kb, stride_kh, stride_ks, stride_kd,
        stride_vb, stride_vh, stride_vs, stride_vd,
        stride_ob, stride_oh, stride_os, stride_od,
        stride_pb, stride_ps, stride_sb, stride_ss,
        stride_lb, stride_lh, stride_ls,
        num_q_heads, group, seq_q, seq_k, head_dim, q_start, qk_scale_log2,
        BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: BLOCK_M queries of one (batch, query head) against their two key ranges."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)  # batch and head offsets can pass 2^31 elements
    batch = pid_bh // num_q_heads
    head = pid_bh % num_q_heads
    kv_head = head // group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < seq_q
    d_ok = offs_d < head_dim

    # Row bounds clamped to [0, Sk] (same visibility) and held in int32 (Sk < 2^31).
    # Rows past Sq see nothing: prefix_end 0, segment_start past every key.
    prefix_end = tl.load(prefix_end_ptr + batch * stride_pb + offs_m * stride_ps, mask=row_ok, other=0)
    prefix_end = tl.minimum(tl.maximum(prefix_end.to(tl.int64), 0), seq_k).to(tl.int32)
    segment_start = tl.load(segment_start_ptr + batch * stride_sb + offs_m * stride_ss,
                            mask=row_ok, other=seq_k)
    segment_start = tl.minimum(tl.maximum(segment_start.to(tl.int64), 0), seq_k).to(tl.int32)
    last_key = tl.minimum(q_start + offs_m.to(tl.int64), seq_k - 1).to(tl.int32)

    # Key ranges of this tile. Some row sees keys in [0, prefix_hi) and [segment_lo, segment_hi)
    # only (rows with an empty interval do not widen it); every row sees [0, prefix_all) and
    # [segment_all_lo, segment_all_hi). Tiles inside the latter skip the visibility rule.
    segment_live = row_ok & (segment_start <= last_key)
    prefix_hi = tl.max(tl.where(row_ok, prefix_end, 0), 0)
    prefix_all = tl.min(tl.where(row_ok, prefix_end, seq_k), 0)
    segment_lo = tl.min(tl.where(segment_live, segment_start, seq_k), 0)
    segment_hi = tl.max(tl.where(segment_live, last_key + 1, 0), 0)
    segment_all_lo = tl.max(tl.where(row_ok, segment_start, 0), 0)
    segment_all_hi = tl.min(tl.where(row_ok, last_key + 1, seq_k), 0)

    full_prefix_end = (prefix_all // BLOCK_N) * BLOCK_N
    prefix_end_tile = tl.cdiv(prefix_hi, BLOCK_N) * BLOCK_N
    segment_first = tl.maximum((segment_lo // BLOCK_N) * BLOCK_N, prefix_end_tile)
    full_lo = tl.maximum(tl.cdiv(segment_all_lo, BLOCK_N) * BLOCK_N, segment_first)
    full_hi = tl.maximum((segment_all_hi // BLOCK_N) * BLOCK_N, full_lo)
    before_full = tl.minimum(full_lo, tl.cdiv(segment_hi, BLOCK_N) * BLOCK_N)

    q = tl.load(q_ptr + batch * stride_qb + head * stride_qh
                + offs_m[:, None] * stride_qs + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_head = k_ptr + batch * stride_kb + kv_head * stride_kh
    v_head = v_ptr + batch * stride_vb + kv_head * stride_vh

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # Disjoint tile ranges in key order: prefix (whole, then partial), then segment (partial,
    # whole, partial).
    for start_n in range(0, full_prefix_end, BLOCK_N):
        acc, m_i, l_i = _attend_key_tile(
            acc, m_i, l_i, q, k_head, v_head, start_n, offs_d, d_ok, prefix_end, segment_start,
            last_key, seq_k, qk_scale_log2, stride_ks, stride_kd, stride_vs, stride_vd,
            BLOCK_N, False, EVEN_D, UPCAST, DOT_PRECISION)
    for start_n in range(full_prefix_end, prefix_end_tile, BLOCK_N):
        acc, m_i, l_i = _attend_key_tile(
            acc, m_i, l_i, q, k_head, v_head, start_n, offs_d, d_ok, prefix_end, segment_start,
            last_key, seq_k, qk_scale_log2, stride_ks, stride_kd, stride_vs, stride_vd,
            BLOCK_N, True, EVEN_D, UPCAST, DOT_PRECISION)
    for start_n in range(segment_first, before_full, BLOCK_N):
        acc, m_i, l_i = _attend_key_tile(
            acc, m_i, l_i, q, k_head, v_head, start_n, offs_d, d_ok, prefix_end, segment_start,
            last_key, seq_k, qk_scale_log2, stride_ks, stride_kd, stride_vs, stride_vd,
            BLOCK_N, True, EVEN_D, UPCAST, DOT_PRECISION)
    for start_n in range(full_lo, full_hi, BLOCK_N):
        acc, m_i, l_i = _attend_key_tile(
            acc, m_i, l_i, q, k_head, v_head, start_n, offs_d, d_ok, prefix_end, segment_start,
            last_key, seq_k, qk_scale_log2, stride_ks, stride_kd, stride_vs, stride_vd,
            BLOCK_N, False, EVEN_D, UPCAST, DOT_PRECISION)
    for start_n in range(full_hi, segment_hi, BLOCK_N):
        acc, m_i, l_i = _attend_key_tile(
            acc, m_i, l_i, q, k_head, v_head, start_n, offs_d, d_ok, prefix_end, segment_start,
            last_key, seq_k, qk_scale_log2, stride_ks, stride_kd, stride_vs, stride_vd,
            BLOCK_N, True, EVEN_D, UPCAST, DOT_PRECISION)

    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    # lse = ln(2) * (m + log2 l): back from base-2 to natural log.
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    tl.store(o_ptr + batch * stride_ob + head * stride_oh
             + offs_m[:, None] * stride_os + offs_d[None, :] * stride_od,
             o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + batch * stride_lb + head * stride_lh + offs_m * stride_ls, lse, mask=row_ok)


_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_kernel_inputs(q, k, v, prefix_end, segment_start) -> None:
    """Raise TypeError/ValueError for inputs the kernel cannot take (dtype, device, length)."""
    if q.dtype not in _KERNEL_DTYPES:
        raise TypeError(f"q must be bfloat16, float16 or float32, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    for name, t in (("k", k), ("v", v), ("prefix_end", prefix_end), ("segment_start", segment_start)):
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    for name, t in (("q", q), ("k", k)):
        if t.shape[2] >= 2 ** 31:
            raise ValueError(f"{name} must have fewer than 2^31 tokens (int32 indices), got {t.shape[2]}")
    if q.shape[0] * q.shape[1] > 65535:
        raise ValueError(f"q must have batch x heads <= 65535 (one grid axis), got {q.shape[0] * q.shape[1]}")


def _launch(q, k, v, prefix_end, segment_start, scale: float, q_start: int):
    """Allocate (o, lse) and run the Triton kernel over every (query tile, batch, head)."""
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    o = torch.empty((b, hq, sq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device)
    if lse.numel() == 0:
        return o, lse

    block_d = max(16, next_power_of_2(d))

    def run(config: LaunchConfig) -> None:
        grid = (cdiv(sq, dict(config.meta)["BLOCK_M"]), b * hq)
        _two_interval_attention_kernel[grid](
            q, k, v, prefix_end, segment_start, o, lse,
            *q.stride(), *k.stride(), *v.stride(), *o.stride(),
            *prefix_end.stride(), *segment_start.stride(), *lse.stride(),
            hq, hq // hkv, sq, sk, d, q_start, scale * LOG2_E,
            BLOCK_D=block_d, EVEN_D=block_d == d, UPCAST=_INTERPRETED,
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            **config.kwargs())

    config = choose_config(
        "two_interval_attention", _launch_configs(q.dtype), run, device=q.device, length=max(sq, 1),
        shape={"head_dim": d, "itemsize": q.element_size(), "group": hq // hkv,
               "key_bucket": length_bucket(max(sk, 1))},
        work=2 * b * hq * sq * sk * d)
    run(config)
    return o, lse


@torch.library.custom_op("pulsar_dosa::two_interval_attention_triton", mutates_args=())
def _two_interval_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               prefix_end: torch.Tensor, segment_start: torch.Tensor,
                               scale: float, q_start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton on CUDA (or under the interpreter); the plain-torch reference on CPU otherwise."""
    if q.is_cuda or _INTERPRETED:
        return _launch(q, k, v, prefix_end, segment_start, scale, q_start)
    return two_interval_attention(q, k, v, prefix_end, segment_start, scale=scale, q_start=q_start)


@_two_interval_attention_op.register_fake
def _two_interval_attention_fake(q, k, v, prefix_end, segment_start, scale, q_start):
    b, hq, sq, d = q.shape
    return (q.new_empty((b, hq, sq, d)), q.new_empty((b, hq, sq), dtype=torch.float32))


def two_interval_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  prefix_end: torch.Tensor, segment_start: torch.Tensor, *,
                                  scale: float, q_start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two-interval attention ``(o, lse)`` through the Triton kernel (contract in the module doc).

    Raises TypeError/ValueError naming the argument for a bad shape, dtype, device or scalar.
    """
    check_attention_inputs(q, k, v, prefix_end, segment_start, scale, q_start)
    _check_kernel_inputs(q, k, v, prefix_end, segment_start)
    return torch.ops.pulsar_dosa.two_interval_attention_triton(
        q, k, v, prefix_end, segment_start, float(scale), int(q_start))


register_attention_kernel("cuda", two_interval_attention_triton)

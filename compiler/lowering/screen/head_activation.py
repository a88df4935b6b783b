"""Activation frequencies of the certificate's heads, in one Triton kernel (SPEC A.3, C.2).

``activation_frequency(q, k, seed_ids, A, samples)``: q [B,S,H,D], k [B,T,D] (one dtype,
bf16/fp16/fp32, or float8_e4m3fn multiplied as bf16), seed_ids [B,G,W] int32 key ids (G =
ceil(S / A) groups of A queries), samples >= 1. Returns p [B,S,H] fp32: for query s of group g = s // A and head h, the fraction of the first
min(samples, W) witness keys ``seed_ids[b, g, :m]`` with q_h . k > 0. p steers the plan's choices
only, never its soundness, so the products' rounding may differ from any other form."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiler.lowering.scoring.indexer_scores import INTERPRET
from compiler.lowering import defaults
from compiler.lowering.host_ints import cdiv, next_power_of_2

__all__ = ["activation_frequency"]


@triton.jit
def _activation_kernel(q_ptr, k_ptr, ids_ptr, out_ptr, S, H, A, m, sqb, sqs, sqh, skb, skt, sib, sig,
                       D: tl.constexpr, DP: tl.constexpr, ROWS: tl.constexpr, KEYS: tl.constexpr,
                       TO_FP32: tl.constexpr, TO_BF16: tl.constexpr):
    """out[b, s, h] (contiguous [B, S, H]) for the ROWS rows (s, h) of group g, block rb. TO_FP32:
    operands upcast before the dot (the interpreter multiplies bf16 operands wrongly); TO_BF16:
    E4M3 operands converted (exactly) to bf16."""
    b = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    rows = tl.program_id(2) * ROWS + tl.arange(0, ROWS)
    s = g * A + rows // H
    head = rows % H
    rok = (rows < A * H) & (s < S)
    d = tl.arange(0, DP)
    q = tl.load(q_ptr + b * sqb + s[:, None].to(tl.int64) * sqs + head[:, None] * sqh + d[None, :],
                mask=rok[:, None] & (d < D)[None, :], other=0.0)
    if TO_FP32:
        q = q.to(tl.float32)
    elif TO_BF16:
        q = q.to(tl.bfloat16)
    positive = tl.zeros([ROWS], dtype=tl.int32)
    for p0 in range(0, m, KEYS):
        j = p0 + tl.arange(0, KEYS)
        jok = j < m
        key = tl.load(ids_ptr + b * sib + g * sig + j, mask=jok, other=0).to(tl.int64)
        kt = tl.load(k_ptr + b * skb + key[None, :] * skt + d[:, None], mask=jok[None, :] & (d < D)[:, None],
                     other=0.0)
        if TO_FP32:
            kt = kt.to(tl.float32)
        elif TO_BF16:
            kt = kt.to(tl.bfloat16)
        x = tl.dot(q, kt)
        positive += tl.sum(((x > 0) & jok[None, :]).to(tl.int32), axis=1)
    tl.store(out_ptr + (b * S + s) * H + head, positive.to(tl.float32) / m, mask=rok)


def activation_frequency(q: torch.Tensor, k: torch.Tensor, seed_ids: torch.Tensor, A: int,
                         samples: int) -> torch.Tensor:
    """p [B,S,H] fp32 (module docstring); no host synchronisation."""
    B, S, H, D = q.shape
    G, W = seed_ids.shape[1], seed_ids.shape[2]
    if G * A < S or seed_ids.shape[0] != B or W < 1:
        raise ValueError(f"seed_ids: expected [B={B}, G, W >= 1] with G * A >= S = {S} (A = {A}), "
                         f"got {tuple(seed_ids.shape)}")
    m = min(samples, W)
    out = torch.empty((B, S, H), dtype=torch.float32, device=q.device)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    ids = seed_ids if seed_ids.stride(-1) == 1 else seed_ids.contiguous()
    if B * S * H:
        grid = (B, G, cdiv(A * H, defaults.ACTIVATION_ROWS))
        _activation_kernel[grid](q, k, ids, out, S, H, A, m, q.stride(0), q.stride(1), q.stride(2),
                                 k.stride(0), k.stride(1), ids.stride(0), ids.stride(1), D=D,
                                 DP=max(16, next_power_of_2(D)), ROWS=defaults.ACTIVATION_ROWS, KEYS=defaults.ACTIVATION_KEYS,
                                 TO_FP32=INTERPRET, TO_BF16=q.dtype == torch.float8_e4m3fn)
    return out

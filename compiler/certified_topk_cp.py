"""``compiler.certified_topk_cp``: the certified top-K over keys sharded across ranks, on the
device's kernel.

``runtime.certified_topk_cp`` holds the protocol (one all-reduce of the per-query thresholds,
one all-gather of candidates, the merge; exactly ``dense_topk`` of the unsharded call on every
rank); this module only picks the shard kernel (``shard_kernel``), as the op does: the Triton
pipeline (``compiler/lowering/topk_pipeline.py``) for CUDA tensors, the plain-torch
reference elsewhere (gloo on the CPU).
"""
from __future__ import annotations

import torch

from runtime.certified_topk import certified_topk
from runtime.certified_topk_cp import ShardKernel, certified_topk_cp as reference_certified_topk_cp

__all__ = ["certified_topk_cp", "shard_kernel"]


def shard_kernel(device: torch.device) -> ShardKernel:
    """The shard's certified top-K on ``device``: the Triton pipeline on CUDA, else the reference."""
    if torch.device(device).type == "cuda":
        from compiler.lowering.topk_pipeline import certified_topk_cuda

        return certified_topk_cuda
    return certified_topk


def certified_topk_cp(q: torch.Tensor, k_shard: torch.Tensor, weights: torch.Tensor, topk: int,
                      mask_shard: torch.Tensor | None = None, **options) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact global (values [B,S,kk] float32, indices [B,S,kk] int64) of keys sharded over the
    ranks of a process group: ``runtime.certified_topk_cp.certified_topk_cp`` with the shard kernel
    of q's device; ``options`` are its keyword arguments (key_offset, required; group, config,
    stats, share_threshold; ``kernel`` is this function's choice: TypeError naming it)."""
    if "kernel" in options:
        raise TypeError("kernel: compiler.certified_topk_cp runs the shard kernel of q's device; pass one to "
                        "runtime.certified_topk_cp.certified_topk_cp instead")
    kernel = shard_kernel(q.device) if isinstance(q, torch.Tensor) else None
    return reference_certified_topk_cp(q, k_shard, weights, topk, mask_shard, kernel=kernel, **options)

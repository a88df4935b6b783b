"""The CUDA entry of ``pulsar_dosa.absorbed_sparse_attention``: DSA attention of an MLA layer from its
latent, in the form the op chose, and what its form choice reads of the kernels.

Contract: ``runtime.absorbed_attention.absorbed_sparse_attention`` (q ``[B, H, S, Dn+Dr]``, latent
``[B, T, Dc]``, rope_key ``[B, T, Dr]``, kv_b_weight ``[H·(Dn+Dv), Dc]``, indices ``[B, S, K]``,
mask None or bool broadcastable to ``[B, 1, S, T]``; o ``[B, H, S, Dv]`` in q's dtype). Both forms
give it to rounding.

``latent_sparse_attention`` runs ``absorbed_attention``, or with ``union`` the union form: the
latent expanded the way transformers does (k = [latent W_UKᵀ, rope_key], v = latent W_UVᵀ, per
head, from the weight the call receives), then ``union_attention``'s kernels on it. For the
op's choice between them (``compiler.ops.sparse_form``): ``warp_specialised`` says which absorbed
kernel a call would run, ``union_bytes`` what the union form allocates. Nothing here decides.
"""
from __future__ import annotations

from typing import Optional

import torch

from compiler.autotune import interpreter_active
from compiler.lowering.attention import absorbed_attention
from compiler.lowering.attention.absorbed_attention import WARP_SPECIALISED_MIN_HEADS, absorbed_sparse_attention_triton
from compiler.lowering.attention.union_attention import sparse_attention_triton, workspace_bytes
from runtime.absorbed_attention import absorbed_dims, checked_absorbed_inputs, expand_latent


def union_bytes(q, latent, rope_key, kv_b_weight, indices) -> int:
    """Bytes the union form of a call on checked inputs allocates: the expanded keys and values and
    the union kernels' workspace."""
    b, heads, s, _ = q.shape
    nope_dim, rope_dim, v_dim = absorbed_dims(q, rope_key, kv_b_weight)
    t_len = latent.shape[1]
    k = torch.empty((b, heads, t_len, nope_dim + rope_dim), dtype=q.dtype, device="meta")
    v = torch.empty((b, heads, t_len, v_dim), dtype=q.dtype, device="meta")
    expansion = b * t_len * heads * (2 * nope_dim + rope_dim + 2 * v_dim) * q.element_size()
    return expansion + workspace_bytes(q, k, v, indices)


def warp_specialised(q: torch.Tensor, latent: torch.Tensor, rope_key: torch.Tensor) -> bool:
    """Whether the absorbed form of this call could run the Gluon kernel: its device, dtype and
    dimensions (``absorbed_attention._warp_specialised_applies`` also reads the strides)."""
    ws = absorbed_attention.absorbed_attention_ws
    return (ws is not None and not interpreter_active() and q.shape[1] >= WARP_SPECIALISED_MIN_HEADS
            and ws.supports(q.device, q.dtype, latent.shape[2], rope_key.shape[2]))


def latent_sparse_attention(q: torch.Tensor, latent: torch.Tensor, rope_key: torch.Tensor, kv_b_weight: torch.Tensor,
                            indices: torch.Tensor, mask: Optional[torch.Tensor] = None, *, scale: float,
                            masked_rows: str = "zero", distinct: bool = False, union: bool = False) -> torch.Tensor:
    """o ``[B, H, S, Dv]`` (module docstring) in the absorbed form, or in the union form when
    ``union``; ``distinct`` as in ``absorbed_sparse_attention_triton``. Raises TypeError/ValueError
    naming the argument before any work."""
    if not union:  # which checks its arguments itself
        return absorbed_sparse_attention_triton(q, latent, rope_key, kv_b_weight, indices, mask, scale=scale,
                                                masked_rows=masked_rows, distinct=distinct)
    checked_absorbed_inputs(q, latent, rope_key, kv_b_weight, indices, mask, scale, masked_rows)
    k, v = expand_latent(latent, rope_key, kv_b_weight, q.shape[1], absorbed_dims(q, rope_key, kv_b_weight)[0])
    return sparse_attention_triton(q, k, v, indices, mask, scale=scale, masked_rows=masked_rows)[0]

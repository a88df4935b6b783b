"""The CUDA entry of ``pulsar_dosa.absorbed_sparse_attention``: DSA attention of an MLA layer from its
latent, in the absorbed form or, when a call's selections overlap enough, in the union form.

Contract: ``runtime.absorbed_attention.absorbed_sparse_attention`` (q ``[B, H, S, Dn+Dr]``, latent
``[B, T, Dc]``, rope_key ``[B, T, Dr]``, kv_b_weight ``[H·(Dn+Dv), Dc]``, indices ``[B, S, K]``,
mask None or bool broadcastable to ``[B, 1, S, T]``; o ``[B, H, S, Dv]`` in q's dtype). Both forms
give it to rounding.

``form="absorbed"`` runs ``absorbed_attention``. ``form="auto"`` asks ``compiler.ops.sparse_form``
(``choose_form``): the union form expands the latent the way transformers does (k = [latent W_UKᵀ,
rope_key], v = latent W_UVᵀ, per head, from the weight the call receives) and runs
``sparse_attention``'s kernels on it. The overlap is measured per call site and size bucket,
synchronising the host on the first call of each only; a call made while a CUDA graph is captured
never measures.
"""
from __future__ import annotations

from typing import Optional

import torch

from compiler.autotune import interpreter_active, length_bucket
from compiler.lowering.attention import absorbed_attention
from compiler.lowering.attention.absorbed_attention import WARP_SPECIALISED_MIN_HEADS, absorbed_sparse_attention_triton
from compiler.lowering.attention.selection_overlap import union_ratio
from compiler.lowering.attention.sparse_attention import sparse_attention_triton, tile_rows, workspace_bytes
from compiler.ops.absorbed_sparse_attention import check_form
from compiler.ops.sparse_form import RECORDS, call_sparse_form
from runtime.absorbed_attention import absorbed_dims, check_absorbed_inputs, expand_latent

FREE_FRACTION = 0.9
"""Share of the device's free memory the union form's expansion and workspace may take."""


def _free_bytes(device: torch.device) -> Optional[int]:
    """Bytes free on a CUDA device outside the caching allocator's pool (the pool's unused blocks
    are not counted: reading them costs more host time than the choice is worth)."""
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None


def _union_fits(q, latent, rope_key, indices, dims: tuple[int, int, int]) -> bool:
    """Whether the union form's expanded keys and values and its workspace fit in free memory."""
    free = _free_bytes(q.device)
    if free is None:
        return True
    b, heads, s, _ = q.shape
    nope_dim, rope_dim, v_dim = dims
    t_len = latent.shape[1]
    k = torch.empty((b, heads, t_len, nope_dim + rope_dim), dtype=q.dtype, device="meta")
    v = torch.empty((b, heads, t_len, v_dim), dtype=q.dtype, device="meta")
    expansion = b * t_len * heads * (2 * nope_dim + rope_dim + 2 * v_dim) * q.element_size()
    return expansion + workspace_bytes(q, k, v, indices) <= FREE_FRACTION * free


def _warp_specialised(q: torch.Tensor, latent: torch.Tensor, rope_key: torch.Tensor) -> bool:
    """Whether the absorbed form of this call would run the Gluon kernel (prefill-sized grids)."""
    ws = absorbed_attention.absorbed_attention_ws
    return (ws is not None and not interpreter_active() and q.is_cuda
            and q.shape[1] >= WARP_SPECIALISED_MIN_HEADS and q.dtype in (torch.bfloat16, torch.float16)
            and latent.shape[2] == ws.LAT_DIM and rope_key.shape[2] == ws.ROPE_DIM
            and torch.cuda.get_device_capability(q.device) == (9, 0))


def choose_form(q, latent, rope_key, kv_b_weight, indices, mask, site: str = "") -> tuple[str, str]:
    """``(form, reason)`` of an "auto" call on checked inputs: ``compiler.ops.sparse_form``, its
    union ratio from ``RECORDS`` under (``site``, device, B, H, K, the buckets of S and T)."""
    b, heads, s, _ = q.shape
    dims = absorbed_dims(q, rope_key, kv_b_weight)
    t_len, width = latent.shape[1], indices.shape[2]
    tile = tile_rows(s)
    capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
    return call_sparse_form(
        batch=b, queries=s, topk=max(width, 1), heads=heads, tile=tile,
        warp_specialised=_warp_specialised(q, latent, rope_key),
        expand=(t_len, latent.shape[2], dims[0], dims[1], dims[2]),
        union_fits=_union_fits(q, latent, rope_key, indices, dims), may_measure=not capturing,
        measure_ratio=lambda: RECORDS.ratio((site, q.device, b, heads, width, length_bucket(s), length_bucket(t_len)),
                                            lambda: union_ratio(indices, mask, t_len, tile)))


def latent_sparse_attention(q: torch.Tensor, latent: torch.Tensor, rope_key: torch.Tensor, kv_b_weight: torch.Tensor,
                            indices: torch.Tensor, mask: Optional[torch.Tensor] = None, *, scale: float,
                            masked_rows: str = "zero", distinct: bool = False, form: str = "auto",
                            site: str = "") -> torch.Tensor:
    """o ``[B, H, S, Dv]`` (module docstring); ``distinct`` as in ``absorbed_sparse_attention_triton``;
    ``site`` names the call site whose measurements an "auto" call reuses (``choose_form``).
    Raises TypeError/ValueError naming the argument before any work."""
    check_form(form)
    check_absorbed_inputs(q, latent, rope_key, kv_b_weight, indices, mask, scale, masked_rows)
    if form == "auto" and q.numel() and latent.shape[1] and indices.shape[2]:
        form = choose_form(q, latent, rope_key, kv_b_weight, indices, mask, site)[0]
    if form != "union":
        return absorbed_sparse_attention_triton(q, latent, rope_key, kv_b_weight, indices, mask, scale=scale,
                                                masked_rows=masked_rows, distinct=distinct)
    k, v = expand_latent(latent, rope_key, kv_b_weight, q.shape[1], absorbed_dims(q, rope_key, kv_b_weight)[0])
    return sparse_attention_triton(q, k, v, indices, mask, scale=scale, masked_rows=masked_rows)[0]

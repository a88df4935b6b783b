"""DSA sparse attention of multi-head latent attention (MLA) in its absorbed form: the plain-torch
reference semantics.

An MLA layer (DeepSeek-V3.2, GLM-5) keeps one latent row per key: ``c_t`` (``Dc``, the kv_lora
rank after its norm) and a rope key ``kr_t`` (``Dr``), shared by all heads. ``kv_b_proj``'s weight
W ``[H·(Dn+Dv), Dc]`` expands them per head: rows ``h·(Dn+Dv) + [0, Dn)`` are ``W_UK[h]``
``[Dn, Dc]`` and the next ``Dv`` rows ``W_UV[h]`` ``[Dv, Dc]``, so head h's key is
``[W_UK[h] c_t, kr_t]`` and its value ``W_UV[h] c_t``. With the query split as
``q = [q_nope (Dn), q_rope (Dr)]``, the score and the output of head h are, exactly in real
arithmetic,

    score_t = scale · (q_lat · c_t + q_rope · kr_t),      q_lat = q_nope W_UK[h]      (Dc)
    out     = W_UV[h] (Σ_t softmax(score)_t c_t)                                        (Dv)

over the keys the query sees: its selected keys as in ``runtime.union_attention`` (the distinct
in-range indices of its row that the bool ``mask`` shows). Rows without such a key get 0
(``masked_rows="zero"``) or the mean of v over all T keys, ``W_UV[h] mean_t(c_t)`` ("mean").
This equals ``runtime.union_attention.sparse_attention`` on the expanded K and V to rounding;
``expand_latent`` computes that expansion (the union form's, and a latent cache's read,
``compiler.ops.latent_kv``).

Shapes: q ``[B, H, S, Dn+Dr]``, latent ``[B, T, Dc]``, rope_key ``[B, T, Dr]``, kv_b_weight
``[H·(Dn+Dv), Dc]`` (Dn, Dv >= 1 follow from the shapes), indices ``[B, S, K]`` int32/int64,
mask None or bool broadcastable to ``[B, 1, S, T]``. Returns o ``[B, H, S, Dv]`` in q's dtype and
lse ``[B, H, S]`` fp32 (natural log; -inf for rows without a visible key). Arithmetic is fp32.
"""
from __future__ import annotations

from typing import Optional

import torch

from runtime.union_attention import (FLOAT_DTYPES, GATHER_ELEMENTS, check_on_q_device, check_sparse_attention_inputs,
                                      selected_keys)
from runtime.signature_check import checked_on_meta
from runtime.workspace import check_workspace


def absorbed_dims(q: torch.Tensor, rope_key: torch.Tensor, kv_b_weight: torch.Tensor) -> tuple[int, int, int]:
    """``(Dn, Dr, Dv)`` of checked inputs: Dr from rope_key, Dn = q's last dim - Dr, Dv the rest of a
    head's rows of kv_b_weight."""
    rope_dim = rope_key.shape[-1]
    nope_dim = q.shape[-1] - rope_dim
    return nope_dim, rope_dim, kv_b_weight.shape[0] // q.shape[1] - nope_dim


def head_weights(kv_b_weight: torch.Tensor, heads: int, nope_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_UK [H, Dn, Dc], W_UV [H, Dv, Dc])``: views of kv_b_weight's rows per head (module docstring)."""
    per_head = kv_b_weight.view(heads, kv_b_weight.shape[0] // heads, kv_b_weight.shape[1])
    return per_head[:, :nope_dim], per_head[:, nope_dim:]


def check_absorbed_devices(q, latent, rope_key, kv_b_weight, indices, mask) -> None:
    """Raise TypeError/ValueError naming the first argument that is not a tensor on q's device
    (``runtime.union_attention.check_on_q_device``; what the op's fake kernel checks)."""
    check_on_q_device(q, (("latent", latent), ("rope_key", rope_key), ("kv_b_weight", kv_b_weight),
                          ("indices", indices)), (("mask", mask),))


def expand_latent(latent: torch.Tensor, rope_key: torch.Tensor, kv_b_weight: torch.Tensor, heads: int,
                  nope_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k [B, H, T, Dn+Dr], v [B, H, T, Dv])``: kv_b_proj's expansion of the latent, rope_key
    shared by every head (views with unit inner stride)."""
    b, t_len, _ = latent.shape
    kv = torch.nn.functional.linear(latent, kv_b_weight).view(b, t_len, heads, -1)
    rope = rope_key[:, :, None, :].expand(b, t_len, heads, rope_key.shape[2])
    k = torch.cat([kv[..., :nope_dim], rope], dim=-1)
    return k.transpose(1, 2), kv[..., nope_dim:].transpose(1, 2)


def check_absorbed_inputs(q, latent, rope_key, kv_b_weight, indices, mask, scale, masked_rows) -> None:
    """Raise TypeError/ValueError naming the argument when the inputs break the contract (no data
    is read)."""
    check_absorbed_devices(q, latent, rope_key, kv_b_weight, indices, mask)
    for name, t in (("q", q), ("latent", latent), ("rope_key", rope_key), ("kv_b_weight", kv_b_weight)):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be bfloat16, float16 or float32 (computed in float32), got {t.dtype}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    if (q.dim(), latent.dim(), rope_key.dim(), kv_b_weight.dim()) != (4, 3, 3, 2):
        raise ValueError("q, latent, rope_key, kv_b_weight must be [B, H, S, Dn+Dr], [B, T, Dc], [B, T, Dr], "
                         f"[H*(Dn+Dv), Dc], got shapes {tuple(q.shape)}, {tuple(latent.shape)}, "
                         f"{tuple(rope_key.shape)}, {tuple(kv_b_weight.shape)}")
    b, heads, _, q_dim = q.shape
    t_len, lat_dim = latent.shape[1], latent.shape[2]
    if latent.shape[0] != b:
        raise ValueError(f"latent must be [B={b}, T, Dc], got shape {tuple(latent.shape)}")
    if tuple(rope_key.shape[:2]) != (b, t_len) or not 1 <= rope_key.shape[2] < q_dim:
        raise ValueError(f"rope_key must be [B={b}, T={t_len}, Dr] with 1 <= Dr < q's last dim {q_dim}, "
                         f"got shape {tuple(rope_key.shape)}")
    nope_dim = q_dim - rope_key.shape[2]
    rows = kv_b_weight.shape[0]
    if heads == 0 or kv_b_weight.shape[1] != lat_dim or rows % heads != 0 or rows // heads <= nope_dim:
        raise ValueError(f"kv_b_weight must be [H*(Dn+Dv), Dc] = [{heads}*({nope_dim}+Dv), {lat_dim}] with Dv >= 1 "
                         f"(H from q, Dn = q's last dim - Dr, Dc from latent), got shape {tuple(kv_b_weight.shape)}")
    dv = rows // heads - nope_dim
    # The selection, the mask and the scalars follow runtime.union_attention's contract for the
    # expanded keys and values, stood in for by zero-size views.
    stand_in = q.new_empty(())
    check_sparse_attention_inputs(q, stand_in.expand(b, 1, t_len, q_dim), stand_in.expand(b, 1, t_len, dv),
                                  indices, mask, scale, masked_rows)


def checked_absorbed_inputs(q, latent, rope_key, kv_b_weight, indices, mask, scale, masked_rows) -> None:
    """``check_absorbed_inputs``, remembered per signature: the devices compared first, then the check
    on meta tensors of the same shapes and dtypes, once per distinct (shapes, dtypes, scale,
    masked_rows). A call repeated at one signature, as a decode loop makes it, costs a dictionary
    lookup; errors are never remembered. Arguments of other types take the full check."""
    tensors = (q, latent, rope_key, kv_b_weight, indices)
    if (not all(isinstance(t, torch.Tensor) for t in tensors) or not (mask is None or isinstance(mask, torch.Tensor))
            or type(scale) not in (int, float) or type(masked_rows) is not str):
        check_absorbed_inputs(q, latent, rope_key, kv_b_weight, indices, mask, scale, masked_rows)
        return
    check_absorbed_devices(q, latent, rope_key, kv_b_weight, indices, mask)
    checked_on_meta(check_absorbed_inputs, (*tensors, mask), (scale, masked_rows))


def reference_workspace_bytes(q, latent, rope_key, kv_b_weight, indices) -> int:
    """An upper bound of the bytes ``absorbed_sparse_attention`` allocates for checked inputs of
    these shapes: about 48 per index (selection, order, masks), the per-query rows in fp32 (q_lat,
    q_rope, o_lat and its "mean" fill, the output, lse) and a cast copy of the output, one chunk of
    gathered latent rows and its scores."""
    b, heads, s, _ = q.shape
    width, lat_dim = indices.shape[2], latent.shape[2]
    _, rope_dim, v_dim = absorbed_dims(q, rope_key, kv_b_weight)
    per_index = 48 * b * s * width
    rows = b * heads * s * (4 * (3 * lat_dim + rope_dim + v_dim + 1) + v_dim * q.element_size())
    gathered = max(GATHER_ELEMENTS, b * width * (lat_dim + rope_dim))
    chunk = max(1, GATHER_ELEMENTS // max(1, b * width * (lat_dim + rope_dim)))
    return per_index + rows + 8 * gathered + 24 * b * heads * min(chunk, s) * width


def absorbed_sparse_attention(q: torch.Tensor, latent: torch.Tensor, rope_key: torch.Tensor,
                              kv_b_weight: torch.Tensor, indices: torch.Tensor, mask: Optional[torch.Tensor] = None,
                              *, scale: float, masked_rows: str = "zero") -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of every query over its visible selected keys in the absorbed form, ``(o, lse)``
    (module docstring). A call whose ``reference_workspace_bytes`` exceed the device's memory is
    refused (ValueError) before any of it is allocated."""
    check_absorbed_inputs(q, latent, rope_key, kv_b_weight, indices, mask, scale, masked_rows)
    check_workspace(reference_workspace_bytes(q, latent, rope_key, kv_b_weight, indices), q.device,
                    "q, latent, indices", f"B={q.shape[0]}, H={q.shape[1]}, S={q.shape[2]}, K={indices.shape[2]}")
    b, heads, s, _ = q.shape
    t_len, lat_dim = latent.shape[1], latent.shape[2]
    nope_dim, rope_dim, v_dim = absorbed_dims(q, rope_key, kv_b_weight)
    w_uk, w_uv = (w.float() for w in head_weights(kv_b_weight, heads, nope_dim))
    o_lat = torch.zeros(b, heads, s, lat_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((b, heads, s), float("-inf"), dtype=torch.float32, device=q.device)
    width = indices.shape[2]
    if o_lat.numel() and t_len and width:
        q_lat = torch.einsum("bhsn,hnc->bhsc", q[..., :nope_dim].float(), w_uk)
        q_rope = q[..., nope_dim:].float()
        keys, visible = selected_keys(indices, t_len, mask)
        chunk = max(1, GATHER_ELEMENTS // max(1, b * width * (lat_dim + rope_dim)))
        for start in range(0, s, chunk):
            stop = min(start + chunk, s)
            flat = keys[:, start:stop].reshape(b, -1, 1)
            c = latent.gather(1, flat.expand(-1, -1, lat_dim)).float().view(b, stop - start, width, lat_dim)
            kr = rope_key.gather(1, flat.expand(-1, -1, rope_dim)).float().view(b, stop - start, width, rope_dim)
            scores = (torch.einsum("bhsc,bskc->bhsk", q_lat[:, :, start:stop], c)
                      + torch.einsum("bhsr,bskr->bhsk", q_rope[:, :, start:stop], kr)) * float(scale)
            scores = scores.masked_fill(~visible[:, None, start:stop], float("-inf"))
            row_lse = torch.logsumexp(scores, dim=-1)
            # A row without a visible key has lse = -inf: shifting it by 0 keeps every weight exp(-inf) = 0.
            shift = torch.where(row_lse == float("-inf"), torch.zeros_like(row_lse), row_lse)
            weights = torch.exp(scores - shift.unsqueeze(-1))
            o_lat[:, :, start:stop] = torch.einsum("bhsk,bskc->bhsc", weights, c)
            lse[:, :, start:stop] = row_lse
    if masked_rows == "mean" and t_len:
        mean = latent.float().mean(dim=1)[:, None, None, :]  # W_UV[h] is linear: mean of v = W_UV[h] mean(c)
        o_lat = torch.where((lse == float("-inf")).unsqueeze(-1), mean, o_lat)
    out = torch.einsum("bhsc,hvc->bhsv", o_lat, w_uv)
    return out.to(q.dtype).contiguous(), lse

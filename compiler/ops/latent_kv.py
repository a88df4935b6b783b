"""``torch.ops.pulsar_dosa.latent_cached_kv``: a model's MLA latent cache in a graph
(``compiler.latent_cache``).

``latent_cached_kv(Tensor latent, Tensor rope_key, Tensor kv_b_weight, int heads, int nope_dim)
-> (Tensor, Tensor)``: latent ``[B, T, Dc]``, rope_key ``[B, T, Dr]``, kv_b_weight
``[heads·(Dn+Dv), Dc]`` (kv_b_proj's weight) -> the keys ``[B, heads, T, Dn+Dr]`` and values
``[B, heads, T, Dv]`` those rows stand for (``runtime.absorbed_attention.expand_latent``, the
expansion transformers' MLA attention computes). It marks the cache read in the graph: the
sparse-attention pass hands ``latent``, ``rope_key`` and ``kv_b_weight`` to
``pulsar_dosa.absorbed_sparse_attention`` (``compiler.passes.matcher.latent_form``), and the expanded
keys and values are then never computed.

It checks its arguments first and names the one that is wrong; the fake kernel keeps symbolic sizes.
"""
from __future__ import annotations

import torch

from runtime.absorbed_attention import expand_latent


def _check(latent: torch.Tensor, rope_key: torch.Tensor, kv_b_weight: torch.Tensor, heads: int,
           nope_dim: int) -> None:
    if latent.dim() != 3 or not latent.is_floating_point():
        raise ValueError(f"latent: expected float rows [B, T, Dc], got {latent.dtype} {tuple(latent.shape)}")
    if rope_key.dim() != 3 or rope_key.shape[:2] != latent.shape[:2] or rope_key.dtype != latent.dtype:
        raise ValueError(f"rope_key: expected {latent.dtype} [B, T, Dr] = {list(latent.shape[:2])} + [Dr], got "
                         f"{rope_key.dtype} {tuple(rope_key.shape)}")
    if heads < 1 or nope_dim < 1:
        raise ValueError(f"heads, nope_dim: expected positive, got {heads}, {nope_dim}")
    rows = kv_b_weight.shape[0] if kv_b_weight.dim() == 2 else 0
    if kv_b_weight.dim() != 2 or kv_b_weight.shape[1] != latent.shape[2] or rows % heads or rows // heads <= nope_dim \
            or kv_b_weight.dtype != latent.dtype:
        raise ValueError(f"kv_b_weight: expected {latent.dtype} [heads·(Dn+Dv), Dc] = [{heads}·({nope_dim}+Dv), "
                         f"{latent.shape[2]}] with Dv >= 1, got {kv_b_weight.dtype} {tuple(kv_b_weight.shape)}")
    if rope_key.device != latent.device or kv_b_weight.device != latent.device:
        raise ValueError(f"rope_key, kv_b_weight: expected latent's device {latent.device}, got {rope_key.device}, "
                         f"{kv_b_weight.device}")


@torch.library.custom_op("pulsar_dosa::latent_cached_kv", mutates_args=(),
                         schema="(Tensor latent, Tensor rope_key, Tensor kv_b_weight, int heads, int nope_dim) "
                                "-> (Tensor, Tensor)")
def latent_cached_kv(latent: torch.Tensor, rope_key: torch.Tensor, kv_b_weight: torch.Tensor, heads: int,
                     nope_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The expanded keys and values of a latent cache (module docstring)."""
    _check(latent, rope_key, kv_b_weight, heads, nope_dim)
    k, v = expand_latent(latent, rope_key, kv_b_weight, heads, nope_dim)
    return k.contiguous(), v.contiguous()


@latent_cached_kv.register_fake
def _latent_cached_kv_fake(latent, rope_key, kv_b_weight, heads, nope_dim):
    _check(latent, rope_key, kv_b_weight, heads, nope_dim)
    b, t_len = latent.shape[:2]
    v_dim = kv_b_weight.shape[0] // heads - nope_dim
    return (latent.new_empty((b, heads, t_len, nope_dim + rope_key.shape[2])),
            latent.new_empty((b, heads, t_len, v_dim)))

"""A DSA causal LM's forward computed piecewise: attention over all or selected keys, the indexer
exposed (differentiable), for training and for capturing a trained model's indexer inputs.

Works on transformers' ``DeepseekV32ForCausalLM`` (and ``GlmMoeDsaForCausalLM``, same layout),
batch B, positions 0..S-1, no cache, dense MLP or MoE layers as the model has them, using the
model's own modules and rotary helpers. With ``select=None`` every query attends to all earlier
keys: the model's own forward when ``index_topk >= S``. With ``select`` (a [B, S, K] int64 index
per layer, -1 = nothing) each query attends to the selected earlier keys only: the model's own
forward with that selection (the indexer's top-K when ``select`` is ``indexer_topk``'s).
The indexer's scores follow SPEC A.1 with every scale folded into the weights:
``s[b,i,t] = Σ_h w[b,i,h] · relu(q[b,i,h] · k[b,t])`` (``IndexerQKW``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

__all__ = ["IndexerQKW", "LayerCapture", "causal_index_scores", "dsa_forward", "indexer_qkw", "indexer_topk",
           "selection_mask"]


@dataclass
class IndexerQKW:
    """One layer's indexer inputs: q [B,R,H,D] and weights [B,R,H] of R query rows at positions
    ``first_row`` .. ``first_row + R - 1``, keys k [B,T,D] at positions 0 .. T-1 (every scale folded
    into the fp32 weights)."""

    q: torch.Tensor
    k: torch.Tensor
    weights: torch.Tensor
    first_row: int = 0


@dataclass
class LayerCapture:
    """What ``dsa_forward`` hands ``on_layer`` for layer ``index``: the attention input ``x``
    [B,S,hidden] (after the input norm), ``q_resid`` [B,S,q_lora], the main attention's query and
    key [B,Hm,S,dq] (rotary applied) and its scaling, and the rotary ``cos``/``sin``."""

    index: int
    attention: torch.nn.Module
    x: torch.Tensor
    q_resid: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor
    scaling: float
    cos: torch.Tensor
    sin: torch.Tensor


def _modeling(module: torch.nn.Module):
    return importlib.import_module(type(module).__module__)


def indexer_qkw(indexer: torch.nn.Module, x: torch.Tensor, q_resid: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, rows: Optional[slice] = None) -> IndexerQKW:
    """The indexer's q and folded weights of query ``rows`` (default all) and its keys for all of
    ``x`` [B,S,hidden] (differentiable; the transformers indexer computes the same under
    ``no_grad``). ``cos``/``sin``: the model's rotary tables for positions 0..S-1."""
    rows = slice(0, x.shape[1]) if rows is None else rows
    B, S, _ = x.shape
    H, D, rope = indexer.n_heads, indexer.head_dim, indexer.qk_rope_head_dim
    R = rows.stop - rows.start
    q = indexer.wq_b(q_resid[:, rows]).view(B, R, H, D)
    k = indexer.k_norm(indexer.wk(x)).unsqueeze(2)
    q_rot, q_pass = torch.split(q, [rope, D - rope], dim=-1)
    k_rot, k_pass = torch.split(k, [rope, D - rope], dim=-1)
    rotate = _modeling(indexer).apply_rotary_pos_emb
    q_rot, _ = rotate(q_rot, q_rot, cos[:, rows], sin[:, rows], unsqueeze_dim=2)
    _, k_rot = rotate(k_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    xr = x[:, rows].to(indexer.weights_proj.weight.dtype)
    w = indexer.weights_proj(xr).float() * (H ** -0.5 * indexer.softmax_scale)
    return IndexerQKW(q, k, w, rows.start)


def causal_index_scores(qkw: IndexerQKW, rows: Optional[slice] = None,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Index scores [B, R, T] of ``qkw``'s query rows ``rows`` (local, default all) against all
    keys, ``-inf`` at keys after the query's position; products in ``dtype``, head sum in fp32."""
    rows = slice(0, qkw.q.shape[1]) if rows is None else rows
    s = F.relu(torch.einsum("bshd,btd->bsht", qkw.q[:, rows].to(dtype), qkw.k.to(dtype)))
    scores = torch.einsum("bsh,bsht->bst", qkw.weights[:, rows].to(dtype), s).float()
    pos = qkw.first_row + torch.arange(rows.start, rows.stop, device=scores.device)
    future = torch.arange(qkw.k.shape[1], device=scores.device)[None, :] > pos[:, None]
    return scores.masked_fill(future, float("-inf"))


@torch.no_grad()
def indexer_topk(qkw: IndexerQKW, topk: int, *, chunk: int = 1024, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Top-``topk`` keys of every query row [B, R, min(topk, T)] int64 (-1 where fewer keys are
    visible), scored in chunks of ``chunk`` rows (ties: ``torch.topk``'s order)."""
    B, R = qkw.q.shape[:2]
    kk = min(topk, qkw.k.shape[1])
    out = torch.empty(B, R, kk, dtype=torch.int64, device=qkw.q.device)
    for start in range(0, R, chunk):
        rows = slice(start, min(start + chunk, R))
        values, idx = causal_index_scores(qkw, rows, dtype).topk(kk, dim=-1)
        out[:, rows] = idx.masked_fill(values == float("-inf"), -1)
    return out


def selection_mask(select: torch.Tensor, T: int) -> torch.Tensor:
    """Bool [B, 1, S, T] (True = attend) from indices [B, S, K] (-1 = nothing), causal."""
    B, S, _ = select.shape
    mask = torch.zeros(B, S, T + 1, dtype=torch.bool, device=select.device)
    mask.scatter_(-1, torch.where(select < 0, T, select), True)
    causal = torch.ones(S, T, dtype=torch.bool, device=select.device).tril(T - S)
    return (mask[..., :T] & causal).unsqueeze(1)


def _attention(attn: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, index: int,
               select, on_layer) -> torch.Tensor:
    B, S, _ = x.shape
    modeling = _modeling(attn)
    q_resid = attn.q_a_layernorm(attn.q_a_proj(x))
    q = attn.q_b_proj(q_resid).view(B, S, -1, attn.qk_head_dim).transpose(1, 2)
    q_pass, q_rot = torch.split(q, [attn.qk_nope_head_dim, attn.qk_rope_head_dim], dim=-1)
    kv_pass, k_rot = torch.split(attn.kv_a_proj_with_mqa(x), [attn.kv_lora_rank, attn.qk_rope_head_dim], dim=-1)
    k_pass = attn.kv_a_layernorm(kv_pass).view(B, 1, S, attn.kv_lora_rank)
    q_rot, k_rot = modeling.apply_rotary_pos_emb_interleave(q_rot, k_rot.view(B, 1, S, -1), cos, sin)
    query = torch.cat((q_pass, q_rot), dim=-1)
    key, value = attn.expand_kv(k_pass, k_rot)
    capture = LayerCapture(index, attn, x, q_resid, query, key, attn.scaling, cos, sin)
    if on_layer is not None:
        on_layer(capture)
    chosen = None if select is None else select(index, capture)
    if chosen is None:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=attn.scaling)
    else:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=selection_mask(chosen, S),
                                             scale=attn.scaling)
    return attn.o_proj(out.transpose(1, 2).reshape(B, S, -1))


def dsa_forward(model: torch.nn.Module, input_ids: torch.Tensor, *,
                select: Optional[Callable[[int, LayerCapture], Optional[torch.Tensor]]] = None,
                on_layer: Optional[Callable[[LayerCapture], None]] = None,
                hidden_only: bool = False) -> torch.Tensor:
    """Logits [B, S, V] (or the final hidden states with ``hidden_only``) of a DSA causal LM on
    ``input_ids`` [B, S]. ``on_layer`` sees every layer's ``LayerCapture`` before its attention;
    ``select(layer, capture)`` then returns that layer's selection [B, S, K] (None or no
    ``select``: all earlier keys)."""
    inner = model.model
    h = inner.embed_tokens(input_ids)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    cos, sin = inner.rotary_emb(h, positions)
    for index, layer in enumerate(inner.layers):
        h = h + _attention(layer.self_attn, layer.input_layernorm(h), cos, sin, index, select, on_layer)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    h = inner.norm(h)
    return h if hidden_only else model.lm_head(h)

"""``torch.ops.pulsar_dosa.certified_topk``: the certified exact top-K of a DSA indexer as a torch op.

Schema: ``certified_topk(Tensor q, Tensor k, Tensor weights, SymInt topk, Tensor? mask=None,
str layer="", int r=-1, int min_keys=-1, str path="auto", bool record_stats=True) -> (Tensor, Tensor)``

q [B,S,H,D], k [B,T,D], weights [B,S,H] (signed, every scale folded in), mask None or [B,S,T]
(bool: True = visible; or additive float, -inf = hidden). Returns (values [B,S,kk] float32,
indices [B,S,kk] int64), kk = min(topk, T): exactly ``runtime.dense_scorer.dense_topk`` (the scores
sum_h w_h relu(q_h.k) + mask, sorted descending, ties by the lower key index; a row with fewer
than topk visible keys lists its visible keys first, then hidden ones with value -inf in index
order). ``layer`` is the module path the statistics and the runtime guard are filed under;
``r`` = -1 takes the runtime's per-query rule; ``path`` ("auto", "dense" or "certified") and
``min_keys`` (the crossover key length under "auto"; -1: the cost model's) are resolved per call by
``compiler.path_choice.call_path``.

The default kernel runs ``runtime.certified_topk.certified_topk`` (CPU and any device without its
own kernel); CUDA runs the Triton pipeline of ``compiler/lowering/certified_topk_triton.py``.
The fake kernel supports symbolic sizes and adds no guards.
"""
from __future__ import annotations

import dataclasses

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from compiler.lowering.stats import TOPK_STATS
from compiler.path_choice import call_path, check_choice
from runtime.certified_topk import CertifiedTopkConfig, certified_topk as reference_certified_topk
from runtime.indexer_inputs import check_indexer_inputs


def topk_config(r: int, path: str) -> CertifiedTopkConfig:
    """The runtime configuration for the op's ``r`` (-1 = the runtime's rule) and a decided path."""
    if r < -1:
        raise ValueError(f"r: expected -1 (default) or a positive int, got {r}")
    return dataclasses.replace(CertifiedTopkConfig(), path=path, **({} if r == -1 else {"r": r}))


def _decide(q, k, weights, topk, mask, layer, r, min_keys, path):
    """(CertifiedTopkConfig, CallTicket) of one call: arguments checked (shapes on meta copies, no
    data read), path chosen (path_choice)."""
    check_indexer_inputs(*(x.to("meta") if isinstance(x, torch.Tensor) else x for x in (q, k, weights, topk, mask)))
    check_choice("path", path)
    for name, value in (("r", r), ("min_keys", min_keys)):
        if value < -1:
            raise ValueError(f"{name}: expected -1 (default) or a non-negative int, got {value}")
    B, S, H, D = q.shape
    T = k.shape[1]
    ticket = call_path(layer=layer, device=q.device, choice=path, crossover=None if min_keys == -1 else min_keys,
                       B=B, S=S, T=T, H=H, D=D, kk=min(topk, T))
    return topk_config(r, ticket.path), ticket


@torch.library.custom_op("pulsar_dosa::certified_topk", mutates_args=())
def certified_topk(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    topk: int,
    mask: torch.Tensor | None = None,
    layer: str = "",
    r: int = -1,
    min_keys: int = -1,
    path: str = "auto",
    record_stats: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    config, ticket = _decide(q, k, weights, topk, mask, layer, r, min_keys, path)
    stats = TOPK_STATS.for_layer(layer, q.device) if record_stats else None
    with ticket.timed(stats) as call_stats:
        return reference_certified_topk(q, k, weights, topk, mask, config=config, stats=call_stats)


@certified_topk.register_kernel("cuda")
def _certified_topk_cuda(q, k, weights, topk, mask=None, layer="", r=-1, min_keys=-1, path="auto",
                         record_stats=True):
    from compiler.lowering.certified_topk_triton import certified_topk_cuda

    config, ticket = _decide(q, k, weights, topk, mask, layer, r, min_keys, path)
    stats = TOPK_STATS.for_layer(layer, q.device) if record_stats else None
    with ticket.timed(stats) as call_stats:
        return certified_topk_cuda(q, k, weights, topk, mask, config=config, stats=call_stats)


@certified_topk.register_fake
def _certified_topk_fake(q, k, weights, topk, mask=None, layer="", r=-1, min_keys=-1, path="auto",
                         record_stats=True):
    if q.dim() != 4 or k.dim() != 3 or weights.dim() != 3:
        raise ValueError(
            f"q, k, weights: expected ranks 4 [B,S,H,D], 3 [B,T,D], 3 [B,S,H], got {q.dim()}, {k.dim()}, {weights.dim()}"
        )
    B, S = q.shape[0], q.shape[1]
    T = k.shape[1]
    kk = topk if statically_known_true(topk <= T) else torch.sym_min(topk, T)
    values = q.new_empty((B, S, kk), dtype=torch.float32)
    indices = q.new_empty((B, S, kk), dtype=torch.int64)
    return values, indices

"""Context-parallel certified top-K: keys sharded over ranks, the exact global top-K on every rank.

Each rank of a process group holds a shard of the keys, ``k_shard`` [B,T_r,D], the mask columns of
those keys, ``mask_shard`` [B,S,T_r] (or None), and their global indices, ``key_offset``: an int, the
first index of a contiguous shard, or an integer tensor [T_r], strictly increasing (an interleaved
shard: r, r + R, r + 2R, ...). The shards partition the T keys; q, weights, topk, config and
share_threshold are the same on every rank (not checked: a rank that differs gets a wrong result
or a failed collective). Every rank returns exactly ``dense_topk`` of the unsharded call: values
[B,S,kk] float32 and global indices [B,S,kk] int64, kk = min(topk, T).

One call, two collectives (SPEC A.9):

1. Shared threshold: the shard's top-K (``runtime.certified_topk``, or the device's kernel passed
   as ``kernel``; dense unless ``config`` asks for the certified path) is called with ``shared_bound``: its seed thresholds (a score that
   topk keys of the shard reach, per query; -inf where it has none) are all-reduced (max) over the
   ranks before its screen, one [B,S] float32. The global kk-th score is at least every rank's,
   hence at least the max, so every rank prunes against the max (strictly below it) and stays
   exact; a rank whose kernel certifies nothing (dense path, empty shard) sends -inf.
2. Exchange: each rank's rows (its top min(topk, T_r) keys; a short row: its keys scoring >= the
   shared bound) are written as order codes over global indices (``runtime.order_codes``), padded
   to topk per query with ``PADDING``, and all-gathered with T_r: B*S*topk + 1 int64 per rank.

Merge: the kk largest of the R*topk codes of each query, decoded. Exactness: the shards' indices
are increasing, so THE ORDER over a shard's local indices is THE ORDER over its global ones. A key
of the global top-kk has fewer than kk keys before it, so fewer than kk of its own shard: it is in
its shard's top min(topk, T_r); in a short row it is listed too, since it scores at least the
global kk-th score, which is >= the shared bound. The codes are unique (global indices), so the kk
largest are the global top-kk in THE ORDER; their values come from the shard's kernel, which
scores a key bitwise as the unsharded call does. Every NaN value comes back as the NaN of
``runtime.order_codes`` (THE ORDER does not tell NaNs apart).

Arguments are checked before any collective (errors name the argument; a ``topk`` whose exchange,
``exchange_bytes``, cannot fit in the device's memory is refused: unlike the single-device op, a
rank cannot cap topk at T, which it learns only in the exchange); a rank that raises leaves
the others waiting in their first collective until the group's timeout. Host synchronisation:
none besides the kernel's; one read of a key_offset tensor that is not on the CPU (its check), and
one of the gathered shard sizes when this shard has fewer than topk keys (kk then depends on T).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from runtime.certified_topk import CertifiedTopkConfig, SharedBound, TopkStats, certified_topk
from runtime.indexer_inputs import checked_kk
from runtime.order_codes import PADDING, decode_order_codes, encode_order_codes
from runtime.process_group import checked_world_size
from runtime.workspace import check_workspace

__all__ = ["KEY_LIMIT", "ShardKernel", "certified_topk_cp", "exchange_bytes", "merge_candidates", "shard_candidates"]

KEY_LIMIT = 1 << 32
"""Global key indices are below KEY_LIMIT - 1 (the order codes' limit; KEY_LIMIT - 1 is ``PADDING``'s key)."""

ShardKernel = Callable[..., tuple[torch.Tensor, torch.Tensor]]
"""kernel(q, k, weights, topk, mask, *, config, stats, shared_bound) -> (values, indices): the
contract of ``runtime.certified_topk.certified_topk`` (short rows included)."""

_RENAMED = {"k": "k_shard", "mask": "mask_shard"}


def _check_shard(q, k_shard, weights, topk, mask_shard) -> None:
    """``check_indexer_inputs`` of the shard's call (no data read), its errors naming k_shard and mask_shard."""
    try:
        checked_kk(q, k_shard, weights, topk, mask_shard)
    except (TypeError, ValueError) as error:
        name, _, rest = str(error).partition(": ")
        if name in _RENAMED:
            raise type(error)(f"{_RENAMED[name]}: {rest}") from None
        raise


def _global_keys(key_offset, T_r: int, device: torch.device) -> torch.Tensor | int:
    """The shard's global key indices: an int offset (contiguous shard) or an int64 tensor [T_r] on
    ``device``, checked (ValueError/TypeError naming key_offset)."""
    if isinstance(key_offset, bool) or not isinstance(key_offset, (int, torch.Tensor)):
        raise TypeError(f"key_offset: expected an int or an integer tensor [T_r], got {type(key_offset).__name__}")
    if isinstance(key_offset, int):
        if not 0 <= key_offset <= KEY_LIMIT - 1 - T_r:
            raise ValueError(f"key_offset: expected an int in [0, {KEY_LIMIT - 1 - T_r}] (global indices below "
                             f"{KEY_LIMIT - 1} for T_r={T_r} keys), got {key_offset}")
        return key_offset
    if key_offset.dtype not in (torch.int32, torch.int64) or tuple(key_offset.shape) != (T_r,):
        raise ValueError(f"key_offset: expected an int32/int64 tensor of shape [T_r] = [{T_r}], got "
                         f"{key_offset.dtype} {tuple(key_offset.shape)}")
    if key_offset.device not in (device, torch.device("cpu")):
        raise ValueError(f"key_offset: expected a tensor on the CPU or on {device} (the device of q), "
                         f"got {key_offset.device}")
    keys = key_offset.to(torch.int64)
    if T_r and not bool((keys[0] >= 0) & (keys[-1] < KEY_LIMIT - 1) & (keys[1:] > keys[:-1]).all()):
        raise ValueError(f"key_offset: expected strictly increasing global indices in [0, {KEY_LIMIT - 1})")
    return keys.to(device, non_blocking=True)


def exchange_bytes(B: int, S: int, topk: int, R: int) -> int:
    """An upper bound of the bytes a rank allocates for the exchange and the merge of ``R`` ranks'
    candidates padded to ``topk`` per query: its codes and what it sends (16 per candidate), what
    it gathers and pools (16 per candidate of every rank), the merge's selection and outputs."""
    return B * S * topk * (44 + 16 * R)


def _all_reduce_max(bound: torch.Tensor, group) -> torch.Tensor:
    out = bound.to(torch.float32).contiguous().clone()
    dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
    return out


DEFAULT_SHARD_CONFIG = CertifiedTopkConfig(path="dense")
"""The shards' config when the caller gives none: dense, as the op keeps layers without a plan.
Where the indexer does not prune, a certified shard costs more than a dense one
(benchmarks/results/cp_topk_h200.md), so pruning is opted into with a config."""


def shard_candidates(q, k_shard, weights, topk: int, mask_shard, keys: torch.Tensor | int, *,
                     kernel: ShardKernel, config: CertifiedTopkConfig, stats: TopkStats | None,
                     shared_bound: SharedBound | None) -> torch.Tensor:
    """The shard's candidates: int64 order codes over global indices [B,S,topk] (``PADDING`` past
    its rows), from ``kernel`` with ``shared_bound`` (called at most once). Arguments as checked
    by ``certified_topk_cp`` (``keys``: ``_global_keys``)."""
    B, S = q.shape[:2]
    T_r = k_shard.shape[1]
    codes = torch.full((B, S, topk), PADDING, dtype=torch.int64, device=q.device)
    if B * S == 0 or T_r == 0:
        return codes
    values, local = kernel(q, k_shard, weights, topk, mask_shard, config=config, stats=stats,
                           shared_bound=shared_bound)
    listed = local >= 0
    at = local.clamp_min(0)
    if mask_shard is None:
        visible = listed
    else:
        entry = mask_shard.gather(-1, at)
        visible = listed & (entry if entry.dtype == torch.bool else entry != float("-inf"))
    global_keys = at + keys if isinstance(keys, int) else keys[at]
    codes[..., :local.shape[-1]] = torch.where(listed, encode_order_codes(values, visible, global_keys, KEY_LIMIT),
                                               PADDING)
    return codes


def merge_candidates(codes: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [B,S,kk] float32, global indices [B,S,kk] int64): the kk largest of the ranks'
    candidate codes ``codes`` [R,B,S,topk], decoded (module docstring, "Merge")."""
    R, B, S, topk = codes.shape
    pooled = codes.permute(1, 2, 0, 3).reshape(B, S, R * topk)
    return decode_order_codes(pooled.topk(kk, dim=-1).values, KEY_LIMIT)


def certified_topk_cp(
    q: torch.Tensor,
    k_shard: torch.Tensor,
    weights: torch.Tensor,
    topk: int,
    mask_shard: torch.Tensor | None = None,
    *,
    key_offset: int | torch.Tensor,
    group: dist.ProcessGroup | None = None,
    config: CertifiedTopkConfig | None = None,
    stats: TopkStats | None = None,
    share_threshold: bool = True,
    kernel: ShardKernel | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact global top-K of keys sharded over the ranks of ``group`` (module docstring).

    q [B,S,H,D], weights [B,S,H] (replicated), k_shard [B,T_r,D], mask_shard None or [B,S,T_r]
    (bool or additive), topk a positive int: as ``runtime.indexer_inputs`` (T_r = 0 allowed).
    key_offset: int or integer tensor [T_r] (on the CPU or q's device). config: the shard kernel's
    (``CertifiedTopkConfig``; None: ``DEFAULT_SHARD_CONFIG``, dense shards; the certified path, and
    with it the shared threshold, is asked for by a config, e.g. a layer's plan). stats: the shard
    kernel's counters.
    share_threshold: False prunes against each rank's own thresholds (no all-reduce).
    kernel: the shard's top-K (None: ``runtime.certified_topk.certified_topk``).
    Returns (values [B,S,kk] float32, indices [B,S,kk] int64), kk = min(topk, T).
    """
    _check_shard(q, k_shard, weights, topk, mask_shard)
    if q.is_meta:
        raise ValueError("q: expected tensors with values, got the meta device (the ranks exchange scores and "
                         "indices)")
    keys = _global_keys(key_offset, k_shard.shape[1], q.device)
    config = DEFAULT_SHARD_CONFIG if config is None else config
    if not isinstance(config, CertifiedTopkConfig):
        raise TypeError(f"config: expected a CertifiedTopkConfig or None, got {type(config).__name__}")
    if stats is not None and not isinstance(stats, TopkStats):
        raise TypeError(f"stats: expected a TopkStats or None, got {type(stats).__name__}")
    if not isinstance(share_threshold, bool):
        raise TypeError(f"share_threshold: expected a bool, got {type(share_threshold).__name__}")
    if kernel is not None and not callable(kernel):
        raise TypeError(f"kernel: expected a callable or None, got {type(kernel).__name__}")
    R = checked_world_size(group)

    B, S = q.shape[:2]
    T_r = k_shard.shape[1]
    check_workspace(exchange_bytes(B, S, topk, R), q.device, "topk", f"B={B}, S={S}, topk={topk}, R={R} ranks",
                    "every rank pads its candidates to topk per query: pass topk <= T, the keys of all shards")
    shared = []

    def share(bound: torch.Tensor) -> torch.Tensor:
        shared.append(_all_reduce_max(bound, group))
        return shared[-1]

    codes = shard_candidates(q, k_shard, weights, topk, mask_shard, keys, kernel=kernel or certified_topk,
                             config=config, stats=stats, shared_bound=share if share_threshold else None)
    if share_threshold and not shared:
        share(torch.full((B, S), float("-inf"), device=q.device))
    sent = torch.cat((codes.view(-1), torch.full((1,), T_r, dtype=torch.int64, device=q.device)))
    gathered = torch.empty(R * sent.numel(), dtype=torch.int64, device=q.device)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(gathered, sent, group=group)
    gathered = gathered.view(R, sent.numel())
    kk = topk if T_r >= topk else min(topk, int(gathered[:, -1].sum()))
    return merge_candidates(gathered[:, :-1].view(R, B, S, topk), kk)

"""How much neighbouring queries' selections overlap: the quantity the union form's time follows.

The union form (``union_attention``) walks, for every tile of ``tile`` consecutive queries, the
union of their visible selected keys; its work is proportional to the mean union size. The
absorbed form's does not depend on it. ``union_ratio`` measures that mean on a sample of tiles,
relative to the selection width K: about 1 when a tile's queries select the same keys (a shared
window), up to ``tile`` when they share none.

Exact on the sampled tiles (the distinct in-range keys that the mask shows, per tile, as
``_build_union_kernel`` counts them); an estimate of the mean over all tiles. Plain torch (one
scatter of ``SAMPLED_TILES · tile · K`` indices into a bitmap of ``SAMPLED_TILES · (T + 1)`` bytes),
on any device.
"""
from __future__ import annotations

from typing import Optional

import torch

SAMPLED_TILES = 32
"""Tiles measured per call, evenly spaced over the batch's tiles (all of them when fewer)."""


def sampled_tiles(batch: int, tiles: int, device: torch.device, samples: Optional[int] = None) -> torch.Tensor:
    """[n] int64 flat ids (batch-major) of the tiles ``union_ratio`` measures: ``samples`` of them
    (None: SAMPLED_TILES), evenly spaced, or all when there are fewer."""
    total = batch * tiles
    count = min(total, SAMPLED_TILES if samples is None else samples)
    return (torch.arange(count, device=device, dtype=torch.int64) * total) // count


def union_ratio(indices: torch.Tensor, mask: Optional[torch.Tensor], seq_k: int, tile: int,
                samples: Optional[int] = None) -> torch.Tensor:
    """0-dim fp32 tensor on indices' device: the mean over the sampled tiles of the number of
    distinct visible keys in the tile's rows of ``indices`` ``[B, S, K]``, divided by K.

    A key is visible when it is in ``[0, seq_k)`` and ``mask`` (None or bool broadcastable to
    ``[B, 1, S, seq_k]``) shows it to the row that selected it. The last tile of a batch row may
    hold fewer than ``tile`` rows. ``samples`` as in ``sampled_tiles``. No host synchronisation.
    """
    b, s, width = indices.shape
    if width == 0 or s == 0 or b == 0 or seq_k == 0:
        return torch.zeros((), dtype=torch.float32, device=indices.device)
    tiles = -(-s // tile)
    flat = sampled_tiles(b, tiles, indices.device, samples)
    batch, first = flat // tiles, (flat % tiles) * tile
    rows = first[:, None] + torch.arange(tile, device=indices.device)[None, :]  # [n, tile]
    row_ok = rows < s
    rows = rows.clamp(max=s - 1)
    keys = indices[batch[:, None], rows].long()  # [n, tile, K]
    ok = row_ok[:, :, None] & (keys >= 0) & (keys < seq_k)
    if mask is not None:
        shown = mask.expand(b, 1, s, seq_k)[:, 0]
        ok &= shown[batch[:, None, None], rows[:, :, None], keys.clamp(0, seq_k - 1)]
    keys = torch.where(ok, keys, seq_k).flatten(1)
    seen = torch.zeros((keys.shape[0], seq_k + 1), dtype=torch.uint8, device=indices.device)
    seen.scatter_(1, keys, 1)  # column seq_k collects every key that is not visible
    return seen[:, :seq_k].sum(dim=1, dtype=torch.int64).float().mean() / width

"""Seed sets of the certified top-K: >= kk distinct visible keys per query (SPEC A.2, A.8).

Seed sets of exactly kk keys are useless (tau is then their minimum score); good prefill seeds
are witnesses. The choice made here:

* every ``anchor_stride``-th query of a batch row (s = 0, stride, 2 stride, ...) is an anchor,
  answered by dense scoring; its exact top-kk keys are witnesses for the queries after it up to
  the next anchor (neighbouring queries share most of their top keys);
* a non-anchor query's seeds = its anchor's top-kk keys that are visible to it
  U the first ``sink`` visible keys U the last ``window`` visible keys;
* while that is still fewer than kk keys, further visible keys are added, most recent first.

Every seed is a visible key and the set is a boolean mask, so seeds are distinct; a query with
more than kk visible keys always gets at least kk seeds. Which keys are seeds only affects speed,
never the result.
"""
from __future__ import annotations

import torch

__all__ = ["anchor_rows", "seed_mask"]


def anchor_rows(S: int, anchor_stride: int, device: torch.device) -> torch.Tensor:
    """The anchor query position of every query position: int64 [S], s - s % anchor_stride."""
    s = torch.arange(S, device=device)
    return s - s % anchor_stride


def _rank_from_end(mask: torch.Tensor) -> torch.Tensor:
    """1-based rank of each True entry counted from the last key (0 where False)."""
    return torch.where(mask, mask.flip(-1).cumsum(-1).flip(-1), 0)


def seed_mask(
    visible: torch.Tensor,
    witnesses: torch.Tensor,
    kk: int,
    sink: int,
    window: int,
) -> torch.Tensor:
    """Seed set of every query as a mask.

    visible [..., T] bool; witnesses [..., W] int64 key indices (the anchor's top-kk; entries
    that are not visible to the query are ignored). Returns bool [..., T]: a subset of visible,
    with at least min(kk, number of visible keys) keys per query.
    """
    seeds = torch.zeros_like(visible).scatter(-1, witnesses, True) & visible
    rank = torch.where(visible, visible.cumsum(-1), 0)
    seeds |= visible & (rank <= sink)
    seeds |= visible & (_rank_from_end(visible) <= window)
    missing = (kk - seeds.sum(-1, keepdim=True)).clamp_min(0)
    spare = visible & ~seeds
    seeds |= spare & (_rank_from_end(spare) <= missing)
    return seeds

"""Seed sets of the certified top-K: >= kk distinct visible keys per query (SPEC A.2, A.8).

Seed sets of exactly kk keys are useless (tau is then their minimum score); good prefill seeds
are witnesses. The choice made here:

* every ``anchor_stride``-th query of a batch row (s = 0, stride, 2 stride, ...) is an anchor,
  answered by dense scoring; its exact top-kk keys are witnesses for the queries after it up to
  the next anchor (neighbouring queries share most of their top keys);
* a non-anchor query's seeds = its anchor's top-kk keys that are visible to it
  U the first ``sink`` visible keys U the last ``window`` visible keys;
* while that is still fewer than kk keys, further visible keys are added, most recent first.

Witnesses, sink and window are drawn from the *preferred* keys (by default the visible ones):
``certified_topk`` leaves out keys whose additive bias is below ``SOFT_HIDDEN_BIAS``, since
transformers' eager masks hide keys with float32 min instead of -inf; such keys stay visible
for exactness but make poor witnesses. The fill step draws from all visible keys.

Every seed is a visible key and the set is a boolean mask, so seeds are distinct; a query with
more than kk visible keys always gets at least kk seeds. Which keys are seeds only affects speed,
never the result.
"""
from __future__ import annotations

import torch

__all__ = ["SOFT_HIDDEN_BIAS", "anchor_rows", "seed_mask"]

SOFT_HIDDEN_BIAS = -1e30
"""Additive-mask values below this mark keys that masks hide with a finite value (float32 min)."""


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
    preferred: torch.Tensor | None = None,
) -> torch.Tensor:
    """Seed set of every query as a mask.

    visible [..., T] bool; witnesses [..., W] int64 key indices (the anchor's top-kk; entries
    that are not preferred for the query are ignored); preferred [..., T] bool, a subset of
    visible (None: visible). Returns bool [..., T]: a subset of visible, with at least
    min(kk, number of visible keys) keys per query.
    """
    pool = visible if preferred is None else preferred & visible
    seeds = torch.zeros_like(visible).scatter(-1, witnesses, True) & pool
    rank = torch.where(pool, pool.cumsum(-1), 0)
    seeds |= pool & (rank <= sink)
    seeds |= pool & (_rank_from_end(pool) <= window)
    missing = (kk - seeds.sum(-1, keepdim=True)).clamp_min(0)
    spare = visible & ~seeds
    seeds |= spare & (_rank_from_end(spare) <= missing)
    return seeds

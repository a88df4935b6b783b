"""Seed sets and the own threshold of the certified top-K (SPEC A.2, A.8, C.9).

``anchor_rows(S, anchor_stride, device)``: each query's anchor (every stride-th query, scored densely).
``seed_mask(visible, witnesses, kk, sink, window, preferred=None)``: per query, its anchor's top-kk
keys it can see ∪ the first ``sink`` ∪ the last ``window`` visible keys (from the preferred keys:
bias above ``SOFT_HIDDEN_BIAS``), filled with the most recent visible keys while fewer than kk: at
least kk distinct visible keys whenever the query has more than kk. ``sample_keys``,
``sample_size`` and ``sample_rank`` give each query's strided key sample and the rank of its own
threshold estimate (``defaults.SAMPLE_SIGMAS`` binomial deviations low). Which keys are seeds and where the
threshold lies change speed only, never the result."""
from __future__ import annotations

import math

import torch

from runtime import defaults

__all__ = ["SOFT_HIDDEN_BIAS", "anchor_rows", "sample_keys", "sample_rank", "sample_size", "seed_mask",
           "takes_witnesses"]

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


def sample_size(T: int, requested: int | None = None) -> int:
    """M, the strided sample per query: ``requested`` (0 = no own threshold) or the default
    (``defaults.SAMPLE_PER_KEYS``); never more than T."""
    if requested is None:
        requested = (0 if T < 8 * defaults.SAMPLE_MIN else
                     max(defaults.SAMPLE_MIN, min(defaults.SAMPLE_MAX, T // defaults.SAMPLE_PER_KEYS)))
    return min(requested, T)


def takes_witnesses(witnesses: bool, M: int, sharded: bool) -> bool:
    """Whether a call has anchors whose top keys seed their groups: when ``witnesses`` asks for them,
    when it has no strided sample (``M`` = 0: no other threshold), and when its keys are sharded
    (``sharded``: the ranks share a bound proven by at least kk seed scores, SPEC A.9)."""
    return witnesses or M == 0 or sharded


def sample_rank(kk: int, M: int, T: int, sigmas: float) -> int:
    """Rank (1-based) of the sampled score taken as theta: ceil(mu + sigmas sqrt(mu)) + 1 with
    mu = kk M / T (expected sampled keys above the kk-th score of T keys), clipped to [1, M]."""
    mu = kk * M / T
    return max(1, min(M, math.ceil(mu + sigmas * math.sqrt(mu)) + 1))


def sample_keys(groups: int, M: int, T: int, device: torch.device) -> torch.Tensor:
    """The sampled keys of each anchor group: int64 [groups, M], j * stride + offset_g with
    stride = T // M and offset_g = (7919 g) mod stride (distinct keys, all < T)."""
    stride = T // M
    offset = (torch.arange(groups, device=device) * 7919) % stride
    return torch.arange(M, device=device)[None, :] * stride + offset[:, None]

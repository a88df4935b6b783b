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

Own threshold (for a query whose neighbours do not share its top keys): every query also scores
a strided sample of M keys (``sample_keys``; one sample per anchor group) and takes theta, the
``sample_rank``-th best sampled score. Of n visible keys, a strided sample of M holds about
kk * M / n keys at or above the true kk-th score (binomial); the rank is that mean plus
``sigmas`` standard deviations, so theta is an estimate of the kk-th score that errs low. The
threshold used is max(seed threshold, theta). It need not be a lower bound of the kk-th score:
a query is answered from its candidates only when at least kk keys reach the threshold, else
densely (the callers check this after the fact), so a bad estimate costs speed, never exactness.
"""
from __future__ import annotations

import math

import torch

__all__ = ["SOFT_HIDDEN_BIAS", "anchor_rows", "sample_keys", "sample_rank", "sample_size", "seed_mask"]

SAMPLE_MIN, SAMPLE_MAX, SAMPLE_PER_KEYS = 1024, 4096, 128
"""Default sample size: T // SAMPLE_PER_KEYS keys clamped to [SAMPLE_MIN, SAMPLE_MAX] (1.6% of the
keys at T = 65536, 0.8% at T = 131072 and 524288), none below T = 8 * SAMPLE_MIN (where the sample
would cost more than 1/8 of dense scoring)."""
SAMPLE_SIGMAS = 4.0
"""Default safety of the sample rank, in binomial standard deviations."""

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
    (``SAMPLE_MIN``); never more than T."""
    if requested is None:
        requested = 0 if T < 8 * SAMPLE_MIN else max(SAMPLE_MIN, min(SAMPLE_MAX, T // SAMPLE_PER_KEYS))
    return min(requested, T)


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

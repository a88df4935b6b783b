"""Two-interval attention with log-sum-exp: the plain-torch reference semantics.

Query ``p`` of a row sees the keys ``j`` with ``j < prefix_end[p]`` or
``segment_start[p] <= j <= q_start + p`` (and ``j < Sk``). This one rule covers ordinary causal
attention (``prefix_end = 0``, ``segment_start = 0``, ``q_start = Sk - Sq``), packed segments
(``segment_start`` = start of the query's segment), a causal spine shared by several segments
(``prefix_end`` = end of the spine part a segment may read) and "see every key" (``prefix_end = Sk``).

Arithmetic is fp32 whatever the input dtype; GQA maps query head ``h`` to key/value head
``h // (Hq // Hkv)`` (the order of Hugging Face ``repeat_kv``).
"""
from __future__ import annotations

import bisect

import torch

from runtime import defaults


def check_attention_inputs(q, k, v, prefix_end, segment_start, scale, q_start) -> None:
    """Raise TypeError/ValueError naming the argument when the inputs break the contract."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [B, H, S, D], got shape {tuple(t.shape)}")
    b, hq, sq, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(
            f"k must be [B={b}, Hkv, Sk, D={d}] to match q, got shape {tuple(k.shape)}")
    hkv = k.shape[1]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"q heads ({hq}) must be a multiple of k/v heads ({hkv}) (GQA)")
    for name, t in (("prefix_end", prefix_end), ("segment_start", segment_start)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be an int32 or int64 tensor, got {t.dtype}")
        if tuple(t.shape) != (b, sq):
            raise ValueError(f"{name} must have shape [B, Sq] = {(b, sq)}, got {tuple(t.shape)}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float, got {type(scale).__name__}")
    if not float(scale) == float(scale) or abs(float(scale)) == float("inf"):
        raise ValueError(f"scale must be finite, got {scale}")
    if isinstance(q_start, bool) or not isinstance(q_start, int):
        raise TypeError(f"q_start must be an int, got {type(q_start).__name__}")
    if q_start < 0:
        raise ValueError(f"q_start must be >= 0, got {q_start}")


def visible_keys(prefix_end: torch.Tensor, segment_start: torch.Tensor, q_start: int,
                 query_offset: int, keys: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B, Sq', len(keys)]`` visibility of the key indices ``keys`` for queries
    ``query_offset ..`` (the two-interval rule)."""
    last = q_start + query_offset + torch.arange(prefix_end.shape[1], device=prefix_end.device)
    in_prefix = keys < prefix_end.unsqueeze(-1)
    in_segment = (keys >= segment_start.unsqueeze(-1)) & (keys <= last.unsqueeze(-1))
    return in_prefix | in_segment


def key_span(prefix_end: torch.Tensor, segment_start: torch.Tensor, q_start: int, query_offset: int,
             num_keys: int) -> torch.Tensor:
    """Ascending int64 indices of the keys that some query ``query_offset ..`` of a chunk may see.

    A superset of the visible keys (the rule is applied on top of it): ``[0, max prefix_end)``
    and ``[min segment_start, max last key]`` over the rows whose segment interval is not empty,
    both clipped to ``[0, num_keys)``. Reads three integers back to the host.
    """
    device = prefix_end.device
    last = q_start + query_offset + torch.arange(prefix_end.shape[1], device=device)
    live = segment_start <= torch.clamp(last, max=num_keys - 1)
    bounds = torch.stack([prefix_end.max(), torch.where(live, segment_start, num_keys).min(),
                          torch.where(live, last + 1, 0).max()]).tolist()
    prefix_hi, segment_lo, segment_hi = (min(max(int(x), 0), num_keys) for x in bounds)
    segment_lo = max(segment_lo, prefix_hi)
    return torch.cat([torch.arange(prefix_hi, device=device),
                      torch.arange(segment_lo, max(segment_hi, segment_lo), device=device)])


def query_chunks(segment_start: torch.Tensor, rows: int) -> list[tuple[int, int]]:
    """``[start, stop)`` query chunks of at most ``rows`` queries covering ``[0, Sq)`` in order.

    A chunk ends early where ``segment_start`` changes (in any batch row) once it holds
    ``defaults.ATTENTION_MIN_CHUNK`` queries, so the chunks of a packed layout rarely straddle two segments and
    their key spans stay tight. Reads the change positions back to the host.
    """
    sq = segment_start.shape[1]
    cuts = (torch.nonzero((segment_start[:, 1:] != segment_start[:, :-1]).any(0)).flatten() + 1).tolist()
    chunks, start = [], 0
    while start < sq:
        stop = min(start + rows, sq)
        first = bisect.bisect_left(cuts, start + min(defaults.ATTENTION_MIN_CHUNK, rows))
        if first < len(cuts) and cuts[first] < stop:
            stop = cuts[first]
        chunks.append((start, stop))
        start = stop
    return chunks


def two_interval_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           prefix_end: torch.Tensor, segment_start: torch.Tensor, *,
                           scale: float, q_start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention under the two-interval rule, returning ``(o, lse)``.

    q ``[B, Hq, Sq, D]``; k, v ``[B, Hkv, Sk, D]`` with ``Hq % Hkv == 0``; prefix_end and
    segment_start ``[B, Sq]`` int key indices; ``q_start`` the key index of query 0.
    Returns o ``[B, Hq, Sq, D]`` in q's dtype and lse ``[B, Hq, Sq]`` fp32 (natural log of the
    sum of ``exp(scale * q.k)`` over visible keys). A query with no visible key gets o = 0 and
    lse = -inf. Computed in fp32 with a max-shifted softmax (no overflow): with m the row's largest
    score, lse = m + log Σ exp(s - m) and o = Σ exp(s - m) v / Σ exp(s - m). Work and memory follow
    the visible keys: each chunk of queries (``query_chunks``) reads only its ``key_span``, and the
    query heads of a key/value head share its keys without copies.
    """
    check_attention_inputs(q, k, v, prefix_end, segment_start, scale, q_start)
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    if sq == 0:
        return q.new_zeros(b, hq, 0, d), torch.zeros(b, hq, 0, device=q.device)
    group = hq // hkv
    rows = max(1, min(defaults.ATTENTION_QUERY_CHUNK, defaults.ATTENTION_SCORE_BUDGET // max(hq * sk, 1)))
    grouped = q.reshape(b, hkv, group, sq, d)  # query head h reads key/value head h // group
    outputs, lses = [], []
    for start, stop in query_chunks(segment_start, rows):
        n = stop - start
        prefix, segment = prefix_end[:, start:stop], segment_start[:, start:stop]
        keys = key_span(prefix, segment, q_start, start, sk)
        kf, vf = k.index_select(2, keys).float(), v.index_select(2, keys).float()
        qf = grouped[:, :, :, start:stop].float().reshape(b, hkv, group * n, d)
        scores = torch.matmul(qf, kf.transpose(-1, -2)).view(b, hkv, group, n, keys.numel())
        scores.mul_(float(scale))
        scores.masked_fill_(~visible_keys(prefix, segment, q_start, start, keys)[:, None, None], float("-inf"))
        top = scores.amax(dim=-1, keepdim=True) if keys.numel() else scores.new_full((*scores.shape[:-1], 1),
                                                                                       float("-inf"))
        # A row with no visible key has every score -inf: shifting it by 0 gives weights
        # exp(-inf) = 0, a sum of 0, hence o = 0 and lse = log(0) = -inf.
        shift = torch.where(top == float("-inf"), torch.zeros_like(top), top)
        weights = scores.sub_(shift).exp_()
        total = weights.sum(dim=-1, keepdim=True)
        out = torch.matmul(weights.view(b, hkv, group * n, keys.numel()), vf).view(b, hkv, group, n, d)
        out = torch.where(total > 0, out / total, torch.zeros((), device=q.device))
        outputs.append(out.view(b, hq, n, d))
        lses.append((shift + torch.log(total)).view(b, hq, n))
    return torch.cat(outputs, dim=2).to(q.dtype), torch.cat(lses, dim=2)

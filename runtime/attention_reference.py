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

import torch

QUERY_CHUNK = 1024
"""Queries handled per step, so the score matrix stays ``[B, Hq, QUERY_CHUNK, Sk]``."""


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
                 query_offset: int, num_keys: int) -> torch.Tensor:
    """Boolean ``[B, Sq', Sk]`` visibility for queries ``query_offset ..`` (the two-interval rule)."""
    device = prefix_end.device
    key = torch.arange(num_keys, device=device)
    last = q_start + query_offset + torch.arange(prefix_end.shape[1], device=device)
    in_prefix = key < prefix_end.unsqueeze(-1)
    in_segment = (key >= segment_start.unsqueeze(-1)) & (key <= last.unsqueeze(-1))
    return in_prefix | in_segment


def two_interval_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           prefix_end: torch.Tensor, segment_start: torch.Tensor, *,
                           scale: float, q_start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention under the two-interval rule, returning ``(o, lse)``.

    q ``[B, Hq, Sq, D]``; k, v ``[B, Hkv, Sk, D]`` with ``Hq % Hkv == 0``; prefix_end and
    segment_start ``[B, Sq]`` int key indices; ``q_start`` the key index of query 0.
    Returns o ``[B, Hq, Sq, D]`` in q's dtype and lse ``[B, Hq, Sq]`` fp32 (natural log of the
    sum of ``exp(scale * q.k)`` over visible keys). A query with no visible key gets o = 0 and
    lse = -inf. Computed in fp32 with a max-shifted softmax (no overflow).
    """
    check_attention_inputs(q, k, v, prefix_end, segment_start, scale, q_start)
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    if sq == 0:
        return q.new_zeros(b, hq, 0, d), torch.zeros(b, hq, 0, device=q.device)
    group = hq // hkv
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    outputs, lses = [], []
    for start in range(0, sq, QUERY_CHUNK):
        stop = min(start + QUERY_CHUNK, sq)
        scores = torch.matmul(q[:, :, start:stop].float(), kf.transpose(-1, -2)) * float(scale)
        mask = visible_keys(prefix_end[:, start:stop], segment_start[:, start:stop],
                            q_start, start, sk).unsqueeze(1)
        scores = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        # A row with no visible key has lse = -inf and all scores -inf: shifting by 0 there
        # gives exp(-inf) = 0 weights, hence o = 0.
        shift = torch.where(lse == float("-inf"), torch.zeros_like(lse), lse)
        outputs.append(torch.matmul(torch.exp(scores - shift.unsqueeze(-1)), vf))
        lses.append(lse)
    return torch.cat(outputs, dim=2).to(q.dtype), torch.cat(lses, dim=2)

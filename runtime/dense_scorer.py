"""THE SCORER and THE ORDER of the DSA indexer top-K, and the dense reference ``dense_topk``.

THE SCORER (dense scoring and the certified path's refine, so a key's value is bitwise the same
whichever path computed it): ``x_h = q_h . k`` accumulated from 0 in ascending d, ``s = sum_h w_h
relu(x_h)`` accumulated from 0 in ascending h, every product and sum rounded to float32 (no fused
multiply-add, no layout-dependent blocking), then ``* a`` with the key's scale a for FP8 inputs
(SPEC A.10; their products are exact), then ``+ bias`` for an additive mask; hidden keys score
-inf. Every step is elementwise, so a pair's value does not depend on what is scored with it.
THE ORDER (every selection): values descending; NaN above +inf; equal values: visible keys before
hidden ones, then the lower key index. A row with fewer than kk visible keys lists its visible
keys first, then hidden ones (value -inf) in index order. ``dense_topk(q, k, w, topk, mask,
key_scale)`` returns (values [B,S,kk] fp32, indices [B,S,kk] int64) by both."""
from __future__ import annotations

import torch

from runtime import defaults
from runtime.indexer_inputs import IndexerInputs, check_indexer_inputs

__all__ = [
    "head_dots",
    "weighted_relu_sum",
    "exact_scores",
    "scaled_scores",
    "masked_scores",
    "select_topk",
    "dense_topk",
]



def head_dots(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x[..., h, m] = q[..., h, :] . k[..., m, :] in float32, ascending d (THE SCORER, step 1).

    q [..., H, D] and k [..., M, D] are float32; their leading dimensions broadcast.
    """
    shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (q.shape[-2], k.shape[-2])
    q_by_d = q.movedim(-1, 0).contiguous()  # [D, ..., H]
    k_by_d = k.movedim(-1, 0).contiguous()  # [D, ..., M]
    x = torch.zeros(shape, dtype=torch.float32, device=q.device)
    product = torch.empty(shape, dtype=torch.float32, device=q.device)
    for d in range(q.shape[-1]):
        torch.mul(q_by_d[d][..., :, None], k_by_d[d][..., None, :], out=product)
        x.add_(product)
    return x


def weighted_relu_sum(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """s[..., m] = sum_h w[..., h] * relu(x[..., h, m]) in float32, ascending h (step 2).

    w [..., H] and x [..., H, M] are float32; the result is [..., M].
    """
    shape = torch.broadcast_shapes(w.shape[:-1], x.shape[:-2]) + (x.shape[-1],)
    s = torch.zeros(shape, dtype=torch.float32, device=x.device)
    for h in range(x.shape[-2]):
        s.add_(w[..., h, None] * torch.relu(x[..., h, :]))
    return s


def exact_scores(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """THE SCORER without bias: q [N,H,D], w [N,H], k [N,M,D] float32 -> [N,M] float32.

    Leading dimensions broadcast (e.g. k [B,1,T,D] against q [B,S,H,D]). Keys are processed in
    chunks to bound memory; chunking does not change any value.
    """
    H, M = q.shape[-2], k.shape[-2]
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], w.shape[:-1])
    rows = max(1, lead.numel())
    chunk = max(1, defaults.SCORER_CHUNK_ELEMENTS // max(1, rows * max(1, H)))
    if M <= chunk:
        return weighted_relu_sum(w, head_dots(q, k))
    parts = [
        weighted_relu_sum(w, head_dots(q, k[..., start : start + chunk, :]))
        for start in range(0, M, chunk)
    ]
    return torch.cat(parts, dim=-1)


def scaled_scores(inputs: IndexerInputs, scores: torch.Tensor, b_idx: torch.Tensor,
                  key_idx: torch.Tensor) -> torch.Tensor:
    """THE SCORER's scale step: ``scores`` [N,L] times the scale of key ``key_idx`` [N,L] (or [1,L])
    of batch row ``b_idx`` [N] (float32 multiply); unchanged without FP8 inputs."""
    if inputs.key_scale is None:
        return scores
    return scores * inputs.key_scale[b_idx[:, None], key_idx]


def masked_scores(
    inputs: IndexerInputs,
    b_idx: torch.Tensor | None = None,
    s_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scores of every key for some query rows: scorer (+ scale) + bias at visible keys, -inf at hidden.

    Without indices: all rows, [B,S,T]. With b_idx, s_idx (int64 [n]): those rows, [n,T].
    """
    B, S, T, H, D = inputs.shape
    if b_idx is None:
        scores = exact_scores(inputs.q, inputs.weights, inputs.k[:, None])
        if inputs.key_scale is not None:
            scores = scores * inputs.key_scale[:, None, :]
        visible = inputs.visible
        bias = inputs.bias
    else:
        n = b_idx.shape[0]
        step = max(1, defaults.SCORER_CHUNK_ELEMENTS // max(1, T * D))
        parts = [
            exact_scores(
                inputs.q[b_idx[i : i + step], s_idx[i : i + step]],
                inputs.weights[b_idx[i : i + step], s_idx[i : i + step]],
                inputs.k[b_idx[i : i + step]],
            )
            for i in range(0, n, step)
        ]
        scores = torch.cat(parts, dim=0) if parts else inputs.q.new_zeros((0, T))
        scores = scaled_scores(inputs, scores, b_idx, torch.arange(T, device=scores.device)[None])
        visible = inputs.visible[b_idx, s_idx]
        bias = None if inputs.bias is None else inputs.bias[b_idx, s_idx]
    if bias is not None:
        scores = scores + bias
    return torch.where(visible, scores, torch.full((), float("-inf"), device=scores.device))


def select_topk(
    values: torch.Tensor, visible: torch.Tensor, kk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first kk entries of each row under THE ORDER.

    values [..., M] float32 (hidden entries are expected to hold -inf), visible [..., M] bool,
    0 <= kk <= M. Returns (values [..., kk] float32, indices [..., kk] int64 positions in the row).
    """
    if not 0 <= kk <= values.shape[-1]:
        raise ValueError(f"kk: expected 0 <= kk <= {values.shape[-1]}, got {kk}")
    hidden_last = torch.argsort((~visible).to(torch.uint8), dim=-1, stable=True)
    by_value = torch.sort(values.gather(-1, hidden_last), dim=-1, descending=True, stable=True)
    indices = hidden_last.gather(-1, by_value.indices[..., :kk])
    return by_value.values[..., :kk], indices


def dense_topk(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    topk: int,
    mask: torch.Tensor | None = None,
    key_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense reference: score every key with THE SCORER, select with THE ORDER.

    Inputs as in ``check_indexer_inputs`` (``key_scale``: FP8 inputs). Returns (values [B,S,kk]
    float32, indices [B,S,kk] int64), kk = min(topk, T).
    """
    inputs = check_indexer_inputs(q, k, weights, topk, mask, key_scale)
    return select_topk(masked_scores(inputs), inputs.visible, inputs.kk)

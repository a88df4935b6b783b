"""``torch.ops.pulsar_dosa.sparse_attention``: DSA attention over the indexer's selected keys only, in
the union form (the expanded keys and values; the absorbed form is ``absorbed_sparse_attention``).

Schema: ``sparse_attention(Tensor q, Tensor k, Tensor v, Tensor indices, Tensor? mask, Scalar scale,
str masked_rows) -> Tensor`` (``Scalar``, so that ``True`` reaches the op as a bool and is refused,
where a ``float`` argument would turn it into 1.0). q [B, Hq, S, Dqk], k [B, Hkv, T, Dqk], v [B, Hkv, T, Dv]
(``Hq % Hkv == 0``), indices [B, S, K] int32/int64, mask None or bool (True = visible)
broadcastable to [B, 1, S, T], ``masked_rows`` "zero" or "mean". Returns o [B, Hq, S, Dv] in q's
dtype: softmax attention of each query over the distinct in-range indices of its row that the
mask shows (the semantics of ``runtime.union_attention``; rows with no such key get 0 or the
mean of v over all keys; keys not attended to never reach the output, even when their values
are not finite).

Every kernel, the fake one included, first checks the arguments
(``runtime.union_attention.check_devices`` in the fake kernel: a meta tensor among real ones
would otherwise be answered with uninitialised memory; the whole
``check_sparse_attention_inputs`` in the CPU and CUDA kernels, before any work).

The CPU kernel (and any device without its own) runs the plain-torch reference
``runtime.union_attention.sparse_attention``; CUDA runs the Triton kernels of
``compiler/lowering/attention/union_attention.py`` (no host synchronisation: capturable in a CUDA
graph after one warm-up call). The fake kernel supports symbolic sizes.

DSA under a Pulsar layout: the op raises when ``runtime.attention_layout.active_layout()`` is set.
The indexer that chose ``indices`` scored the packed tokens under the model's causal mask and
keeps its own key cache, which the Pulsar KV drop does not touch, so no layout-aware answer would
be the model's; a Pulsar run of a DSA model fails here, at its first attention layer, with that
reason instead of computing something else.
"""
from __future__ import annotations

from typing import Optional

import torch

from runtime.attention_layout import active_layout
from runtime.dsa_config import PULSAR_UNSUPPORTED
from runtime.union_attention import check_devices, check_scale
from runtime.union_attention import sparse_attention as reference_sparse_attention

SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor indices, Tensor? mask, Scalar scale, str masked_rows) "
          "-> Tensor")


def _refuse_pulsar_layout() -> None:
    if active_layout() is not None:
        raise RuntimeError(f"pulsar_dosa.sparse_attention: a Pulsar layout is active, but {PULSAR_UNSUPPORTED}; "
                           "call the compiled model directly")


@torch.library.custom_op("pulsar_dosa::sparse_attention", mutates_args=(), schema=SCHEMA)
def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                     mask: Optional[torch.Tensor], scale: float, masked_rows: str) -> torch.Tensor:
    """Sparse attention (module docstring), by the plain-torch reference."""
    _refuse_pulsar_layout()
    out, _ = reference_sparse_attention(q, k, v, indices, mask, scale=scale, masked_rows=masked_rows)
    return out


@sparse_attention.register_kernel("cuda")
def _sparse_attention_cuda(q, k, v, indices, mask, scale, masked_rows):
    from compiler.lowering.attention.union_attention import sparse_attention_triton

    _refuse_pulsar_layout()
    out, _ = sparse_attention_triton(q, k, v, indices, mask, scale=scale, masked_rows=masked_rows)
    return out


@sparse_attention.register_fake
def _sparse_attention_fake(q, k, v, indices, mask, scale, masked_rows):
    check_devices(q, k, v, indices, mask)
    if not isinstance(scale, (torch.SymFloat, torch.SymInt)):
        check_scale(scale)
    if q.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, v: expected 4-D [B, H, S, D] tensors, got ranks {q.dim()} and {v.dim()}")
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))

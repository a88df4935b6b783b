"""DSA sparse attention over expanded keys and values, with log-sum-exp: the plain-torch reference
semantics of the union form (``pulsar_dosa.sparse_attention``; the absorbed form's is
``runtime.absorbed_attention``).

A DSA layer attends, for query ``s`` of batch row ``b``, to the keys its indexer selected:

    visible(b, s, t)  =  t ∈ {indices[b, s, j] : 0 <= indices[b, s, j] < T}  and  mask[b, 0, s, t]

An index outside ``[0, T)`` (e.g. -1 padding, as FlashMLA's sparse kernels take it) selects
nothing and a repeated index selects its key once: the selection is a set, as the
``ones.scatter(-1, indices, False)`` mask transformers builds from it. ``mask`` (bool, True =
visible, broadcastable to ``[B, 1, S, T]``) is the model's own attention mask (causal, padding);
None means every selected key is visible. A query attends with softmax weights
``exp(scale·q·k_t - lse)`` over its visible keys, ``lse = log Σ_visible exp(scale·q·k_t)``.

A query with no visible key gets what the replaced dense chain gives it (``masked_rows``):

* ``"zero"``: output 0 (``F.scaled_dot_product_attention`` with a bool mask whose row is all
  False, torch >= 2.5);
* ``"mean"``: the mean of v over all T keys (an additive mask of ``finfo.min``: every logit of the
  row is then the same ``finfo.min``, so softmax is uniform over all keys).

Either way such a row has lse = -inf. Shapes: q ``[B, Hq, S, Dqk]``, k ``[B, Hkv, T, Dqk]``,
v ``[B, Hkv, T, Dv]`` (``Hq % Hkv == 0``; query head h reads key/value head ``h // (Hq // Hkv)``,
the order of Hugging Face ``repeat_kv``), indices ``[B, S, K]`` int32/int64; q, k, v in one dtype,
bfloat16, float16 or float32 (float64 is refused, not computed in float32); T, S and K below 2^31.
Returns o ``[B, Hq, S, Dv]`` in q's dtype and lse ``[B, Hq, S]`` fp32 (natural log). Arithmetic is
fp32.

Only visible keys reach the output: a key that is not visible (an index out of range, a repeat, a
key the mask hides) contributes exactly 0 even when its k or v row holds inf or NaN. A visible key
whose v row does makes the row's output non-finite in those columns (IEEE arithmetic; the "mean"
fill of an empty row averages every v row, so non-finite values there reach it too).
"""
from __future__ import annotations

from typing import Optional

import torch

from runtime.workspace import check_index_range, check_workspace

MASKED_ROWS = ("zero", "mean")

GATHER_ELEMENTS = 1 << 24
"""Upper bound on gathered key elements per step (queries are processed in chunks below it)."""
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
"""The dtypes of q, k and v (one of them for all three)."""


def check_on_q_device(q, tensors: tuple[tuple[str, object], ...],
                      optional: tuple[tuple[str, object], ...] = ()) -> None:
    """Raise TypeError/ValueError naming the first of q, the named ``tensors`` and the named
    ``optional`` ones (None allowed) that is not a tensor on q's device (a meta tensor among real
    ones included: the dispatcher would run an op's meta kernel, whose output is uninitialised
    memory on q's device)."""
    for name, t in (("q", q), *tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (*tensors, *optional):
        if isinstance(t, torch.Tensor) and t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")


def check_devices(q, k, v, indices, mask) -> None:
    """``check_on_q_device`` of the sparse-attention arguments."""
    check_on_q_device(q, (("k", k), ("v", v), ("indices", indices)), (("mask", mask),))


def check_scale(scale) -> None:
    """Raise TypeError/ValueError unless ``scale`` is a finite int or float (a bool is refused)."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float, got {scale!r} ({type(scale).__name__})")
    if not float(scale) == float(scale) or abs(float(scale)) == float("inf"):
        raise ValueError(f"scale must be finite, got {scale}")


def check_sparse_attention_inputs(q, k, v, indices, mask, scale, masked_rows) -> None:
    """Raise TypeError/ValueError naming the argument when the inputs break the contract (no data
    is read)."""
    check_devices(q, k, v, indices, mask)
    if not (q.is_floating_point() and k.is_floating_point() and v.is_floating_point()):
        raise TypeError(f"q, k, v must be floating-point tensors, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in FLOAT_DTYPES:
        raise TypeError(f"q must be bfloat16, float16 or float32, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    if (q.dim(), k.dim(), v.dim()) != (4, 4, 4):
        raise ValueError(f"q, k, v must be 4-D [B, H, S, D] tensors, got shapes {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    b, hq, s, dqk = q.shape
    hkv, t_len = k.shape[1], k.shape[2]
    if k.shape[0] != b or k.shape[3] != dqk:
        raise ValueError(f"k must be [B={b}, Hkv, T, Dqk={dqk}] to match q, got shape {tuple(k.shape)}")
    if tuple(v.shape[:3]) != (b, hkv, t_len):
        raise ValueError(f"v must be [B={b}, Hkv={hkv}, T={t_len}, Dv] to match k, got shape {tuple(v.shape)}")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"q heads ({hq}) must be a multiple of k/v heads ({hkv}) (GQA)")
    if indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"indices must be an int32 or int64 tensor, got {indices.dtype}")
    if indices.dim() != 3 or tuple(indices.shape[:2]) != (b, s):
        raise ValueError(f"indices must be [B={b}, S={s}, K], got shape {tuple(indices.shape)}")
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask must be a bool torch.Tensor or None, got {type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor (True = visible), got {mask.dtype}")
        if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[0] not in (1, b) \
                or mask.shape[2] not in (1, s) or mask.shape[3] != t_len:
            raise ValueError(f"mask must be broadcastable to [B={b}, 1, S={s}, T={t_len}] with its own "
                             f"dim 1 of size 1, got shape {tuple(mask.shape)}")
    check_scale(scale)
    if masked_rows not in MASKED_ROWS:
        raise ValueError(f"masked_rows must be one of {list(MASKED_ROWS)}, got {masked_rows!r}")
    check_index_range("k", "keys T", t_len)
    check_index_range("q", "queries S", s)
    check_index_range("indices", "indices per row K", indices.shape[2])


def reference_workspace_bytes(q, k, v, indices) -> int:
    """An upper bound of the bytes ``sparse_attention`` allocates for these shapes: about 48 per
    index (selection, order, masks), the fp32 outputs and a cast copy, one chunk of gathered k/v."""
    b, hq, s, dqk = q.shape
    hkv, dv, width = k.shape[1], v.shape[3], indices.shape[2]
    per_index = 48 * b * s * width
    outputs = b * hq * s * (dv * (8 + q.element_size()) + 8)
    chunk = 4 * 4 * max(GATHER_ELEMENTS, b * hkv * width * max(dqk, dv))
    return per_index + outputs + chunk


def selected_keys(indices: torch.Tensor, num_keys: int,
                  mask: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keys, visible)``, both ``[B, S, K]``: each index as an int64 key (0 where out of range)
    and whether it counts: in ``[0, num_keys)``, the first occurrence of its key in the row, and
    visible in ``mask`` (module docstring)."""
    idx = indices.long()
    in_range = (idx >= 0) & (idx < num_keys)
    keys = torch.where(in_range, idx, torch.zeros((), dtype=idx.dtype, device=idx.device))
    ordered, order = torch.sort(torch.where(in_range, idx, -1), dim=-1, stable=True)
    repeat = torch.zeros_like(in_range)
    repeat[..., 1:] = ordered[..., 1:] == ordered[..., :-1]
    first = torch.empty_like(in_range).scatter_(-1, order, ~repeat)
    visible = in_range & first
    if mask is not None:
        b, s = indices.shape[:2]
        visible &= mask.expand(b, 1, s, num_keys)[:, 0].gather(-1, keys)
    return keys, visible


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                     mask: Optional[torch.Tensor] = None, *, scale: float,
                     masked_rows: str = "zero") -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of every query over its visible selected keys, ``(o, lse)`` (module docstring)."""
    check_sparse_attention_inputs(q, k, v, indices, mask, scale, masked_rows)
    check_workspace(reference_workspace_bytes(q, k, v, indices), q.device, "q, k, v, indices",
                    f"B={q.shape[0]}, Hq={q.shape[1]}, S={q.shape[2]}, K={indices.shape[2]}")
    b, hq, s, _ = q.shape
    hkv, t_len, dv = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    out = torch.zeros(b, hq, s, dv, dtype=torch.float32, device=q.device)
    lse = torch.full((b, hq, s), float("-inf"), dtype=torch.float32, device=q.device)
    if out.numel() == 0 or t_len == 0 or indices.shape[2] == 0:
        return _fill_masked_rows(out, lse, v, group, masked_rows).to(q.dtype), lse
    keys, visible = selected_keys(indices, t_len, mask)
    width = indices.shape[2]
    chunk = max(1, GATHER_ELEMENTS // max(1, b * hkv * width * max(k.shape[3], dv)))
    for start in range(0, s, chunk):
        stop = min(start + chunk, s)
        n = stop - start
        flat = keys[:, start:stop].reshape(b, 1, n * width, 1)
        kg = k.gather(2, flat.expand(b, hkv, n * width, k.shape[3])).float().view(b, hkv, 1, n, width, -1)
        vg = v.gather(2, flat.expand(b, hkv, n * width, dv)).float().view(b, hkv, 1, n, width, dv)
        qf = q[:, :, start:stop].float().view(b, hkv, group, n, -1)
        scores = torch.einsum("bhgsd,bhgskd->bhgsk", qf, kg.expand(b, hkv, group, n, width, -1)) * float(scale)
        seen = visible[:, None, None, start:stop]
        scores = scores.masked_fill(~seen, float("-inf"))
        vg = vg.masked_fill(~seen[..., None], 0.0)  # 0 * inf would be NaN: unseen values are dropped
        row_lse = torch.logsumexp(scores, dim=-1)
        # A row without a visible key has lse = -inf: shifting it by 0 keeps every weight exp(-inf) = 0.
        shift = torch.where(row_lse == float("-inf"), torch.zeros_like(row_lse), row_lse)
        weights = torch.exp(scores - shift.unsqueeze(-1))
        o = torch.einsum("bhgsk,bhgskd->bhgsd", weights, vg.expand(b, hkv, group, n, width, dv))
        out[:, :, start:stop] = o.reshape(b, hq, n, dv)
        lse[:, :, start:stop] = row_lse.reshape(b, hq, n)
    return _fill_masked_rows(out, lse, v, group, masked_rows).to(q.dtype), lse


def _fill_masked_rows(out: torch.Tensor, lse: torch.Tensor, v: torch.Tensor, group: int,
                      masked_rows: str) -> torch.Tensor:
    """``out`` with the rows of lse = -inf set per ``masked_rows`` (they are 0 already)."""
    if masked_rows == "zero" or v.shape[2] == 0:
        return out
    mean = v.float().mean(dim=2).repeat_interleave(group, dim=1)  # [B, Hq, Dv]
    return torch.where((lse == float("-inf")).unsqueeze(-1), mean.unsqueeze(2), out)

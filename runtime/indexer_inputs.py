"""Validation and normalisation of the inputs of a DSA lightning-indexer top-K (SPEC A.1).

``check_indexer_inputs(q, k, weights, topk, mask, key_scale)``: q [B,S,H,D] (H, D >= 1), k [B,T,D],
weights [B,S,H], all float16 / bfloat16 / float32; ``topk`` a positive int (a bool is refused);
mask None, bool [B,S,T] (True = visible) or additive float [B,S,T] (-inf hides a key, any other
value is added to its score); ``key_scale`` None, or the FP8 scorer's per-key scale [B,T] float32
(SPEC A.10: q and k then float8_e4m3fn, weights float32). A bad argument raises an error naming
it. Returns ``IndexerInputs``: the floats upcast to float32 (exact), ``visible`` [B,S,T], ``bias``
(the mask value at visible keys, 0 at hidden ones; +inf or NaN kept, such rows are answered
densely) and ``kk = min(topk, T)``. ``checked_kk`` checks a call once per signature on meta tensors
(no data read). ``topk`` must be below 2^63 and T, S below 2^31 (the kernels index keys and queries
in int32); with real tensors a call whose reference workspace (``reference_workspace_bytes``)
exceeds the device's memory is refused before any of it is built."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.signature_check import checked_on_meta
from runtime.workspace import check_index_range, check_workspace

__all__ = ["IndexerInputs", "check_indexer_inputs", "checked_kk", "reference_workspace_bytes"]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class IndexerInputs:
    """Validated indexer inputs, all on one device.

    q [B,S,H,D], k [B,T,D], weights [B,S,H]: float32. topk: the requested count; kk = min(topk, T).
    visible [B,S,T] bool. bias [B,S,T] float32 (0 at hidden keys) or None when there is no
    additive part. key_scale [B,T] float32 (the FP8 scorer's per-key scale) or None.
    """

    q: torch.Tensor
    k: torch.Tensor
    weights: torch.Tensor
    topk: int
    kk: int
    visible: torch.Tensor
    bias: torch.Tensor | None
    key_scale: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """(B, S, T, H, D)."""
        B, S, H, D = self.q.shape
        return B, S, self.k.shape[1], H, D


def _check_float_tensor(name: str, x: object, ndim: int, layout: str, fp8: bool = False) -> torch.Tensor:
    """``x`` if it is a tensor of rank ``ndim``: float16/bfloat16/float32, or float8_e4m3fn with ``fp8``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape {layout}, got {type(x).__name__}")
    if fp8 and x.dtype != _FP8:
        raise TypeError(f"{name}: expected dtype float8_e4m3fn (FP8 inputs: key_scale is given), got {x.dtype}")
    if not fp8 and x.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name}: expected dtype float16, bfloat16 or float32, got {x.dtype}"
            + (" (E4M3 inputs need their key_scale)" if x.dtype == _FP8 else "")
        )
    if x.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions {layout}, got shape {tuple(x.shape)}")
    return x


def _check_topk(topk: object) -> int:
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise TypeError(f"topk: expected a positive int, got {topk!r} ({type(topk).__name__})")
    if not 0 < topk < 2**63:
        raise ValueError(f"topk: expected a positive int below 2^63 (the op's int64), got {topk}")
    return topk


def reference_workspace_bytes(B: int, S: int, T: int, H: int, D: int) -> int:
    """An upper bound of the bytes the plain-torch reference holds at once for a call: about 40 per
    (query, key) (visibility, bias, scores, their sort) and 40 per query element (q in float32 and
    float64 copies)."""
    return 40 * B * S * T + 40 * B * S * H * D + 12 * B * T * D


def _split_mask(
    mask: object, B: int, S: int, T: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if mask is None:
        return torch.ones((B, S, T), dtype=torch.bool, device=device), None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask: expected None or a torch.Tensor [B,S,T], got {type(mask).__name__}")
    if tuple(mask.shape) != (B, S, T):
        raise ValueError(f"mask: expected shape [B,S,T] = {(B, S, T)}, got {tuple(mask.shape)}")
    if mask.device != device:
        raise ValueError(f"mask: expected device {device} (the device of q), got {mask.device}")
    if mask.dtype == torch.bool:
        return mask, None
    if mask.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"mask: expected dtype bool or float16/bfloat16/float32 (additive), got {mask.dtype}"
        )
    additive = mask.to(torch.float32)
    visible = additive != float("-inf")
    bias = torch.where(visible, additive, torch.zeros((), dtype=torch.float32, device=device))
    return visible, bias


def check_indexer_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    topk: int,
    mask: torch.Tensor | None = None,
    key_scale: torch.Tensor | None = None,
) -> IndexerInputs:
    """Validate the indexer inputs and return them upcast to float32 (see the module docstring).

    Raises TypeError for a wrong type or dtype and ValueError for a wrong rank, shape, device or
    value; each message names the argument and what was expected. No value is read (key_scale's
    values are the certified top-K's precondition, not an error).
    """
    fp8 = key_scale is not None
    if fp8 and (not isinstance(key_scale, torch.Tensor) or key_scale.dtype != torch.float32):
        raise TypeError(f"key_scale: expected None or a float32 torch.Tensor [B,T], got "
                        f"{getattr(key_scale, 'dtype', type(key_scale).__name__)}")
    q = _check_float_tensor("q", q, 4, "[B,S,H,D]", fp8)
    k = _check_float_tensor("k", k, 3, "[B,T,D]", fp8)
    weights = _check_float_tensor("weights", weights, 3, "[B,S,H]")
    if fp8 and weights.dtype != torch.float32:
        raise TypeError(f"weights: expected dtype float32 with FP8 inputs (scales folded in), got {weights.dtype}")
    topk = _check_topk(topk)
    B, S, H, D = q.shape
    if H < 1 or D < 1:
        raise ValueError(
            f"q: expected at least one head and one dimension [B,S,H>=1,D>=1], got {tuple(q.shape)}"
        )
    if k.shape[0] != B or k.shape[2] != D:
        raise ValueError(
            f"k: expected shape [B,T,D] with B={B}, D={D} (from q), got {tuple(k.shape)}"
        )
    if tuple(weights.shape) != (B, S, H):
        raise ValueError(
            f"weights: expected shape [B,S,H] = {(B, S, H)} (from q), got {tuple(weights.shape)}"
        )
    for name, x in (("k", k), ("weights", weights)):
        if x.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (the device of q), got {x.device}")
    T = k.shape[1]
    if fp8:
        if tuple(key_scale.shape) != (B, T):
            raise ValueError(f"key_scale: expected shape [B,T] = {(B, T)}, got {tuple(key_scale.shape)}")
        if key_scale.device != q.device:
            raise ValueError(f"key_scale: expected device {q.device} (the device of q), got {key_scale.device}")
    check_index_range("k", "keys T", T)
    check_index_range("q", "queries S", S)
    check_workspace(reference_workspace_bytes(B, S, T, H, D), q.device, "q, k", f"B={B}, S={S}, T={T}")
    visible, bias = _split_mask(mask, B, S, T, q.device)
    return IndexerInputs(
        q=q.to(torch.float32),
        k=k.to(torch.float32),
        weights=weights.to(torch.float32),
        topk=topk,
        kk=min(topk, T),
        visible=visible,
        bias=bias,
        key_scale=key_scale,
    )


def checked_kk(q: object, k: object, weights: object, topk: object, mask: object = None,
               key_scale: object = None) -> int:
    """``kk`` of a call that ``check_indexer_inputs`` accepts, else its error; no data is read.

    The check runs on meta tensors of the same shapes and dtypes (devices compared first), once per
    distinct signature (shapes, dtypes, topk): a call repeated at one signature, as a
    decode loop makes it, costs a dictionary lookup (errors are never remembered)."""
    Tensor = torch.Tensor
    tensors = (q, k, weights, mask, key_scale)
    if (type(topk) is not int or not isinstance(q, Tensor) or not isinstance(k, Tensor)
            or not isinstance(weights, Tensor) or not all(x is None or isinstance(x, Tensor) for x in tensors[3:])):
        meta = [x.to("meta") if isinstance(x, Tensor) else x for x in tensors]
        return check_indexer_inputs(meta[0], meta[1], meta[2], topk, meta[3], meta[4]).kk
    device = q.device
    if any(x is not None and x.device != device for x in tensors[1:]):
        for name, x in zip(("k", "weights", "mask", "key_scale"), tensors[1:]):
            if x is not None and x.device != device:
                raise ValueError(f"{name}: expected device {device} (the device of q), got {x.device}")
    return checked_on_meta(_kk_of, tensors, (topk,))


def _kk_of(q, k, weights, mask, key_scale, topk: int) -> int:
    return check_indexer_inputs(q, k, weights, topk, mask, key_scale).kk

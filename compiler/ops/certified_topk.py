"""``torch.ops.pulsar_dosa.certified_topk``: the certified exact top-K of a DSA indexer as a torch op.

Schema (:data:`SCHEMA`, shared by ``capture_topk``): ``(Tensor q, Tensor k, Tensor weights, Scalar
topk, Tensor? mask=None, str layer="", str path="auto", SymInt? r=None, SymInt? min_keys=None,
bool record_stats=True, str precision="bf16", Tensor? k_scale=None, bool sorted=True, int?
list_queries=None, bool? witnesses=None) -> (Tensor, Tensor)``. q [B,S,H,D], k [B,T,D], weights
[B,S,H] (signed, every scale folded in), mask None or [B,S,T] (bool, True = visible; or additive
float), one device; ``topk`` a positive int (a bool is refused). Returns (values [B,S,kk] fp32,
indices [B,S,kk] int64), kk = min(topk, T): exactly ``runtime.dense_scorer.dense_topk`` of the
scored operands (``scored_operands``: the inputs for
``precision`` "bf16"; for "fp8" / "fp8_unrotated" their E4M3 quantisation, SPEC A.10; ``k_scale``
[B,T] fp32: k is already E4M3 with these scales, e.g. an FP8 key cache); with ``sorted`` False,
each row's same (value, index) pairs in an unspecified order, for readers of the set. ``layer`` files the
statistics and the runtime guard; ``path``, ``r``, ``min_keys``, ``list_queries``, ``witnesses`` are
the layer's ``TopkSettings``, the path resolved per call by ``compiler.ops.guard.call_path``, r, the
survivor lists' size and the witnesses passed to the runtime's ``CertifiedTopkConfig``. Every kernel
checks its arguments first (``check_call``: a clear error naming the argument) and answers empty
inputs with empty outputs.
The CPU runs ``runtime.certified_topk``; CUDA ``compiler/lowering/topk_pipeline.py`` (its FP8 inputs
quantised by ``compiler/lowering/scoring/fp8_quant.py``, the same bits). The fake
kernel keeps symbolic sizes and adds no guards."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from compiler.ops.guard import call_path
from compiler.ops.stats import TOPK_STATS
from compiler.topk_settings import TopkSettings, settings_of
from runtime.certified_topk import CertifiedTopkConfig, certified_topk as reference_certified_topk
from runtime.fp8_quant import Quantizer, check_head_dim, check_precision, quantize, quantize_keys, quantize_queries
from runtime.indexer_inputs import checked_kk

SCHEMA = ('(Tensor q, Tensor k, Tensor weights, Scalar topk, Tensor? mask=None, str layer="", '
          'str path="auto", SymInt? r=None, SymInt? min_keys=None, bool record_stats=True, '
          'str precision="bf16", Tensor? k_scale=None, bool sorted=True, int? list_queries=None, '
          'bool? witnesses=None) -> (Tensor, Tensor)')
"""The schema of ``certified_topk`` and of every op that stands in for it (``capture_topk``); arguments
added later go last, so that positional calls keep their meaning."""
_ARGUMENTS = torch._C.parse_schema("pulsar_dosa::certified_topk" + SCHEMA).arguments


_DEFAULTS = {a.name: a.default_value for a in _ARGUMENTS}
_NAMES = tuple(_DEFAULTS)


def op_arguments(args: tuple, kwargs: dict) -> dict[str, Any]:
    """A kernel's ``(args, kwargs)`` as {argument name: value} in schema order, defaults filled in
    (the dispatcher drops trailing arguments that equal their default)."""
    a = dict(_DEFAULTS)
    a.update(zip(_NAMES, args))
    a.update(kwargs)
    return a


def check_devices(a: dict[str, Any]) -> None:
    """ValueError naming the first tensor argument that is not on q's device (a meta tensor among
    real ones included: the dispatcher would otherwise answer with the meta kernel's empty tensors)."""
    q = a["q"]
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q: expected a torch.Tensor [B,S,H,D], got {type(q).__name__}")
    for name in ("k", "weights", "mask", "k_scale"):
        x = a[name]
        if isinstance(x, torch.Tensor) and x.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (the device of q), got {x.device}")


def check_topk_type(topk: Any) -> None:
    """TypeError unless ``topk`` is an int or SymInt (a bool or a float is refused)."""
    if isinstance(topk, bool) or not isinstance(topk, (int, torch.SymInt)):
        raise TypeError(f"topk: expected a positive int, got {topk!r} ({type(topk).__name__})")


def check_call(a: dict[str, Any]) -> tuple[int, TopkSettings]:
    """Validate a concrete call (every argument, tensors on one device); returns kk and the settings.

    Shapes, dtypes and topk's value are checked by the runtime's ``check_indexer_inputs`` on meta
    tensors, once per signature (``checked_kk``; no data is read)."""
    check_devices(a)
    check_topk_type(a["topk"])
    settings = settings_of(a["path"], a["r"], a["min_keys"], a["list_queries"], a["witnesses"])
    precision = check_precision("precision", a["precision"])
    q, k, k_scale = a["q"], a["k"], a["k_scale"]
    if isinstance(q, torch.Tensor) and q.dim() == 4:
        check_head_dim("q", q.shape[3], precision)
    if k_scale is None:
        return checked_kk(q, k, a["weights"], a["topk"], a["mask"]), settings
    if precision == "bf16":
        raise ValueError("k_scale: pre-quantised keys are scored by an fp8 precision, got precision='bf16'")
    if not isinstance(k, torch.Tensor) or k.dtype != torch.float8_e4m3fn:
        raise TypeError(f"k: expected float8_e4m3fn keys [B,T,D] with k_scale, got {getattr(k, 'dtype', type(k))}")
    if not isinstance(k_scale, torch.Tensor) or k_scale.dtype != torch.float32 or k_scale.shape != k.shape[:2]:
        raise ValueError(f"k_scale: expected float32 [B,T] = {tuple(k.shape[:2])} (k's), got "
                         f"{getattr(k_scale, 'dtype', type(k_scale).__name__)} {tuple(getattr(k_scale, 'shape', ()))}")
    keys = torch.empty(k.shape, dtype=torch.float32, device="meta")  # the keys k stands for
    meta = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in (q, a["weights"], a["mask"])]
    return checked_kk(meta[0], keys, meta[1], a["topk"], meta[2]), settings


Kernel = Callable[[dict[str, Any], int, CertifiedTopkConfig, Any, "int | None"], tuple[torch.Tensor, torch.Tensor]]


def _run(kernel: Kernel, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Check the call, answer empty inputs with empty outputs, decide its path and
    settings (``compiler.ops.guard.call_path``), then run ``kernel(a, kk, config, stats, min_keys)`` inside the
    decision's timed block (the runtime guard measures guarded calls); ``min_keys`` the ticket's."""
    a = op_arguments(args, kwargs)
    kk, settings = check_call(a)
    q = a["q"]
    B, S, H, D = q.shape
    if B * S * kk == 0:
        return (torch.empty((B, S, kk), dtype=torch.float32, device=q.device),
                torch.empty((B, S, kk), dtype=torch.int64, device=q.device))
    ticket = call_path(settings, layer=a["layer"], device=q.device, B=B, S=S, T=a["k"].shape[1], H=H, D=D, kk=kk)
    config = ticket.settings.runtime_config(ticket.path)
    stats = TOPK_STATS.for_layer(a["layer"], q.device) if a["record_stats"] else None
    with ticket.timed(stats) as call_stats:
        return kernel(a, kk, config, call_stats, ticket.min_keys)


def scored_operands(a: dict[str, Any], quantizer: Quantizer = quantize
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q, k, weights, k_scale) that the scorer reads: the call's own for "bf16" (k_scale None); for
    an fp8 precision the E4M3 quantisation of ``runtime.fp8_quant`` by ``quantizer`` (q8, k8 or the
    given FP8 keys, w' with the query scales folded in, the key scales)."""
    precision = a["precision"]
    if precision == "bf16":
        return a["q"], a["k"], a["weights"], None
    q8, w8 = quantize_queries(a["q"], a["weights"], precision, quantizer)
    k8, k_scale = (quantize_keys(a["k"], precision, quantizer) if a["k_scale"] is None
                   else (a["k"], a["k_scale"]))
    return q8, k8, w8, k_scale


def _reference_kernel(a, kk, config, stats, min_keys):
    """The plain-torch reference: every row of a certified call certified (``min_keys`` unused)."""
    q, k, w, k_scale = scored_operands(a)
    return reference_certified_topk(q, k, w, a["topk"], a["mask"], key_scale=k_scale, config=config, stats=stats)


def _cuda_kernel(a, kk, config, stats, min_keys):
    from compiler.lowering.scoring.fp8_quant import quantize_rows
    from compiler.lowering.scoring.indexer_scores import check_fp8_head_dim
    from compiler.lowering.topk_pipeline import checked_certified_topk_cuda

    if a["precision"] != "bf16":
        check_fp8_head_dim(a["q"].shape[3])
    q, k, w, k_scale = scored_operands(a, quantize_rows)
    return checked_certified_topk_cuda(q, k, w, kk, a["mask"], k_scale=k_scale, config=config, stats=stats,
                                       ordered=a["sorted"], min_keys=min_keys)


def _default(*args, **kwargs):
    """Any device without its own kernel (CPU): the plain-torch reference."""
    return _run(_reference_kernel, args, kwargs)


certified_topk = torch.library.custom_op("pulsar_dosa::certified_topk", _default, mutates_args=(), schema=SCHEMA)


@certified_topk.register_kernel("cuda")
def _certified_topk_cuda(*args, **kwargs):
    return _run(_cuda_kernel, args, kwargs)


def fake_certified_topk(*args, **kwargs):
    """Output shapes of the op (symbolic sizes kept, no guards): values float32 and indices int64 [B,S,kk]."""
    a = op_arguments(args, kwargs)
    check_devices(a)
    check_topk_type(a["topk"])
    q, k, weights, topk = a["q"], a["k"], a["weights"], a["topk"]
    if q.dim() != 4 or k.dim() != 3 or weights.dim() != 3:
        raise ValueError(
            f"q, k, weights: expected ranks 4 [B,S,H,D], 3 [B,T,D], 3 [B,S,H], got {q.dim()}, {k.dim()}, {weights.dim()}"
        )
    B, S = q.shape[0], q.shape[1]
    T = k.shape[1]
    kk = topk if statically_known_true(topk <= T) else torch.sym_min(topk, T)
    values = q.new_empty((B, S, kk), dtype=torch.float32)
    indices = q.new_empty((B, S, kk), dtype=torch.int64)
    return values, indices


certified_topk.register_fake(fake_certified_topk)

"""Compile time: the settings of each rewritten indexer layer, and which calls keep their stock subgraph.

``layer_settings``: a plan's layer, else the forced ``path`` option, else path "auto" from the cost
model's crossover for an assumed trained indexer (``cost_model.default_min_keys``). ``keeps_stock``:
a call of fewer query-key-head products than ``stock_threshold`` stays as traced, because there the
stock form's device time is shorter than the op's per-call host cost (``defaults.STOCK_BELOW``), or
because the device has only the ops' plain-torch references; a stock MLA attention's expansion of
its latent counts as products too (``latent_expansion_products``). With symbolic sizes that decision is
a guard: Dynamo recompiles once a call crosses it; under an fp8 ``indexer_precision`` every
indexer call is rewritten. Imports neither the plans nor the ops.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch.fx.experimental.symbolic_shapes import guard_or_false

from compiler import defaults
from compiler.cost_model import default_min_keys, shape_form
from compiler.options import SPARSE_FORM_CHOICES
from compiler.topk_settings import TopkSettings

__all__ = ["ALWAYS_STOCK", "LayerSettings", "indexer_settings", "keeps_stock", "latent_expansion_products",
           "layer_settings", "sparse_attention_form", "stock_threshold"]

ALWAYS_STOCK = math.inf
"""The threshold of a device type without the ops' own kernels: every call keeps its stock subgraph."""


@dataclass(frozen=True)
class LayerSettings:
    """One rewritten indexer layer: its ``topk`` settings, the plan's predicted pruned fraction, and
    where the settings came from ("plan <hash>", "options", "cost model", "runtime defaults")."""

    topk: TopkSettings
    predicted_pruned_frac: float | None
    source: str

    def report_fields(self) -> dict:
        """What the layer's rewrite entry in the report records about the choice."""
        return {**self.topk.op_arguments(), "predicted_pruned_frac": self.predicted_pruned_frac,
                "settings_from": self.source}


def _static_int(size) -> int | None:
    """A size known at compile time as a plain int, else None (symbolic)."""
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def indexer_settings(options, layer: str, q_shape, topk, device_type: str) -> LayerSettings:
    """``layer_settings`` for a rewrite with q shape [B,S,H,D] and ``topk``; ``options`` is the
    backend's CompileOptions (its ``plan`` and ``path``)."""
    return layer_settings(layer, plan=options.plan, path=options.path, heads=_static_int(q_shape[2]),
                          head_dim=_static_int(q_shape[3]), topk=_static_int(topk), device_type=device_type)


def layer_settings(layer: str, *, plan, path: str, heads: int | None, head_dim: int | None, topk: int | None,
                   device_type: str) -> LayerSettings:
    """Settings of the indexer at module path ``layer``; sizes symbolic at compile time are None.

    With a plan (``compiler.plan.Plan``): its layer's settings (``PlanError`` when it has no such
    layer or another geometry); a ``path`` other than "auto" overrides the plan's path and keeps its
    r, list size and witnesses. Without one: ``path`` when forced, else "auto" from
    ``default_min_keys`` of a prefill on the device type ("dense" where it never pays; no min_keys
    while a size is symbolic).
    """
    forced = TopkSettings(path)
    if plan is not None:
        entry = plan.layer_for(layer, heads=heads, head_dim=head_dim, topk=topk)
        if forced.path != "auto":
            kept = TopkSettings(forced.path, entry.settings.r, list_queries=entry.settings.list_queries,
                                witnesses=entry.settings.witnesses)
            return LayerSettings(kept, entry.predicted_pruned_frac, "options")
        return LayerSettings(entry.settings, entry.predicted_pruned_frac, f"plan {plan.hash[:12]}")
    if forced.path != "auto":
        return LayerSettings(forced, None, "options")
    if heads is None or head_dim is None or topk is None:
        return LayerSettings(forced, None, "runtime defaults")
    min_keys = default_min_keys(heads, head_dim, topk, None, device_type)
    if min_keys is None:
        return LayerSettings(TopkSettings("dense"), None, "cost model")
    return LayerSettings(TopkSettings("auto", min_keys=min_keys), None, "cost model")


def stock_threshold(options, kind: str, device_type: str, cuda_graphs: bool) -> float:
    """The product count below which pass family ``kind`` keeps the stock subgraph: 0 for the indexer
    under an fp8 ``indexer_precision`` (a stock subgraph would score in the model's precision); else
    the option ``stock_below`` when given; else 0 when the compile asks for the indexer op itself (a
    forced path, or ``capture``, which records every call); else ``defaults.STOCK_BELOW`` of the
    device type (``ALWAYS_STOCK`` where none is listed), 0 for a listed one under CUDA graphs (the
    host cost is then paid once, at capture)."""
    if kind == "dsa_indexer" and options.indexer_precision != "bf16":
        return 0
    if options.stock_below is not None:
        return options.stock_below
    if kind == "dsa_indexer" and (options.capture or options.path != "auto"):
        return 0
    threshold = defaults.STOCK_BELOW.get(kind, {}).get(device_type, ALWAYS_STOCK)
    return 0 if cuda_graphs and threshold != ALWAYS_STOCK else threshold


def keeps_stock(threshold: float, products, what: str = "B*S*T*H") -> str | None:
    """Why a call of ``products`` = B*S*T*H query-key-head products (``what`` spells them) keeps the
    stock subgraph, or None. Symbolic sizes add a guard; a size that depends on data (unbacked) is
    not guarded on and the call is rewritten."""
    if threshold <= 0:
        return None
    if threshold == ALWAYS_STOCK:
        return ("kept stock: on this device the op runs its plain-torch reference, slower than the stock "
                "subgraph (option stock_below=0 rewrites every call)")
    if guard_or_false(products < threshold):
        return (f"kept stock: {what} = {products} query-key-head products, below the {threshold} at which "
                "the op's per-call host cost pays (option stock_below; 0 under CUDA graphs)")
    return None


def latent_expansion_products(latent_dim: int, nope_dim: int, rope_dim: int, value_dim: int) -> int:
    """The query-key-head products that cost what expanding one key of an MLA latent for one head
    costs (kv_b_proj: 2·Dc·(Dn+Dv) flops, where a product, score and weighted value, takes
    2·(Dn+Dr+Dv)), rounded down. A stock attention over a latent expands every key it holds for
    every head at every call, decode included; the absorbed op reads the latent: the pass adds
    B·H·T times this to the products ``keeps_stock`` weighs, so that a decode over a long cache is
    not kept stock for the size of its score matrix alone (one row)."""
    return latent_dim * (nope_dim + value_dim) // (nope_dim + rope_dim + value_dim)


def sparse_attention_form(forced: str, heads: int, queries, cuda_graphs: bool = False) -> tuple[str, str]:
    """``(form, reason)`` of a DSA sparse attention whose keys and values expand a latent.

    ``forced``: the ``sparse_form`` option ("auto" decides); ``heads``: its query heads; ``queries``:
    its queries per batch row (an int, or symbolic: then not decode). Form "auto" is the absorbed op
    choosing per call (``compiler.ops.sparse_form``): how the selections overlap is known only then. At decode
    (``defaults.UNION_MIN_QUERIES``) the form is absorbed; under CUDA graphs (``cuda_graphs``: a call
    must not synchronise) it is decided on shapes (``cost_model.shape_form``).
    """
    if forced not in SPARSE_FORM_CHOICES:
        raise ValueError(f"forced: expected one of {list(SPARSE_FORM_CHOICES)}, got {forced!r}")
    if forced != "auto":
        return forced, "option sparse_form"
    if isinstance(queries, int) and queries < defaults.UNION_MIN_QUERIES:
        return "absorbed", (f"{queries} queries per row (< {defaults.UNION_MIN_QUERIES}): no neighbours share "
                            "keys, and the latent cache is read instead of expanded")
    if not cuda_graphs:
        return "auto", ("chosen at every call from how the tiles' selections overlap "
                        "(compiler.ops.sparse_form)")
    return shape_form(heads)


"""The DSA sparse-attention pass: indexer indices -> index mask -> dense attention  =>
``pulsar_dosa.absorbed_sparse_attention`` or ``pulsar_dosa.sparse_attention``.

transformers' DSA layers (``DeepseekV32Attention``, ``GlmMoeDsaAttention``, eager and sdpa
implementations) turn the indexer's top-K indices into a mask and run dense attention over all
T keys. The pass anchors on the attention (an SDPA call, or ``matmul(softmax(...), v)``) and
accepts it when its mask is built from indices:

    index_mask = ones_bool[B,S,T].scatter(-1, indices[.long()], False).unsqueeze(1)   # True = not selected
    sdpa   F.scaled_dot_product_attention(q, k, v, attn_mask=C, dropout_p=0, is_causal=False, scale=c?)
    eager  matmul(softmax(matmul(q, kᵀ) (*|/) c + C, dim=-1[, dtype=float32]) [.to] [dropout p=0], v)
    C      M & ~index_mask            M bool [B|1, 1, S|1, T]         (or ~index_mask alone: no M)
           F.masked_fill(index_mask, finfo(F.dtype).min)   with F = where(M, 0, finfo(F.dtype).min)

with kᵀ = ``k.transpose(-2, -1)`` (any spelling of the last two dims), c a Python number, and
GQA ``repeat_kv`` on k and v folded (``compiler.passes.matcher.fold_repeat_kv``). MLA shapes are
the point: q/k head dim Dqk (nope + rope) and v head dim Dv differ.

Exactness by construction: the op receives the very ``indices`` tensor the mask was scattered
from and the model's own mask M, and attends to exactly the keys the combined mask leaves visible
(a repeated index is one key, as in the scatter). Keys it drops carried ``finfo.min`` or False:
their softmax weight in the dense chain is exactly 0 whenever the row has a visible key. A row
with none gets what the dense chain gives it: 0 for a bool mask in SDPA (torch >= 2.5),
the mean of v over all keys for an additive ``finfo.min`` mask (every logit equal): the op's
``masked_rows``. Scores are computed in fp32, the original in the model dtype: the outputs agree
to floating-point rounding.

Two forms. Where k and v are ``kv_b_proj``'s expansion of an MLA latent
(``compiler.passes.matcher.latent_form``: both transformers DSA models, without a cache, over a cache
of the latent, transformers' after 5.17 or ``compiler.latent_cache``, or over an empty 5.17 one), the
absorbed op reads the latent rows, the rope key and kv_b_proj's weight instead (the expansion dies
with the attention; o_proj and everything else stay as they are). ``policy.sparse_attention_form``
says how: form "auto" (the op picks absorbed or union per call from how the selections overlap,
expanding the latent itself for union), "absorbed", or "union" (the union op reads k and v).
Where k and v are not a latent's expansion the union op runs, with a near miss saying why where
the absorbed op would have. ``distinct`` is passed True when the indices are a top-K's (``from_topk``).

A safe match where the stock form is faster (``policy.keeps_stock``: e.g. decode over a
short cache on a GPU without CUDA graphs, or any call on the CPU, where the op runs its plain-torch
reference) is declined: left untouched, reported as a near miss. A stock MLA attention expands every
key of its latent for every head at every call (at decode, the whole cache per token): where the op
would read the latent instead, that expansion counts in the stock form's size.

An attention whose mask is not built from indices is not a candidate (left to the ``attention``
family, which runs after this one). Near misses (left untouched, reported with the reason):
active dropout, ``is_causal=True``, a tensor scale (numbers and symbolic floats are taken), an additive mask whose values are not
provably {0, finfo.min} (not ``where(bool, 0, finfo.min)``, or another fill), an eager chain
adding a bool mask, scores or attention weights used outside the chain, operands that are not
q [B,Hq,S,Dqk], k [B,Hkv,T,Dqk], v [B,Hkv,T,Dv], indices [B,S,K] integer, index mask [B,S,T]
with (B, S, T) those of q and k, or q, k, v in a dtype the op does not compute (float64). The index-mask nodes are erased when nothing else uses them.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx as fx

import compiler.ops.absorbed_sparse_attention  # noqa: F401  (registers pulsar_dosa::absorbed_sparse_attention)
import compiler.ops.union_sparse_attention  # noqa: F401  (registers pulsar_dosa::sparse_attention)
from compiler.passes.base import Declined, PatternPass, near_miss
from compiler.passes.matcher import (SDPA_TARGETS, NearMiss, NotCandidate, arg, fold_repeat_kv, insert_call, is_unit,
                                     may_be_equal, normalize_dim, op_kind, same_size, scale_value, score_operands,
                                     single_use, softmax_dtype, softmax_of, tensor_meta, value)
from compiler.passes.matcher import LatentKV, NotLatent, latent_form, module_path
from compiler.policy import keeps_stock, latent_expansion_products, sparse_attention_form, stock_threshold
from runtime.union_attention import FLOAT_DTYPES

KIND = "sparse_attention"
OP = torch.ops.pulsar_dosa.sparse_attention.default
ABSORBED_OP = torch.ops.pulsar_dosa.absorbed_sparse_attention.default
_AND_TARGETS = (operator.and_, torch.logical_and, torch.bitwise_and)
_AND_METHODS = ("logical_and", "bitwise_and", "__and__")
_ONES_FUNCTIONS = (torch.ones, torch.ones_like)
_INDEX_DTYPES = (torch.int32, torch.int64)
_TOPK_OPS = ("pulsar_dosa::certified_topk", "pulsar_dosa::capture_topk")


@dataclass
class IndexMask:
    """``ones_bool.scatter(-1, indices, False).unsqueeze(1)``: its nodes and the indices operand."""

    indices: fx.Node
    nodes: list[fx.Node]
    operand_nodes: list[fx.Node]


@dataclass
class SparseMatch:
    """A proved-safe DSA attention: the op's operands and the nodes the op replaces."""

    anchor: fx.Node
    q: fx.Node
    k: fx.Node
    v: fx.Node
    indices: fx.Node
    mask: Optional[fx.Node]
    scale: float | fx.Node
    divide: bool
    masked_rows: str
    variant: str
    interior: list[fx.Node]
    operand_nodes: list[fx.Node] = field(default_factory=list)
    latent: Optional[LatentKV] = None
    """k and v as kv_b_proj's expansion of a latent (None: not recognised, ``not_latent`` says why)."""
    not_latent: str = ""
    distinct: bool = False
    """The indices come from a top-K: no row repeats a key."""


def _is_and(node: Any) -> bool:
    if not isinstance(node, fx.Node):
        return False
    return (node.op == "call_function" and node.target in _AND_TARGETS) or \
        (node.op == "call_method" and node.target in _AND_METHODS)


def _all_true_bool(node: Any) -> bool:
    """A freshly built all-True bool tensor: ``x.new_ones(..., dtype=bool)``, ``torch.ones(...,
    dtype=bool)``, ``ones_like(..., dtype=bool)``, ``full``/``new_full`` with True."""
    meta = tensor_meta(node)
    if meta is None or meta.dtype != torch.bool:
        return False
    if node.op == "call_method" and node.target == "new_ones":
        return True
    if node.op == "call_function" and node.target in _ONES_FUNCTIONS:
        return True
    if node.op == "call_method" and node.target == "new_full":
        return arg(node, 2, "fill_value") in (True, 1)
    if node.op == "call_function" and node.target is torch.full:
        return arg(node, 1, "fill_value") in (True, 1)
    return False


def _integer_source(node: Any) -> tuple[Any, list[fx.Node]]:
    """``x`` for ``x.long()`` / ``x.to(torch.int64)`` of an int32/int64 ``x`` (value-preserving), else ``node``."""
    if isinstance(node, fx.Node) and op_kind(node) == "cast" and isinstance(node.args[0], fx.Node):
        src, out = tensor_meta(node.args[0]), tensor_meta(node)
        if src is not None and out is not None and out.dtype == torch.int64 and src.device == out.device \
                and src.dtype in _INDEX_DTYPES:
            return node.args[0], [node]
    return node, []


def from_topk(indices: Any) -> bool:
    """Whether ``indices`` are the indices of a top-K (``topk(...)[1]`` or the certified top-K op's),
    through integer casts: then no row repeats a key (the keys are below 2^31, so a cast to int32
    keeps them distinct)."""
    while isinstance(indices, fx.Node) and (op_kind(indices) == "cast" or (
            indices.op == "call_method" and indices.target in ("long", "int"))):
        meta = tensor_meta(indices)
        if meta is None or meta.dtype not in _INDEX_DTYPES:
            return False
        indices = indices.args[0]
    if not (isinstance(indices, fx.Node) and indices.op == "call_function" and indices.target is operator.getitem
            and indices.args[1] == 1 and isinstance(indices.args[0], fx.Node)):
        return False
    source = indices.args[0]
    if op_kind(source) == "topk":
        return True
    name = getattr(getattr(source.target, "_schema", None), "name", None)
    return source.op == "call_function" and name in _TOPK_OPS


def index_mask_of(node: Any) -> Optional[IndexMask]:
    """The index mask ``node`` is (a ``[B,1,S,T]`` unsqueeze of a scatter of indices into all-True), or None."""
    if not isinstance(node, fx.Node) or op_kind(node) != "unsqueeze" or normalize_dim(arg(node, 1, "dim"), 4) != 1:
        return None
    scatter = node.args[0]
    if not isinstance(scatter, fx.Node) or not (
            (scatter.op == "call_method" and scatter.target == "scatter")
            or (scatter.op == "call_function" and scatter.target is torch.scatter)):
        return None
    base, dim = arg(scatter, 0, "input"), arg(scatter, 1, "dim")
    index, fill = arg(scatter, 2, "index"), arg(scatter, 3, "value")
    if not _all_true_bool(base) or fill not in (False, 0) or isinstance(fill, float) \
            or normalize_dim(dim, 3) != 2 or not isinstance(index, fx.Node):
        return None
    indices, casts = _integer_source(index)
    return IndexMask(indices, [node, scatter, base], casts)


@dataclass
class _Combined:
    """The combined mask C split into the model mask M (None: none), the index mask and C's own nodes."""

    model_mask: Optional[fx.Node]
    index: IndexMask
    nodes: list[fx.Node]
    additive: bool


def combined_mask(mask: Any) -> _Combined:
    """Read C (module docstring); NotCandidate when it is not built from an index mask."""
    if not isinstance(mask, fx.Node):
        raise NotCandidate
    if op_kind(mask) == "invert":
        found = index_mask_of(mask.args[0])
        if found is None:
            raise NotCandidate
        return _Combined(None, found, [mask], additive=False)
    if _is_and(mask) and len(mask.args) == 2:
        for side, other in (mask.args, mask.args[::-1]):
            if isinstance(side, fx.Node) and op_kind(side) == "invert":
                found = index_mask_of(side.args[0])
                if found is not None:
                    return _Combined(other, found, [mask, side], additive=False)
        raise NotCandidate
    if op_kind(mask) == "masked_fill":
        found = index_mask_of(arg(mask, 1, "mask"))
        if found is None:
            raise NotCandidate
        return _Combined(arg(mask, 0, "input"), found, [mask], additive=True)
    raise NotCandidate


def _is_zero(x: Any) -> bool:
    """0 as a Python number, ``torch.zeros(...)`` or a 0-dim ``torch.tensor(0.0)`` (transformers 5.17's
    ``where(mask, torch.tensor(0.0), min)``)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return x == 0
    if not (isinstance(x, fx.Node) and x.op == "call_function"):
        return False
    if x.target is torch.zeros:
        return True
    data = arg(x, 0, "data")
    return x.target is torch.tensor and isinstance(data, (int, float)) and not isinstance(data, bool) and data == 0


def _bool_source_of_additive(additive: Any, fill: Any) -> fx.Node:
    """M for F = ``where(M, 0, finfo(F.dtype).min)`` masked with ``fill`` = finfo(F.dtype).min; else NearMiss."""
    meta = tensor_meta(additive)
    if meta is None or not meta.is_floating_point():
        raise NearMiss("the mask the index mask is filled into is not a floating tensor")
    lowest = torch.finfo(meta.dtype).min
    if not (isinstance(fill, float) and fill == lowest):
        raise NearMiss(f"index mask filled with {fill!r}, expected torch.finfo({meta.dtype}).min")
    if not (isinstance(additive, fx.Node) and additive.op == "call_function" and additive.target is torch.where
            and len(additive.args) == 3):
        raise NearMiss("additive attention mask is not where(bool, 0, finfo.min): its values are unknown")
    cond, hit, miss = additive.args
    if not (_is_zero(hit) and isinstance(miss, float) and miss == lowest and tensor_meta(cond) is not None
            and tensor_meta(cond).dtype == torch.bool):
        raise NearMiss("additive attention mask is not where(bool, 0, finfo.min): its values are unknown")
    return cond


@dataclass
class _Attention:
    """The attention around the anchor: operands, scale and the chain nodes that die with it."""

    q: Any
    k: Any
    v: Any
    mask: Any
    scale: Optional[float | fx.Node]
    divide: bool
    form: str
    folded: bool
    chain: list[fx.Node]


def sdpa_attention(node: fx.Node) -> _Attention:
    """An SDPA call's operands (positional or keyword); NearMiss for dropout, is_causal, a tensor scale."""
    q, k, v = arg(node, 0, "query"), arg(node, 1, "key"), arg(node, 2, "value")
    mask = arg(node, 3, "attn_mask")
    if mask is None:
        raise NotCandidate
    dropout = arg(node, 4, "dropout_p", 0.0)
    is_causal = arg(node, 5, "is_causal", False)
    scale = arg(node, 6, "scale")
    if not (isinstance(dropout, (int, float)) and dropout == 0):
        raise NearMiss(f"dropout_p={dropout} may be active")
    if is_causal is not False:
        raise NearMiss(f"is_causal={is_causal} with an index mask")
    if scale is not None:
        scale = scale_value(scale)
    k, v, folded, repeats = fold_repeat_kv(k, v)
    single_use(repeats)
    return _Attention(q, k, v, mask, scale, False, "sdpa", folded, repeats)


def _softmax_above(node: Any) -> Optional[fx.Node]:
    """The softmax feeding ``node`` through casts, copies and dropout (of any rate), or None."""
    while isinstance(node, fx.Node):
        if op_kind(node) == "softmax":
            return node
        if op_kind(node) not in ("cast", "contiguous", "clone") and not (
                node.op == "call_function" and node.target is torch.nn.functional.dropout):
            return None
        node = node.args[0]
    return None


def eager_attention(anchor: fx.Node) -> _Attention:
    """``matmul(softmax(matmul(q, kᵀ) (*|/) c + C), v)``; NotCandidate unless a softmax of scores
    plus a mask built from indices feeds the matmul."""
    probs, v = anchor.args[0], anchor.args[1]
    softmax = _softmax_above(probs)
    added = softmax.args[0] if softmax is not None else None
    if not isinstance(added, fx.Node) or op_kind(added) != "add" or len(added.args) != 2:
        raise NotCandidate
    scores, mask = added.args
    if op_kind(scores) not in ("mul", "div", "matmul"):
        scores, mask = mask, scores
    combined_mask(mask)  # NotCandidate unless the added mask is built from indices
    _, chain = softmax_of(probs)  # NearMiss for dropout that may be active
    chain += [softmax, added]
    if normalize_dim(arg(softmax, 1, "dim"), 4) != 3:
        raise NearMiss(f"softmax over dim {arg(softmax, 1, 'dim')}, not the key dim")
    dtype = softmax_dtype(softmax)
    if dtype not in (None, torch.float32):
        raise NearMiss(f"softmax in dtype {dtype}")
    q, k, v, scale, divide, folded, repeats = score_operands(scores, v, chain, "matmul(q, kᵀ) [scaled] + mask")
    return _Attention(q, k, v, mask, scale, divide, "eager", folded, chain + repeats)


def check_operands(att: _Attention, index: IndexMask, model_mask: Optional[fx.Node], out: fx.Node) -> None:
    """q [B,Hq,S,Dqk], k [B,Hkv,T,Dqk], v [B,Hkv,T,Dv], indices [B,S,K], index mask and M sized to them.
    The key length of v and of the masks need only not be provably different from k's: the graph
    contracts and broadcasts them against it (``may_be_equal``)."""
    metas = [tensor_meta(x) for x in (att.q, att.k, att.v)]
    if any(m is None or m.dim() != 4 for m in metas):
        raise NearMiss("q, k and v must be 4-D [B, H, S, D] tensors")
    mq, mk, mv = metas
    b, hq, s, dqk = mq.shape
    hkv, t = mk.shape[1], mk.shape[2]
    if not (same_size(mk.shape[0], b) and same_size(mv.shape[0], b) and same_size(mk.shape[3], dqk)
            and same_size(mv.shape[1], hkv) and may_be_equal(mv.shape[2], t)):
        raise NearMiss(f"q {tuple(mq.shape)}, k {tuple(mk.shape)}, v {tuple(mv.shape)} are not "
                       "[B,Hq,S,Dqk], [B,Hkv,T,Dqk], [B,Hkv,T,Dv]")
    if not (isinstance(hq, int) and isinstance(hkv, int) and hkv > 0 and hq % hkv == 0):
        raise NearMiss("query heads are not a static multiple of key/value heads")
    if att.scale is None and not isinstance(dqk, int):
        raise NearMiss("SDPA's default scale needs a static head dim")
    mi = tensor_meta(index.indices)
    if mi is None or mi.dim() != 3 or mi.dtype not in _INDEX_DTYPES \
            or not (same_size(mi.shape[0], b) and same_size(mi.shape[1], s)):
        raise NearMiss(f"indices must be an int32/int64 [B,S,K] tensor for q {tuple(mq.shape)}")
    ones = tensor_meta(index.nodes[2])
    if ones.dim() != 3 or not (same_size(ones.shape[0], b) and same_size(ones.shape[1], s)
                               and may_be_equal(ones.shape[2], t)):
        raise NearMiss(f"index mask {tuple(ones.shape)} is not [B,S,T] of q and k")
    if model_mask is not None:
        mm = tensor_meta(model_mask)
        if mm is None or mm.dtype != torch.bool or mm.dim() != 4 or not is_unit(mm.shape[1]) \
                or not (is_unit(mm.shape[0]) or same_size(mm.shape[0], b)) \
                or not (is_unit(mm.shape[2]) or same_size(mm.shape[2], s)) or not may_be_equal(mm.shape[3], t):
            raise NearMiss("the model's mask is not a bool tensor broadcastable to [B,1,S,T]")
    if tensor_meta(out).dtype != mq.dtype or mk.dtype != mq.dtype or mv.dtype != mq.dtype:
        raise NearMiss("q, k, v and the attention output differ in dtype")
    if mq.dtype not in FLOAT_DTYPES:
        raise NearMiss(f"q, k, v in {mq.dtype}: the op computes bfloat16, float16 or float32")


def match_sparse(anchor: fx.Node) -> SparseMatch:
    """Match the DSA attention ending at ``anchor``; raises NotCandidate or NearMiss."""
    if anchor.op == "call_function" and anchor.target in SDPA_TARGETS:
        att = sdpa_attention(anchor)
    else:
        att = eager_attention(anchor)
    combined = combined_mask(att.mask)
    model_mask = combined.model_mask
    if combined.additive:
        model_mask = _bool_source_of_additive(model_mask, arg(combined.nodes[0], 2, "value"))
        masked_rows = "mean"
    elif att.form == "eager":
        raise NearMiss("the eager chain adds a bool mask to the scores")
    else:
        masked_rows = "zero"
    check_operands(att, combined.index, model_mask, anchor)
    scale = att.scale if att.scale is not None else tensor_meta(att.q).shape[3] ** -0.5
    mask_kind = "index_only" if model_mask is None else "additive_mask" if combined.additive else "bool_mask"
    variant = f"{att.form}+{mask_kind}" + ("+gqa" if att.folded else "")
    latent, not_latent = None, ""
    try:
        if att.folded:
            raise NotLatent("the keys and values are repeated over query heads (GQA)")
        latent = latent_form(att.k, att.v, tensor_meta(att.q).shape[1], {anchor, *att.chain})
    except NotLatent as why:
        not_latent = str(why)
    return SparseMatch(anchor, att.q, att.k, att.v, combined.index.indices, model_mask, scale, att.divide, masked_rows,
                       variant, att.chain + combined.nodes + combined.index.nodes,
                       combined.index.operand_nodes, latent, not_latent, from_topk(combined.index.indices))


def _latent_dims(latent: LatentKV, heads: int) -> tuple[int, int, int, int]:
    """``(Dc, Dn, Dr, Dv)`` of a latent form with ``heads`` query heads."""
    rows = tensor_meta(latent.weight).shape[0]
    return (tensor_meta(latent.latent).shape[-1], latent.nope_dim, tensor_meta(latent.rope_key).shape[-1],
            rows // heads - latent.nope_dim)


def _latent_rows(graph: fx.Graph, node: fx.Node, like: fx.Node) -> fx.Node:
    """``node`` as ``[B, T, D]``: a ``[B, 1, T, D]`` tensor loses its dim 1."""
    if tensor_meta(node).dim() == 3:
        return node
    return insert_call(graph, "call_function", torch.squeeze, (node, 1), like=like)


def rewrite(graph: fx.Graph, match: SparseMatch, form: str) -> fx.Node:
    """Insert the op of ``form`` before the anchor and return it (the runner reroutes and erases; the
    absorbed form adds the key/value expansion to the nodes that die)."""
    with graph.inserting_before(match.anchor):
        scale = match.scale
        if match.divide:
            scale = 1.0 / scale if not isinstance(scale, fx.Node) else \
                insert_call(graph, "call_function", operator.truediv, (1.0, scale), like=match.anchor)
        if form == "union":
            return insert_call(graph, "call_function", OP,
                               (match.q, match.k, match.v, match.indices, match.mask, scale, match.masked_rows),
                               like=match.anchor)
        latent = match.latent
        rows = [_latent_rows(graph, x, match.anchor) for x in (latent.latent, latent.rope_key)]
        op = insert_call(graph, "call_function", ABSORBED_OP,
                         (match.q, *rows, latent.weight, match.indices, match.mask, scale, match.masked_rows,
                          match.distinct, form, module_path(match.anchor)), like=match.anchor)
    match.interior = match.interior + latent.nodes
    return op


class SparseAttentionPass(PatternPass):
    """Anchors: every SDPA call and every matmul (the eager chain's ``softmax @ v``)."""

    kind = KIND

    def anchors(self, graph):
        return [n for n in graph.nodes
                if (n.op == "call_function" and n.target in SDPA_TARGETS) or op_kind(n) == "matmul"]

    def match(self, anchor, analysis):
        return match_sparse(anchor)

    def settings(self, ctx, match):
        """``(form, reason)``: the form of ``policy.sparse_attention_form``, the union form where k and
        v are not a latent's expansion (a near miss says why when the absorbed form would have run);
        Declined (``policy.keeps_stock``) when the stock subgraph is too small for the op's per-call
        host cost: B*Hq*S*T query-key-head products, and where the op reads the latent the stock
        subgraph expands, B*Hq*T*E more for that expansion (``policy.latent_expansion_products``)."""
        q, k = value(match.q), value(match.k)
        form, reason = sparse_attention_form(ctx.options.sparse_form, q.shape[1], q.shape[2], ctx.cuda_graphs)
        b, heads, queries, keys = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        products, what = b * heads * queries * keys, "B*S*T*H"
        if form != "union" and match.latent is not None:
            per_key = latent_expansion_products(*_latent_dims(match.latent, heads))
            products, what = products + b * heads * keys * per_key, f"B*H*T*(S + {per_key}: the latent's expansion)"
        threshold = stock_threshold(ctx.options, KIND, q.device.type, ctx.cuda_graphs)
        why = keeps_stock(threshold, products, what)
        if why is not None:
            raise Declined(why)
        if form != "union" and match.latent is None:
            near_miss(ctx, KIND, match.anchor, f"absorbed form not taken: {match.not_latent}")
            return "union", f"absorbed form not taken: {match.not_latent}"
        return form, reason

    def rewrite(self, ctx, match, settings):
        return rewrite(ctx.gm.graph, match, settings[0])

    def describe(self, match, settings, op):
        form, reason = settings
        operands = (("q", match.q), ("k", match.k), ("v", match.v), ("indices", match.indices))
        if form != "union":
            operands = (("q", match.q), ("latent", match.latent.latent), ("rope_key", match.latent.rope_key),
                        ("kv_b_weight", match.latent.weight), ("indices", match.indices))
        shapes = {name: value(x).shape for name, x in operands}
        if match.mask is not None:
            shapes["mask"] = value(match.mask).shape
        variant = match.variant + ("+absorbed" if form != "union" else "")
        return dict(variant=variant, shapes=shapes, path=form, masked_rows=match.masked_rows,
                    topk=str(value(match.indices).shape[2]), form_reason=reason, distinct_indices=match.distinct)

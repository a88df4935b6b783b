"""The attention pass: a model's attention -> ``pulsar_dosa.attention`` (follows the Pulsar layout).

Two spellings on the Dynamo graph, each with GQA ``repeat_kv`` on k and v folded into ``enable_gqa``
(``matcher.fold_repeat_kv``):

    sdpa     F.scaled_dot_product_attention(q, k, v, attn_mask?, dropout_p=0, is_causal, scale?, enable_gqa)
    eager    matmul(softmax(matmul(q, kᵀ) (*|/) c [+ mask], dim=-1[, dtype=float32]) [.to] [dropout p=0], v)

with kᵀ any spelling of ``k.transpose(-2, -1)`` and c a finite non-zero Python number or a symbolic
float (``matcher.scale_value``: ``dynamic=True`` traces a module's float as one; the op takes it as
it is). Variant: the op form (``compiler.ops.attention.TRACED_FORMS``), ``+gqa``, ``+mask``. A matched
chain is closed (every interior node feeds only the next one). Near misses: dropout that may be
active, a tensor scale, a softmax over another dim or dtype, operands that are not 4-D [B, H, S, D],
k and v of different shapes. An attention whose mask depends on a top-K (a DSA layer's selection) is not
a candidate: it is the sparse-attention family's, and Pulsar layouts do not run DSA models."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx as fx

from compiler.ops.attention import SDPA_FORM
from compiler.passes.base import PatternPass
from compiler.passes.matcher import (SDPA_TARGETS, NearMiss, NotCandidate, arg, fold_repeat_kv, insert_call,
                                     may_be_equal, normalize_dim, op_kind, op_targets, same_size, scale_value,
                                     score_operands, single_use, softmax_dtype, softmax_of, tensor_meta)

KIND = "attention"
OP = torch.ops.pulsar_dosa.attention.default
_SELECTIONS = op_targets(torch.ops.pulsar_dosa.certified_topk, torch.ops.pulsar_dosa.capture_topk)
"""The indexer ops that stand in for a DSA layer's top-K once its pass rewrote it."""


@dataclass
class AttentionMatch:
    """A safe attention subgraph: what replaces ``anchor`` and which nodes die with it."""

    anchor: fx.Node
    q: fx.Node
    k: fx.Node
    v: fx.Node
    mask: Optional[fx.Node]
    is_causal: bool
    scale: Optional[float | fx.Node]
    enable_gqa: bool
    form: str
    interior: list[fx.Node]
    operand_nodes: list[fx.Node] = field(default_factory=list)

    @property
    def variant(self) -> str:
        return self.form + ("+gqa" if self.enable_gqa else "") + ("+mask" if self.mask is not None else "")


def check_operands(q: Any, k: Any, v: Any) -> None:
    """q, k, v 4-D [B, H, S, D] tensors, k and v not provably of different shapes (equality of
    symbolic lengths is checked when the op runs), heads of q a static multiple of k's."""
    metas = [tensor_meta(x) for x in (q, k, v)]
    if any(m is None or m.dim() != 4 for m in metas):
        raise NearMiss("q, k and v must be 4-D [B, H, S, D] tensors")
    mq, mk, mv = metas
    if not all(may_be_equal(a, b) for a, b in zip(mk.shape, mv.shape)):
        raise NearMiss(f"k and v have different shapes {tuple(mk.shape)} and {tuple(mv.shape)}")
    if not same_size(mq.shape[3], mk.shape[3]) or not same_size(mq.shape[0], mk.shape[0]):
        raise NearMiss("q and k differ in batch or head dim")
    hq, hkv = mq.shape[1], mk.shape[1]
    if not (isinstance(hq, int) and isinstance(hkv, int) and hkv > 0 and hq % hkv == 0):
        raise NearMiss("query heads are not a static multiple of key/value heads")


def _not_a_selection(mask: Any, selected: set) -> None:
    """NotCandidate when the mask depends on a top-K (``selected``: ``AttentionPass.analyse``)."""
    if mask is not None and mask in selected:
        raise NotCandidate


def match_sdpa(node: fx.Node, selected: set = frozenset()) -> AttentionMatch:
    """``F.scaled_dot_product_attention`` with inactive dropout -> the op in sdpa form (arguments
    given positionally or by keyword); NotCandidate when its mask is in ``selected``."""
    q, k, v = arg(node, 0, "query"), arg(node, 1, "key"), arg(node, 2, "value")
    mask = arg(node, 3, "attn_mask")
    _not_a_selection(mask, selected)
    dropout = arg(node, 4, "dropout_p", 0.0)
    is_causal = arg(node, 5, "is_causal", False)
    scale = arg(node, 6, "scale")
    enable_gqa = node.kwargs.get("enable_gqa", False)
    if not (isinstance(dropout, (int, float)) and dropout == 0):
        raise NearMiss(f"dropout_p={dropout} may be active")
    if not isinstance(is_causal, bool) or not isinstance(enable_gqa, bool):
        raise NearMiss("is_causal/enable_gqa are not constants")
    if scale is not None:
        scale = scale_value(scale)
    k, v, folded, repeats = fold_repeat_kv(k, v)
    single_use(repeats)
    check_operands(q, k, v)
    return AttentionMatch(node, q, k, v, mask, is_causal, scale, enable_gqa or folded, SDPA_FORM, repeats)


def match_eager(anchor: fx.Node, selected: set = frozenset()) -> Optional[AttentionMatch]:
    """``matmul(softmax(...), v)`` -> the op in an eager form; None when no softmax feeds it;
    NotCandidate when its added mask is in ``selected``."""
    probs, v = anchor.args[0], anchor.args[1]
    softmax, chain = softmax_of(probs)
    if softmax is None:
        return None
    dim = arg(softmax, 1, "dim")
    dtype = softmax_dtype(softmax)
    if normalize_dim(dim, 4) != 3:
        raise NearMiss(f"softmax over dim {dim}, not the key dim")
    scores = softmax.args[0]
    chain.append(softmax)
    mask = None
    if op_kind(scores) == "add":
        left, right = scores.args[0], scores.args[1]
        chain.append(scores)
        scores, mask = (left, right) if op_kind(left) in ("mul", "div", "matmul") else (right, left)
        if not isinstance(mask, fx.Node):
            raise NearMiss("the added mask is not a tensor")
        _not_a_selection(mask, selected)
    q, k, v_src, scale, divides, folded, repeats = score_operands(scores, v, chain,
                                                                  "matmul(q, kᵀ) [scaled] [+ mask]")
    check_operands(q, k, v_src)
    q_meta = tensor_meta(q)
    if dtype not in (None, torch.float32):
        raise NearMiss(f"softmax in dtype {dtype}")
    if dtype is None and q_meta.dtype != torch.float32 and tensor_meta(softmax).dtype != q_meta.dtype:
        raise NearMiss("softmax output dtype differs from q's")
    if any(tensor_meta(n).dtype != q_meta.dtype for n in chain if op_kind(n) == "cast") \
            or tensor_meta(probs).dtype != q_meta.dtype:
        raise NearMiss("attention weights are not cast back to q's dtype")
    form = ("eager_div" if divides else "eager_mul") + ("_softmax_fp32" if dtype is torch.float32 else "")
    return AttentionMatch(anchor, q, k, v_src, mask, False, scale, folded, form, chain + repeats)


def rewrite(graph: fx.Graph, match: AttentionMatch) -> fx.Node:
    """Insert the op before the anchor and return it (the pass runner reroutes and erases the chain)."""
    with graph.inserting_before(match.anchor):
        return insert_call(graph, "call_function", OP,
                           (match.q, match.k, match.v, match.mask, match.is_causal, match.scale,
                            match.enable_gqa, match.form), like=match.anchor)


class AttentionPass(PatternPass):
    """Anchors: every SDPA call and every matmul (``matmul(softmax, v)`` candidates)."""

    kind = KIND

    def anchors(self, graph):
        return [n for n in graph.nodes if (n.op == "call_function" and n.target in SDPA_TARGETS)
                or op_kind(n) == "matmul"]

    def analyse(self, graph, anchors):
        """The nodes that depend on a top-K (forward closure of every ``topk`` and indexer op)."""
        selected, frontier = set(), [n for n in graph.nodes if op_kind(n) == "topk" or n.target in _SELECTIONS]
        while frontier:
            node = frontier.pop()
            if node not in selected:
                selected.add(node)
                frontier.extend(node.users)
        return selected

    def match(self, node, analysis):
        if node.op == "call_function" and node.target in SDPA_TARGETS:
            return match_sdpa(node, analysis)
        found = match_eager(node, analysis)
        if found is None:
            raise NotCandidate
        return found

    def rewrite(self, ctx, match, settings):
        return rewrite(ctx.gm.graph, match)

    def describe(self, match, settings, op):
        shapes = {name: tensor_meta(x).shape for name, x in (("q", match.q), ("k", match.k), ("v", match.v))}
        if match.mask is not None:
            shapes["mask"] = tensor_meta(match.mask).shape
        return dict(variant=match.variant, shapes=shapes, path="pulsar_layout", form=match.form)

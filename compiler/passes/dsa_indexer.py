"""The DSA indexer pass: ``topk(mask(Σ_h w_h·relu(scale·q_h·k)))`` -> ``pulsar_dosa.certified_topk``.

Anchored on every ``topk``, the matcher walks producers through layout-preserving ops (SPEC A.1):

    topk(x, kk, dim=last, largest=True)                        [then getitem .values/.indices]
    mask step      x = s + mask | s.masked_fill(cond, -inf | finfo(float32).min) | s
    head weighting matmul(W[B,S,1,H], P) | sum(P * W[B,S,H,1], dim=2) | einsum(W[b,s,h], P[b,s,h,t])
    scales, relu   [(*|/) c] relu | clamp_min(., 0) | clamp(., min=0) [(*|/) c]
    q·k            matmul(Q[B,S,H,D], K[B,1,D,T]) | einsum(bshd,btd->bsht) | view(bmm(Q[B,S*H,D], K[B,D,T]))

Scales fold into the weights (c > 0) or q, or split into sign and magnitude (exact in real
arithmetic); bf16/fp16 q and k reach the op without their upcast. The op selects the exact top-K
as its scorer evaluates the function in fp32: the graph's selection unless keys tie, or lie within
BLAS rounding, at the kk-th place. A
topk without a head contraction (a router) is not a candidate; escaping intermediates or unusable
operands make a near miss; a call too small for the op (``policy.keeps_stock``) is declined."""
from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

import torch
import torch.fx as fx

import compiler.ops.capture_topk  # noqa: F401  (registers pulsar_dosa::capture_topk)
import compiler.ops.certified_topk  # noqa: F401  (registers pulsar_dosa::certified_topk)
from compiler.passes.base import Declined, PatternPass
from compiler.passes.matcher import (NearMiss, NotCandidate, arg, escaping_nodes, insert_call, is_scalar, is_unit,
                                     module_path, normalize_dim, op_kind, post_dominators, same_shape, same_size,
                                     is_layout_preserving, skip_layout_preserving, tensor_meta, value)
from compiler.policy import indexer_settings, keeps_stock, stock_threshold

KIND = "dsa_indexer"
LOWEST_FP32 = torch.finfo(torch.float32).min


class MaskVariant(enum.Enum):
    NONE = "no_mask"
    ADD = "mask_add"
    FILL = "mask_fill"


class HeadVariant(enum.Enum):
    MATMUL = "heads_matmul"
    MUL_SUM = "heads_mul_sum"
    EINSUM = "heads_einsum"


class ScaleVariant(enum.Enum):
    NONE = "no_scale"
    PRE_RELU = "scale_pre_relu"
    POST_RELU = "scale_post_relu"
    BOTH = "scale_pre_and_post_relu"


class QkVariant(enum.Enum):
    MATMUL = "qk_matmul"
    EINSUM = "qk_einsum"
    BMM = "qk_bmm"


def variant_name(qk: QkVariant, scale: ScaleVariant, heads: HeadVariant, mask: MaskVariant) -> str:
    return "+".join(v.value for v in (qk, scale, heads, mask))


PATTERN_VARIANTS = tuple(variant_name(*v) for v in
                         ((qk, sc, hw, mk) for qk in QkVariant for sc in ScaleVariant
                          for hw in HeadVariant for mk in MaskVariant))


@dataclasses.dataclass
class Operand:
    """A graph value and the methods (name, args) to apply to bring it to the op's layout.

    ``replay``: layout-preserving nodes of the original graph re-applied to ``node``, in order,
    before ``fix`` (an operand narrowed past an upcast, ``narrow_upcast_operands``)."""

    node: fx.Node
    fix: list[tuple[str, tuple]] = dataclasses.field(default_factory=list)
    replay: list[fx.Node] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Scale:
    """A scalar factor folded into ``target`` by ``op`` ("mul" or "div"): "q", "weights", or "signed"
    (a pre-relu factor c split as ``relu(c·x) = |c|·relu(sign(c)·x)``: sign(c), -1, 0 or 1, into q,
    exact in any dtype; |c| into the weights)."""

    target: str
    op: str
    factor: Any


@dataclasses.dataclass
class IndexerMatch:
    """A proved-safe match: the op's operands (with layout fixes and folded scales), the interior
    nodes the op replaces, and the operand-side nodes that may become dead afterwards."""

    anchor: fx.Node
    module: str
    topk: Any
    q: Operand
    k: Operand
    weights: Operand
    mask: fx.Node | None
    invert_mask: bool
    expand_mask: bool
    scales: list[Scale]
    interior: list[fx.Node]
    operand_nodes: list[fx.Node]
    variant: str


# ---------------------------------------------------------------------------------------------
# step checks (each returns what it recognised or raises NotCandidate / NearMiss)


def _meta(node: Any, what: str) -> torch.Tensor:
    t = tensor_meta(node)
    if t is None:
        raise NearMiss(f"{what} has no traced tensor value")
    return t


def _shape(t: torch.Tensor) -> str:
    return "[" + ",".join(str(s) for s in t.shape) + "]"


def _head_contraction(node: Any) -> HeadVariant | None:
    """The head-weighting spelling ``node`` could be (ranks only), else None."""
    if not isinstance(node, fx.Node):
        return None
    kind = op_kind(node)
    if kind == "matmul":
        a, b = (tensor_meta(x) for x in node.args[:2])
        return HeadVariant.MATMUL if a is not None and b is not None and a.dim() == 4 and b.dim() == 4 else None
    if kind == "einsum":
        ranks = sorted(t.dim() for t in (tensor_meta(x) for x in _einsum_operands(node)) if t is not None)
        return HeadVariant.EINSUM if ranks == [3, 4] else None
    if kind == "sum":
        src, _ = skip_layout_preserving(node.args[0])
        if isinstance(src, fx.Node) and op_kind(src) == "mul":
            ranks = [t.dim() for t in (tensor_meta(x) for x in src.args[:2]) if t is not None]
            return HeadVariant.MUL_SUM if 4 in ranks else None
    return None


def _einsum_operands(node: fx.Node) -> list[Any]:
    ops = list(node.args[1:])
    if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
        ops = list(ops[0])
    return ops


def _einsum_labels(node: fx.Node) -> tuple[list[str], str]:
    eq = node.args[0]
    if not isinstance(eq, str) or "->" not in eq or "..." in eq:
        raise NearMiss(f"einsum equation {eq!r}: expected explicit labels with '->' and no ellipsis")
    lhs, out = eq.replace(" ", "").split("->")
    return lhs.split(","), out


def check_mask_step(x: fx.Node, m: "_Builder") -> fx.Node:
    """Recognise the mask step above the topk input; returns the head-weighting output node."""
    src = m.skip(x)
    kind = op_kind(src)
    if kind == "cast" and _head_contraction(skip_layout_preserving(src.args[0])[0]) is not None:
        raise NearMiss(f"cast of the scores from {_meta(src.args[0], 'scores').dtype} to {_meta(src, 'scores').dtype} "
                       "before topk changes their order")
    if kind == "add" and "alpha" not in src.kwargs and len(src.args) == 2:
        a, b = src.args
        sides = [(c, other) for c, other in ((a, b), (b, a))
                 if isinstance(c, fx.Node) and _head_contraction(skip_layout_preserving(c)[0]) is not None]
        if not sides:
            raise NotCandidate
        chain, mask = sides[0]
        if not isinstance(mask, fx.Node) or _meta(mask, "mask").dtype == torch.bool \
                or not _meta(mask, "mask").is_floating_point():
            raise NearMiss("additive mask is not a floating tensor")
        m.interior.append(src)
        m.mask, m.mask_variant = mask, MaskVariant.ADD
        return m.skip(chain)
    if kind == "masked_fill":
        chain, cond, fill = arg(src, 0, "input"), arg(src, 1, "mask"), arg(src, 2, "value")
        if _head_contraction(skip_layout_preserving(chain)[0]) is None:
            raise NotCandidate
        if not (isinstance(fill, float) and fill in (-math.inf, LOWEST_FP32)):
            raise NearMiss(f"masked_fill with value {fill!r}, expected -inf or torch.finfo(torch.float32).min")
        m.fill_is_lowest = fill == LOWEST_FP32
        if not isinstance(cond, fx.Node) or _meta(cond, "mask").dtype != torch.bool:
            raise NearMiss("masked_fill condition is not a bool tensor")
        m.interior.append(src)
        m.mask_variant = MaskVariant.FILL
        if op_kind(cond) == "invert" and _meta(cond.args[0], "mask").dtype == torch.bool:
            m.mask, m.operand_nodes = cond.args[0], m.operand_nodes + [cond]
        else:
            m.mask, m.invert_mask = cond, True
        return m.skip(chain)
    if _head_contraction(src) is None:
        raise NotCandidate
    return src


def check_anchor(anchor: fx.Node, x: fx.Node, hw_out: fx.Node, m: "_Builder") -> Any:
    """topk over the last (key) dim of a float32 [B,S,T], largest, results used by index; returns kk."""
    xt = _meta(x, "topk input")
    if xt.dim() != 3:
        raise NearMiss(f"topk input is {_shape(xt)}, expected [B,S,T]")
    dim = normalize_dim(arg(anchor, 2, "dim", -1), 3)
    if dim != 2:
        raise NearMiss(f"topk over dim {arg(anchor, 2, 'dim', -1)}, expected the key dim (last)")
    if arg(anchor, 3, "largest", True) is not True:
        raise NearMiss("topk with largest=False selects the smallest scores")
    if xt.dtype != torch.float32:
        raise NearMiss(f"topk input is {xt.dtype}, expected float32 scores")
    if not same_size(xt.shape[2], _meta(hw_out, "head weighting output").shape[-1]):
        raise NearMiss("topk dim is not the key dim of the head-weighting output")
    for user in anchor.users:
        if op_kind(user) != "getitem" or user.args[1] not in (0, 1):
            raise NearMiss("topk result used other than through .values/.indices")
        if m.fill_is_lowest and user.args[1] == 0:
            raise NearMiss("masked_fill with finfo(float32).min and the values used: the op reports -inf there")
    if m.mask is not None:
        mt = _meta(m.mask, "mask")
        m.expand_mask = not same_shape(mt.shape, xt.shape)
        trailing = xt.shape[3 - mt.dim():] if mt.dim() <= 3 else ()
        if mt.dim() > 3 or not all(is_unit(a) or same_size(a, b) for a, b in zip(mt.shape, trailing)):
            raise NearMiss(f"mask is {_shape(mt)}, expected the scores' shape {_shape(xt)} or one broadcast to it")
    return arg(anchor, 1, "k")


def check_head_weighting(hw: fx.Node, m: "_Builder") -> fx.Node:
    """Recognise the head weighting; sets m.weights and returns the per-head scores node P [B,S,H,T]."""
    variant = _head_contraction(hw)
    m.head_variant = variant
    m.interior.append(hw)
    out = _meta(hw, "head weighting output")
    if out.dtype != torch.float32:
        raise NearMiss(f"head-weighted scores are {out.dtype}, expected float32")
    if variant is HeadVariant.MATMUL:
        w4, p = hw.args[:2]
        wt, pt = _meta(w4, "weights"), _meta(p, "scores")
        if not (is_unit(wt.shape[2]) and same_shape(wt.shape[:2], pt.shape[:2]) and same_size(wt.shape[3], pt.shape[2])):
            raise NearMiss(f"head-weighting matmul {_shape(wt)} @ {_shape(pt)}, expected [B,S,1,H] @ [B,S,H,T]")
        m.weights = Operand(w4, [("squeeze", (2,))])
        return p
    if variant is HeadVariant.MUL_SUM:
        dims = arg(hw, 1, "dim")
        dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
        if "dtype" in hw.kwargs or len(dims) != 1:
            raise NearMiss(f"sum over dims {dims}, expected the head dim 2 only")
        prod, skipped = skip_layout_preserving(hw.args[0])
        m.interior += skipped + [prod]
        a, b = prod.args[:2]
        pairs = [(p, w) for p, w in ((a, b), (b, a)) if isinstance(p, fx.Node) and isinstance(w, fx.Node)
                 and _meta(p, "scores").dim() == 4 and _meta(w, "weights").dim() == 4 and is_unit(value(w).shape[3])
                 and not is_unit(value(p).shape[3])]
        if not pairs:
            raise NearMiss("head-weighting product is not [B,S,H,T] * [B,S,H,1]")
        p, w4 = pairs[0]
        pt, wt = value(p), value(w4)
        if not same_shape(wt.shape[:3], pt.shape[:3]):
            raise NearMiss(f"head-weighting product {_shape(pt)} * {_shape(wt)}, expected [B,S,H,T] * [B,S,H,1]")
        d = normalize_dim(dims[0], 4)
        if d != 2:
            raise NearMiss(f"sum over dim {dims[0]}, expected the head dim 2 of [B,S,H,T]")
        m.weights = Operand(w4, [("squeeze", (3,))])
        return p
    (sw, sp), out_labels = _einsum_labels(hw)
    ops = _einsum_operands(hw)
    if len(sw) == 4:
        (sw, sp), ops = (sp, sw), ops[::-1]
    w, p = ops
    b, s, h, t = sp
    if out_labels != b + s + t or sorted(sw) != sorted(b + s + h) or len(set(sp)) != 4:
        raise NearMiss(f"head-weighting einsum {hw.args[0]!r} does not sum the scores' dim 2 against [B,S,H] weights")
    perm = tuple(sw.index(c) for c in b + s + h)
    m.weights = Operand(w, [] if perm == (0, 1, 2) else [("permute", (perm,))])
    return p


def _scale(node: fx.Node) -> tuple[fx.Node, str, Any] | None:
    """(tensor operand, 'mul'|'div', scalar) when ``node`` multiplies or divides by a scalar."""
    kind = op_kind(node)
    if kind not in ("mul", "div") or len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    if kind == "mul" and is_scalar(a) and isinstance(b, fx.Node) and not is_scalar(b):
        return b, "mul", a
    if is_scalar(b) and isinstance(a, fx.Node) and not is_scalar(a):
        return a, kind, b
    return None


def _is_positive_constant(c: Any) -> bool:
    return isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0 and math.isfinite(c)


def check_relu_and_scales(p: fx.Node, m: "_Builder") -> fx.Node:
    """Recognise [post scale] relu [pre scale] above P; returns the q·k contraction node."""
    node = m.skip(p)
    post = _scale(node)
    if post is not None:
        m.interior.append(node)
        m.scales.append(Scale("weights", post[1], post[2]))
        node = m.skip(post[0])
    kind = op_kind(node)
    if kind == "softmax":
        raise NearMiss("softmax instead of relu on the per-head scores")
    if kind in ("matmul", "einsum", "bmm") or (kind == "reshape" and op_kind(m.skip_quiet(node.args[0])) == "bmm"):
        raise NearMiss("no relu between the q·k contraction and the head weighting")
    is_relu = (kind == "relu" and not arg(node, 1, "inplace", False)) \
        or (kind == "clamp_min" and arg(node, 1, "min") == 0) \
        or (kind == "clamp" and arg(node, 1, "min") == 0 and arg(node, 2, "max") is None)
    if not is_relu:
        raise NearMiss(f"{kind or node.target} instead of relu on the per-head scores")
    m.interior.append(node)
    node = m.skip(node.args[0])
    pre = _scale(node)
    if pre is not None:
        m.interior.append(node)
        target = "weights" if _is_positive_constant(pre[2]) else "q"
        m.scales.append(Scale(target, pre[1], pre[2]))
        node = m.skip(pre[0])
    m.scale_variant = {(False, False): ScaleVariant.NONE, (True, False): ScaleVariant.PRE_RELU,
                       (False, True): ScaleVariant.POST_RELU, (True, True): ScaleVariant.BOTH}[
        (pre is not None, post is not None)]
    return node


def check_qk(node: fx.Node, m: "_Builder") -> None:
    """Recognise the q·k contraction producing [B,S,H,T] fp32; sets m.q and m.k."""
    out = _meta(node, "q·k scores")
    if out.dim() != 4 or out.dtype != torch.float32:
        raise NearMiss(f"q·k scores are {_shape(out)} {out.dtype}, expected [B,S,H,T] float32")
    kind = op_kind(node)
    m.interior.append(node)
    if kind == "matmul":
        q, k4 = node.args[:2]
        qt, kt = _meta(q, "q"), _meta(k4, "k")
        if not (qt.dim() == 4 and kt.dim() == 4 and is_unit(kt.shape[1]) and same_size(qt.shape[0], kt.shape[0])
                and same_size(qt.shape[3], kt.shape[2])):
            raise NearMiss(f"q·k matmul {_shape(qt)} @ {_shape(kt)}, expected [B,S,H,D] @ [B,1,D,T]")
        m.qk_variant, m.q, m.k = QkVariant.MATMUL, Operand(q), Operand(k4, [("squeeze", (1,)), ("transpose", (1, 2))])
        return
    if kind == "einsum":
        (la, lb), lo = _einsum_labels(node)
        a, b = _einsum_operands(node)
        if len(la) == 3:
            (la, lb), (a, b) = (lb, la), (b, a)
        if len(la) != 4 or len(lb) != 3 or len(lo) != 4 or len(set(lo)) != 4:
            raise NearMiss(f"q·k einsum {node.args[0]!r}: expected q [b,s,h,d], k [b,t,d] -> [b,s,h,t]")
        bb, s, h, t = lo
        d = set(la) & set(lb) - set(lo)
        if len(d) != 1 or sorted(la) != sorted(bb + s + h + "".join(d)) or sorted(lb) != sorted(bb + t + "".join(d)):
            raise NearMiss(f"q·k einsum {node.args[0]!r}: expected q [b,s,h,d], k [b,t,d] -> [b,s,h,t]")
        (d,) = d
        qperm = tuple(la.index(c) for c in bb + s + h + d)
        kperm = tuple(lb.index(c) for c in bb + t + d)
        m.qk_variant = QkVariant.EINSUM
        m.q = Operand(a, [] if qperm == (0, 1, 2, 3) else [("permute", (qperm,))])
        m.k = Operand(b, [] if kperm == (0, 1, 2) else [("permute", (kperm,))])
        return
    if kind == "reshape":
        bmm = m.skip(node.args[0])
        if op_kind(bmm) == "bmm":
            m.interior.append(bmm)
            a3, k3 = bmm.args[:2]
            q4 = m.skip_quiet(a3)
            a3t, k3t = _meta(a3, "q"), _meta(k3, "k")
            if op_kind(q4) == "reshape":
                q = q4.args[0]
                qt = _meta(q, "q")
                if (qt.dim() == 4 and same_shape(qt.shape[:3], out.shape[:3]) and same_size(qt.shape[3], a3t.shape[2])
                        and same_size(a3t.shape[1], out.shape[1] * out.shape[2]) and same_size(k3t.shape[1], qt.shape[3])
                        and same_size(k3t.shape[0], qt.shape[0])):
                    m.qk_variant, m.q, m.k = QkVariant.BMM, Operand(q), Operand(k3, [("transpose", (1, 2))])
                    m.operand_nodes.append(a3)
                    return
            raise NearMiss(f"q·k bmm {_shape(a3t)} @ {_shape(k3t)} is not q [B,S,H,D] reshaped to [B,S*H,D] times k [B,D,T]")
    raise NearMiss(f"{kind or node.target} where the q·k contraction was expected")


class _Builder:
    """Mutable state of one match while the steps run."""

    def __init__(self) -> None:
        self.interior: list[fx.Node] = []
        self.operand_nodes: list[fx.Node] = []
        self.mask: fx.Node | None = None
        self.invert_mask = False
        self.expand_mask = False
        self.fill_is_lowest = False
        self.mask_variant = MaskVariant.NONE
        self.head_variant: HeadVariant | None = None
        self.scale_variant = ScaleVariant.NONE
        self.qk_variant: QkVariant | None = None
        self.scales: list[Scale] = []
        self.weights: Operand | None = None
        self.q: Operand | None = None
        self.k: Operand | None = None

    def skip(self, node: Any) -> Any:
        src, skipped = skip_layout_preserving(node)
        self.interior += skipped
        return src

    @staticmethod
    def skip_quiet(node: Any) -> Any:
        return skip_layout_preserving(node)[0]


def match_indexer(anchor: fx.Node, pdom: dict) -> IndexerMatch:
    """Match the indexer chain ending at ``anchor`` (a topk); raises NotCandidate or NearMiss."""
    m = _Builder()
    m.interior.append(anchor)
    x = arg(anchor, 0, "input")
    if not isinstance(x, fx.Node):
        raise NotCandidate
    hw = check_mask_step(x, m)
    kk = check_anchor(anchor, x, hw, m)
    p = check_head_weighting(hw, m)
    qk = check_relu_and_scales(p, m)
    check_qk(qk, m)
    check_operands(m)
    narrow_upcast_operands(m)
    escaping = escaping_nodes(pdom, m.interior, anchor)
    if escaping:
        raise NearMiss(f"intermediate {escaping[0].name} is used outside the matched region")
    return IndexerMatch(anchor, module_path(anchor), kk, m.q, m.k, m.weights, m.mask, m.invert_mask, m.expand_mask,
                        m.scales,
                        m.interior, m.operand_nodes + [m.q.node, m.k.node, m.weights.node],
                        variant_name(m.qk_variant, m.scale_variant, m.head_variant, m.mask_variant))


def check_operands(m: _Builder) -> None:
    """q, k, weights as laid out for the op are [B,S,H,D], [B,T,D], [B,S,H], floating."""
    q, k, w = (_fixed_shape(o) for o in (m.q, m.k, m.weights))
    ok = (len(q) == 4 and len(k) == 3 and len(w) == 3 and same_size(q[0], k[0]) and same_size(q[3], k[2])
          and same_shape(w, q[:3]))
    if not ok:
        raise NearMiss(f"operands q {list(q)}, k {list(k)}, weights {list(w)} are not [B,S,H,D], [B,T,D], [B,S,H]")
    for name, o in (("q", m.q), ("k", m.k), ("weights", m.weights)):
        if not value(o.node).is_floating_point():
            raise NearMiss(f"{name} is {value(o.node).dtype}, expected a floating dtype")


NARROW_DTYPES = (torch.bfloat16, torch.float16)
"""Operand dtypes the op takes as they are, on tensor cores (fp32 accumulation of exact products)."""


def narrow_upcast_operands(m: _Builder) -> None:
    """Hand the op q and k in their original bf16/fp16 dtype when the pattern only upcast them
    (``.float()`` / ``.to(torch.float32)`` among layout-preserving ops, as transformers' indexers
    do): the products of two bf16 (fp16) values are exact in fp32, so fp32-accumulated scoring of
    the originals computes the same real function, without an fp32 operand path. Both operands
    must narrow to one dtype. A scale folded into q would be rounded in the narrow dtype: a finite
    constant or a traced scalar (Dynamo passes a module's float as one under dynamic shapes; its
    sign is unknown when compiling) is split instead ("signed" in ``Scale``), exact whenever the
    factor applied (c, or 1/c for a division) is finite (else the scores are non-finite in both
    forms, not necessarily equal); with any other scale the operands stay as matched."""
    if any(s.target == "q" and not _splits_exactly(s.factor) for s in m.scales):
        return
    narrowed = [_narrowed(o) for o in (m.q, m.k)]
    if None in narrowed or value(narrowed[0].node).dtype != value(narrowed[1].node).dtype:
        return
    m.operand_nodes += [m.q.node, m.k.node]  # the upcast chains: erased when left unused
    m.q, m.k = narrowed
    m.scales = [Scale("signed", s.op, s.factor) if s.target == "q" else s for s in m.scales]


def _splits_exactly(c: Any) -> bool:
    """Whether a scale folded into q may be split into sign and magnitude: a finite constant, or a
    traced scalar (a node)."""
    return isinstance(c, fx.Node) or (isinstance(c, (int, float)) and math.isfinite(c))


def _narrowed(o: Operand) -> Operand | None:
    """``o`` read from the bf16/fp16 tensor below its widening casts, or None."""
    src, skipped = skip_layout_preserving(o.node)
    t = tensor_meta(src)
    if t is None or t.dtype not in NARROW_DTYPES or not any(op_kind(n) == "cast" for n in skipped):
        return None
    return Operand(src, o.fix, [n for n in reversed(skipped) if op_kind(n) != "cast"])


def _fixed_shape(o: Operand) -> tuple:
    shape = list(value(o.replay[-1] if o.replay else o.node).shape)
    for method, args in o.fix:
        if method == "squeeze":
            shape.pop(args[0])
        elif method == "transpose":
            shape[args[0]], shape[args[1]] = shape[args[1]], shape[args[0]]
        elif method == "permute":
            shape = [shape[i] for i in args[0]]
    return tuple(shape)


# ---------------------------------------------------------------------------------------------
# rewrite


def _fold_signed(graph: fx.Graph, q: fx.Node, w: fx.Node, c: Any, target: Any,
                 like: fx.Node) -> tuple[fx.Node, fx.Node]:
    """(q·sign(c), w ``target`` |c|) for a "signed" scale c (sign(c) in {-1, 0, 1}: exact in q's dtype;
    c = 0 zeroes both, as it zeroes the model's scores)."""
    if not isinstance(c, fx.Node):
        return (insert_call(graph, "call_function", torch.mul, (q, math.copysign(1.0, c) if c else 0.0), like=like),
                insert_call(graph, "call_function", target, (w, abs(c)), like=like))
    if tensor_meta(c) is None:  # a traced Python scalar: as a 0-dim fp32 tensor
        c = insert_call(graph, "call_function", torch.full, ((), c), {"dtype": torch.float32}, like=like)
    sign = insert_call(graph, "call_function", torch.sign, (c,), like=like)
    magnitude = insert_call(graph, "call_function", torch.abs, (c,), like=like)
    return (insert_call(graph, "call_function", torch.mul, (q, sign), like=like),
            insert_call(graph, "call_function", target, (w, magnitude), like=like))


def _emit(graph: fx.Graph, operand: Operand, like: fx.Node) -> fx.Node:
    node = operand.node
    for step in operand.replay:
        node = insert_call(graph, step.op, step.target, (node, *step.args[1:]), dict(step.kwargs), like=like)
    for method, args in operand.fix:
        node = insert_call(graph, "call_method", method, (node, *args), like=like)
    return node


def _indexer_op(options):
    """certified_topk, or with ``options.capture`` the plan's recording twin capture_topk (same schema)."""
    return torch.ops.pulsar_dosa.capture_topk.default if options.capture else torch.ops.pulsar_dosa.certified_topk.default


_CACHE_VIEW_KINDS = ("cast", "contiguous", "clone", "detach", "unsqueeze", "squeeze", "transpose", "permute")
"""Ops between an FP8 cache's keys and the indexer's product that ``cached_fp8_keys`` follows."""


def _dim_args(node: fx.Node) -> tuple:
    """The dim arguments of a dim-moving call, positional or by keyword (``_moved_dims``'s ``args``)."""
    kind = op_kind(node)
    if kind in ("unsqueeze", "squeeze"):
        return tuple(d for d in (arg(node, 1, "dim"),) if d is not None)
    if kind == "transpose":
        return arg(node, 1, "dim0"), arg(node, 2, "dim1")
    if kind == "permute":
        return tuple(node.args[1:]) or (node.kwargs.get("dims"),)
    return ()


def _moved_dims(dims: list, kind: str, args: tuple) -> list | None:
    """The source dims (labels) a tensor of ``dims`` holds after ``kind(*args)``, or None where the
    step is not a dim move this follows (a squeeze of a non-unit dim, a dim out of range)."""
    rank = len(dims)
    if kind in ("cast", "contiguous", "clone", "detach"):
        return dims
    if kind == "unsqueeze" and len(args) == 1:
        d = normalize_dim(args[0], rank + 1)
        return None if d is None else dims[:d] + [None] + dims[d:]
    if kind == "squeeze" and len(args) == 1:
        d = normalize_dim(args[0], rank)
        return None if d is None or dims[d] is not None else dims[:d] + dims[d + 1:]
    if kind == "transpose" and len(args) == 2:
        a, b = (normalize_dim(x, rank) for x in args)
        if a is None or b is None:
            return None
        out = list(dims)
        out[a], out[b] = out[b], out[a]
        return out
    if kind == "permute" and args:
        order = list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)
        order = [normalize_dim(x, rank) for x in order]
        return None if None in order or sorted(order) != list(range(rank)) else [dims[x] for x in order]
    return None


def cached_fp8_keys(o: Operand, precision: str) -> tuple[fx.Node, fx.Node] | None:
    """(the E4M3 keys [B, T, D], their scales) when the k operand ``o`` is, element for element, an
    FP8 indexer key cache of ``precision`` (``pulsar_dosa::fp8_cached_keys``, ``compiler.fp8_indexer_cache``)
    read through value-preserving casts and dim moves that ``o``'s own steps undo; else None."""
    chain, node = [], o.node
    while (isinstance(node, fx.Node) and op_kind(node) in _CACHE_VIEW_KINDS
           and (op_kind(node) != "cast" or is_layout_preserving(node))):
        chain.append(node)
        node = node.args[0]
    if not (isinstance(node, fx.Node) and op_kind(node) == "fp8_cached_keys" and arg(node, 2, "precision") == precision):
        return None
    dims = ["B", "T", "D"]
    steps = [(op_kind(n), _dim_args(n)) for n in [*reversed(chain), *o.replay]] + list(o.fix)
    for kind, args in steps:
        dims = None if dims is None else _moved_dims(dims, kind, args)
    return (arg(node, 0, "keys"), arg(node, 1, "scales")) if dims == ["B", "T", "D"] else None


def rewrite(graph: fx.Graph, match: IndexerMatch, options, settings) -> fx.Node:
    """Insert one certified_topk call for the matched region before its anchor (``settings``: its plan
    arguments); returns the op node (the pass runner reroutes the anchor's users and erases the region).
    Keys from an FP8 indexer cache of the compiled precision go to the op as they are cached, with
    their scales (``cached_fp8_keys``)."""
    anchor = match.anchor
    cached = None if options.indexer_precision == "bf16" else cached_fp8_keys(match.k, options.indexer_precision)
    with graph.inserting_before(anchor):
        q, k, w = (_emit(graph, o, anchor) for o in (match.q, match.k if cached is None else Operand(cached[0]),
                                                      match.weights))
        for scale in match.scales:
            target = {"mul": torch.mul, "div": torch.div}[scale.op]
            if scale.target == "signed":
                q, w = _fold_signed(graph, q, w, scale.factor, target, anchor)
            elif scale.target == "q":
                q = insert_call(graph, "call_function", target, (q, scale.factor), like=anchor)
            else:
                w = insert_call(graph, "call_function", target, (w, scale.factor), like=anchor)
        mask = match.mask
        if mask is not None and match.invert_mask:
            mask = insert_call(graph, "call_function", torch.logical_not, (mask,), like=anchor)
        if mask is not None and match.expand_mask:
            sizes = [insert_call(graph, "call_method", "size", (node, dim), like=anchor)
                     for node, dim in ((q, 0), (q, 1), (k, 1))]
            mask = insert_call(graph, "call_method", "expand", (mask, *sizes), like=anchor)
        precision = {} if options.indexer_precision == "bf16" else {"precision": options.indexer_precision}
        if cached is not None:
            precision["k_scale"] = cached[1]
        op = insert_call(graph, "call_function", _indexer_op(options), (q, k, w, match.topk, mask),
                         {"layer": match.module, **settings.topk.op_arguments(), "record_stats": options.record_stats,
                          **precision}, like=anchor)
    return op


class IndexerPass(PatternPass):
    """Every topk of the graph is an anchor; the matches share the graph's post-dominators."""

    kind = KIND

    def anchors(self, graph):
        return [n for n in graph.nodes if op_kind(n) == "topk"]

    def analyse(self, graph, anchors):
        return post_dominators(graph) if anchors else {}

    def match(self, anchor, pdom):
        return match_indexer(anchor, pdom)

    def settings(self, ctx, match):
        q_shape, device_type = _fixed_shape(match.q), value(match.q.node).device.type
        settings = indexer_settings(ctx.options, match.module, q_shape, value(match.topk), device_type)
        threshold = stock_threshold(ctx.options, KIND, device_type, ctx.cuda_graphs)
        why = keeps_stock(threshold, q_shape[0] * q_shape[1] * _fixed_shape(match.k)[1] * q_shape[2])
        if why is not None:
            raise Declined(why)
        return settings

    def rewrite(self, ctx, match, settings):
        return rewrite(ctx.gm.graph, match, ctx.options, settings)

    def describe(self, match, settings, op):
        q, k, w = (value(a) for a in op.args[:3])
        shapes = {"q": q.shape, "k": k.shape, "weights": w.shape}
        if op.args[4] is not None:
            shapes["mask"] = value(op.args[4]).shape
        return dict(variant=match.variant, shapes=shapes, topk=str(value(match.topk)),
                    precision=op.kwargs.get("precision", "bf16"), fp8_key_cache=op.kwargs.get("k_scale") is not None,
                    **settings.report_fields())

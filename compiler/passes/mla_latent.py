"""Recognise multi-head latent attention's key/value expansion on a Dynamo graph: the latent rows
and the weight an absorbed attention needs instead of the expanded keys and values.

transformers' MLA layers (``DeepseekV32Attention.expand_kv``, ``GlmMoeDsaAttention.expand_kv``, and
the inline form of earlier releases) build per-head keys and values from the latent ``c``
(``[B, 1, T, Dc]`` or ``[B, T, Dc]``, after ``kv_a_layernorm`` and the cache) and the rope key
``kr`` (``[B, 1, T, Dr]``):

    kv    = linear(c, W).view(B, T, H, Dn+Dv).transpose(1, 2)        W [H·(Dn+Dv), Dc], no bias
    k_nope, v = split(kv, [Dn, Dv], dim=-1)                           (or kv[..., :Dn], kv[..., Dn:])
    k     = cat((k_nope, kr.expand(B, H, T, Dr)), dim=-1)
          | k = kv.new_empty(B, H, T, Dn+Dr); k[..., :Dn].copy_(k_nope); k[..., Dn:].copy_(kr[.expand])

:func:`latent_form` returns the latent, the rope key and W for such k and v, or raises
:class:`NotLatent` with the reason. Shapes are read from ``node.meta`` without adding guards. The
expansion nodes are returned so that they die with the attention; in the ``new_empty`` form the
two copies are erased too, so the key buffer must have no other reader (checked: its users are
the two slices, each copied into once, the attention and size queries).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx as fx

from compiler.passes.matcher import arg, is_unit, non_unit, normalize_dim, op_kind, same_shape, same_size, tensor_meta

_LINEAR_TARGETS = (torch._C._nn.linear, torch.nn.functional.linear)
_SPLIT_TARGETS = (torch.split, torch.functional.split)
_SIZE_TARGETS = (torch.ops.aten.sym_size.int, torch.ops.aten.sym_size)


class NotLatent(Exception):
    """k and v are not recognised as an MLA expansion of a latent; the message says why."""


@dataclass
class LatentKV:
    """What an absorbed attention reads instead of the expanded k and v."""

    latent: fx.Node
    """The linear's input, ``[B, 1, T, Dc]`` or ``[B, T, Dc]``."""
    rope_key: fx.Node
    """The rope key before its head expand, ``[B, 1, T, Dr]``."""
    weight: fx.Node
    """kv_b_proj's weight ``[H·(Dn+Dv), Dc]``, the node the linear reads."""
    nope_dim: int
    nodes: list[fx.Node]
    """The expansion's nodes (they die with the attention when nothing else reads them)."""


def _last_dim_part(node: Any) -> Optional[tuple[fx.Node, Any, Any, list[fx.Node]]]:
    """``(x, start, stop, nodes)`` when ``node`` is ``split(x, sizes, -1)[i]`` or ``x[..., start:stop]``
    (stop None: to the end), else None."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is operator.getitem):
        return None
    base, index = node.args
    if not isinstance(base, fx.Node):
        return None
    is_split = (base.op == "call_function" and base.target in _SPLIT_TARGETS) or \
        (base.op == "call_method" and base.target == "split")
    if is_split and isinstance(index, int):
        source, dim = base.args[0], arg(base, 2, "dim", 0)
        sizes = arg(base, 1, "split_size" if base.op == "call_method" else "split_size_or_sections")
        meta = tensor_meta(source)
        if not isinstance(sizes, (list, tuple)) or meta is None or normalize_dim(dim, meta.dim()) != meta.dim() - 1:
            return None
        start = sum(sizes[:index])
        return source, start, start + sizes[index], [node, base]
    if isinstance(index, tuple) and len(index) == 2 and index[0] is Ellipsis and isinstance(index[1], slice) \
            and index[1].step in (None, 1):
        return base, index[1].start or 0, index[1].stop, [node]
    return None


def _expanded_kv(kv: Any, batch: Any, heads: int, keys: Any) -> tuple[fx.Node, fx.Node, int, list[fx.Node]]:
    """``(latent, W, Dn+Dv, nodes)`` for ``kv = linear(latent, W).view(B, T, H, Dn+Dv).transpose(1, 2)``."""
    if not (isinstance(kv, fx.Node) and op_kind(kv) == "transpose"
            and {normalize_dim(kv.args[1], 4), normalize_dim(kv.args[2], 4)} == {1, 2}):
        raise NotLatent("the expanded key/value is not a transpose(1, 2) of per-head rows")
    view = kv.args[0]
    if not (isinstance(view, fx.Node) and op_kind(view) == "reshape"):
        raise NotLatent("the per-head rows are not a view of a projection")
    linear = view.args[0]
    if not (isinstance(linear, fx.Node) and linear.op == "call_function" and linear.target in _LINEAR_TARGETS):
        raise NotLatent("the per-head rows do not come from a linear projection (kv_b_proj)")
    latent, weight, bias = arg(linear, 0, "input"), arg(linear, 1, "weight"), arg(linear, 2, "bias")
    if bias is not None:
        raise NotLatent("kv_b_proj has a bias")
    ml, mw, mp, mv = (tensor_meta(x) for x in (latent, weight, linear, view))
    if any(m is None for m in (ml, mw, mp, mv)) or mw.dim() != 2 or mv.dim() != 4 or ml.dim() not in (3, 4):
        raise NotLatent("the projection's input, weight or output is not a tensor of the expected rank")
    if ml.dim() == 4 and not is_unit(ml.shape[1]):
        raise NotLatent(f"the latent {tuple(ml.shape)} is not [B, 1, T, Dc]")
    width = mv.shape[3]
    if not (isinstance(width, int) and same_size(mv.shape[2], heads) and same_size(mp.shape[-1], heads * width)
            and same_size(mv.shape[0], batch) and same_size(mv.shape[1], keys)
            and same_shape(non_unit(mp.shape[:-1]), non_unit(mv.shape[:2]))):
        raise NotLatent(f"the projection's output {tuple(mp.shape)} is not viewed as [B, T={keys}, H={heads}, "
                        f"Dn+Dv] ({tuple(mv.shape)})")
    return latent, weight, width, [kv, view, linear]


def _rope_source(node: Any, batch: Any, keys: Any) -> tuple[fx.Node, list[fx.Node]]:
    """``(kr, nodes)`` for ``kr.expand(B, H, T, Dr)`` (or ``kr`` itself) with kr ``[B, 1, T, Dr]``."""
    nodes = []
    if isinstance(node, fx.Node) and op_kind(node) == "expand":
        nodes, node = [node], node.args[0]
    meta = tensor_meta(node)
    if meta is None or meta.dim() != 4 or not is_unit(meta.shape[1]) or not same_size(meta.shape[0], batch) \
            or not same_size(meta.shape[2], keys):
        raise NotLatent("the rope part of the key is not one [B, 1, T, Dr] rope key expanded over the heads")
    return node, nodes


def _is_size_query(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target in _SIZE_TARGETS) or \
        (node.op == "call_method" and node.target == "size")


def _key_parts(k: fx.Node, nope_dim: int, readers: set[fx.Node]) -> tuple[Any, Any, list[fx.Node]]:
    """``(k_nope, rope, nodes)``: the two last-dim parts k is assembled from (cat or new_empty +
    copies); ``readers``: the attention's nodes that may read k."""
    if k.op == "call_function" and k.target is torch.cat:
        parts, dim = arg(k, 0, "tensors"), arg(k, 1, "dim", 0)
        if normalize_dim(dim, 4) != 3 or not isinstance(parts, (list, tuple)) or len(parts) != 2:
            raise NotLatent("the key is a concatenation, but not of two parts along the last dim")
        return parts[0], parts[1], [k]
    if not (k.op == "call_method" and k.target == "new_empty"):
        raise NotLatent("the key is neither cat((k_nope, k_rope), -1) nor a new_empty buffer filled by copies")
    filled: dict[tuple[Any, Any], Any] = {}
    nodes = [k]
    for user in k.users:
        if user in readers or _is_size_query(user):
            continue
        part = _last_dim_part(user)
        writers = list(user.users)
        if part is None or len(writers) != 1 or not (writers[0].op == "call_method" and writers[0].target == "copy_"
                                                      and writers[0].args[0] is user and not writers[0].users):
            raise NotLatent(f"the key buffer is read or written by {user.name} besides its two copies")
        filled[(part[1], part[2])] = writers[0].args[1]
        nodes += [user, writers[0]]
    total = tensor_meta(k).shape[3]
    nope = filled.pop((0, nope_dim), None)
    rope = filled.pop((nope_dim, None), None)
    rope = filled.pop((nope_dim, total), None) if rope is None else rope
    if nope is None or rope is None or filled:
        raise NotLatent(f"the key buffer is not filled by exactly [..., :{nope_dim}] and [..., {nope_dim}:]")
    return nope, rope, nodes


def latent_form(k: Any, v: Any, heads: int, readers: set[fx.Node]) -> LatentKV:
    """The latent form of the attention's k ``[B, H, T, Dn+Dr]`` and v ``[B, H, T, Dv]``; NotLatent
    with the reason when they are not transformers' expansion of one latent (module docstring).
    ``readers``: the attention's nodes that read k (the SDPA call, the eager chain's transpose)."""
    mk = tensor_meta(k)
    if mk is None or mk.dim() != 4 or not isinstance(k, fx.Node):
        raise NotLatent("the key is not a 4-D tensor node")
    batch = mk.shape[0]
    found = _last_dim_part(v)
    if found is None:
        raise NotLatent("the value is not the last-dim part of an expanded projection (split or slice)")
    kv, v_start, v_stop, v_nodes = found
    latent, weight, width, kv_nodes = _expanded_kv(kv, batch, heads, mk.shape[2])
    if not isinstance(v_start, int) or v_stop not in (None, width) or not 0 < v_start < width:
        raise NotLatent(f"the value is columns [{v_start}, {v_stop}) of the {width} per-head rows, not their tail")
    nope_dim = v_start
    k_nope, rope, k_nodes = _key_parts(k, nope_dim, readers)
    nope_part = _last_dim_part(k_nope)
    if nope_part is None or nope_part[0] is not kv or nope_part[1] != 0 or nope_part[2] != nope_dim:
        raise NotLatent(f"the key's first {nope_dim} columns are not the head of the value's projection")
    rope_key, rope_nodes = _rope_source(rope, batch, mk.shape[2])
    mr = tensor_meta(rope_key)
    if not same_size(mk.shape[3], nope_dim + mr.shape[3]):
        raise NotLatent(f"the key's last dim {mk.shape[3]} is not {nope_dim} + the rope key's {mr.shape[3]}")
    if len({tensor_meta(x).dtype for x in (k, v, latent, rope_key, weight)}) != 1:
        raise NotLatent("the latent, the rope key, kv_b_proj's weight and the expanded key/value differ in dtype")
    nodes = list(dict.fromkeys(v_nodes + nope_part[3] + k_nodes + rope_nodes + kv_nodes))
    return LatentKV(latent, rope_key, weight, nope_dim, nodes)

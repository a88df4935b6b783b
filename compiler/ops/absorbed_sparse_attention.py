"""``torch.ops.pulsar_dosa.absorbed_sparse_attention``: DSA attention of an MLA layer over the
indexer's selected keys, in the absorbed form (the keys and values stay latent rows).

Schema: ``absorbed_sparse_attention(Tensor q, Tensor latent, Tensor rope_key, Tensor kv_b_weight,
Tensor indices, Tensor? mask, Scalar scale, str masked_rows, bool distinct, str form, str site) -> Tensor``
(``Scalar``, as ``pulsar_dosa.sparse_attention``'s, so that ``True`` is refused, not read as 1.0). q
``[B, H, S, Dn+Dr]``, latent ``[B, T, Dc]``, rope_key ``[B, T, Dr]``, kv_b_weight
``[H·(Dn+Dv), Dc]`` (the weight of ``kv_b_proj``, read at every call), indices ``[B, S, K]``
int32/int64, mask None or bool (True = visible) broadcastable to ``[B, 1, S, T]``,
``masked_rows`` "zero" or "mean". Returns o ``[B, H, S, Dv]`` in q's dtype: the semantics of
``runtime.absorbed_attention`` (equal to ``pulsar_dosa.sparse_attention`` on the keys and values
``kv_b_proj`` expands, to rounding). ``distinct`` = True promises that no row repeats an in-range
index (indices from a top-K): the CUDA kernel then skips the per-row sort that removes repeats.
``form``: "absorbed", or "auto" (CUDA picks the absorbed or the union form per call from how the
selections overlap, ``compiler.ops.sparse_form``; same result to rounding); ``site`` names the call
site (the attention module) whose measurements its "auto" calls share.

Every kernel, the fake one included, first checks that every tensor is on q's device
(``runtime.absorbed_attention.check_absorbed_devices``: a meta tensor among real ones would
otherwise be answered with uninitialised memory); the CPU and CUDA kernels then check the whole
contract and the workspace before any work.

The CPU kernel (and any device without its own) runs the plain-torch reference, which treats every
selection as a set; the CUDA kernel (``absorbed_sparse_attention_cuda``) decides the form of an
"auto" call (``compiler.ops.sparse_form.choose_form``), then runs it by
``compiler/lowering/attention/latent_attention.py`` (form "absorbed": no host synchronisation;
"auto": at most one per call, none while a CUDA graph is captured). The fake kernel supports
symbolic sizes. Under a
Pulsar layout the op raises, as ``pulsar_dosa.sparse_attention`` does, for the same reason.
"""
from __future__ import annotations

from typing import Optional

import torch

from compiler.ops.union_sparse_attention import _refuse_pulsar_layout
from runtime.union_attention import check_scale
from runtime.absorbed_attention import absorbed_sparse_attention as reference_absorbed_sparse_attention
from runtime.absorbed_attention import check_absorbed_devices, checked_absorbed_inputs


FORM_ARGUMENTS = ("absorbed", "auto")
"""What the op's ``form`` argument takes: "absorbed" (decided at compile time), or "auto" (decided per
call, ``compiler.ops.sparse_form``)."""


def check_form(form) -> None:
    """ValueError naming ``form`` unless it is one of FORM_ARGUMENTS."""
    if form not in FORM_ARGUMENTS:
        raise ValueError(f"form must be one of {list(FORM_ARGUMENTS)}, got {form!r}")


SCHEMA = ("(Tensor q, Tensor latent, Tensor rope_key, Tensor kv_b_weight, Tensor indices, Tensor? mask, Scalar scale, "
          "str masked_rows, bool distinct, str form, str site) -> Tensor")


@torch.library.custom_op("pulsar_dosa::absorbed_sparse_attention", mutates_args=(), schema=SCHEMA)
def absorbed_sparse_attention(q: torch.Tensor, latent: torch.Tensor, rope_key: torch.Tensor,
                              kv_b_weight: torch.Tensor, indices: torch.Tensor, mask: Optional[torch.Tensor],
                              scale: float, masked_rows: str, distinct: bool, form: str, site: str) -> torch.Tensor:
    """Absorbed sparse attention (module docstring), by the plain-torch reference."""
    check_form(form)
    _refuse_pulsar_layout()
    out, _ = reference_absorbed_sparse_attention(q, latent, rope_key, kv_b_weight, indices, mask, scale=scale,
                                                 masked_rows=masked_rows)
    return out


@absorbed_sparse_attention.register_kernel("cuda")
def absorbed_sparse_attention_cuda(q, latent, rope_key, kv_b_weight, indices, mask, scale, masked_rows, distinct,
                                   form, site):
    """The CUDA kernel (module docstring); on CPU tensors too under ``TRITON_INTERPRET=1``."""
    from compiler.lowering.attention.latent_attention import latent_sparse_attention
    from compiler.ops.sparse_form import choose_form

    check_form(form)
    _refuse_pulsar_layout()
    if form == "auto":
        checked_absorbed_inputs(q, latent, rope_key, kv_b_weight, indices, mask, scale, masked_rows)
        if q.numel() and latent.shape[1] and indices.shape[2]:
            form = choose_form(q, latent, rope_key, kv_b_weight, indices, mask, site)[0]
    return latent_sparse_attention(q, latent, rope_key, kv_b_weight, indices, mask, scale=scale,
                                   masked_rows=masked_rows, distinct=distinct, union=form == "union")


@absorbed_sparse_attention.register_fake
def _absorbed_sparse_attention_fake(q, latent, rope_key, kv_b_weight, indices, mask, scale, masked_rows, distinct,
                                    form, site):
    check_form(form)
    check_absorbed_devices(q, latent, rope_key, kv_b_weight, indices, mask)
    if not isinstance(scale, (torch.SymFloat, torch.SymInt)):
        check_scale(scale)
    if q.dim() != 4 or rope_key.dim() != 3 or kv_b_weight.dim() != 2:
        raise ValueError(f"q, rope_key, kv_b_weight: expected ranks 4, 3 and 2, got {q.dim()}, {rope_key.dim()} "
                         f"and {kv_b_weight.dim()}")
    v_dim = kv_b_weight.shape[0] // q.shape[1] - (q.shape[3] - rope_key.shape[2])
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v_dim))

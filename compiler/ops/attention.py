"""``torch.ops.pulsar_dosa.attention``: a model's attention that follows the active Pulsar layout.

Schema: ``attention(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, bool is_causal, float? scale,
bool enable_gqa, str form) -> Tensor``; q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D] (Hkv = Hq unless
``enable_gqa``); returns [B, Hq, Sq, D] in q's dtype, contiguous. With no active layout it
computes what the replaced code computed, with the same torch calls: ``form="sdpa"`` is
``F.scaled_dot_product_attention``; the ``EAGER_FORMS`` are ``softmax((q @ kᵀ) ∘ scale + attn_mask,
-1[, float32]).to(q.dtype) @ v`` with ``∘`` a product (``eager_mul*``) or a division
(``eager_div*``), the softmax in float32 for the ``*_softmax_fp32`` forms, k/v repeated per query
head when ``enable_gqa``. With an active layout the mask and ``is_causal`` are ignored and the
layout's ``attend`` computes it (``runtime.attention_layout``), with the effective scale.
Importing this module registers the CUDA two-interval kernel where triton is installed; without
triton the CPU paths run alone."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

try:
    import compiler.lowering.attention.two_interval_attention  # noqa: F401  (registers the CUDA two-interval kernel)
except ModuleNotFoundError as error:  # no triton (declared for Linux only): the CPU references run without it
    if error.name != "triton":
        raise
from runtime.attention_layout import active_layout
from runtime.union_attention import check_on_q_device

SDPA_FORM = "sdpa"
EAGER_FORMS = ("eager_mul", "eager_div", "eager_mul_softmax_fp32", "eager_div_softmax_fp32")
TRACED_FORMS = (SDPA_FORM, *EAGER_FORMS)
"""How the replaced attention was written, what ``form`` takes: SDPA, or one of the eager chains."""


def effective_scale(form: str, scale: Optional[float], head_dim: int) -> float:
    """The multiplier of q·k that the original attention applied."""
    if scale is None:
        return head_dim ** -0.5
    return 1.0 / scale if form.startswith("eager_div") else scale


def eager_attention(q, k, v, attn_mask, scale: float, enable_gqa: bool, form: str) -> torch.Tensor:
    """The eager chain, replayed op by op (see the module docstring)."""
    if enable_gqa:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1))
    scores = scores / scale if form.startswith("eager_div") else scores * scale
    if attn_mask is not None:
        scores = scores + attn_mask
    softmax_dtype = torch.float32 if form.endswith("softmax_fp32") else None
    probs = F.softmax(scores, dim=-1, dtype=softmax_dtype).to(q.dtype)
    return torch.matmul(probs, v)


@torch.library.custom_op("pulsar_dosa::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor],
              is_causal: bool, scale: Optional[float], enable_gqa: bool, form: str) -> torch.Tensor:
    """Layout-aware attention (module docstring)."""
    if form not in TRACED_FORMS:
        raise ValueError(f"form: expected one of {list(TRACED_FORMS)}, got {form!r}")
    if form != SDPA_FORM and scale is None:
        raise ValueError(f"scale: form {form!r} needs the chain's scale factor, got None")
    layout = active_layout()
    if layout is None:
        if form == SDPA_FORM:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=0.0,
                                                 is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        else:
            out = eager_attention(q, k, v, attn_mask, scale, enable_gqa, form)
    else:
        out = layout.attend(q, k, v, scale=effective_scale(form, scale, q.shape[-1]))
    # The fake kernel's strides (inductor checks them): SDPA may return a transposed layout.
    return out.contiguous()


@attention.register_fake
def _attention_fake(q, k, v, attn_mask, *_):
    """[B, Hq, Sq, Dv] in q's dtype, once k, v and attn_mask are on q's device (a meta tensor among
    real ones would otherwise be answered with uninitialised memory)."""
    check_on_q_device(q, (("k", k), ("v", v)), (("attn_mask", attn_mask),))
    return q.new_empty((*q.shape[:-1], v.shape[-1]))

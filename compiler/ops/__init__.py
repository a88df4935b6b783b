"""Custom ops (torch.library: schema, fake kernel, device dispatch), one file per op, and the
call-time path choice of the certified top-K (``guard``).

Importing this package registers ``torch.ops.pulsar_dosa.certified_topk``, ``capture_topk``,
``attention``, ``sparse_attention``, ``absorbed_sparse_attention``, ``conjunctive_mask`` (a DSA
layer's mask), the FP8 key cache's ``fp8_quantize_keys`` and ``fp8_cached_keys`` and the MLA
latent cache's ``latent_cached_kv``; their Triton kernels are in ``compiler/lowering/``.
"""
from compiler.ops.absorbed_sparse_attention import absorbed_sparse_attention
from compiler.ops.attention import attention
from compiler.ops.capture_topk import capture_topk
from compiler.ops.certified_topk import certified_topk
from compiler.ops.conjunctive_mask import conjunctive_mask
from compiler.ops.fp8_keys import fp8_cached_keys, fp8_quantize_keys
from compiler.ops.latent_kv import latent_cached_kv
from compiler.ops.union_sparse_attention import sparse_attention

__all__ = ["absorbed_sparse_attention", "attention", "capture_topk", "certified_topk", "conjunctive_mask",
           "fp8_cached_keys", "fp8_quantize_keys", "latent_cached_kv", "sparse_attention"]

"""Custom ops (torch.library: schema, fake kernel, device dispatch), one file per op.

Importing this package registers ``torch.ops.pulsar_dosa.certified_topk``,
``torch.ops.pulsar_dosa.attention`` and ``torch.ops.pulsar_dosa.sparse_attention``; their Triton
kernels live in ``compiler/lowering/``.
"""
from compiler.ops.attention import attention
from compiler.ops.certified_topk import certified_topk
from compiler.ops.sparse_attention import sparse_attention

__all__ = ["attention", "certified_topk", "sparse_attention"]

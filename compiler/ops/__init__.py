"""Custom ops (torch.library: schema, fake kernel, device dispatch), one file per op.

Importing this package registers ``torch.ops.pulsar_dosa.certified_topk``,
``torch.ops.pulsar_dosa.attention``, ``torch.ops.pulsar_dosa.sparse_attention`` and
``torch.ops.pulsar_dosa.absorbed_sparse_attention``; their Triton kernels live in
``compiler/lowering/``.
"""
from compiler.ops.absorbed_sparse_attention import absorbed_sparse_attention
from compiler.ops.attention import attention
from compiler.ops.certified_topk import certified_topk
from compiler.ops.sparse_attention import sparse_attention

__all__ = ["absorbed_sparse_attention", "attention", "certified_topk", "sparse_attention"]

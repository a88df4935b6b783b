"""Custom ops (torch.library: schema, fake kernel, device dispatch), one file per op.

Importing this package registers ``torch.ops.pulsar_dosa.sparse_attention``; its Triton kernels
live in ``compiler/lowering/``.
"""
from compiler.ops.sparse_attention import sparse_attention

__all__ = ["sparse_attention"]

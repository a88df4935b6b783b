"""Custom ops (torch.library: schema, fake kernel, device dispatch), one file per op.

Importing this package registers ``torch.ops.pulsar_dosa.certified_topk`` and
``torch.ops.pulsar_dosa.attention``; their Triton kernels live in ``compiler/lowering/``.
"""
from compiler.ops.attention import attention
from compiler.ops.certified_topk import certified_topk

__all__ = ["attention", "certified_topk"]

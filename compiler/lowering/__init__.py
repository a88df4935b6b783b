"""Custom ops (torch.library: schema, fake kernel, device kernels), one file per kernel family."""
from compiler.lowering.attention_op import attention
from compiler.lowering.certified_topk_op import certified_topk

__all__ = ["attention", "certified_topk"]

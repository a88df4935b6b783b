"""Exact merge of attention partials computed over disjoint key sets.

If partial ``i`` is softmax attention over key set K_i with output o_i and log-sum-exp l_i,
attention over the union has

    l = log Σ_i exp(l_i)          o = Σ_i exp(l_i − l) · o_i .

Written with m = max_i l_i: l = m + log Σ_i exp(l_i − m), and every weight exp(l_i − m) lies in
[0, 1] with at least one equal to 1, so nothing overflows and the sum is never below 1 (for two
partials this is the sigmoid form: weight_2 = sigmoid(l_2 − l_1)). A partial with l_i = -inf
(empty or fully masked key set) gets weight exactly 0 and its output is never read, so even a NaN
there contributes nothing; if every partial is -inf the result is o = 0, l = -inf.
A NaN or +inf l_i propagates: the merged o and l of that row are NaN (never silently dropped).
"""
from __future__ import annotations

import torch


def check_partials(outputs: torch.Tensor, lses: torch.Tensor) -> None:
    """TypeError/ValueError naming the argument unless outputs ``[n >= 1, ..., D]`` and lses
    ``[n, ...]`` are floating-point tensors on one device."""
    if not isinstance(outputs, torch.Tensor) or not isinstance(lses, torch.Tensor):
        raise TypeError("outputs and lses must be torch.Tensors, got "
                        f"{type(outputs).__name__} and {type(lses).__name__}")
    if not outputs.is_floating_point() or not lses.is_floating_point():
        raise TypeError(f"outputs and lses must be floating point, got {outputs.dtype} and {lses.dtype}")
    if outputs.dim() < 2:
        raise ValueError(f"outputs must be [n, ..., D], got shape {tuple(outputs.shape)}")
    if tuple(lses.shape) != tuple(outputs.shape[:-1]):
        raise ValueError(f"lses must have shape outputs.shape[:-1] = {tuple(outputs.shape[:-1])}, "
                         f"got {tuple(lses.shape)}")
    if outputs.shape[0] == 0:
        raise ValueError("outputs must hold at least one partial (n >= 1)")
    if lses.device != outputs.device:
        raise ValueError(f"lses must be on outputs' device {outputs.device}, got {lses.device}")


def merge_partials(outputs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``n`` attention partials into attention over the union of their key sets.

    outputs ``[n, ..., D]`` (any float dtype), lses ``[n, ...]`` (natural-log log-sum-exp,
    float). Returns ``(o [..., D] in outputs' dtype, lse [...] fp32)``; arithmetic in fp32.
    """
    check_partials(outputs, lses)
    lse32 = lses.float()
    top = lse32.amax(dim=0)
    shift = torch.where(top == float("-inf"), torch.zeros_like(top), top)
    weights = torch.exp(lse32 - shift)
    total = weights.sum(dim=0)
    live = (weights > 0).unsqueeze(-1)
    weighted = torch.where(live, outputs.float() * weights.unsqueeze(-1), torch.zeros((), device=outputs.device))
    summed = weighted.sum(dim=0)
    # total is 0 only when every partial is -inf (then o = 0); a NaN total stays NaN.
    out = torch.where((total == 0).unsqueeze(-1), torch.zeros_like(summed),
                      summed / total.unsqueeze(-1))
    lse = shift + torch.log(total)
    return out.to(outputs.dtype), lse

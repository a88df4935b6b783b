"""The FP8 tensor-core model behind the FP8 scorer's GPU margin (SPEC A.10), checked on the device.

``adversarial_pairs(D)``: named sets of (q, k) E4M3 row pairs that stress the model: per promotion
interval one large product and products just below the truncation unit after it
("swamped_tail"), the same with cancelling signs ("cancelling"), one interval of large products
and products just below the running sum's unit after it ("unpromoted_tail": within the bound only
when the scorer promotes its partial sums every ``fp8_interval(D)`` products), and random rows of varied
scales ("random").

``dot_check(D, device)``: for each set, the largest ratio |x^ - x| / (phi * sum_d |q_d k_d|) over
its pairs, x^ the dot the Triton scorer computes (one head, weight 1, scale 1: relu(x^) scored for
k and for -k), x the exact dot (float64 holds E4M3 products and their sums exactly), phi =
``fp8_dot_error(D)``. The model, hence the certified FP8 path's exactness on that device, holds
where every ratio is at most 1.
"""
from __future__ import annotations

import torch

from compiler.lowering.order_codes import decode_codes
from compiler.lowering.scoring.indexer_scores import fp8_interval, score_dense
from compiler.lowering.topk_pipeline import fp8_dot_error

__all__ = ["adversarial_pairs", "dot_check"]


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).to(torch.float8_e4m3fn)


def adversarial_pairs(D: int, random_pairs: int = 64, seed: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name -> (q [N, D], k [N, D]) float8_e4m3fn on the CPU (module docstring); D a multiple of
    its promotion interval ``fp8_interval(D)``."""
    d = torch.arange(D)
    interval = fp8_interval(D)
    lead = d % interval == 0
    # 448^2 has exponent 17 and 4 * 3.75 = 15 sits just below 2^(17 - 13); 32 * 15 = 480 just below 2^(22 - 13)
    q_tail = torch.where(lead, 448.0, 4.0)
    k_tail = torch.where(lead, 448.0, 3.75)
    first = d < interval
    sign = torch.where(d % 2 == 0, 1.0, -1.0)
    g = torch.Generator().manual_seed(seed)
    spread = 2.0 ** torch.randint(-6, 7, (2, random_pairs, 1), generator=g)
    return {
        "swamped_tail": (_e4m3(q_tail[None]), _e4m3(k_tail[None])),
        "cancelling": (_e4m3(q_tail[None]), _e4m3((k_tail * sign)[None])),
        "unpromoted_tail": (_e4m3(torch.where(first, 448.0, 32.0)[None]), _e4m3(torch.where(first, 448.0, 15.0)[None])),
        "random": (_e4m3(torch.randn(random_pairs, D, generator=g) * spread[0]),
                   _e4m3(torch.randn(random_pairs, D, generator=g) * spread[1])),
    }


def _device_dots(q8: torch.Tensor, k8: torch.Tensor) -> torch.Tensor:
    """x^ [N] float64: the scorer's dot of pair i (query i, key i)."""
    N, D = q8.shape
    w = torch.ones((1, N, 1), dtype=torch.float32, device=q8.device)
    scale = torch.ones((1, N), dtype=torch.float32, device=q8.device)

    def relu_dots(k):
        values, _ = decode_codes(score_dense(q8.view(1, N, 1, D), w, k.view(1, N, D), k_scale=scale), N)
        return values[0].diagonal().double()

    return relu_dots(k8) - relu_dots(_e4m3(-k8.float()))


def dot_check(D: int, device: str | torch.device) -> dict[str, float]:
    """name -> the largest |x^ - x| / (phi * sum_d |q_d k_d|) of the set's pairs on ``device``."""
    phi = fp8_dot_error(D)
    out = {}
    for name, (q8, k8) in adversarial_pairs(D).items():
        products = q8.double() * k8.double()
        exact, mass = products.sum(-1), products.abs().sum(-1)
        got = _device_dots(q8.to(device), k8.to(device)).cpu()
        out[name] = float(((got - exact).abs() / (phi * mass)).max())
    return out

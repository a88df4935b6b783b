"""Measuring the cost model's ``KernelConstants`` for the plain-torch reference stages on a device.

``measure_reference_constants(device)`` times each stage of ``runtime`` (what the op runs on the
CPU) on random inputs and divides the work the cost model charges for it by the best of a few
runs: dense (``exact_scores``, S·T·H·D MACs), screen (``evaluate_bound``, S·T·(r + 1)·D), refine
(``exact_scores`` over gathered keys, S·M·H·D), select (``select_topk``, S·T keys), plan
(``plan_certificate``, seconds per query) and the fixed costs (one minimal ``certified_topk`` call
per path). ``screen_tile`` is 1 and ``screen_pow2`` False: the reference pads nothing.
``best_seconds`` is the timer the plans use."""
from __future__ import annotations

import time
from typing import Callable

import torch

from compiler.cost_model import KernelConstants
from runtime.certificate import evaluate_bound, plan_certificate
from runtime.certified_topk import CertifiedTopkConfig, certified_topk
from runtime.dense_scorer import exact_scores, select_topk
from runtime.rounding import key_norm_up


def best_seconds(fn: Callable[[], object], device: torch.device, repeats: int, warmup: bool = True) -> float:
    """Least wall time of ``fn`` over ``repeats`` runs after one warm-up run (skipped with
    ``warmup=False``), synchronising on CUDA."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if warmup:
        fn()
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


def measure_reference_constants(device: str | torch.device = "cpu", *, S: int = 32, T: int = 2048, H: int = 16,
                                D: int = 32, kk: int = 64, r: int = 4, repeats: int = 3,
                                seed: int = 0) -> KernelConstants:
    """KernelConstants of the runtime reference on ``device`` (sizes: S queries, T keys, H x D heads)."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(S, H, D, generator=g).to(device)
    w = torch.randn(S, H, generator=g).to(device)
    k = torch.randn(T, D, generator=g).to(device)
    m = T // 4
    gathered = k[torch.randint(0, T, (S, m), generator=g).to(device)]
    values = torch.randn(S, T, generator=g).to(device)
    visible = torch.ones(S, T, dtype=torch.bool, device=device)
    p = torch.full((S, H), 0.5, dtype=torch.float64, device=device)
    budget = torch.full((S,), r, dtype=torch.int64, device=device)
    plan = plan_certificate(q, w, p, budget)
    key_norm = key_norm_up(k)

    def rate(work: float, fn: Callable[[], object]) -> float:
        return work / best_seconds(fn, device, repeats)

    tiny_q = torch.randn(1, 2, H, D, generator=g).to(device)
    tiny_k = torch.randn(1, 2 * kk, D, generator=g).to(device)
    tiny_w = torch.randn(1, 2, H, generator=g).to(device)

    def tiny_call(path: str) -> float:
        config = CertifiedTopkConfig(path=path, sink=0, window=0)
        return best_seconds(lambda: certified_topk(tiny_q, tiny_k, tiny_w, kk, config=config), device, repeats)

    return KernelConstants(
        dense_macs_per_s=rate(S * T * H * D, lambda: exact_scores(q, w, k.expand(S, T, D))),
        screen_macs_per_s=rate(S * T * (r + 1) * D, lambda: evaluate_bound(plan, k, key_norm)),
        refine_macs_per_s=rate(S * m * H * D, lambda: exact_scores(q, w, gathered)),
        select_keys_per_s=rate(S * T, lambda: select_topk(values, visible, kk)),
        plan_s_per_query=best_seconds(lambda: plan_certificate(q, w, p, budget), device, repeats) / S,
        dense_fixed_s=tiny_call("dense"),
        certified_fixed_s=tiny_call("certified"),
        screen_tile=1,
        screen_pow2=False,
        source=f"runtime reference measured on {device.type} ({torch.get_num_threads()} threads, "
               f"S={S} T={T} H={H} D={D} kk={kk} r={r}, torch {torch.__version__})",
    )


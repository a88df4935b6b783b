"""Where the certified and the dense top-K spend their device time, kernel by kernel, on one GPU.

    python3 benchmarks/certified_profile.py --out benchmarks/results/certified_profile_h200.json
    python3 benchmarks/certified_profile.py --smoke --out /tmp/profile.json   # CPU, interpreter

The structured indexer (``runtime.structured_indexer``, H=64, D=128, bf16) with S causal queries at
the end of T keys, topk=2048: both ops are checked equal (indices, values bitwise), timed whole
(CUDA events, median of 3), then profiled once each with ``torch.profiler``: every kernel's name,
launches and device milliseconds, largest first, and their sum. Then the plan alone for budgets
r = 1 and 7: the Triton form (``certificate_plan``, what CUDA calls run), the torch form
(``runtime.certificate``) and the whole ``plan_screen``; and the activation-frequency kernel.
"""
from __future__ import annotations

import argparse
import json

import torch

from benchmarks import harness
from benchmarks.dense_roofline import PLAN
from compiler.lowering import defaults
from compiler.lowering.screen.certificate_plan import plan_certificate_triton
from compiler.lowering.screen.head_activation import activation_frequency
from compiler.lowering.topk_pipeline import certified_topk_cuda, dense_topk_cuda, plan_screen
from runtime.certificate import plan_certificate
from runtime.structured_indexer import structured_indexer_inputs


def kernel_table(fn, device: str, rows: int = 40) -> tuple[list, float]:
    """([[kernel, launches, device ms]] of one call of ``fn``, largest first; their total ms)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    events = prof.key_averages()
    total = lambda e: e.device_time_total if device == "cuda" else e.self_cpu_time_total  # noqa: E731
    ranked = sorted(events, key=lambda e: -total(e))
    return ([[e.key[:100], e.count, round(total(e) / 1e3, 3)] for e in ranked[:rows]],
            round(sum(total(e) for e in events) / 1e3, 2))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--S", type=int, default=16384)
    p.add_argument("--T", type=int, default=131072)
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU under TRITON_INTERPRET=1")
    args = p.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    S, T, H, D, topk = (16, 96, 4, 16, 8) if args.smoke else (args.S, args.T, 64, 128, 2048)
    q, k, w, _ = structured_indexer_inputs(1, S, T, H, D, dtype=torch.bfloat16, device=device)
    w = w.float()
    mask = torch.ones(S, T, dtype=torch.bool, device=device).tril(T - S)[None]
    ms = lambda fn: round(harness.median_ms(fn, 3, device), 2)  # noqa: E731
    dense = lambda: dense_topk_cuda(q, k, w, topk, mask)  # noqa: E731
    certified = lambda: certified_topk_cuda(q, k, w, topk, mask, config=PLAN)  # noqa: E731
    want, got = dense(), certified()
    doc = harness.header(device, S=S, T=T, H=H, D=D, topk=topk, identical=harness.identical(got, want),
                         dense_ms=ms(dense), certified_ms=ms(certified))
    print(json.dumps(doc), flush=True)
    for name, fn in (("certified", certified), ("dense", dense)):
        doc[f"{name}_kernels"], doc[f"{name}_kernels_total_ms"] = kernel_table(fn, device)
    p_act = torch.rand(1, S, H, device=device)
    doc["plan_ms"] = {}
    for r_max in sorted({1, min(7, H)}):
        r = torch.full((1, S), r_max, dtype=torch.long, device=device)
        doc["plan_ms"][f"r={r_max}"] = {
            "triton": ms(lambda: plan_certificate_triton(q, w, p_act, r, r_max)),
            "torch": ms(lambda: plan_certificate(q, w, p_act, r, r_max)),
            "plan_screen": ms(lambda: plan_screen(q, w, k.dtype, p_act, r, r_max))}
    groups = -(-S // PLAN.anchor_stride)
    seeds = torch.randint(0, T, (1, groups, topk + topk // 4 + 1), dtype=torch.int32, device=device)
    doc["activation_ms"] = ms(lambda: activation_frequency(q, k, seeds, PLAN.anchor_stride,
                                                           defaults.ACTIVATION_SAMPLES))
    tables = [f"{name}: {doc[f'{name}_kernels_total_ms']} ms of kernels\n\n"
              + harness.markdown_table(["kernel", "launches", "device ms"], doc[f"{name}_kernels"][:12])
              for name in ("certified", "dense")]
    plans = harness.markdown_table(["r", "triton ms", "torch ms", "plan_screen ms"],
                                   [[r, *t.values()] for r, t in doc["plan_ms"].items()])
    harness.write_results(args.out, doc, "\n\n".join([*tables, plans, f"activation ms: {doc['activation_ms']}"]))
    return 0 if doc["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

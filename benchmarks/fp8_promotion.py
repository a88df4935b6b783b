"""The FP8 scorer at two promotion intervals, each in its own process (the interval is a constant
the kernels read when they compile).

    python3 benchmarks/fp8_promotion.py --out benchmarks/results/fp8_promotion_h200.json

Per interval P (products summed by the tensor cores before each fp32 promotion; the module's
``FP8_PROMOTE``, and the GPU margin's ``fp8_interval`` with it): ``fp8_dot_check`` against
``fp8_dot_error`` at P, the scorer's launch forms at S=4096, T=131072 (``dense_roofline.fp8_forms``),
the dense FP8 op against the bf16 one at S=16384, T=131072, and the certified FP8 path with the
structured plan (pruned fraction, identical to dense). H=64, D=128, topk 2048, on one GPU."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

INTERVALS = (128, 32)


def run_interval(P: int, out: Path) -> None:
    """The rows of interval P (this process: nothing compiled before the constant is set)."""
    import triton.language as tl

    from compiler.lowering.scoring import indexer_scores

    indexer_scores.FP8_PROMOTE, indexer_scores._FP8_PROMOTE = P, tl.constexpr(P)
    import torch

    import benchmarks.dense_roofline as roof
    from benchmarks.fp8_dot_check import dot_check
    from compiler.lowering.topk_pipeline import fp8_dot_error
    from runtime.fp8_quant import quantize_indexer_inputs
    from runtime.structured_indexer import structured_indexer_inputs

    rows = []

    def emit(row):
        rows.append({"promote": P, **row})
        print(json.dumps(rows[-1]), flush=True)
        out.write_text(json.dumps(rows, indent=1))

    emit({"kind": "fp8_dot_check", "phi": fp8_dot_error(roof.D), "max_ratio": dot_check(roof.D, "cuda")})
    roof.fp8_forms(emit, 4096, 131072)
    S, T = 16384, 131072
    q, k, w = roof.random_inputs(S, T, seed=S + T)
    mask = roof.causal_chunk_mask(S, T)
    q8, k8, w8, ks = quantize_indexer_inputs(q, k, w, "fp8")
    emit({"kind": "dense", "S": S, "T": T,
          "fp8_ms": round(roof.timed(lambda: roof.dense_topk_cuda(q8, k8, w8, roof.TOPK, mask, k_scale=ks), reps=3), 2),
          "bf16_ms": round(roof.timed(lambda: roof.dense_topk_cuda(q, k, w, roof.TOPK, mask), reps=3), 2)})
    del q8, k8, w8, ks
    sq, sk, sw, _ = structured_indexer_inputs(1, S, T, roof.H, roof.D, dtype=torch.bfloat16, device="cuda")
    emit({**roof.fp8_certified_row(S, T, sq, sk, sw.float(), mask), "family": "structured"})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--interval", type=int, choices=INTERVALS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.interval:
        run_interval(args.interval, out)
        return 0
    rows, code = [], 0
    for P in INTERVALS:
        part = out.with_suffix(f".{P}.json")
        code |= subprocess.run([sys.executable, "-m", "benchmarks.fp8_promotion", "--interval", str(P),
                                "--out", str(part)]).returncode
        rows += json.loads(part.read_text()) if part.exists() else []
        part.unlink(missing_ok=True)
    out.write_text(json.dumps({"device": "cuda", "rows": rows}, indent=1))
    return code


if __name__ == "__main__":
    raise SystemExit(main())

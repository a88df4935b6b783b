"""Where the exact selection of the dense path spends its time, part by part, on one GPU.

    python3 benchmarks/selection_parts.py --out benchmarks/results/selection_parts_h200.json
    python3 benchmarks/selection_parts.py --smoke --out /tmp/selection_parts.json   # CPU, interpreter

The order codes of S=4096 causal queries at the end of T=131072 keys (H=64, D=128, bf16, the dense
scorer), kk=2048, then each step of ``compiler.lowering.threshold_select.top_codes`` timed alone
(CUDA events, median of 5, its allocations included): the interleaved chunk maxima, tau (the
kk-th largest maximum), the compaction at several step lengths, the final top-kk of the
candidates, the gated overflow selector (``select_top_codes``), and the whole call; ``read_once_floor_ms`` is one read of the codes at
4.2 TB/s. Checked in the same run: ``top_codes`` equals ``torch.topk`` on every row, and the
compaction's candidates and count do not depend on its step.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton

from benchmarks import dense_roofline as roofline
from benchmarks.timing import median_ms
from compiler.lowering import threshold_select as ts
from compiler.lowering.select_codes_triton import select_top_codes

STEPS = (1024, 2048, 4096)
"""Compaction step lengths timed."""


def parts(codes: torch.Tensor, kk: int, device: str) -> dict:
    """Times (ms) and checks of every part of ``top_codes(codes, kk)`` for codes [R, N]."""
    n = ts.CHUNKS_PER_K * kk
    time_ms = lambda fn: round(median_ms(fn, 5, device), 3)  # noqa: E731
    maxima = ts.chunk_maxima(codes, n)
    out = {"chunk_max": time_ms(lambda: ts.chunk_maxima(codes, n))}
    tau = ts.threshold(maxima, kk)
    out["tau"] = time_ms(lambda: ts.threshold(maxima, kk))
    cap = ts.CANDIDATE_FACTOR * kk
    found = {}
    for step in STEPS:
        found[step] = ts.compact(codes, tau, cap, step)
        out[f"compact_{step}"] = time_ms(lambda: ts.compact(codes, tau, cap, step))
    cand, count = found[ts.COMPACT_BLOCK]
    out["compaction_same_for_every_step"] = all(torch.equal(c, cand) and torch.equal(k, count)
                                                for c, k in found.values())
    out["overflow_rows"] = int((count > cap).sum())
    final = torch.topk(cand, kk, dim=-1, sorted=True).values
    out["final_topk"] = time_ms(lambda: torch.topk(cand, kk, dim=-1, sorted=True).values)
    out["gated_select"] = time_ms(lambda: select_top_codes(codes, count > cap, kk, out=final.clone()))
    out["top_codes_total"] = time_ms(lambda: ts.top_codes(codes, kk))
    out["identical_to_torch_topk"] = bool(torch.equal(ts.top_codes(codes, kk), torch.topk(codes, kk, dim=-1).values))
    out["read_once_floor_ms"] = round(codes.numel() * 8 / 4.2e9, 3)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU under TRITON_INTERPRET=1")
    args = p.parse_args(argv)
    S, T, kk, device = 4096, 131072, 2048, "cuda"
    if args.smoke:
        S, T, kk, device = 8, 1024, 16, "cpu"
        roofline.H, roofline.D, roofline.DEVICE = 4, 16, "cpu"
        roofline.scorer.SEQUENTIAL = False
    q, k, w = roofline.random_inputs(S, T)
    codes = roofline.all_codes(q, w, k, roofline.causal_chunk_mask(S, T))[0]
    del q, k, w
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)",
              "versions": {"torch": torch.__version__, "triton": triton.__version__},
              "S": S, "T": T, "kk": kk, **parts(codes, kk, device)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

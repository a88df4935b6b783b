"""The certified pipeline's dense redo: its time by the number of flagged rows, with and without the
few-rows head (``defaults.REDO_FEW_ROWS``), each output checked against the dense op's rows.

    PYTHONPATH=. python3 benchmarks/redo_cost.py --out benchmarks/results/redo_cost_h100.json
    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/redo_cost.py --smoke --out /tmp/redo.json  # CPU

Inputs: random bf16 q [1,S,H,D], k [1,T,D], fp32 weights (H=64, D=128, S=4096 queries, top 2048,
no mask), as the trained indexers' certified calls have them. Per T and flagged-row count (spread
over the S rows at random): ``redo_dense`` into a sentinel-filled code buffer with the head (its
default) and with rounds only (head 0), the median ms of ``reps`` calls after ``warmup`` ones (events
around each call), bitwise equal to the dense codes on the flagged rows and the sentinel elsewhere.
"""
from __future__ import annotations

import argparse

import torch

from benchmarks import harness

import compiler  # noqa: F401
from compiler.lowering import defaults
from compiler.lowering.topk_pipeline import dense_codes_topk, redo_dense

FULL = {"S": 4096, "H": 64, "D": 128, "topk": 2048, "T": [65536, 131072], "flagged": [0, 2, 8, 40], "reps": 10,
        "warmup": 1}
SMOKE = {"S": 24, "H": 4, "D": 16, "topk": 24, "T": [256], "flagged": [0, 20], "reps": 1, "warmup": 0}
SENTINEL = 7
"""What an unflagged row of the code buffer holds before and after the redo."""


def redo_row(q, w, k, kk, flagged: int, head: int, dense, reps: int, warmup: int, device) -> dict:
    """One (flagged rows, head) cell: ms and whether the redo wrote exactly the dense codes."""
    S = q.shape[1]
    redo = torch.zeros(1, S, dtype=torch.bool, device=device)
    picked = torch.randperm(S, generator=torch.Generator().manual_seed(flagged))[:flagged]
    redo[0, picked.to(device)] = True
    base = torch.full((1, S, kk), SENTINEL, dtype=torch.int64, device=device)
    saved = defaults.REDO_FEW_ROWS
    defaults.REDO_FEW_ROWS = head
    try:
        codes = redo_dense(base.clone(), redo, q, w, k, None, kk)
        same = bool(torch.equal(codes[redo], dense[redo])) and bool((codes[~redo] == SENTINEL).all())
        timing = harness.measure(lambda: redo_dense(base.clone(), redo, q, w, k, None, kk), device, reps,
                                 warmup=warmup)
    finally:
        defaults.REDO_FEW_ROWS = saved
    return {"flagged": flagged, "head": head, "ms": round(timing.ms, 4), "identical": same}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU sizes (TRITON_INTERPRET=1)")
    args = ap.parse_args(argv)
    sizes = dict(SMOKE if args.smoke else FULL)
    device = "cpu" if args.smoke else "cuda"
    doc = harness.header(device, what=__doc__.split("\n\n")[0], sizes=sizes, default_head=defaults.REDO_FEW_ROWS)
    doc["rows"] = []
    for T in sizes["T"]:
        g = torch.Generator(device=device).manual_seed(T)
        S, H, D = sizes["S"], sizes["H"], sizes["D"]
        q = torch.randn(1, S, H, D, generator=g, device=device).bfloat16()
        k = torch.randn(1, T, D, generator=g, device=device).bfloat16()
        w = torch.randn(1, S, H, generator=g, device=device)
        kk = min(sizes["topk"], T)
        dense = dense_codes_topk(q, w, k, None, kk)
        for flagged in sizes["flagged"]:
            for head in (defaults.REDO_FEW_ROWS, 0):
                row = redo_row(q, w, k, kk, flagged, head, dense, sizes["reps"], sizes["warmup"], device)
                doc["rows"].append({"T": T, **row})
        harness.write_results(args.out, doc, harness.rows_table(doc["rows"]))
    doc["all_identical"] = all(r["identical"] for r in doc["rows"])
    harness.write_results(args.out, doc, harness.rows_table(doc["rows"]))
    return 0 if doc["all_identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The certified pipeline's candidate buffer: how many candidates its rows hold, and its size's cost.

    python3 benchmarks/certified_buffer.py --out benchmarks/results/certified_buffer_h200.json
    python3 benchmarks/certified_buffer.py --smoke --out /tmp/certified_buffer.json   # CPU, interpreter

Structured indexer inputs (``runtime.structured_indexer``), H=64, D=128, topk=2048, bf16, causal
chunk of S queries at the end of T keys, the structured geometry's plan (r=1, certified), at
(S, T) = (16384, 131072) and (4096, 524288). Per size: the dense op's time, the candidates each
row wrote (keys with s >= tau; mean, 99.9th percentile and maximum, in multiples of kk) and the
rows redone densely at the module's buffer; then, for buffers of 8, 4, 3 and 2 kk
(``defaults.CERTIFIED_BUFFER_K``, restored after), the certified op's time, its ratio
to dense and whether its output is identical to dense's (indices equal, values bitwise). A row
whose candidates overflow the buffer is redone densely, so a small buffer stays exact and costs
time only where rows overflow.
"""
from __future__ import annotations

import argparse
import json

import torch

from benchmarks import dense_roofline as roofline
from benchmarks import harness
from compiler.lowering import defaults
from compiler.lowering import topk_pipeline as certified
from runtime.structured_indexer import structured_indexer_inputs

FACTORS = (8, 4, 3, 2)
"""Candidate buffers timed, in multiples of kk."""


def measure(S: int, T: int, reps: int) -> dict:
    """One size's row (module docstring)."""
    q, k, w, _ = structured_indexer_inputs(1, S, T, roofline.H, roofline.D, dtype=torch.bfloat16)
    device = roofline.DEVICE
    q, k, w, mask = q.to(device), k.to(device), w.float().to(device), roofline.causal_chunk_mask(S, T)
    kk = min(roofline.TOPK, T)
    dense = lambda: certified.dense_topk_cuda(q, k, w, roofline.TOPK, mask)  # noqa: E731
    want = dense()
    dense_ms = harness.median_ms(dense, reps, device)
    trace = []
    certified.certified_topk_cuda(q, k, w, roofline.TOPK, mask, config=roofline.PLAN, trace=trace)
    written = trace[0].cand_count.float() / kk
    row = {"S": S, "T": T, "dense_ms": round(dense_ms, 2), "candidates_mean_kk": round(float(written.mean()), 3),
           "candidates_q999_kk": round(float(written.quantile(0.999)), 3),
           "candidates_max_kk": round(float(written.max()), 3), "redo_rows": int(trace[0].redo.sum())}
    saved = defaults.CERTIFIED_BUFFER_K
    try:
        for factor in FACTORS:
            defaults.CERTIFIED_BUFFER_K = factor
            run = lambda: certified.certified_topk_cuda(q, k, w, roofline.TOPK, mask, config=roofline.PLAN)  # noqa: E731
            row[f"buffer_{factor}kk_identical"] = harness.identical(run(), want)
            ms = harness.median_ms(run, reps, device)
            row[f"buffer_{factor}kk_ms"] = round(ms, 2)
            row[f"buffer_{factor}kk_x_dense"] = round(dense_ms / ms, 3)
    finally:
        defaults.CERTIFIED_BUFFER_K = saved
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU under TRITON_INTERPRET=1")
    args = p.parse_args(argv)
    sizes, reps = ((16384, 131072), (4096, 524288)), 5
    if args.smoke:
        roofline.H, roofline.D, roofline.DEVICE, roofline.TOPK = 4, 16, "cpu", 8
        sizes, reps = ((8, 256),), 1
    rows = []
    for S, T in sizes:
        rows.append(measure(S, T, reps))
        print(json.dumps(rows[-1]), flush=True)
    doc = harness.header(roofline.DEVICE, smoke=args.smoke, buffer_k=defaults.CERTIFIED_BUFFER_K, rows=rows)
    harness.write_results(args.out, doc, harness.rows_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where the exact selection of the dense path spends its time, part by part, on one GPU.

    python3 benchmarks/selection_parts.py --out benchmarks/results/selection_parts_h200.json
    python3 benchmarks/selection_parts.py --sweep --out benchmarks/results/selection_constants_h200.json
    python3 benchmarks/selection_parts.py --smoke --out /tmp/selection_parts.json   # CPU, interpreter

The order codes of S=4096 causal queries at the end of T=131072 keys (H=64, D=128, bf16, the dense
scorer), kk=2048, then each step of ``compiler.lowering.threshold_select.top_codes`` timed alone
(CUDA events, median of 5, its allocations included): the interleaved chunk maxima, tau (the
kk-th largest maximum), the compaction at several step lengths and pipeline stages, the final
top-kk of the candidates (``torch.topk`` against ``top_candidates``, the window kernel and its
sort, in the 2 kk buffer of the dense path and in an 8 kk wide one, as the certified path holds
them), the gated overflow selector (``select_top_codes``), and the whole call, with and
without the chunk maxima given (the dense path's scorer writes them); ``read_once_floor_ms`` is one read of the codes at
4.2 TB/s. Checked in the same run: ``top_codes`` equals ``torch.topk`` on every row, and the
compaction's candidates and count do not depend on its step.

``--sweep`` chooses the selection's constants instead, on the codes of a random and of a structured
indexer (``runtime.structured_indexer``, the same query and key counts): per chunks-per-kk (1, 2, 4)
tau's time and how many codes per row pass it (mean, 99th percentile, maximum), the compaction
over (warps, step) pairs (``COMPACT_FORMS``) and the final top-kk with buffers of 2, 3 and 4 kk (overflowing rows counted);
then the whole ``top_codes`` for every choice of (chunks per kk, buffer, warps and step), checked against
``torch.topk``. The module constants restored after.
"""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import triton

from benchmarks import dense_roofline as roofline
from benchmarks.timing import median_ms
from compiler.lowering import threshold_select as ts
from compiler.lowering.certified_topk_triton import scorer_chunks
from compiler.lowering.select_codes_triton import select_top_codes
from runtime.structured_indexer import structured_indexer_inputs

STEPS = (64, 128, 256, 512)
"""Compaction step lengths timed (at COMPACT_WARPS warps)."""
COMPACT_FORMS = ((1, 64), (1, 128), (1, 256), (2, 64), (2, 128), (4, 128), (4, 512), (4, 1024))
"""(warps, step) pairs of the compaction timed by the sweep."""
TOTAL_FORMS = ((1, 128), (4, 512))
"""(warps, step) pairs of the compaction in the sweep's whole-selection rows (the kept one, the
previous one)."""


def parts(codes: torch.Tensor, kk: int, device: str) -> dict:
    """Times (ms) and checks of every part of ``top_codes(codes, kk)`` for codes [R, N]."""
    n = ts.CHUNKS_PER_K * kk
    time_ms = lambda fn: round(median_ms(fn, 5, device), 3)  # noqa: E731
    maxima = ts.chunk_maxima(codes, n)
    out = {"chunk_max": time_ms(lambda: ts.chunk_maxima(codes, n))}
    tau = ts.kth_largest(maxima, kk)
    out["tau"] = time_ms(lambda: ts.kth_largest(maxima, kk))
    cap = ts.CANDIDATE_FACTOR * kk
    found = {}
    for step in STEPS:
        found[step] = ts.compact(codes, tau, cap, step)
        out[f"compact_{step}"] = time_ms(lambda: ts.compact(codes, tau, cap, step))
    for stages in (1, 2, 3):
        out[f"compact_stages_{stages}"] = time_ms(lambda: ts.compact(codes, tau, cap, stages=stages))
    cand, count = found[ts.COMPACT_BLOCK]
    out["compaction_same_for_every_step"] = all(torch.equal(c, cand) and torch.equal(k, count)
                                                for c, k in found.values())
    out["overflow_rows"] = int((count > cap).sum())
    final = torch.topk(cand, kk, dim=-1, sorted=True).values
    out["final_topk"] = time_ms(lambda: torch.topk(cand, kk, dim=-1, sorted=True).values)
    out["final_window"] = time_ms(lambda: ts.top_candidates(cand, count, kk))
    held = count <= cap  # an overflowed row's result is the gated selector's to give
    out["final_window_same"] = bool(torch.equal(ts.top_candidates(cand, count, kk)[held], final[held]))
    wide = torch.full((cand.shape[0], 4 * cap), ts.INT64_MIN, dtype=torch.int64, device=cand.device)
    wide[:, :cap] = cand  # a certified-path buffer: 8 kk wide, mostly padding
    wide_count = torch.minimum(count, torch.full_like(count, cap))
    out["final_8kk_torch_topk"] = time_ms(lambda: torch.topk(wide, kk, dim=-1).values)
    out["final_8kk_window"] = time_ms(lambda: ts.top_candidates(wide, wide_count, kk))
    out["final_8kk_window_same"] = bool(torch.equal(ts.top_candidates(wide, wide_count, kk),
                                                    torch.topk(wide, kk, dim=-1).values))
    out["gated_select"] = time_ms(lambda: select_top_codes(codes, count > cap, kk, out=final.clone()))
    out["top_codes_total"] = time_ms(lambda: ts.top_codes(codes, kk))
    given = ts.chunk_maxima(codes, scorer_chunks(*codes.shape, kk, torch.bfloat16, codes.device))  # as the dense scorer writes them
    out["top_codes_given_maxima"] = time_ms(lambda: ts.top_codes(codes, kk, given))
    out["identical_to_torch_topk"] = bool(torch.equal(ts.top_codes(codes, kk), torch.topk(codes, kk, dim=-1).values))
    out["read_once_floor_ms"] = round(codes.numel() * 8 / 4.2e9, 3)
    return out


def constants_sweep(codes: torch.Tensor, kk: int, device: str, inputs: str, reps: int = 5,
                    forms=COMPACT_FORMS, total_forms=TOTAL_FORMS) -> list[dict]:
    """Rows of the ``--sweep`` (module docstring) for codes [R, N] of one kind of ``inputs``; times
    are medians of ``reps`` calls; ``forms`` / ``total_forms``: the compaction's (warps, step)
    pairs timed alone / in the whole selection."""
    time_ms = lambda fn: round(median_ms(fn, reps, device), 3)  # noqa: E731
    rows = []
    for per_k in (1, 2, 4):
        maxima = ts.chunk_maxima(codes, per_k * kk)
        tau = ts.kth_largest(maxima, kk)
        passing = (codes >= tau[:, None]).sum(-1).float()
        row = {"inputs": inputs, "chunks_per_k": per_k, "chunk_max": time_ms(lambda: ts.chunk_maxima(codes, per_k * kk)),
               "tau": time_ms(lambda: ts.kth_largest(maxima, kk)), "passing_mean": round(float(passing.mean()), 1),
               "passing_q99": round(float(passing.quantile(0.99)), 1), "passing_max": int(passing.max())}
        for warps, step in forms:
            row[f"compact_w{warps}_{step}"] = time_ms(lambda: ts.compact(codes, tau, 4 * kk, step, warps))
        for factor in (2, 3, 4):
            cand, count = ts.compact(codes, tau, factor * kk)
            row[f"overflow_rows_{factor}kk"] = int((count > factor * kk).sum())
            row[f"final_topk_{factor}kk"] = time_ms(lambda: torch.topk(cand, kk, dim=-1, sorted=True).values)
        rows.append(row)
    want = torch.topk(codes, kk, dim=-1).values
    saved = ts.CHUNKS_PER_K, ts.CANDIDATE_FACTOR, ts.COMPACT_BLOCK, ts.COMPACT_WARPS
    try:
        for per_k, factor, (warps, step) in itertools.product((1, 2), (2, 3, 4), total_forms):
            ts.CHUNKS_PER_K, ts.CANDIDATE_FACTOR, ts.COMPACT_BLOCK, ts.COMPACT_WARPS = per_k, factor, step, warps
            rows.append({"inputs": inputs, "chunks_per_k": per_k, "candidate_factor": factor, "warps": warps,
                         "step": step, "top_codes": time_ms(lambda: ts.top_codes(codes, kk)),
                         "identical_to_torch_topk": bool(torch.equal(ts.top_codes(codes, kk), want))})
    finally:
        ts.CHUNKS_PER_K, ts.CANDIDATE_FACTOR, ts.COMPACT_BLOCK, ts.COMPACT_WARPS = saved
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sweep", action="store_true", help="choose the selection's constants (module docstring)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU under TRITON_INTERPRET=1")
    args = p.parse_args(argv)
    S, T, kk, device = 4096, 131072, 2048, "cuda"
    if args.smoke:
        S, T, kk, device = 2, 512, 16, "cpu"
        roofline.H, roofline.D, roofline.DEVICE = 4, 16, "cpu"
        roofline.scorer.SEQUENTIAL = False
    mask = roofline.causal_chunk_mask(S, T)
    q, k, w = roofline.random_inputs(S, T)
    codes = roofline.all_codes(q, w, k, mask)[0]
    del q, k, w
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)",
              "versions": {"torch": torch.__version__, "triton": triton.__version__}, "S": S, "T": T, "kk": kk}
    if args.sweep:
        reps = 1 if args.smoke else 5
        # The smoke run checks the code path with one form of each kind.
        forms = (COMPACT_FORMS[:2], TOTAL_FORMS[:1]) if args.smoke else (COMPACT_FORMS, TOTAL_FORMS)
        rows = constants_sweep(codes, kk, device, "random", reps, *forms)
        del codes
        q, k, w, _ = structured_indexer_inputs(1, S, T, roofline.H, roofline.D, dtype=torch.bfloat16)
        codes = roofline.all_codes(q.to(device), w.float().to(device), k.to(device), mask)[0]
        result["rows"] = rows + constants_sweep(codes, kk, device, "structured", reps, *forms)
    else:
        result.update(parts(codes, kk, device))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

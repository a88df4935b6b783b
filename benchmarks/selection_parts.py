"""Where the exact selection of the dense path spends its time, part by part, on one GPU.

    python3 benchmarks/selection_parts.py --out benchmarks/results/selection_parts_h200.json
    python3 benchmarks/selection_parts.py --sweep --out benchmarks/results/selection_parts_sweep_h200.json
    python3 benchmarks/selection_parts.py --smoke --out /tmp/selection_parts.json   # CPU, interpreter

On the dense scorer's int32 words of S=4096 causal queries at the end of T=131072 keys (H=64,
D=128, bf16, kk=2048), each step of ``threshold_select.top_codes`` timed alone (median device ms of
5): the chunk maxima, tau, the compaction over several forms (and over int64 codes), the final
top-kk, the gated overflow selector and the whole call; ``read_once_floor_ms`` is one read of the
words at 4.2 TB/s. Checked in the run: ``top_codes`` equals ``torch.topk`` on every row, and every
compaction form finds the same candidates. ``--sweep`` chooses the selection's constants on the
words of a random and a structured indexer: per chunks-per-kk, tau's time and the codes passing it;
the compaction forms; buffers of 2-4 kk; every combination checked against ``torch.topk``.
"""
from __future__ import annotations

import argparse
import itertools

import torch

from benchmarks import dense_roofline as roofline
from benchmarks import harness
from compiler.lowering import defaults
from compiler.lowering.order_codes import codes_of_words
from compiler.lowering.selection import threshold_select as ts
from compiler.lowering.topk_pipeline import scorer_chunks
from compiler.lowering.selection.radix_select import select_top_codes
from runtime.order_codes import PADDING
from runtime.structured_indexer import structured_indexer_inputs

TILES = (2, 4, 8, 16)
"""Compaction tile sizes (codes per lane) timed (in the buffer's default segments)."""
SEGMENTS = (1, 2, 4, 8)
"""Compaction segments (single-warp programs per row) timed (at COMPACT_TILE)."""
COMPACT_FORMS = ((4, 1), (4, 2), (4, 4), (4, 8), (8, 4), (16, 4))
"""(tile, segments) of the compaction timed by the sweep."""
TOTAL_FORMS = ((4, 4), (4, 2))
"""(tile, segments) of the compaction in the sweep's whole-selection rows (the kept one first)."""


def same_candidates(found, want) -> bool:
    """Two compactions ``(cand, count)`` agree: equal counts per row, and equal candidate sets in
    every row that overflowed in neither (segments of other sizes hold the codes elsewhere)."""
    (cand, count), (cand0, count0) = found, want
    held = ~ts.overflowed(count, cand.shape[1]) & ~ts.overflowed(count0, cand0.shape[1])
    return bool(torch.equal(count.sum(-1), count0.sum(-1))) and bool(
        torch.equal(held_codes(cand, count)[held].sort(-1).values, held_codes(cand0, count0)[held].sort(-1).values))


def held_codes(cand, count):
    """A candidate buffer (its segments' counts ``count [R, G]``) with its unspecified slots (past
    each segment's codes) set to INT64_MIN."""
    seg = cand.shape[1] // count.shape[1]
    j = torch.arange(cand.shape[1], device=cand.device)
    return torch.where(j % seg < count[:, j // seg], cand, PADDING)


def parts(words: torch.Tensor, kk: int, device: str) -> dict:
    """Times (ms) and checks of every part of ``top_codes(words, kk)`` for the scorer's words [R, N]
    (int32, as the dense path selects), and of the whole call over the same rows as int64 codes."""
    codes = codes_of_words(words)
    n = defaults.CHUNKS_PER_K * kk
    time_ms = lambda fn: round(harness.median_ms(fn, 5, device), 3)  # noqa: E731
    maxima = ts.chunk_maxima(words, n)
    out = {"chunk_max": time_ms(lambda: ts.chunk_maxima(words, n))}
    tau = ts.kth_largest(maxima, kk)
    out["tau"] = time_ms(lambda: ts.kth_largest(maxima, kk))
    cap = defaults.THRESHOLD_BUFFER_K * kk
    kept = ts.compact(words, tau, cap)
    same = []
    for tile in TILES:
        same.append(same_candidates(ts.compact(words, tau, cap, tile=tile), kept))
        out[f"compact_tile_{tile}"] = time_ms(lambda: ts.compact(words, tau, cap, tile=tile))
    for segments in SEGMENTS:
        same.append(same_candidates(ts.compact(words, tau, cap, segments), kept))
        out[f"compact_segments_{segments}"] = time_ms(lambda: ts.compact(words, tau, cap, segments))
    for stages in (1, 3):
        out[f"compact_stages_{stages}"] = time_ms(lambda: ts.compact(words, tau, cap, stages=stages))
    same.append(same_candidates(ts.compact(codes, tau, cap), kept))
    out["compact_int64_codes"] = time_ms(lambda: ts.compact(codes, tau, cap))
    out["compaction_same_for_every_form"] = all(same)
    cand, count = kept
    out["overflow_rows"] = int(ts.overflowed(count, cap).sum())
    held = ~ts.overflowed(count, cap)  # an overflowed row's result is the gated selector's to give
    final = torch.topk(held_codes(cand, count), kk, dim=-1, sorted=True).values
    out["final_window"] = time_ms(lambda: ts.top_candidates(cand, count, kk))
    out["final_window_same"] = bool(torch.equal(ts.top_candidates(cand, count, kk)[held], final[held]))
    out["gated_select"] = time_ms(lambda: select_top_codes(words, ts.overflowed(count, cap), kk, out=final.clone()))
    out["top_codes_total"] = time_ms(lambda: ts.top_codes(words, kk))
    given = ts.chunk_maxima(words, scorer_chunks(*words.shape, kk, torch.bfloat16, words.device))  # as the dense scorer writes them
    out["top_codes_given_maxima"] = time_ms(lambda: ts.top_codes(words, kk, given))
    out["top_codes_int64_codes_given_maxima"] = time_ms(lambda: ts.top_codes(codes, kk, given))
    want = torch.topk(codes, kk, dim=-1).values
    out["identical_to_torch_topk"] = (bool(torch.equal(ts.top_codes(words, kk), want))
                                      and bool(torch.equal(ts.top_codes(words, kk, given), want))
                                      and bool(torch.equal(ts.top_codes(codes, kk, given), want)))
    out["read_once_floor_ms"] = round(words.numel() * 4 / 4.2e9, 3)
    return out


def constants_sweep(codes: torch.Tensor, kk: int, device: str, inputs: str, reps: int = 5,
                    forms=COMPACT_FORMS, total_forms=TOTAL_FORMS) -> list[dict]:
    """Rows of the ``--sweep`` (module docstring) for the scorer's words [R, N] of one kind of
    ``inputs``; times are medians of ``reps`` calls; ``forms`` / ``total_forms``: the compaction's
    (tile, segments) timed alone / in the whole selection."""
    time_ms = lambda fn: round(harness.median_ms(fn, reps, device), 3)  # noqa: E731
    rows = []
    for per_k in (1, 2, 4):
        maxima = ts.chunk_maxima(codes, per_k * kk)
        tau = ts.kth_largest(maxima, kk)
        passing = (codes_of_words(codes) >= tau[:, None]).sum(-1).float()
        row = {"inputs": inputs, "chunks_per_k": per_k, "chunk_max": time_ms(lambda: ts.chunk_maxima(codes, per_k * kk)),
               "tau": time_ms(lambda: ts.kth_largest(maxima, kk)), "passing_mean": round(float(passing.mean()), 1),
               "passing_q99": round(float(passing.quantile(0.99)), 1), "passing_max": int(passing.max())}
        for tile, segments in forms:
            row[f"compact_t{tile}_g{segments}"] = time_ms(lambda: ts.compact(codes, tau, 4 * kk, segments, tile))
        for factor in (2, 3, 4):
            cand, count = ts.compact(codes, tau, factor * kk)
            row[f"overflow_rows_{factor}kk"] = int(ts.overflowed(count, factor * kk).sum())
            row[f"final_window_{factor}kk"] = time_ms(lambda: ts.top_candidates(cand, count, kk))
        rows.append(row)
    want = torch.topk(codes_of_words(codes), kk, dim=-1).values
    saved = defaults.CHUNKS_PER_K, defaults.THRESHOLD_BUFFER_K, defaults.COMPACT_TILE, defaults.COMPACT_SEGMENTS
    try:
        for per_k, factor, (tile, segments) in itertools.product((1, 2), (2, 3, 4), total_forms):
            defaults.CHUNKS_PER_K, defaults.THRESHOLD_BUFFER_K, defaults.COMPACT_TILE, defaults.COMPACT_SEGMENTS = per_k, factor, tile, segments
            rows.append({"inputs": inputs, "chunks_per_k": per_k, "candidate_factor": factor, "tile": tile,
                         "segments": segments, "top_codes": time_ms(lambda: ts.top_codes(codes, kk)),
                         "identical_to_torch_topk": bool(torch.equal(ts.top_codes(codes, kk), want))})
    finally:
        defaults.CHUNKS_PER_K, defaults.THRESHOLD_BUFFER_K, defaults.COMPACT_TILE, defaults.COMPACT_SEGMENTS = saved
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
    codes = roofline.all_codes(q, w, k, mask, words=True)[0]  # the scorer's int32 words, as the dense path selects
    del q, k, w
    result = harness.header(device, smoke=args.smoke, S=S, T=T, kk=kk)
    if args.sweep:
        reps = 1 if args.smoke else 5
        # The smoke run checks the code path with one form of each kind.
        forms = (COMPACT_FORMS[:2], TOTAL_FORMS[:1]) if args.smoke else (COMPACT_FORMS, TOTAL_FORMS)
        rows = constants_sweep(codes, kk, device, "random", reps, *forms)
        del codes
        q, k, w, _ = structured_indexer_inputs(1, S, T, roofline.H, roofline.D, dtype=torch.bfloat16)
        codes = roofline.all_codes(q.to(device), w.float().to(device), k.to(device), mask, words=True)[0]
        result["rows"] = rows + constants_sweep(codes, kk, device, "structured", reps, *forms)
    else:
        result.update(parts(codes, kk, device))
    table = (harness.rows_table(result["rows"]) if args.sweep else
             harness.markdown_table(["part", "value"], [[n, v] for n, v in result.items()
                                                      if n not in ("device", "versions")]))
    harness.write_results(args.out, result, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

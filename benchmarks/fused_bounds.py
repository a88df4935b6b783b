"""How many keys a fused selection would emit, for three bounds on a row's kk-th score (CPU).

    python3 benchmarks/fused_bounds.py --out benchmarks/results/fused_bounds_cpu.json   # ~5 min, 2 cores
    python3 benchmarks/fused_bounds.py --smoke --out /tmp/fused_bounds.json

A design measurement for a selection fused into the dense scorer: score half the scorer's groups
(the positions of chunk index below n / 2, spread over the row), bound the row's kk-th score from
them, and let the other half emit its keys at or above the bound. Per row of exact fp32 scores of S
queries over T visible keys, in units of kk: ``chunks_<c>kk``: the bound is the kk-th largest of the
first half's maxima of c kk interleaved chunks; ``emitted`` the second half's keys >= it, ``total``
those plus the first half's keys >= today's tau (the buffer a fused form fills), ``today_kept`` the
keys >= today's tau; ``exact_half_kth``: the first half's exact kk-th. Every bound is at most the
row's kk-th score, so every total is at least kk: checked (``total_min`` >= 1). Inputs: Gaussian
q, k, w and the indexer zoo's families.
"""
from __future__ import annotations

import argparse
import json

import torch

from benchmarks import harness
from runtime.dense_scorer import exact_scores
from runtime.indexer_zoo import zoo_inputs

FAMILIES = ("gaussian", "misaligned_runs", "locality_64", "random_indexer", "mixture", "heavy_norms")
CHUNKS_PER_K = (2, 4, 8)
"""Chunk counts (in kk) whose first-half maxima bound the kk-th score: today's 2, then 4 and 8."""


def inputs(family: str, S: int, T: int, H: int, D: int):
    """(q [1,S,H,D], k [1,T,D], w [1,S,H]) of ``family``: bf16 q and k, fp32 w."""
    if family == "gaussian":
        g = torch.Generator().manual_seed(1)
        return (torch.randn(1, S, H, D, generator=g).bfloat16(), torch.randn(1, T, D, generator=g).bfloat16(),
                torch.randn(1, S, H, generator=g))
    q, k, w, _ = zoo_inputs(family, 1, S, T, H, D, seed=0, dtype=torch.bfloat16)
    return q, k, w


def kth(x: torch.Tensor, r: int) -> torch.Tensor:
    """The r-th largest of each row of x."""
    return torch.topk(x, r, dim=-1).values[..., -1]


def in_kk(counts: torch.Tensor, kk: int) -> dict:
    """Mean, least and largest of per-row counts, in units of kk."""
    c = counts.float() / kk
    return {"mean": round(float(c.mean()), 3), "min": round(float(c.min()), 3), "max": round(float(c.max()), 3)}


def bound_rows(scores: torch.Tensor, kk: int) -> list[dict]:
    """The module docstring's rows for scores [S, T]."""
    S, T = scores.shape
    rows = []
    for per_k in CHUNKS_PER_K:
        n = per_k * kk
        maxima = scores.view(S, T // n, n).amax(1)  # chunk j: positions j, j + n, ...
        first = torch.arange(T) % n < n // 2
        bound = kth(maxima[:, : n // 2], kk)
        emitted = ((scores >= bound[:, None]) & ~first).sum(-1)
        tau = kth(maxima, kk)
        total = emitted + ((scores >= tau[:, None]) & first).sum(-1)
        rows.append({"bound": f"chunks_{per_k}kk", "emitted": in_kk(emitted, kk), "total": in_kk(total, kk),
                     "today_kept": in_kk((scores >= tau[:, None]).sum(-1), kk)})
    first = torch.arange(T) % (2 * kk) < kk
    bound = kth(scores[:, first], kk)
    emitted = ((scores >= bound[:, None]) & ~first).sum(-1)
    rows.append({"bound": "exact_half_kth", "emitted": in_kk(emitted, kk), "total": in_kk(emitted + kk, kk)})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--smoke", action="store_true", help="tiny sizes (S=3, T=4096, H=8, D=16, kk=64)")
    args = p.parse_args(argv)
    S, T, H, D, kk = (3, 4096, 8, 16, 64) if args.smoke else (24, 131072, 64, 128, 2048)
    if T % (max(CHUNKS_PER_K) * kk):
        raise ValueError(f"T = {T} must be a multiple of {max(CHUNKS_PER_K)} kk = {max(CHUNKS_PER_K) * kk}")
    result = harness.header("cpu", S=S, T=T, H=H, D=D, kk=kk, rows=[])
    for family in args.families:
        q, k, w = inputs(family, S, T, H, D)
        scores = exact_scores(q.float(), w, k[:, None].float())[0]
        for row in bound_rows(scores, kk):
            row = {"inputs": family, **row}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    result["every_bound_below_the_kth"] = all(r["total"]["min"] >= 1 for r in result["rows"])
    table = harness.markdown_table(
        ["inputs", "bound", "emitted mean (max), kk", "buffer mean (max), kk", "today's buffer, kk"],
        [[r["inputs"], r["bound"], f"{r['emitted']['mean']} ({r['emitted']['max']})",
          f"{r['total']['mean']} ({r['total']['max']})", r.get("today_kept", {}).get("mean")] for r in result["rows"]])
    harness.write_results(args.out, result, table)
    return 0 if result["every_bound_below_the_kth"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

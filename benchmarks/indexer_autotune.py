"""Certified DSA top-K on one GPU with the screen's default launch config against its autotuned one.

    PYTHONPATH=. python3 benchmarks/indexer_autotune.py --out-dir benchmarks/results

Structured inputs (``runtime.structured_indexer``, seed 0), bf16, D = 128, topk = 2048, a causal
chunk of S queries at the end of T keys. Per retained budget r: the tuning itself
(``choose_screen_config`` on an empty cache file), the screen kernel alone under every candidate
of ``compiler.lowering.defaults.SCREEN_CONFIGS``, then ``certified_topk_cuda`` with the default,
the tuned and the automatic config, each checked ``identical`` to ``dense_topk_cuda`` (indices,
values bitwise). Median device ms after a warm-up call; JSON and markdown after every row.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import harness

D = 128
TOPK = 2048


def timed(fn, reps=7):
    """(median device ms of ``reps`` calls after one warm-up call, the last result): ``harness.measure``."""
    t = harness.measure(fn, "cuda", reps)
    return t.ms, t.out


def render_markdown(doc) -> str:
    v = harness.versions_of(doc)
    lines = [f"Device: {doc['device']}, torch {v['torch']}, triton {v['triton']}. "
             f"Shape: {doc['shape']}.", ""]
    if "dense_ms" in doc:
        lines.append(f"triton_dense (dense_topk_cuda): {doc['dense_ms']:.1f} ms")
        lines.append("")
    for run in doc["runs"]:
        lines.append(f"## r = {run['r']} (screen rows padded: {run.get('screen_rows', '?')}, "
                     f"pruned: {100 * run.get('pruned_frac', float('nan')):.1f}% of visible keys)")
        lines.append("")
        if run.get("screen"):
            lines += ["| screen config (BLOCK_T, warps, stages) | screen ms |", "|---|---|"]
            for row in run["screen"]:
                lines.append(f"| {row['config']} | {row['ms']:.2f} |")
            lines.append("")
        if "tuning_s" in run:
            lines.append(f"Tuning (empty cache, launch check + measurement): {run['tuning_s']:.2f} s; "
                         f"chosen: {run['tuned_config']}")
            lines.append("")
        if run.get("certified"):
            lines += ["| certified with screen config | ms | vs triton_dense | identical |",
                      "|---|---|---|---|"]
            for row in run["certified"]:
                lines.append(f"| {row['which']} {row['config']} | {row['ms']:.1f} | "
                             f"{doc['dense_ms'] / row['ms']:.2f}x | {row['identical']} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def label(config) -> str:
    kw = config.kwargs()
    return f"({kw['BLOCK_T']}, {kw['num_warps']}, {kw['num_stages']})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--S", type=int, default=16384)
    ap.add_argument("--T", type=int, default=131072)
    ap.add_argument("--H", type=int, default=64)
    ap.add_argument("--r", type=int, nargs="+", default=[1, 4])
    args = ap.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # A fresh tuning cache, so that the measured tuning time is a cold one.
    os.environ["PULSAR_DOSA_AUTOTUNE_CACHE"] = str(Path(tempfile.mkdtemp()) / "autotune.json")

    from compiler.lowering import defaults
    from compiler.lowering.screen.key_norms import key_norms
    from compiler.lowering.topk_pipeline import certified_topk_cuda, dense_topk_cuda
    from compiler.lowering.scoring.indexer_scores import mask_operand
    from compiler.lowering.screen.certificate_screen import (
        choose_screen_config,
        screen,
    )
    from runtime.certified_topk import CertifiedTopkConfig
    from runtime.structured_indexer import structured_indexer_inputs

    S, T, H = args.S, args.T, args.H
    doc = harness.header("cuda", shape={"S": S, "T": T, "H": H, "D": D, "topk": TOPK, "dtype": "bfloat16",
                                        "input": "structured", "mask": "causal chunk"}, runs=[])

    def save():
        harness.write_json(out_dir / "indexer_autotune_h200.json", doc)
        (out_dir / "indexer_autotune_h200.md").write_text(
            "# Screen launch config: default vs autotuned (certified top-K, one H200)\n\n"
            + render_markdown(doc))

    t0 = time.perf_counter()
    q, k, w, params = structured_indexer_inputs(1, S, T, H, D, seed=0, dtype=torch.bfloat16)
    q, k, w = q.cuda(), k.cuda(), w.float().cuda()
    mask = torch.ones(S, T, dtype=torch.bool, device="cuda").tril(T - S)[None]
    doc["input_params"] = params
    print(f"inputs ready in {time.perf_counter() - t0:.1f} s", flush=True)
    doc["dense_ms"], (dv, di) = timed(lambda: dense_topk_cuda(q, k, w, TOPK, mask), 5)
    print(f"triton_dense {doc['dense_ms']:.1f} ms", flush=True)
    save()
    nk = key_norms(k)
    for r in args.r:
        cfg = CertifiedTopkConfig(path="certified", r=r)
        run = {"r": r, "screen": [], "certified": []}
        doc["runs"].append(run)
        trace = []
        certified_topk_cuda(q, k, w, TOPK, mask, config=cfg, trace=trace,
                            screen_config=defaults.SCREEN_CONFIGS[0])
        tr = trace[0]
        p = tr.plan
        run["screen_rows"] = p.g.shape[2]
        run["pruned_frac"] = 1 - float(torch.where(tr.list_count > tr.cap, T, tr.list_count).float()
                                       .sum() * tr.list_queries / mask.sum())

        def launch(config):
            return screen(p.g, p.alpha, p.beta, p.e, p.c, tr.tau, k, nk, mask=mask,
                          lists_per_batch=tr.list_count.shape[1], list_queries=tr.list_queries,
                          cap=tr.cap, config=config)

        torch.cuda.synchronize()
        t1 = time.perf_counter()
        kind = mask_operand(mask, 1, S, T)[0]
        tuned = choose_screen_config(launch, k, kind, p.g.shape[2], tr.list_queries,
                                     work=S * T * p.g.shape[2] * k.shape[2])
        torch.cuda.synchronize()
        run["tuning_s"] = time.perf_counter() - t1
        run["tuned_config"] = label(tuned)
        print(f"r={r} tuned {label(tuned)} in {run['tuning_s']:.2f} s", flush=True)
        save()
        for config in defaults.SCREEN_CONFIGS:
            try:
                ms, _ = timed(lambda: launch(config), 10)
                run["screen"].append({"config": label(config), "ms": ms})
            except Exception as err:  # a candidate that does not compile here is reported
                run["screen"].append({"config": label(config), "ms": float("nan"),
                                      "error": repr(err)[:200]})
            print(f"r={r} screen {run['screen'][-1]}", flush=True)
        save()

        for which, config in (("default", defaults.SCREEN_CONFIGS[0]), ("tuned", tuned),
                              ("auto (screen_config=None)", None)):
            ms, (cv, ci) = timed(lambda: certified_topk_cuda(q, k, w, TOPK, mask, config=cfg,
                                                             screen_config=config), 5)
            same = harness.identical((cv, ci), (dv, di))
            run["certified"].append({"which": which, "config": label(tuned if config is None
                                                                     else config),
                                     "ms": ms, "identical": same})
            print(f"r={r} certified {which} {ms:.1f} ms identical={same}", flush=True)
            save()
    doc["wall_s"] = time.perf_counter() - t0
    save()
    print(render_markdown(doc))


if __name__ == "__main__":
    main()

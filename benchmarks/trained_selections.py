"""How much neighbouring queries share their DSA selections on the trained measuring model.

The sparse-attention form is chosen on shapes (``compiler.policy.sparse_attention_form``): the
union form wins when the queries of a 64-query block select nearly the same keys (a sliding
window), the absorbed form when they do not. This measures which case trained selections are: per
layer of ``benchmarks/models/tiny-dsa`` (the ``trained`` zoo family: the last S queries of a
held-out window of T tokens), the indexer's exact top-K (the op's scorer and order, causal), then
per block of UNION_BLOCK consecutive queries the distinct keys they select, over K (1: all the same
keys; up to UNION_BLOCK: disjoint), and the share of selected keys among each query's K most recent.
``--save`` writes the selections ``[layers, S, K]`` with T for ``sparse_attention_forms.py
--selections`` (one batch row per layer; int16 when T <= 2^15, so that the file is half the size).

    python3 benchmarks/trained_selections.py --T 32768 --S 1024 --out benchmarks/results/trained_selections_cpu.json
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks import harness
from compiler.lowering.attention.union_attention import tile_rows
from runtime.dense_scorer import dense_topk
from runtime.indexer_zoo import zoo_inputs

H, D = 64, 128
UNION_BLOCK = tile_rows(1 << 30)
"""Queries per tile of the union op at prefill lengths (any S > 32)."""


def layer_selections(layer: int, S: int, T: int, topk: int, seed: int = 0) -> torch.Tensor:
    """[S, topk] int64: the trained indexer's exact top-K (``dense_topk``, the op's order) of the last
    S queries (causal) of layer ``layer``."""
    q, k, w, _ = zoo_inputs("trained", 1, S, T, H, D, seed=seed, layer=layer)
    causal = torch.arange(T)[None, None, :] <= torch.arange(T - S, T)[None, :, None]
    return dense_topk(q, k, w, topk, causal)[1][0]


def sharing(indices: torch.Tensor, T: int) -> dict:
    """``union_over_k`` (mean over blocks of UNION_BLOCK queries of their distinct keys / K) and
    ``recent_share`` (mean share of each query's selections among its K most recent keys)."""
    S, topk = indices.shape
    unions = [torch.unique(indices[b:b + UNION_BLOCK]).numel() / topk for b in range(0, S, UNION_BLOCK)]
    position = torch.arange(T - S, T)[:, None]
    recent = (indices > position - topk).double().mean()
    return {"union_over_k": sum(unions) / len(unions), "union_over_k_max": max(unions),
            "recent_share": float(recent)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results JSON (the markdown table is written beside it)")
    p.add_argument("--T", type=int, default=32768)
    p.add_argument("--S", type=int, default=1024)
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--layers", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--save", help="a .pt file for sparse_attention_forms.py --selections")
    args = p.parse_args(argv)
    if not Path(args.out).parent.is_dir():
        p.error(f"--out: directory {Path(args.out).parent} does not exist")
    if not 1 <= args.topk <= args.T - args.S + 1:
        p.error(f"--topk: expected 1 <= topk <= T - S + 1 = {args.T - args.S + 1} (every query sees topk keys), "
                f"got {args.topk}")
    if not 1 <= args.S <= args.T:
        p.error(f"--S: expected 1 <= S <= T={args.T}, got {args.S}")
    doc = harness.header("cpu", T=args.T, S=args.S, topk=args.topk, union_block=UNION_BLOCK, rows=[])
    kept = []
    for layer in args.layers:
        t0 = time.perf_counter()
        indices = layer_selections(layer, args.S, args.T, args.topk)
        doc["rows"].append({"layer": layer, **{k: round(v, 4) for k, v in sharing(indices, args.T).items()},
                            "seconds": round(time.perf_counter() - t0, 1)})
        print(doc["rows"][-1], flush=True)
        harness.write_json(args.out, doc)
        kept.append(indices.to(torch.int16 if args.T <= 1 << 15 else torch.int32))
    if args.save:
        torch.save({"indices": torch.stack(kept), "T": args.T, "layers": args.layers}, args.save)
    harness.write_results(args.out, doc, harness.rows_table(doc["rows"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

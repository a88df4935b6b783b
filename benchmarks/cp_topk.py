"""The context-parallel certified top-K (``runtime.certified_topk_cp``) with R ranks simulated in
turn on one GPU: each rank's share of the time, its bytes, its pruning with and without the shared
threshold.

    PYTHONPATH=. python3 benchmarks/cp_topk.py --out benchmarks/results/cp_topk_h200.json
    PYTHONPATH=. python3 benchmarks/cp_topk.py --smoke --out /tmp/cp_topk.json   # CPU, tiny sizes, seconds

Inputs: ``structured`` (``runtime.structured_indexer``: a trained indexer's geometry) and
``random`` (the zoo's ``random_indexer``, a random-init DeepseekV32Indexer: it does not prune);
S=16384 queries at the end of T=524288 keys under a causal chunk mask, H=64, D=128, topk=2048, q
and k bf16. The keys are sharded contiguously over R in {2, 4, 8} ranks. The ranks run one after
another, each its share exactly as ``certified_topk_cp`` runs it (``shard_candidates``: the
shard's certified top-K on the device's kernel, ``compiler.certified_topk_cp.shard_kernel``, with
the structured plan's config, ``dense_roofline.PLAN``, for both inputs; then the order codes it
sends), three times: dense (config path "dense": every rank scores every key of its shard, as
vLLM's context parallelism does: the anchor), certified with its own thresholds, and certified with
the shared bound (the max over the ranks of their seed thresholds, recorded by the first certified
run's warm-up calls: what the all-reduce returns). Then the merge that every rank runs
(``merge_candidates``), and the three merged results are checked against the one-GPU dense op
(indices equal, values bitwise).

Reported per (input, R): ``one_gpu_ms`` (the one-GPU certified op) and ``dense_ms``; per rank
the time of its share, the fraction of its screened (query, key) pairs it pruned (``TopkStats``;
on CUDA refined pairs are counted per scorer tile) and the fractions of its rows that were short
or redone densely, without (``local``) and with (``shared``) the shared bound; the slowest
rank's time, the merge's, ``cp_ms`` = slowest shared rank + merge, ``dense_cp_ms`` = slowest
dense rank + merge, ``speedup`` = one_gpu_ms / cp_ms and ``speedup_vs_dense_cp`` = dense_cp_ms /
cp_ms. The collectives do not run here: ``bytes_per_rank`` gives each rank's payloads (the
all-reduce: B*S float32; the all-gather: B*S*topk + 1 int64) and what a ring algorithm sends
(2 (R-1)/R of the all-reduce's, R-1 times the all-gather's); their time is not in cp_ms.

NCCL: this script runs no collective. The multi-process path (the same functions with
torch.distributed collectives) is tested with gloo on the CPU (tests/test_certified_topk_cp.py);
with NCCL on several GPUs it has not been run (``nccl`` in the JSON).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json

import torch

from benchmarks.dense_roofline import PLAN
from benchmarks import harness
from benchmarks.harness import identical, median_ms
from compiler.certified_topk_cp import shard_kernel
from runtime.certified_topk import CertifiedTopkConfig, TopkStats
from runtime.certified_topk_cp import merge_candidates, shard_candidates
from runtime.dense_scorer import dense_topk
from runtime.indexer_zoo import zoo_inputs
from runtime.structured_indexer import structured_indexer_inputs

FULL = dict(S=16384, T=524288, H=64, D=128, topk=2048, ranks=(2, 4, 8), reps=3, device="cuda", config=PLAN,
            random_params={})
SMOKE = dict(S=16, T=256, H=4, D=8, topk=8, ranks=(2, 4), reps=1, device="cpu",
             config=CertifiedTopkConfig(anchor_stride=4, sink=4, window=8),
             random_params=dict(hidden_size=64, q_lora_rank=32))
INPUTS = ("structured", "random")
NCCL = "not run: every rank simulated in turn on one GPU; collectives counted, not timed"


def make_inputs(name: str, sizes: dict):
    """(q, k, w, mask) of input ``name`` at ``sizes`` on its device: q, k bf16, w fp32, causal chunk mask."""
    S, T, H, D, device = sizes["S"], sizes["T"], sizes["H"], sizes["D"], sizes["device"]
    if name == "structured":
        q, k, w, _ = structured_indexer_inputs(1, S, T, H, D, dtype=torch.bfloat16, device=device)
    else:
        q, k, w, _ = zoo_inputs("random_indexer", 1, S, T, H, D, dtype=torch.bfloat16, device=device,
                                **sizes["random_params"])
    mask = torch.ones(S, T, dtype=torch.bool, device=device).tril(T - S)[None]
    return q, k, w.float(), mask


def rank_share(q, k, w, mask, keys: slice, sizes: dict, warmup_hook, hook) -> tuple[dict, torch.Tensor]:
    """One rank's share (its codes and a row): ms, the median of ``reps`` calls with ``hook`` as the
    shared bound after a warm-up call with ``warmup_hook``, which also takes the counters (pruned
    fraction; on CUDA the short and redone rows)."""
    device = torch.device(sizes["device"])
    traces = [] if device.type == "cuda" else None  # the Triton kernel's CertifiedTrace
    stats = TopkStats()

    def run(shared_bound, stats=None, traces=None):
        kernel = shard_kernel(device)
        if traces is not None:
            kernel = functools.partial(kernel, trace=traces)
        return shard_candidates(q, k[:, keys], w, sizes["topk"], mask[..., keys], keys.start, kernel=kernel,
                                config=sizes["config"], stats=stats, shared_bound=shared_bound)

    run(warmup_hook, stats, traces)
    ms = median_ms(lambda: run(hook), sizes["reps"], device)
    row = {"ms": round(ms, 3), "pruned": round(stats.pruned_frac, 4)}
    if traces:
        row["short_rows"] = round(float(traces[0].short.float().mean()), 4)
        row["redo_rows"] = round(float(traces[0].redo.float().mean()), 4)
    return row, run(hook)


def simulate(q, k, w, mask, R: int, sizes: dict, want) -> dict:
    """Every rank's share without and with the shared bound, the merge, exactness (module docstring)."""
    T, B, S, topk = k.shape[1], q.shape[0], q.shape[1], sizes["topk"]
    cuts = [T * r // R for r in range(R + 1)]
    shards = [slice(a, b) for a, b in zip(cuts, cuts[1:])]
    seen = []  # every rank's seed thresholds, as the warm-up calls without sharing pass them

    def record(bound):
        seen.append(bound)
        return bound

    dense_sizes = {**sizes, "config": dataclasses.replace(sizes["config"], path="dense")}
    dense = [rank_share(q, k, w, mask, keys, dense_sizes, None, None) for keys in shards]
    local = [rank_share(q, k, w, mask, keys, sizes, record, None) for keys in shards]
    bound = torch.stack(seen).amax(0) if seen else None  # what the all-reduce returns
    hook = None if bound is None else (lambda own: torch.maximum(own, bound))
    shared = [rank_share(q, k, w, mask, keys, sizes, hook, hook) for keys in shards]
    kk = min(topk, T)
    codes = {name: torch.stack([c for _, c in runs])
             for name, runs in (("dense", dense), ("local", local), ("shared", shared))}
    merge_ms = median_ms(lambda: merge_candidates(codes["shared"], kk), sizes["reps"], torch.device(sizes["device"]))
    max_shared = max(r["ms"] for r, _ in shared)
    row = {"R": R, "T_per_rank": [s.stop - s.start for s in shards],
           "local": [r for r, _ in local], "shared": [r for r, _ in shared],
           "max_rank_local_ms": max(r["ms"] for r, _ in local), "max_rank_shared_ms": max_shared,
           "merge_ms": round(merge_ms, 3), "cp_ms": round(max_shared + merge_ms, 3),
           "max_rank_dense_ms": max(r["ms"] for r, _ in dense),
           "dense_cp_ms": round(max(r["ms"] for r, _ in dense) + merge_ms, 3),
           "identical_dense": identical(merge_candidates(codes["dense"], kk), want),
           "identical_local": identical(merge_candidates(codes["local"], kk), want),
           "identical_shared": identical(merge_candidates(codes["shared"], kk), want)}
    reduce_bytes, gather_bytes = 4 * B * S, 8 * (B * S * topk + 1)
    row["bytes_per_rank"] = {"all_reduce_payload": reduce_bytes, "all_gather_payload": gather_bytes,
                             "ring_sent": round(2 * (R - 1) / R * reduce_bytes + (R - 1) * gather_bytes)}
    return row


def measure(name: str, sizes: dict) -> list[dict]:
    """The rows of one input: the one-GPU ops, then every R."""
    q, k, w, mask = make_inputs(name, sizes)
    device = torch.device(sizes["device"])
    kernel, topk = shard_kernel(device), sizes["topk"]
    if device.type == "cuda":
        from compiler.lowering.topk_pipeline import dense_topk_cuda as dense
    else:
        dense = dense_topk
    want = dense(q, k, w, topk, mask)
    dense_ms = median_ms(lambda: dense(q, k, w, topk, mask), 1, device)
    stats = TopkStats()
    one_gpu = kernel(q, k, w, topk, mask, config=sizes["config"], stats=stats)
    one_gpu_ms = median_ms(lambda: kernel(q, k, w, topk, mask, config=sizes["config"]), sizes["reps"], device)
    base = {"input": name, "dense_ms": round(dense_ms, 3), "one_gpu_ms": round(one_gpu_ms, 3),
            "one_gpu_pruned": round(stats.pruned_frac, 4), "one_gpu_identical": identical(one_gpu, want)}
    rows = []
    for R in sizes["ranks"]:
        row = {**base, **simulate(q, k, w, mask, R, sizes, want)}
        row["speedup"] = round(row["one_gpu_ms"] / row["cp_ms"], 3)
        row["speedup_vs_dense_cp"] = round(row["dense_cp_ms"] / row["cp_ms"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """A readable table of the rows."""
    head = ("input", "R", "one-GPU ms (dense)", "slowest rank ms: dense / own / shared", "merge ms",
            "speed-up vs one GPU", "vs dense shards", "pruned % own", "pruned % shared", "exact")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        pruned = {m: "/".join(f"{100 * x['pruned']:.1f}" for x in r[m]) for m in ("local", "shared")}
        lines.append(" | ".join(str(x) for x in (
            r["input"], r["R"], f"{r['one_gpu_ms']} ({r['dense_ms']})",
            f"{r.get('max_rank_dense_ms', '-')} / {r['max_rank_local_ms']} / {r['max_rank_shared_ms']}",
            r["merge_ms"], r["speedup"], r.get("speedup_vs_dense_cp", "-"), pruned["local"], pruned["shared"],
            r.get("identical_dense", True) and r["identical_local"] and r["identical_shared"]
            and r["one_gpu_identical"])))
    return "\n".join(lines)


def render(doc: dict) -> str:
    """The results document's markdown: what was run, then ``table``."""
    sizes = doc["sizes"]
    return (f"# Context-parallel certified top-K, R ranks simulated in turn on one GPU ({doc['device']})\n\n"
            f"S={sizes['S']}, T={sizes['T']}, H={sizes['H']}, D={sizes['D']}, topk={sizes['topk']}, bf16, causal "
            f"chunk mask; certified config {doc['config']}. One-GPU: the certified op (the dense op in brackets). "
            "Slowest rank: dense shards (each rank scores all its keys) / certified with its own thresholds / "
            "certified with the shared threshold. Speed-ups: one-GPU certified over CP certified, and CP dense over "
            f"CP certified (collectives not timed). NCCL: {doc['nccl']}.\n\n" + table(doc["rows"]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results JSON (the markdown table is written beside it)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (plain-torch shard kernel)")
    args = p.parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    doc = {"device": torch.cuda.get_device_name() if sizes["device"] == "cuda" else "cpu (smoke)",
           "versions": {"torch": torch.__version__}, "nccl": NCCL,
           "sizes": {n: v for n, v in sizes.items() if n not in ("config", "random_params", "device")},
           "config": repr(sizes["config"]), "rows": []}
    for name in INPUTS:  # the document is rewritten after each input, so that a run cut short keeps it
        doc["rows"] += measure(name, sizes)
        harness.write_json(args.out, doc)
    harness.write_results(args.out, doc, render(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

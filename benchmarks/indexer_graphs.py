"""The indexer top-K inside CUDA graphs on one GPU: no host synchronisation, same answer, time.

    PYTHONPATH=. python3 benchmarks/indexer_graphs.py --out benchmarks/results/indexer_graphs_h200.json
    PYTHONPATH=. python3 benchmarks/indexer_graphs.py --render benchmarks/results/indexer_graphs_h200.json

Every method, after two warm-up calls, is run under ``torch.cuda.set_sync_debug_mode("error")``
(``no_sync``: it never waited on the device), captured in a CUDA graph and replayed (``identical``:
eager and replayed outputs equal ``dense_topk_cuda``'s, indices and values bitwise), then timed
(median of eager calls and of replays). Cases: a causal chunk of S queries at the end of T keys on
structured inputs (the op as a compiled model calls it: "auto" with the cost model's crossover, or
a plan's r = 1) and on a random-init transformers indexer forced certified (mostly redone densely);
decode of one query (the op, the transformers pattern in plain torch, the dense path); and the
gated radix selector against ``torch.topk`` on random codes.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import compiler.ops.certified_topk  # noqa: F401  (registers torch.ops.pulsar_dosa)
from benchmarks import harness
from benchmarks.harness import median_ms
from benchmarks.indexer import D, TOPK, causal_chunk_mask, decode_dense, transformers_random
from compiler.lowering import defaults
from compiler.lowering.selection.radix_select import default_splits, select_top_codes
from compiler.lowering.topk_pipeline import certified_topk_cuda, dense_topk_cuda
from runtime.certified_topk import CertifiedTopkConfig
from runtime.structured_indexer import structured_indexer_inputs

CERTIFIED = CertifiedTopkConfig(path="certified")
PLAN_CROSSOVER = 32725
"""The crossover of the per-layer plan for the structured geometry (results/indexer_plan_h200.md,
r = 1): ``op_plan_r1`` is the op as a model compiled with that plan calls it."""


def without_sync(fn):
    """(output, True) when ``fn`` ran with host synchronisations forbidden; (None, error text)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn(), True
    except RuntimeError as exc:
        return None, repr(exc)[:300]
    finally:
        torch.cuda.set_sync_debug_mode(0)


def captured(fn):
    """(graph, outputs of the captured call) after two warm-up calls on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def same(out, ref):
    """Indices equal and, when ``out`` carries values, values bitwise equal (``harness.identical``)."""
    return harness.identical(out, ref[1] if isinstance(out, torch.Tensor) else ref)


def measure(fn, ref, reps):
    """One row: no_sync, identical (eager and replay), eager and replay medians."""
    fn()
    torch.cuda.synchronize()
    eager_out, no_sync = without_sync(fn)
    graph, graph_out = captured(fn)
    graph.replay()
    torch.cuda.synchronize()
    row = {"no_sync": no_sync,
           "identical_eager": None if eager_out is None else same(eager_out, ref),
           "identical_graph": same(graph_out, ref),
           "eager_ms": median_ms(fn, reps), "graph_ms": median_ms(graph.replay, reps)}
    del graph
    torch.cuda.empty_cache()
    return row


def structured(S, T, H):
    q, k, w, params = structured_indexer_inputs(1, S, T, H, D, dtype=torch.bfloat16)
    return q.cuda(), k.cuda(), w.float().cuda(), params


def prefill_rows(S, T, H, inputs, reps, rows):
    q, k, w, _ = (structured if inputs == "structured" else transformers_random)(S, T, H)
    mask = causal_chunk_mask(S, T)
    ref = dense_topk_cuda(q, k, w, TOPK, mask)
    base = {"case": "prefill", "input": inputs, "S": S, "T": T, "H": H}
    methods = {"triton_dense": lambda: dense_topk_cuda(q, k, w, TOPK, mask),
               "certified": lambda: certified_topk_cuda(q, k, w, TOPK, mask, config=CERTIFIED)}
    if inputs == "structured":
        methods["op_auto_crossover"] = lambda: torch.ops.pulsar_dosa.certified_topk(
            q, k, w, TOPK, mask, "graphs.auto", path="auto", min_keys=65536)
        methods["op_plan_r1"] = lambda: torch.ops.pulsar_dosa.certified_topk(
            q, k, w, TOPK, mask, "graphs.plan_r1", path="auto", r=1, min_keys=PLAN_CROSSOVER)
    for name, fn in methods.items():
        rows.append({**base, "method": name, **measure(fn, ref, reps)})
        print(rows[-1], flush=True)


def decode_rows(T, H, reps, rows):
    q, k, w, _ = structured(2, T, H)
    mask = causal_chunk_mask(2, T)
    ql, wl, ml = q[:, 1:], w[:, 1:], mask[:, 1:]
    ref = dense_topk_cuda(ql, k, wl, TOPK, ml)
    base = {"case": "decode", "input": "structured", "S": 1, "T": T, "H": H}
    methods = {
        "decode_dense_torch": lambda: decode_dense(ql, k, wl, ml, TOPK),
        "decode_triton_dense": lambda: dense_topk_cuda(ql, k, wl, TOPK, ml),
        "decode_op": lambda: torch.ops.pulsar_dosa.certified_topk(ql, k, wl, TOPK, ml, layer="decode", min_keys=0),
    }
    for name, fn in methods.items():
        rows.append({**base, "method": name, **measure(fn, ref, reps)})
        print(rows[-1], flush=True)


def select_rows(R, N, reps, rows):
    """The gated selector against torch.topk on random int64 codes [R, N]: every row valid, or one
    valid row, each with one program per row (splits=1) and with several (default_splits)."""
    codes = torch.randint(-2**62, 2**62, (R, N), device="cuda")
    ref = torch.topk(codes, TOPK, dim=-1).values
    base = {"case": "select", "input": "random_codes", "S": R, "T": N, "H": None}
    every = torch.ones(R, dtype=torch.bool, device="cuda")
    one = torch.arange(R, device="cuda") == 0
    split = default_splits(1, N, defaults.RADIX_BLOCK, codes.device)
    variants = (("select_all_rows_p1", every, 1, False), ("select_one_row_p1", one, 1, False),
                ("select_one_row_split", one, split, False),
                ("select_all_rows_p1_scratch (incl. a copy of the codes)", every, 1, True),
                ("select_one_row_p1_scratch (incl. a copy of the codes)", one, 1, True))
    for name, valid, splits, scratch in variants:
        out = torch.zeros(R, TOPK, dtype=torch.int64, device="cuda")
        fn = lambda: select_top_codes(codes.clone() if scratch else codes, valid, TOPK,  # noqa: E731
                                      out=out, splits=splits, scratch=scratch)
        fn()
        torch.cuda.synchronize()
        rows.append({**base, "method": f"{name} (P={splits})", "no_sync": without_sync(fn)[1] is True,
                     "identical_eager": bool(torch.equal(out[valid], ref[valid])),
                     "identical_graph": None, "eager_ms": median_ms(fn, reps), "graph_ms": None})
        print(rows[-1], flush=True)
    rows.append({**base, "method": "copy_of_the_codes", "no_sync": True, "identical_eager": None,
                 "identical_graph": None, "eager_ms": median_ms(codes.clone, reps), "graph_ms": None})
    rows.append({**base, "method": "torch_topk_all_rows", "no_sync": True, "identical_eager": True,
                 "identical_graph": None,
                 "eager_ms": median_ms(lambda: torch.topk(codes, TOPK, dim=-1), reps),
                 "graph_ms": None})
    print(rows[-1], flush=True)


def render_markdown(doc) -> str:
    v = harness.versions_of(doc)
    out = [f"Device: {doc['device']}, torch {v['torch']}, triton {v['triton']}. D = {D}, "
           f"topk = {TOPK}, bf16, causal chunk mask.", "",
           "| case | input | H | S | T | method | no host sync | identical (eager / graph) | "
           "eager ms | graph ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        if "error" in r:
            out.append(f"| {r.get('case')} | {r.get('input')} | {r.get('H')} | {r.get('S')} | "
                       f"{r.get('T')} | {r.get('method', '-')} | error: {r['error'][:80]} | | | |")
            continue
        sync = "yes" if r["no_sync"] is True else "no"
        graph = "-" if r["graph_ms"] is None else f"{r['graph_ms']:.3f}"
        out.append(f"| {r['case']} | {r['input']} | {r['H']} | {r['S']} | {r['T']} | {r['method']} | "
                   f"{sync} | {r['identical_eager']} / {r['identical_graph']} | "
                   f"{r['eager_ms']:.3f} | {graph} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--render")
    ap.add_argument("--out")
    ap.add_argument("--prefill", nargs="+", default=["structured:16384:131072:64",
                                                     "structured:16384:524288:64",
                                                     "transformers_random:4096:131072:64"],
                    help="input:S:T:H cases")
    ap.add_argument("--decode_T", type=int, nargs="+", default=[32768, 131072, 524288])
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            print(render_markdown(json.load(f)), end="")
        return
    if not args.out:
        ap.error("--out is required to run the benchmark")
    t0 = time.perf_counter()
    doc = harness.header("cuda", rows=[])
    jobs = ([("select", N) for N in (131072, 524288)] + [("decode", T) for T in args.decode_T]
            + [("prefill", c) for c in args.prefill])
    for kind, spec in jobs:
        try:
            if kind == "select":
                select_rows(128, spec, args.reps, doc["rows"])
            elif kind == "decode":
                decode_rows(spec, 64, 50, doc["rows"])
            else:
                inputs, S, T, H = spec.split(":")
                prefill_rows(int(S), int(T), int(H), inputs, args.reps, doc["rows"])
        except Exception as exc:  # recorded, the run goes on with the next case
            doc["rows"].append({"case": kind, "spec": str(spec), "error": repr(exc)[:500]})
            print(doc["rows"][-1], flush=True)
            torch.cuda.empty_cache()
        harness.write_json(args.out, doc)
    harness.write_results(args.out, doc, render_markdown(doc))
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

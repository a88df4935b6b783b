"""A plan's retained-head budget r against fixed budgets, on the structured indexer geometry.

    PYTHONPATH=. python3 benchmarks/indexer_plan.py --out benchmarks/results/indexer_plan_h200.json
    PYTHONPATH=. python3 benchmarks/indexer_plan.py --tiny --out /tmp/plan.json   # CPU, TRITON_INTERPRET=1

The plan (``compiler.plan.cli.plan_from_calls``, H200 constants) measures m(r) on a calibration
slice and chooses the layer's settings for S queries at the first timed length. Per key length T
(a causal chunk of S queries at the end of T keys): ``triton_dense``; ``plan_op``, the op with the
plan's settings as a compiled layer calls it (under the runtime guard); ``fixed_r<r>``, the
certified pipeline with that r. Every row: median host-paced ms, ``identical`` (indices and values
bitwise equal to triton_dense's), the path taken, the pruned fraction and refined keys per query
(one traced call), and the cost model's prediction. Inputs: ``runtime.structured_indexer``,
default parameters, seed 0, bf16, generated once at the largest sizes and sliced.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from benchmarks import harness
from compiler.cost_model import H200_FITTED, T as T_SYMBOL, IndexerShape, certified_call_time, dense_call_time
from compiler.lowering.topk_pipeline import certified_topk_cuda, dense_topk_cuda
from compiler.policy import layer_settings
from compiler.ops.capture_topk import CapturedCall
from compiler.plan.cli import plan_from_calls
from runtime.certified_topk import CertifiedTopkConfig
from runtime.dense_scorer import dense_topk
from runtime.structured_indexer import structured_indexer_inputs

LAYER = "structured"
FULL = {"S": 16384, "T": [131072, 524288], "H": 64, "D": 128, "topk": 2048, "cal_S": 512,
        "cal_T": 131072, "fixed_r": [4, 8, 16], "candidates": [1, 3, 4, 7, 8, 15, 16]}
TINY = {"S": 32, "T": [2048], "H": 16, "D": 32, "topk": 64, "cal_S": 16, "cal_T": 1024,
        "fixed_r": [4, 8], "candidates": [1, 3, 4, 7, 8]}


def timed(fn, device, budget_s, max_reps=7):
    """(median wall ms of synchronised calls after one warm-up call, within ``budget_s`` and at
    least 3 calls, the last result): ``harness.measure``, host-paced as a compiled layer runs."""
    t = harness.measure(fn, device, max_reps, host_paced=True, budget_s=budget_s, min_reps=3)
    return t.ms, t.out


def causal_chunk_mask(S, T, device):
    """[1,S,T] bool: query i sits at position T - S + i and sees keys <= its position."""
    return torch.ones(S, T, dtype=torch.bool, device=device).tril(T - S)[None]


def make_plan(q, k, w, sizes, device, queries, design_length):
    """The plan of the one structured layer from the calibration slice, and its wall seconds."""
    S, T = sizes["cal_S"], sizes["cal_T"]
    call = CapturedCall(q[:, :S].float(), k[:, :T].float(), w[:, :S].float(), sizes["topk"],
                        causal_chunk_mask(S, T, device))
    t0 = time.perf_counter()
    plan = plan_from_calls({LAYER: [call]}, constants=H200_FITTED, design_length=design_length,
                           queries=queries, candidates=sizes["candidates"], model={"spec": "structured"},
                           inputs={"source": "runtime.structured_indexer", "S": S, "T": T})
    harness.synchronize(device)
    return plan, time.perf_counter() - t0


def traced_stats(trace, mask, S, T):
    """Pruned fraction and refined keys per query of a traced certified call (as benchmarks/indexer.py)."""
    if not trace:
        return {"path": "dense", "pruned_frac": 0.0, "survivors_per_query": float(T)}
    tr = trace[0]
    G = tr.list_queries
    visible = mask[0].sum(-1).float()
    refined = torch.where(tr.list_count > tr.cap, T, tr.list_count).float()[0]
    refined = torch.minimum(refined.repeat_interleave(G)[:S], visible)
    return {"path": "certified", "pruned_frac": float(1 - refined.sum() / visible.sum()),
            "survivors_per_query": float(refined.mean()), "screen_rows_padded": int(tr.plan.g.shape[2]),
            "redo_rows": int(tr.redo.sum())}


def predicted_ms(r, pruned_frac, S, T, sizes):
    """Cost-model time (H200 constants) of a certified call with budget r and survival 1 - pruned."""
    shape = IndexerShape(heads=sizes["H"], head_dim=sizes["D"], topk=sizes["topk"], queries=S)
    m = min(1.0, max(0.0, 1.0 - pruned_frac))
    return float(certified_call_time(r, m, shape, H200_FITTED).subs(T_SYMBOL, T)) * 1e3


def predicted_dense_ms(S, T, sizes):
    shape = IndexerShape(heads=sizes["H"], head_dim=sizes["D"], topk=sizes["topk"], queries=S)
    return float(dense_call_time(shape, H200_FITTED).subs(T_SYMBOL, T)) * 1e3


def op_call(q, k, w, mask, topk, settings):
    return torch.ops.pulsar_dosa.certified_topk(q, k, w, topk, mask, LAYER, **settings.op_arguments())


def rows_for_length(q, k, w, T, sizes, settings, device, budget_s, emit):
    """Every timed row at key length T (module docstring), emitted one by one."""
    S, topk = sizes["S"], sizes["topk"]
    k = k[:, :T].contiguous()
    mask = causal_chunk_mask(S, T, device)
    base = {"S": S, "T": T, "H": sizes["H"], "D": sizes["D"], "topk": topk, "dtype": "bfloat16"}
    dense_ms, (dv, di) = timed(lambda: dense_topk_cuda(q, k, w, topk, mask), device, budget_s)
    emit({**base, "method": "triton_dense", "r": None, "ms": dense_ms, "identical": True, "path": "dense",
          "pruned_frac": 0.0, "survivors_per_query": float(T),
          "predicted_ms": predicted_dense_ms(S, T, sizes)})
    plan = settings.topk
    plan_path = "dense" if plan.path == "dense" or T < plan.min_keys else "certified"
    variants = [("plan_op", plan.r, lambda: op_call(q, k, w, mask, topk, plan), plan.runtime_config(plan_path))]
    for r in sizes["fixed_r"]:
        cfg = CertifiedTopkConfig(r=r, path="certified")
        variants.append((f"fixed_r{r}", r, lambda cfg=cfg: certified_topk_cuda(q, k, w, topk, mask, config=cfg),
                         cfg))
    # On CPU the op runs the runtime reference, whose contract is runtime.dense_topk's output.
    op_ref = (dv, di) if device.type == "cuda" else dense_topk(q, k, w, topk, mask)
    for method, r, fn, cfg in variants:
        ms, (v, i) = timed(fn, device, budget_s)
        ref_v, ref_i = op_ref if method.startswith("plan_op") else (dv, di)
        trace = []
        certified_topk_cuda(q, k, w, topk, mask, config=cfg, trace=trace)
        st = traced_stats(trace, mask, S, T)
        pred = (predicted_ms(r, st["pruned_frac"], S, T, sizes) if st["path"] == "certified" and r is not None
                else predicted_dense_ms(S, T, sizes) if st["path"] == "dense" else None)
        emit({**base, "method": method, "r": r, "ms": ms,
              "identical": harness.identical((v, i), (ref_v, ref_i)), "x_triton_dense": dense_ms / ms,
              **st, "predicted_ms": pred})
    del mask, dv, di
    if device.type == "cuda":
        torch.cuda.empty_cache()


def render_markdown(doc) -> str:
    """The results JSON as a markdown table with the plan excerpt."""
    p = doc["plan"]
    v = harness.versions_of(doc)
    out = [f"Device: {doc['device']}, torch {v['torch']}, triton {v['triton']}; structured inputs, "
           f"H={doc['sizes']['H']}, D={doc['sizes']['D']}, topk={doc['sizes']['topk']}, bf16, causal chunk of "
           f"S={doc['sizes']['S']} queries at the end of T keys.", "",
           f"Plan (calibration: {p['calibration']['S']} queries at T={p['calibration']['T']}, runtime reference "
           f"on the device, {p['calibration']['seconds']:.0f} s; H200 constants, design length "
           f"{p['design_length']}, {p['queries']} queries): path={p['path']}, r={p['r']}, "
           f"min_keys={p['min_keys']}, predicted pruned {_fmt(p['predicted_pruned_frac'], 3)}, predicted "
           f"speedup {p['predicted_speedup']:.2f}.", "",
           "m(r) on the calibration slice: " + ", ".join(f"r={c['r']}: {c['survival']:.4f}" for c in p["candidates"]),
           "", "| T | method | r | path | ms | x triton_dense | predicted ms | identical | pruned | survivors/query |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        if "error" in r:
            out.append(f"| {r.get('T')} | error: {r['error'][:120]} |||||||||")
            continue
        out.append(f"| {r['T']} | {r['method']} | {_fmt(r['r'], 0)} | {r['path']} | {r['ms']:.1f} | "
                   f"{_fmt(r.get('x_triton_dense'), 2)} | {_fmt(r['predicted_ms'])} | {r['identical']} | "
                   f"{r['pruned_frac']:.3f} | {r['survivors_per_query']:.0f} |")
    if doc.get("skipped"):
        out += ["", "Not run (time budget): T=" + ", ".join(str(t) for t in doc["skipped"])]
    return "\n".join(out) + "\n"


def _fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="results JSON (the markdown table is written beside it, .md)")
    ap.add_argument("--render", help="print the markdown table of a results JSON and exit")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run at interpreter sizes")
    ap.add_argument("--budget_s", type=float, default=270, help="no new key length after this many seconds")
    ap.add_argument("--rep_budget_s", type=float, default=1.5, help="timing budget per row")
    args = ap.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            print(render_markdown(json.load(f)), end="")
        return 0
    if not args.out:
        ap.error("--out is required to run the benchmark")
    t0 = time.perf_counter()
    sizes = TINY if args.tiny else FULL
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    S, H, D = sizes["S"], sizes["H"], sizes["D"]
    q, k, w, params = structured_indexer_inputs(1, S, max(sizes["T"]), H, D, seed=0, dtype=torch.bfloat16)
    q, k, w = q.to(device), k.to(device), w.float().to(device)
    doc = harness.header(device, sizes=sizes, input_params={n: v if isinstance(v, (int, float, str)) else str(v)
                                                            for n, v in params.items()}, rows=[], skipped=[])

    def write():
        harness.write_json(args.out, doc)

    plan, plan_s = make_plan(q, k, w, sizes, device, S, sizes["T"][0])
    entry = plan.layer(LAYER)
    settings = layer_settings(LAYER, plan=plan, path="auto", heads=H, head_dim=D, topk=sizes["topk"],
                              device_type=device.type)
    doc["plan"] = {"hash": plan.hash, **entry.settings.op_arguments(),
                   "predicted_pruned_frac": entry.predicted_pruned_frac,
                   "predicted_speedup": entry.predicted_speedup, "design_length": plan.design_length,
                   "queries": plan.queries,
                   "candidates": [{"r": c.r, "survival": c.survival} for c in entry.candidates],
                   "calibration": {"S": sizes["cal_S"], "T": sizes["cal_T"], "seconds": plan_s},
                   "constants_source": plan.constants.source}
    print(json.dumps(doc["plan"]), flush=True)
    write()

    def emit(row):
        doc["rows"].append(row)
        print({n: (round(v, 4) if isinstance(v, float) else v) for n, v in row.items()}, flush=True)
        write()

    for T in sizes["T"]:
        if time.perf_counter() - t0 > args.budget_s:
            doc["skipped"].append(T)
            continue
        try:
            rows_for_length(q, k, w, T, sizes, settings, device, args.rep_budget_s, emit)
        except Exception as exc:  # recorded; the run goes on with the next length
            emit({"T": T, "error": repr(exc)[:500]})
    harness.write_results(args.out, doc, render_markdown(doc))
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Never slower than dense on geometries nobody tuned for: the certified top-K op over the indexer zoo.

    PYTHONPATH=. python3 benchmarks/indexer_zoo.py --out benchmarks/results/indexer_zoo_h200.json   # ~5 min
    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/indexer_zoo.py --smoke --out /tmp/zoo.json  # CPU

Every family of ``runtime.indexer_zoo`` and the ``structured`` control, S in {4096, 16384} queries
at the end of T in {131072, 524288} keys (causal), H=64, D=128, topk=2048, bf16 (``--S``, ``--T``,
``--families``). Rows: ``dense``; ``plan_op`` (the op with the settings of the family's plan, made
on calibration inputs of another seed); ``noplan_op`` (default settings); ``best_fixed`` (the
fastest fixed budget). Op rows: a fresh guard, untimed calls until it has decided (its warm-ups,
trials and, without a plan, its rungs), then ``--reps`` host-paced
calls (``calls_ms``); ``identical`` to the dense row; ``pruned``. At each family's smallest cell
the pipeline and the plan op also run with host synchronisation forbidden and from a CUDA graph
(``graph_checks``). ``--budget-s`` stops starting new cells; JSON after every row."""
from __future__ import annotations

import argparse
import sys
import time

import torch

from benchmarks import harness

import compiler  # noqa: F401  (registers torch.ops.pulsar_dosa.certified_topk)
from compiler import defaults
from compiler.cost_model import CPU_REFERENCE, H200_FITTED
from compiler.lowering.topk_pipeline import certified_topk_cuda, dense_topk_cuda
from compiler.ops.stats import TOPK_STATS
from compiler.ops.guard import GUARD
from compiler.policy import layer_settings
from compiler.topk_settings import TopkSettings
from compiler.ops.capture_topk import CapturedCall
from compiler.plan.cli import plan_from_calls
from runtime.certified_topk import CertifiedTopkConfig, TopkStats
from runtime.dense_scorer import dense_topk
from runtime.indexer_zoo import FAMILIES, zoo_inputs
from runtime.structured_indexer import structured_indexer_inputs

FULL = {"S": [4096, 16384], "T": [131072, 524288], "H": 64, "D": 128, "topk": 2048, "reps": 4, "fixed_reps": 1,
        "fixed_r": [1, 3, 7, 15], "cal_S": 4096, "cal_T": 131072, "design_length": 524288, "plan_queries": 16384}
"""The zoo's sizes. Plans are made for the longest key count the zoo serves (``design_length``): a
plan decides whether certifying pays at its design length and certifies from the crossover it
predicts below it, so a plan designed for 131072 keys keeps a layer dense at 524288 keys even
where certifying pays there."""
SMOKE = {"S": [32], "T": [1024], "H": 8, "D": 32, "topk": 32, "reps": 3, "fixed_reps": 1,
         "fixed_r": [1, 3], "cal_S": 32, "cal_T": 1024, "design_length": 1024, "plan_queries": 32}
CONTROL = "structured"
"""The project's default generator (query runs of 16 = the anchor stride): the numbers to keep."""


def make_inputs(family, S, T, sizes, seed, device):
    """q, k (bf16), w (fp32), the causal chunk mask [1,S,T] and the family's parameters."""
    H, D = sizes["H"], sizes["D"]
    if family == CONTROL:
        q, k, w, params = structured_indexer_inputs(1, S, T, H, D, seed=seed, device=device, dtype=torch.bfloat16)
        w = w.float()
    elif family.startswith("trained/L"):  # one layer of the trained measuring model
        q, k, w, params = zoo_inputs("trained", 1, S, T, H, D, seed=seed, device=device, dtype=torch.bfloat16,
                                     layer=int(family.removeprefix("trained/L")))
    else:
        q, k, w, params = zoo_inputs(family, 1, S, T, H, D, seed=seed, device=device, dtype=torch.bfloat16)
    mask = torch.ones(S, T, dtype=torch.bool, device=device).tril(T - S)[None]
    return q, k, w, mask, {n: v if isinstance(v, (int, float, str)) else str(v) for n, v in params.items()}


def timed_calls(fn, reps, device):
    """(median ms, every call's ms, the last output) of ``reps`` synchronised calls, none untimed
    (``harness.measure``, host-paced: the guard's measured calls are among them)."""
    t = harness.measure(fn, device, reps, warmup=0, host_paced=True)
    return t.ms, t.times, t.out


def pruned(summary):
    screened = summary.get("keys_screened", 0)
    return 0.0 if not screened else 1.0 - summary["survivors"] / screened


def make_plan(family, sizes, device):
    """The family's plan from calibration inputs drawn with seed 1, and its summary for the JSON."""
    q, k, w, mask, _ = make_inputs(family, sizes["cal_S"], sizes["cal_T"], sizes, seed=1, device=device)
    t0 = time.perf_counter()
    constants = H200_FITTED if device.type == "cuda" else CPU_REFERENCE
    plan = plan_from_calls({family: [CapturedCall(q, k, w, sizes["topk"], mask)]}, constants=constants,
                           design_length=sizes["design_length"], queries=sizes["plan_queries"],
                           candidates=sizes["fixed_r"], model={"spec": f"zoo:{family}"},
                           inputs={"S": sizes["cal_S"], "T": sizes["cal_T"], "seed": 1})
    e = plan.layer(family)
    summary = {**e.settings.op_arguments(), "reason": e.reason, "dense_ms": e.dense_ms,
               "predicted_speedup": e.predicted_speedup, "seconds": time.perf_counter() - t0,
               "candidates": [{"r": c.r, "survival": c.survival, "redo_frac": c.redo_frac, "ms": c.ms}
                              for c in e.candidates]}
    return plan, summary


def op_row(name, layer, settings, q, k, w, mask, sizes, device, want):
    """Time the op with ``settings`` (fresh guard of ``layer``): untimed calls until the runtime
    guard has decided (``harness.settle_guard``: its warm-ups, trials and, without a plan, its
    rungs), then sizes['reps'] timed."""
    topk = sizes["topk"]

    def call():
        return torch.ops.pulsar_dosa.certified_topk(q, k, w, topk, mask, layer, **settings.op_arguments())

    first = call()
    settle = harness.settle_guard(call, device, layer=layer)
    ms, calls_ms, out = timed_calls(call, sizes["reps"], device)
    states = GUARD.summaries().get(layer, [])
    return {"method": name, "r": settings.r, "ms": ms, "calls_ms": calls_ms,
            "identical": harness.identical(out, want) and harness.identical(first, want),
            "pruned": pruned(TOPK_STATS.summaries().get(layer, {})), "op_arguments": settings.op_arguments(),
            "guard": states[0] if states else None, "untimed_calls": 1 + settle}


def best_fixed_row(q, k, w, mask, sizes, device, dense_out):
    """Every fixed r (one untimed call, then sizes['fixed_reps'] timed); the row of the fastest."""
    candidates = []
    for r in sizes["fixed_r"]:
        config = CertifiedTopkConfig(r=r, path="certified")
        stats = TopkStats()

        def call(config=config, stats=stats):
            return certified_topk_cuda(q, k, w, sizes["topk"], mask, config=config, stats=stats)

        call()
        ms, calls_ms, out = timed_calls(call, sizes["fixed_reps"], device)
        candidates.append({"r": r, "ms": ms, "calls_ms": calls_ms, "identical": harness.identical(out, dense_out),
                           "pruned": stats.pruned_frac})
    best = min(candidates, key=lambda c: c["ms"])
    return {"method": "best_fixed", "r": best["r"], "ms": best["ms"], "identical": all(c["identical"] for c in candidates),
            "pruned": best["pruned"], "candidates": candidates}


def graph_check(fn, want):
    """The call run with host synchronisation forbidden, then captured in a CUDA graph and replayed
    (benchmarks/indexer_graphs.py): {"no_sync", "identical_eager", "identical_graph"}."""
    from benchmarks.indexer_graphs import captured, without_sync

    torch.cuda.synchronize()
    eager, no_sync = without_sync(fn)
    graph, out = captured(fn)
    graph.replay()
    torch.cuda.synchronize()
    result = {"no_sync": no_sync, "identical_eager": None if eager is None else harness.identical(eager, want),
              "identical_graph": harness.identical(out, want)}
    del graph
    return result


def run_graph_checks(family, S, T, sizes, device, plan, checks):
    """CUDA-graph and no-sync checks of the certified pipeline (r=1, own-threshold sample on) and of
    the plan's guarded op, on the family's inputs at S, T (the smallest cell)."""
    q, k, w, mask, _ = make_inputs(family, S, T, sizes, seed=0, device=device)
    want = dense_topk_cuda(q, k, w, sizes["topk"], mask)
    settings = layer_settings(family, plan=plan, path="auto", heads=sizes["H"], head_dim=sizes["D"],
                              topk=sizes["topk"], device_type=device.type).topk
    config = CertifiedTopkConfig(r=1, path="certified")
    calls = {"certified_r1": lambda: certified_topk_cuda(q, k, w, sizes["topk"], mask, config=config),
             "plan_op": lambda: torch.ops.pulsar_dosa.certified_topk(
                 q, k, w, sizes["topk"], mask, f"graph/{family}", **settings.op_arguments())}
    for name, fn in calls.items():
        try:
            checks.append({"family": family, "S": S, "T": T, "method": name, **graph_check(fn, want)})
        except Exception as exc:  # recorded: a failed capture is a result
            checks.append({"family": family, "S": S, "T": T, "method": name, "error": repr(exc)[:300]})
    del q, k, w, mask, want
    torch.cuda.empty_cache()


def run_cell(family, S, T, sizes, device, plan, emit):
    q, k, w, mask, params = make_inputs(family, S, T, sizes, seed=0, device=device)
    base = {"family": family, "S": S, "T": T}
    dense_topk_cuda(q, k, w, sizes["topk"], mask)
    ms, calls_ms, dense_out = timed_calls(lambda: dense_topk_cuda(q, k, w, sizes["topk"], mask), sizes["reps"], device)
    emit({**base, "method": "dense", "r": None, "ms": ms, "calls_ms": calls_ms, "identical": True, "pruned": 0.0,
          "input_params": params})
    # The op on the CPU runs the runtime reference: its contract there is runtime.dense_topk's output.
    op_want = dense_out if device.type == "cuda" else dense_topk(q, k, w, sizes["topk"], mask)
    settings = layer_settings(family, plan=plan, path="auto", heads=sizes["H"], head_dim=sizes["D"],
                              topk=sizes["topk"], device_type=device.type).topk
    stem = f"zoo/{family}/S{S}/T{T}"
    emit({**base, **op_row("plan_op", f"{stem}/plan", settings, q, k, w, mask, sizes, device, op_want)})
    emit({**base, **op_row("noplan_op", f"{stem}/noplan", TopkSettings(), q, k, w, mask, sizes, device, op_want)})
    emit({**base, **best_fixed_row(q, k, w, mask, sizes, device, dense_out)})
    del q, k, w, mask, dense_out, op_want
    if device.type == "cuda":
        torch.cuda.empty_cache()


def cell_checks(doc):
    """Per cell: x = method ms / dense ms, and the targets of the run."""
    cells = {}
    for row in doc["rows"]:
        cells.setdefault((row["family"], row["S"], row["T"]), {})[row["method"]] = row
    out = []
    for (family, S, T), rows in cells.items():
        if len(rows) < 4:
            continue
        dense = rows["dense"]["ms"]
        plan, noplan, best = rows["plan_op"], rows["noplan_op"], rows["best_fixed"]
        near_best = None if best["pruned"] < 0.9 else plan["ms"] <= 1.10 * best["ms"]
        out.append({"family": family, "S": S, "T": T, "dense_ms": dense, "plan_x": plan["ms"] / dense,
                    "noplan_x": noplan["ms"] / dense, "best_x": best["ms"] / dense, "best_r": best["r"],
                    "best_pruned": best["pruned"], "plan_pruned": plan["pruned"],
                    "plan_path": (plan["guard"] or {}).get("path", plan["op_arguments"]["path"]),
                    "noplan_path": (noplan["guard"] or {}).get("path", "dense"),
                    "identical": all(r["identical"] for r in rows.values()),
                    "plan_ok": plan["ms"] <= 1.05 * dense, "noplan_ok": noplan["ms"] <= 1.10 * dense,
                    "near_best": near_best})
    return out


def render_markdown(doc) -> str:
    s, v = doc["sizes"], harness.versions_of(doc)
    lines = [f"# Indexer zoo on {doc['device']}: never slower than dense", "",
             f"torch {v['torch']}, triton {v['triton']}; H={s['H']}, D={s['D']}, topk={s['topk']}, bf16, "
             f"S queries at the end of T keys (causal chunk). Produced by `benchmarks/indexer_zoo.py` "
             f"({doc.get('total_s', 0):.0f} s). Op rows: untimed calls until the runtime guard has decided, then "
             f"{s['reps']} timed calls, "
             f"median; x = ms / dense ms. Targets: plan_op <= 1.05x and noplan_op <= 1.10x dense; identical; "
             f"plan_op within 10% of best_fixed where best_fixed prunes >= 90%.", "",
             "| family | S | T | dense ms | plan_op x (path) | noplan_op x (path) | best_fixed x (r, pruned) | "
             "identical | plan <= 1.05 | noplan <= 1.10 | plan vs best |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    checks = cell_checks(doc)
    for c in checks:
        near = "-" if c["near_best"] is None else ("ok" if c["near_best"] else "MISSED")
        lines.append(f"| {c['family']} | {c['S']} | {c['T']} | {c['dense_ms']:.1f} | {c['plan_x']:.3f} "
                     f"({c['plan_path']}) | {c['noplan_x']:.3f} ({c['noplan_path']}) | {c['best_x']:.3f} "
                     f"(r={c['best_r']}, {c['best_pruned']:.3f}) | {c['identical']} | "
                     f"{'ok' if c['plan_ok'] else 'MISSED'} | {'ok' if c['noplan_ok'] else 'MISSED'} | {near} |")
    if checks:
        lines += ["", f"Cells: {len(checks)}; identical in all: {all(c['identical'] for c in checks)}; "
                  f"plan_op <= 1.05x in {sum(c['plan_ok'] for c in checks)}; noplan_op <= 1.10x in "
                  f"{sum(c['noplan_ok'] for c in checks)}; plan within 10% of a >= 90%-pruning best_fixed in "
                  f"{sum(c['near_best'] is True for c in checks)} of {sum(c['near_best'] is not None for c in checks)}."]
    lines += ["", "Plans (one per family, calibration inputs of the family drawn with seed 1):", "",
              "| family | path | r | min_keys | seconds | reason | candidates (r: survival, redo, ms) |",
              "|---|---|---|---|---|---|---|"]
    for family, p in doc["plans"].items():
        cands = "; ".join(f"{c['r']}: {c['survival']:.3f}, {c['redo_frac']:.3f}, "
                          f"{'-' if c['ms'] is None else format(c['ms'], '.1f')}" for c in p["candidates"])
        lines.append(f"| {family} | {p['path']} | {p['r']} | {p['min_keys']} | {p['seconds']:.0f} | {p['reason']} | "
                     f"{cands} |")
    if doc["graph_checks"]:
        lines += ["", "CUDA graphs (the call with host synchronisation forbidden, then captured and replayed):", "",
                  "| family | S | T | call | no host sync | identical eager / graph |", "|---|---|---|---|---|---|"]
        for g in doc["graph_checks"]:
            result = g.get("error") or f"{g['identical_eager']} / {g['identical_graph']}"
            lines.append(f"| {g['family']} | {g['S']} | {g['T']} | {g['method']} | {g.get('no_sync', '-')} | {result} |")
    if doc["skipped"]:
        lines += ["", "Not run (time budget): " + ", ".join(doc["skipped"])]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="results JSON (the markdown table is written beside it, .md)")
    ap.add_argument("--smoke", action="store_true", help="CPU run at interpreter sizes (set TRITON_INTERPRET=1)")
    ap.add_argument("--families", nargs="*", default=[CONTROL, *(f for f in FAMILIES if f != "trained")],
                    help="families to run; trained/L<n> is layer n of the trained measuring model")
    ap.add_argument("--trained-layers", nargs="+", type=int, default=[],
                    help="add trained/L<n> for these layers (sizes: --S, --T at most the held-out tokens)")
    ap.add_argument("--cal-T", type=int, help="calibration key count instead of the default sizes'")
    ap.add_argument("--budget-s", type=float, default=400, help="no new cell is started after this many seconds")
    ap.add_argument("--S", nargs="+", type=int, help="query counts to run instead of the default sizes'")
    ap.add_argument("--T", nargs="+", type=int, help="key counts to run instead of the default sizes'")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    sizes = dict(SMOKE if args.smoke else FULL)
    sizes.update({name: values for name, values in (("S", args.S), ("T", args.T)) if values})
    if args.cal_T:
        sizes["cal_T"] = args.cal_T
    if args.T:
        sizes["design_length"] = max(args.T)  # plans serve the longest key count of the run
    args.families = [*args.families, *(f"trained/L{n}" for n in args.trained_layers)]
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke:  # the plan's evidence thresholds, lowered to the smoke sizes so that plans can certify
        defaults.MIN_SCREENED_KEYS, defaults.MIN_CERTIFIED_QUERIES = 1000, 8
    doc = harness.header(device, smoke=args.smoke, sizes=sizes, families=args.families,
                         constants=(H200_FITTED if device.type == "cuda" else CPU_REFERENCE).to_dict(),
                         plans={}, rows=[], graph_checks=[], skipped=[])

    def write():
        doc["total_s"] = time.perf_counter() - t0
        doc["checks"] = cell_checks(doc)
        harness.write_json(args.out, doc)

    def emit(row):
        doc["rows"].append(row)
        brief = {n: (round(v, 3) if isinstance(v, float) else v) for n, v in row.items()
                 if n not in ("calls_ms", "candidates", "input_params", "guard", "op_arguments")}
        print(f"[{time.perf_counter() - t0:6.0f} s] {brief}", flush=True)
        write()

    plans = {}
    for S, T in sorted(((S, T) for S in sizes["S"] for T in sizes["T"]), key=lambda c: c[0] * c[1]):
        for family in args.families:
            if time.perf_counter() - t0 > args.budget_s:
                doc["skipped"].append(f"{family} S={S} T={T}")
                continue
            try:
                if family not in plans:
                    plans[family], doc["plans"][family] = make_plan(family, sizes, device)
                    print(f"[{time.perf_counter() - t0:6.0f} s] plan {family}: {doc['plans'][family]['path']} "
                          f"r={doc['plans'][family]['r']}: {doc['plans'][family]['reason']}", flush=True)
                run_cell(family, S, T, sizes, device, plans[family], emit)
                if device.type == "cuda" and (S, T) == (min(sizes["S"]), min(sizes["T"])):
                    run_graph_checks(family, S, T, sizes, device, plans[family], doc["graph_checks"])
                    print(f"[{time.perf_counter() - t0:6.0f} s] graph checks {doc['graph_checks'][-2:]}", flush=True)
            except Exception as exc:  # recorded; the run goes on with the next cell
                emit({"family": family, "S": S, "T": T, "method": "error", "error": repr(exc)[:500]})
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    write()
    harness.write_results(args.out, doc, render_markdown(doc))
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

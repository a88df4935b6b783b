"""The certified top-K on the trained measuring model's indexers: every layer, every budget, its time split.

    PYTHONPATH=. python3 benchmarks/certified_trained.py --out benchmarks/results/certified_trained_h100.json
    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/certified_trained.py --smoke --out /tmp/ct.json  # CPU

Inputs: the indexer q, k and weights of every layer of ``benchmarks/models/tiny-dsa`` (H=64, D=128), captured
in one forward over T held-out tokens (``runtime.dsa_forward``), the last S queries under the causal
chunk mask, bf16, topk 2048. Per (T, layer): the dense op, then the certified pipeline at each budget
r of ``--rs`` with and without anchor witnesses (``CertifiedTopkConfig.witnesses``). Every op is
called as the compiled model calls it, its selection unsorted (``--sorted``: in THE ORDER). Per
certified row: the median time of ``--reps`` calls after a warm-up, identical to dense (the same
(value, index) pairs per row, bit for bit; ``--sorted``: in the same order too),
the pruned share of the screened keys, the mean survival per query m, the threshold gap b (per query
(tau* - tau) / (tau* - median visible score), tau* the exact kk-th score, on ``--gap-queries`` queries),
the queries redone densely, the time split from CUDA events between the pipeline's stages (seeds,
plan, screen, refine, select, redo), the device time of a call replayed from a CUDA graph
(``graph_ms``: no host time) and the host time to issue one (``issue_ms``: the call not waited
for), both also for the dense row; at the budget ``profile_r`` without witnesses, the costliest
kernels of one call (torch profiler); and every budget without and with witnesses at survivor lists
of each other count of queries in ``refine_queries`` (``CertifiedTopkConfig.list_queries``: the union
of the list's queries' survivors; 1: a query's own), as the op would run them. Then the plan's
choice (``compiler.plan.choice.choose_layer`` on every certified row, each with the r, list size and
witnesses it ran, designed for the same call) and the op with those settings through the runtime
guard, timed after its warm-up calls, then the dense op once more beside it (the dense row was timed
minutes earlier); the layers' choices form a plan (written beside ``--out``). With
``--prefill T``: the model's prefill of T tokens as ``generate`` runs it, compiled with that plan, with
every indexer dense and with the defaults. JSON after every layer.
"""
from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness

import compiler  # noqa: F401  (registers torch.ops.pulsar_dosa.certified_topk)
from compiler.cost_model import constants_for
from compiler.lowering.topk_pipeline import checked_certified_topk_cuda, dense_topk_cuda, refine_queries, screen_rows
from compiler.ops.guard import GUARD
from compiler.plan.choice import choose_layer
from compiler.plan.schema import CandidateMeasurement, LayerPlan, Plan, save_plan
from compiler.report import rung_label
from runtime.certified_topk import CertifiedTopkConfig, TopkStats
from runtime.dsa_forward import dsa_forward, indexer_qkw
from runtime.indexer_zoo import HELD_OUT_TOKENS, TRAINED_MODEL
from runtime.seeds import sample_size

FULL = {"S": 4096, "T": [32768, 65536, 131072], "topk": 2048, "rs": [7, 15, 31], "reps": 5, "warmup": 1,
        "gap_queries": 64, "profile_r": 15, "refine_queries": [1, 2, 4]}
"""The sizes; the certified rows refine the pipeline's default survivor lists, the ``refine_queries``
rows lists of each other count of queries (1: each query's own survivors)."""
SMOKE = {"S": 4, "T": [128], "topk": 16, "rs": [7], "reps": 1, "warmup": 0, "gap_queries": 4, "profile_r": 7,
         "refine_queries": [1, 2]}
STAGES = ("seeds", "plan", "screen", "refine", "select", "redo")
FIXED_STAGES = tuple(s for s in STAGES if s not in ("screen", "refine"))
"""The stages whose cost does not scale with the keys screened or refined (``shortfall``)."""


def capture_layers(T: int, S: int, device, seed: int = 0):
    """[(q [1,S,H,D] bf16, k [1,T,D] bf16, w [1,S,H] fp32)] per layer of the trained model, on T held-out
    tokens (window start drawn from ``seed``), the last S queries."""
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(TRAINED_MODEL, dtype=torch.bfloat16).to(device).eval()
    tokens = np.load(HELD_OUT_TOKENS)
    start = int(np.random.default_rng(seed).integers(0, tokens.size - T + 1))
    ids = torch.from_numpy(tokens[start:start + T].astype(np.int64))[None].to(device)
    layers = []

    def capture(c):
        qkw = indexer_qkw(c.attention.indexer, c.x, c.q_resid, c.cos, c.sin, slice(T - S, T))
        layers.append((qkw.q.contiguous(), qkw.k.contiguous(), qkw.weights.float().contiguous()))

    with torch.no_grad():
        dsa_forward(net, ids, on_layer=capture, hidden_only=True)
    return layers


def threshold_gap(q, k, w, mask, tau, tau_star, n):
    """Mean over n evenly spread queries with a finite tau of (tau* - tau) / (tau* - median visible score)."""
    S = q.shape[1]
    rows = torch.linspace(0, S - 1, n, device=q.device).long()
    x = torch.relu(torch.einsum("shd,td->sht", q[0, rows].float(), k[0].float()))
    s = torch.einsum("sh,sht->st", w[0, rows], x).masked_fill(~mask[0, rows], float("nan"))
    median = s.nanmedian(-1).values
    t, ts = tau[0, rows], tau_star[0, rows]
    ok = torch.isfinite(t) & (ts > median)
    return float(((ts - t) / (ts - median))[ok].mean()) if bool(ok.any()) else None


def certified_row(q, k, w, mask, kk, config, dense, sizes, device):
    """Time, identity, pruning and the stage split of one certified configuration."""
    run = lambda: checked_certified_topk_cuda(q, k, w, kk, mask, config=config, ordered=sizes["sorted"])  # noqa: E731
    timing = harness.measure(run, device, sizes["reps"], warmup=sizes["warmup"])
    graph = harness.graph_ms(run, device, sizes["reps"])
    issue = harness.issue_ms(run, device, sizes["reps"])
    stats, trace, marks = TopkStats(), [], []
    cuda = torch.device(device).type == "cuda"

    def mark(stage):
        if cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            marks.append((stage, event))

    start = torch.cuda.Event(enable_timing=True) if cuda else None
    if cuda:
        start.record()
    out = checked_certified_topk_cuda(q, k, w, kk, mask, config=config, stats=stats, trace=trace, mark=mark,
                                      ordered=sizes["sorted"])
    harness.synchronize(device)
    split, last = {}, start
    for stage, event in marks:
        split[stage] = round(last.elapsed_time(event), 3)
        last = event
    summary = stats.summary()
    tr = trace[0]
    visible = mask.sum(-1).clamp_min(1).view(-1)
    survived = torch.where(tr.list_count > tr.cap, mask.shape[-1], tr.list_count).repeat_interleave(tr.list_queries, -1)
    survived = survived.view(-1)[:visible.numel()]
    return {"ms": round(timing.ms, 3), "graph_ms": None if graph is None else round(graph, 3),
            "issue_ms": round(issue, 3),
            "identical": same_as_dense(out, dense, sizes) and same_as_dense(timing.out, dense, sizes),
            "pruned": round(summary["pruned_frac"], 4), "m": round(float((survived / visible).mean()), 4),
            "redo": round(float(tr.redo.float().mean()), 4), "overflow": summary["fallbacks"]["overflow"],
            "threshold_miss": summary["fallbacks"]["threshold_miss"], "split_ms": split,
            "keys_screened": summary["keys_screened"], "queries": summary["queries"], "tau": tr.tau}


def same_as_dense(got, dense, sizes) -> bool:
    """A row's output against the dense op's: bitwise in order for sorted calls, the same (value,
    index) pairs per row, bit for bit, for unsorted ones."""
    return (harness.identical if sizes["sorted"] else harness.same_pairs)(got, dense)


def candidate(row, config: CertifiedTopkConfig) -> CandidateMeasurement:
    """The plan's measurement of a certified row run with ``config``."""
    return CandidateMeasurement(
        r=config.r, survival=1.0 - row["pruned"], redo_frac=row["redo"], ms=row["ms"], queries=row["queries"],
        certified_queries=row["queries"], keys_screened=row["keys_screened"],
        survivors=round((1.0 - row["pruned"]) * row["keys_screened"]), fallbacks={},
        list_queries=config.list_queries, witnesses=config.witnesses)


def budget_rows(layer, q, k, w, mask, kk, dense, tau_star, sizes, device, rows) -> list[CandidateMeasurement]:
    """The certified rows at every budget with and without witnesses (appended to ``rows``), each the
    plan's candidate with its settings."""
    S, T = q.shape[1], k.shape[1]
    candidates = []
    for witnesses in (False, True):
        for r in sizes["rs"]:
            config = CertifiedTopkConfig(r=r, witnesses=witnesses, path="certified")
            row = certified_row(q, k, w, mask, kk, config, dense.out, sizes, device)
            tau = row.pop("tau")
            row["b"] = threshold_gap(q, k, w, mask, tau, tau_star, sizes["gap_queries"])
            row["x_dense"] = round(row["ms"] / dense.ms, 3)
            if r == sizes["profile_r"] and not witnesses:
                call = lambda: checked_certified_topk_cuda(q, k, w, kk, mask, config=config,  # noqa: E731
                                                           ordered=sizes["sorted"])
                row["kernels"] = harness.kernel_breakdown(call, top=14) if torch.device(device).type == "cuda" else None
            rows.append({"layer": layer, "T": T, "S": S, "variant": f"r={r}" + (" +witnesses" if witnesses else ""),
                         "r": r, "witnesses": witnesses, **row})
            candidates.append(candidate(row, config))
            print(rows[-1], flush=True)
    return candidates


def layer_rows(layer, q, k, w, mask, sizes, device):
    """Every row of one layer at one T: dense, certified per (r, witnesses), the plan and its op."""
    S, T, kk = q.shape[1], k.shape[1], min(sizes["topk"], k.shape[1])
    dense_call = lambda: dense_topk_cuda(q, k, w, kk, mask, ordered=sizes["sorted"])  # noqa: E731
    dense = harness.measure(dense_call, device, sizes["reps"], warmup=sizes["warmup"])
    tau_star = dense.out[0].amin(-1)
    rows = [{"layer": layer, "T": T, "S": S, "variant": "dense", "ms": round(dense.ms, 3), "heads": q.shape[2],
             "graph_ms": harness.graph_ms(dense_call, device),
             "issue_ms": round(harness.issue_ms(dense_call, device), 3)}]
    candidates = budget_rows(layer, q, k, w, mask, kk, dense, tau_star, sizes, device, rows)
    default = refine_queries(q.shape[2], CertifiedTopkConfig())
    for witnesses, r, G in itertools.product((False, True), sizes["rs"], sizes["refine_queries"]):
        if G != default:  # survivor lists of G queries (their union) other than the default's
            config = CertifiedTopkConfig(r=r, witnesses=witnesses, path="certified", list_queries=G)
            row = certified_row(q, k, w, mask, kk, config, dense.out, sizes, device)
            row.pop("tau")
            row["x_dense"] = round(row["ms"] / dense.ms, 3)
            rows.append({"layer": layer, "T": T, "S": S,
                         "variant": f"r={r}" + (" +witnesses" if witnesses else "") + f" lists of {G}",
                         "r": r, "witnesses": witnesses, "refine_queries": G, **row})
            candidates.append(candidate(row, config))
            print(rows[-1], flush=True)
    constants = constants_for(torch.device(device).type)
    choice = choose_layer(candidates, dense.ms, [(1, S, T)], heads=q.shape[2], head_dim=q.shape[3], topk=kk,
                          constants=constants, design_length=T, queries=S)
    s = choice.settings
    layer_plan = LayerPlan(layer=f"model.layers.{layer}.self_attn.indexer", settings=s, heads=q.shape[2],
                           head_dim=q.shape[3], topk=kk, predicted_pruned_frac=choice.predicted_pruned_frac,
                           predicted_speedup=choice.predicted_speedup, reason=choice.reason, dense_ms=dense.ms,
                           calibration_calls=((1, S, T),), candidates=tuple(candidates), seed_gap=None, slack=None)
    GUARD.reset()

    def plan_op():
        return torch.ops.pulsar_dosa.certified_topk(q, k, w, kk, mask, sorted=sizes["sorted"], **s.op_arguments(),
                                                    layer=f"trained/L{layer}")

    harness.settle_guard(plan_op, device, at_least=4)  # the guard's warm-ups and its dense and certified trials
    op = harness.measure(plan_op, device, sizes["reps"])
    again = harness.measure(dense_call, device, sizes["reps"])  # the dense op once more, next to the plan's
    rows.append({"layer": layer, "T": T, "S": S, "variant": "plan", **s.op_arguments(),
                 "reason": choice.reason, "ms": round(op.ms, 3), "x_dense": round(op.ms / dense.ms, 3),
                 "dense_again_ms": round(again.ms, 3), "x_dense_again": round(op.ms / again.ms, 3),
                 "identical": same_as_dense(op.out, dense.out, sizes)})
    print(rows[-1], flush=True)
    return rows, layer_plan


def prefill_rows(T: int, plan_path: str, reps: int, device, rows: list[dict], save) -> None:
    """The trained model's prefill of T held-out tokens as ``generate`` runs it (``use_cache=True``,
    the last position's logits), compiled with the backend with every indexer dense (option
    ``path="dense"``), with the plan and with its defaults, then by stock ``torch.compile(model)``;
    warm-up calls until the runtime guard has decided every layer (its trials and, for the defaults,
    its rungs; at least 4, ``harness.settle_guard``), then the median of ``reps`` calls;
    the last position's logits compared with the backend's dense run's (stock rounds otherwise), and
    the path the runtime guard keeps per guarded layer. Each row is appended to ``rows``, then
    ``save()`` is called."""
    from transformers import AutoModelForCausalLM

    tokens = np.load(HELD_OUT_TOKENS)
    ids = torch.from_numpy(tokens[:T].astype(np.int64))[None].to(device)
    reference, dense_ms = None, None
    for name, options in (("dense", {"path": "dense"}), ("plan", {"plan": plan_path}), ("default", {}),
                          ("stock", None)):
        torch._dynamo.reset()
        GUARD.reset()
        net = AutoModelForCausalLM.from_pretrained(TRAINED_MODEL, dtype=torch.bfloat16).to(device).eval()
        compiled = torch.compile(net) if options is None else torch.compile(net, backend="pulsar_dosa", options=options)

        def call():
            with torch.no_grad():
                return compiled(ids, logits_to_keep=1).logits[0, -1].float()

        try:
            calls = harness.settle_guard(call, device, at_least=4)  # compile, the guard's warm-ups, trials, rungs
            timing = harness.measure(call, device, reps)
        except RuntimeError as exc:  # out of memory, or stock's compiler failing for it
            rows.append({"T": T, "variant": f"prefill {name}", "error": str(exc).splitlines()[0][:300]})
            print(rows[-1], flush=True)
            save()
            del compiled, net
            continue
        if reference is None:  # the first variant that ran, the dense path unless it failed
            reference, dense_ms = timing.out, timing.ms
        rows.append({"T": T, "variant": f"prefill {name}", "ms": round(timing.ms, 3), "peak_gib": timing.peak_gib,
                     "x_dense": round(timing.ms / dense_ms, 3),
                     "argmax_as_dense": int(timing.out.argmax()) == int(reference.argmax()),
                     "max_abs_diff": float((timing.out - reference).abs().max()),
                     "warmup_calls": calls,
                     "guard": {layer: [_guard_state(b) for b in buckets] for layer, buckets in GUARD.summaries().items()}})
        print(rows[-1], flush=True)
        save()
        del compiled, net


def _guard_state(bucket: dict) -> str:
    """A guard bucket's kept path, with the rung's settings where it climbed past the layer's own."""
    return bucket["path"] + (f" ({rung_label(bucket)})" if bucket["rung"] else "")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU sizes (TRITON_INTERPRET=1)")
    ap.add_argument("--T", type=int, nargs="+", help="key counts (default: 32768 65536 131072)")
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--rs", type=int, nargs="+", help="budgets (default 7 15 31)")
    ap.add_argument("--sorted", action="store_true", help="time the ops' sorted selections (the model's are unsorted)")
    ap.add_argument("--prefill", type=int, nargs="*", default=[],
                    help="key counts of --T whose plan also drives the model's prefill of that many tokens")
    args = ap.parse_args(argv)
    sizes = dict(SMOKE if args.smoke else FULL)
    sizes["T"] = args.T or sizes["T"]
    if args.prefill and (set(args.prefill) - set(sizes["T"]) or sorted(args.layers) != [0, 1, 2, 3, 4]):
        ap.error("--prefill: each length must be one of --T, and its plan needs every layer (--layers 0 1 2 3 4)")
    sizes["rs"] = args.rs or sizes["rs"]
    sizes["sorted"] = args.sorted
    device = "cpu" if args.smoke else "cuda"
    doc = harness.header(device, what=__doc__.split("\n\n")[0], sizes=sizes, layers=args.layers)
    doc["rows"] = []
    t0 = time.time()
    for T in sizes["T"]:
        layers = capture_layers(T, sizes["S"], device)
        mask = torch.ones(sizes["S"], T, dtype=torch.bool, device=device).tril(T - sizes["S"])[None]
        plans = []
        for layer in args.layers:
            q, k, w = layers[layer]
            rows, layer_plan = layer_rows(layer, q, k, w, mask, sizes, device)
            doc["rows"] += rows
            plans.append(layer_plan)
            doc["seconds"] = round(time.time() - t0, 1)
            harness.write_results(args.out, doc, render(doc))
        del layers, mask
        plan = Plan(model=str(TRAINED_MODEL.name), inputs=f"{sizes['S']} held-out queries at the end of {T} keys",
                    design_length=T, queries=sizes["S"], constants=constants_for(torch.device(device).type),
                    layers=tuple(plans))
        plan_path = Path(args.out).with_name(f"{Path(args.out).stem}_plan_{T}.json")
        save_plan(plan, plan_path)
        if T in args.prefill:
            prefill_rows(T, str(plan_path), sizes["reps"], device, doc["rows"],
                         lambda: harness.write_results(args.out, doc, render(doc)))
    return doc


def _choice(row) -> str:
    """The plan row's settings after its variant: " -> path r=..", its list size and its witnesses
    when not the default."""
    lists = "" if row.get("list_queries") is None else f" lists of {row['list_queries']}"
    witnesses = "" if row.get("witnesses") is None else " +witnesses" if row["witnesses"] else " no witnesses"
    return f" -> {row['path']} r={row['r']}{lists}{witnesses}"


def shortfall(doc) -> list[dict]:
    """Per (T, layer), the fastest certified row against what its dot products allow: its speed (dense
    ms / ms); the speed of the dot products alone, 1 / (RP / H + m + M / T) with RP the screen's rows
    (``screen_rows``), m the survival and M the sampled seed keys per query; the screen's and the
    refine's rates against the dense op's (the dense op's ms per dot product over theirs: RP / H of
    dense ms over the screen's, m of dense ms over the refine's); the fixed stages (seeds, plan,
    select, redo) in ms and as a share of dense; the time the device waits on the host (ms less
    ``graph_ms``) and the host time to issue the call; the gap b of its seeds (the same at every
    budget and list size: the rows with and without witnesses measure it)."""
    out = []
    for dense in (r for r in doc["rows"] if r["variant"] == "dense" and "heads" in r):
        T, layer, H = dense["T"], dense["layer"], dense["heads"]
        certified = [r for r in doc["rows"] if r.get("layer") == layer and r["T"] == T and r.get("split_ms")]
        if not certified:
            continue
        best = min(certified, key=lambda r: r["ms"])
        gap = next((r["b"] for r in certified if r["witnesses"] == best["witnesses"] and r.get("b") is not None), None)
        split, rp = best["split_ms"], screen_rows(best["r"])
        fixed = sum(split.get(s, 0.0) for s in FIXED_STAGES)
        dots = rp / H + best["m"] + sample_size(T) / T
        out.append({"T": T, "layer": layer, "variant": best["variant"], "speed": round(dense["ms"] / best["ms"], 3),
                    "dots allow": round(1 / dots, 3), "b": gap,
                    "m": best["m"], "screen rate": round(dense["ms"] * rp / H / split["screen"], 3),
                    "refine rate": round(dense["ms"] * best["m"] / split["refine"], 3),
                    "fixed ms": round(fixed, 3), "fixed / dense": round(fixed / dense["ms"], 3),
                    "host ms": None if best.get("graph_ms") is None else round(best["ms"] - best["graph_ms"], 3),
                    "issue ms": best.get("issue_ms")})
    return out


def render(doc) -> str:
    """The readable tables: one line per (T, layer, variant), then ``shortfall``'s per (T, layer)."""
    head = ["T", "layer", "variant", "ms", "x dense", "graph ms", "identical", "pruned", "m", "b", "redo",
            "split ms (seeds/plan/screen/refine/select/redo)"]
    lines = []
    for r in doc["rows"]:
        split = r.get("split_ms")
        variant = r["variant"] + (_choice(r) if r["variant"] == "plan" else "")
        if "dense_again_ms" in r:
            variant += f" (dense again {r['dense_again_ms']} ms: x {r['x_dense_again']})"
        if "peak_gib" in r or "error" in r:  # a prefill row
            variant += f" ({r['error']})" if "error" in r else "" if r["peak_gib"] is None else f" (peak {r['peak_gib']:.1f} GiB)"
            certified = [layer.split(".")[2] + path[len("certified"):] for layer, paths in r.get("guard", {}).items()
                         for path in paths if path.startswith("certified")]
            variant += f", guard certified layers {', '.join(certified) or 'none'}" if r.get("guard") else ""
        lines.append([r["T"], r.get("layer", "-"), variant,
                      r.get("ms"), r.get("x_dense", 1.0), r.get("graph_ms"), r.get("identical", "-"), r.get("pruned", "-"),
                      r.get("m", "-"),
                      "-" if r.get("b") is None else round(r["b"], 3), r.get("redo", "-"),
                      "-" if not split else " / ".join(str(split.get(s, "-")) for s in STAGES)])
    table = harness.markdown_table(head, lines)
    gaps = shortfall(doc)
    if gaps:
        table += ("\n\nWhere the time goes: the fastest certified row per (T, layer) against what its dot products"
                  " allow (speeds are dense ms over ms; rates are against the dense op's ms per dot product)\n\n"
                  + harness.rows_table(gaps))
    return table


if __name__ == "__main__":
    main()

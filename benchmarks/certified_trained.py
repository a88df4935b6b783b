"""The certified top-K on the trained measuring model's indexers: every layer, every budget, its time split.

    PYTHONPATH=. python3 benchmarks/certified_trained.py --out benchmarks/results/certified_trained_h100.json
    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/certified_trained.py --smoke --out /tmp/ct.json  # CPU

Inputs: the indexer q, k and weights of every layer of ``benchmarks/models/tiny-dsa`` (H=64, D=128), captured
in one forward over T held-out tokens (``runtime.dsa_forward``), the last S queries under the causal
chunk mask, bf16, topk 2048. Per (T, layer): the dense op, then the certified pipeline at each budget
r of ``--rs`` with and without anchor witnesses (``CertifiedTopkConfig.witnesses``). Per certified row:
the median time of ``--reps`` calls after a warm-up, bitwise identical to dense (values and indices),
the pruned share of the screened keys, the mean survival per query m, the threshold gap b (per query
(tau* - tau) / (tau* - median visible score), tau* the exact kk-th score, on ``--gap-queries`` queries),
the queries redone densely, and the time split from CUDA events between the pipeline's stages (seeds,
plan, screen, refine, select, redo). Then the plan's choice (``compiler.plan.choice.choose_layer`` on
the measured rows, designed for the same call) and the op with those settings through the runtime
guard, timed after its warm-up calls. JSON after every layer.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks import harness

import compiler  # noqa: F401  (registers torch.ops.pulsar_dosa.certified_topk)
from compiler.cost_model import constants_for
from compiler.lowering.topk_pipeline import checked_certified_topk_cuda, dense_topk_cuda
from compiler.ops.guard import GUARD
from compiler.plan.choice import choose_layer
from compiler.plan.schema import CandidateMeasurement
from runtime.certified_topk import CertifiedTopkConfig, TopkStats
from runtime.dsa_forward import dsa_forward, indexer_qkw
from runtime.indexer_zoo import HELD_OUT_TOKENS, TRAINED_MODEL

FULL = {"S": 4096, "T": [32768, 65536, 131072], "topk": 2048, "rs": [7, 15, 31], "reps": 5, "gap_queries": 64}
SMOKE = {"S": 64, "T": [2048], "topk": 64, "rs": [7, 15], "reps": 2, "gap_queries": 8}
STAGES = ("seeds", "plan", "screen", "refine", "select", "redo")


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


def certified_row(q, k, w, mask, kk, config, dense, reps, device):
    """Time, identity, pruning and the stage split of one certified configuration."""
    run = lambda: checked_certified_topk_cuda(q, k, w, kk, mask, config=config)  # noqa: E731
    timing = harness.measure(run, device, reps)
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
    out = checked_certified_topk_cuda(q, k, w, kk, mask, config=config, stats=stats, trace=trace, mark=mark)
    harness.synchronize(device)
    split, last = {}, start
    for stage, event in marks:
        split[stage] = round(last.elapsed_time(event), 3)
        last = event
    summary = stats.summary()
    tr = trace[0]
    visible = mask.sum(-1).clamp_min(1)
    survived = torch.where(tr.list_count > tr.cap, mask.shape[-1], tr.list_count)
    return {"ms": round(timing.ms, 3), "identical": harness.identical(out, dense) and harness.identical(timing.out, dense),
            "pruned": round(summary["pruned_frac"], 4), "m": round(float((survived / visible).mean()), 4),
            "redo": round(float(tr.redo.float().mean()), 4), "overflow": summary["fallbacks"]["overflow"],
            "threshold_miss": summary["fallbacks"]["threshold_miss"], "split_ms": split,
            "keys_screened": summary["keys_screened"], "queries": summary["queries"], "tau": tr.tau}


def layer_rows(layer, q, k, w, mask, sizes, device):
    """Every row of one layer at one T: dense, certified per (r, witnesses), the plan and its op."""
    S, T, kk = q.shape[1], k.shape[1], min(sizes["topk"], k.shape[1])
    dense = harness.measure(lambda: dense_topk_cuda(q, k, w, kk, mask), device, sizes["reps"])
    tau_star = dense.out[0][..., -1]
    rows = [{"layer": layer, "T": T, "S": S, "variant": "dense", "ms": round(dense.ms, 3)}]
    candidates = []
    for witnesses in (False, True):
        for r in sizes["rs"]:
            config = CertifiedTopkConfig(r=r, witnesses=witnesses, path="certified")
            row = certified_row(q, k, w, mask, kk, config, dense.out, sizes["reps"], device)
            tau = row.pop("tau")
            row["b"] = threshold_gap(q, k, w, mask, tau, tau_star, sizes["gap_queries"])
            row["x_dense"] = round(row["ms"] / dense.ms, 3)
            rows.append({"layer": layer, "T": T, "S": S, "variant": f"r={r}" + (" +witnesses" if witnesses else ""),
                         "r": r, "witnesses": witnesses, **row})
            if witnesses is False:
                candidates.append(CandidateMeasurement(
                    r=r, survival=1.0 - row["pruned"], redo_frac=row["redo"], ms=row["ms"], queries=row["queries"],
                    certified_queries=row["queries"], keys_screened=row["keys_screened"],
                    survivors=round((1.0 - row["pruned"]) * row["keys_screened"]), fallbacks={}))
            print(rows[-1], flush=True)
    choice = choose_layer(candidates, dense.ms, [(1, S, T)], heads=q.shape[2], head_dim=q.shape[3], topk=kk,
                          constants=constants_for(torch.device(device).type), design_length=T, queries=S)
    s = choice.settings
    GUARD.reset()

    def plan_op():
        return torch.ops.pulsar_dosa.certified_topk(q, k, w, kk, mask, path=s.path, r=s.r, min_keys=s.min_keys,
                                                    layer=f"trained/L{layer}")

    for _ in range(4):  # the guard's warm-ups and its dense and certified trials
        plan_op()
    op = harness.measure(plan_op, device, sizes["reps"])
    rows.append({"layer": layer, "T": T, "S": S, "variant": "plan", "path": s.path, "r": s.r, "min_keys": s.min_keys,
                 "reason": choice.reason, "ms": round(op.ms, 3), "x_dense": round(op.ms / dense.ms, 3),
                 "identical": harness.identical(op.out, dense.out)})
    print(rows[-1], flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU sizes (TRITON_INTERPRET=1)")
    ap.add_argument("--T", type=int, nargs="+", help="key counts (default: 32768 65536 131072)")
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--rs", type=int, nargs="+", help="budgets (default 7 15 31)")
    args = ap.parse_args(argv)
    sizes = dict(SMOKE if args.smoke else FULL)
    sizes["T"] = args.T or sizes["T"]
    sizes["rs"] = args.rs or sizes["rs"]
    device = "cpu" if args.smoke else "cuda"
    doc = harness.header(device, what=__doc__.split("\n\n")[0], sizes=sizes, layers=args.layers)
    doc["rows"] = []
    t0 = time.time()
    for T in sizes["T"]:
        layers = capture_layers(T, sizes["S"], device)
        mask = torch.ones(sizes["S"], T, dtype=torch.bool, device=device).tril(T - sizes["S"])[None]
        for layer in args.layers:
            q, k, w = layers[layer]
            doc["rows"] += layer_rows(layer, q, k, w, mask, sizes, device)
            doc["seconds"] = round(time.time() - t0, 1)
            harness.write_results(args.out, doc, render(doc))
        del layers
    return doc


def render(doc) -> str:
    """The readable table: one line per (T, layer, variant)."""
    head = ["T", "layer", "variant", "ms", "x dense", "identical", "pruned", "m", "b", "redo", "split ms (seeds/plan/screen/refine/select/redo)"]
    lines = []
    for r in doc["rows"]:
        split = r.get("split_ms")
        lines.append([r["T"], r["layer"], r["variant"] + (f" -> {r['path']} r={r['r']}" if r["variant"] == "plan" else ""),
                      r["ms"], r.get("x_dense", 1.0), r.get("identical", "-"), r.get("pruned", "-"), r.get("m", "-"),
                      "-" if r.get("b") is None else round(r["b"], 3), r.get("redo", "-"),
                      "-" if not split else " / ".join(str(split.get(s, "-")) for s in STAGES)])
    return harness.markdown_table(head, lines)


if __name__ == "__main__":
    main()

"""DSA indexer top-K on one GPU: inductor_dense vs triton_dense vs certified (+ decode rows).

    PYTHONPATH=. python3 benchmarks/indexer.py --out benchmarks/results/indexer_h200.json
    PYTHONPATH=. python3 benchmarks/indexer.py --render benchmarks/results/indexer_h200.json

Every row: median device ms (warm-up excluded), peak memory above the inputs, and ``identical``
(indices equal to triton_dense's; for certified also values bitwise). Per input one traced certified
call reports the pruned fraction, survivors, the seed gap b = tau* - tau and the bound slack delta
= U - s (SPEC A.6), also in units of the query's score standard deviation. Inputs:
``transformers_random`` (a random-init transformers DeepseekV32Indexer) and ``structured``
(``runtime.structured_indexer``); a causal chunk of S queries at the end of T keys. Tables are
written beside the JSON; ``--render`` prints those of a results file."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks import harness
from compiler.lowering.topk_pipeline import (
    certified_topk_cuda,
    dense_topk_cuda,
)
from compiler.lowering.scoring.indexer_scores import score_keys
from compiler.lowering.screen.certificate_screen import screen
from compiler.ops.guard import GUARD
from runtime.certified_topk import CertifiedTopkConfig
from runtime.rounding import key_norm_up, round_up_to_float32
from runtime.structured_indexer import structured_indexer_inputs

D = 128
TOPK = 2048
SCORE_BUDGET_BYTES = 24 << 30  # [chunk, H, T] fp32 scores of the inductor baseline
BREAKDOWN = {}


def timed(fn, budget_ms=2000.0, max_reps=10):
    """(median ms after one warm-up call, within ``budget_ms`` and at least 2 calls, peak GiB above
    the memory allocated before the timed calls, the last result): ``harness.measure``."""
    t = harness.measure(fn, "cuda", max_reps, budget_s=budget_ms / 1e3)
    return t.ms, t.peak_gib, t.out


def causal_chunk_mask(S, T):
    """[1,S,T] bool: query i sits at position T - S + i and sees keys <= its position."""
    return torch.ones(S, T, dtype=torch.bool, device="cuda").tril(T - S)[None]


def transformers_random(S, T, H, seed=0):
    """q [1,S,H,D] bf16, k [1,T,D] bf16, weights [1,S,H] fp32 (softmax_scale and H**-0.5 folded)
    from a random-init transformers DeepseekV32Indexer on random hidden states."""
    from transformers import DeepseekV32Config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import (
        DeepseekV32Indexer,
        DeepseekV32RotaryEmbedding,
        apply_rotary_pos_emb,
    )

    torch.manual_seed(seed)
    cfg = DeepseekV32Config(hidden_size=1024, q_lora_rank=512, index_n_heads=H, index_head_dim=D,
                            qk_rope_head_dim=64, index_topk=TOPK, num_hidden_layers=1)
    ix = DeepseekV32Indexer(cfg, 0).cuda()
    rope = DeepseekV32RotaryEmbedding(cfg).cuda()
    with torch.no_grad():
        x = torch.randn(1, T, cfg.hidden_size, device="cuda")
        q_resid = torch.randn(1, S, cfg.q_lora_rank, device="cuda")
        cos, sin = rope(x, torch.arange(T, device="cuda")[None])
        q = ix.wq_b(q_resid).view(1, S, H, D)
        k = ix.k_norm(ix.wk(x)).unsqueeze(2)
        r = cfg.qk_rope_head_dim
        q_rot, _ = apply_rotary_pos_emb(q[..., :r], q[..., :r], cos[:, T - S:], sin[:, T - S:], 2)
        k_rot, _ = apply_rotary_pos_emb(k[..., :r], k[..., :r], cos, sin, 2)
        q = torch.cat([q_rot, q[..., r:]], -1)
        k = torch.cat([k_rot, k[..., r:]], -1).squeeze(2)
        w = ix.weights_proj(x[:, T - S:]).float() * H**-0.5 * ix.softmax_scale
    params = {"generator": "transformers DeepseekV32Indexer, default init", "hidden_size": 1024,
              "q_lora_rank": 512, "qk_rope_head_dim": 64, "seed": seed}
    return q.to(torch.bfloat16).contiguous(), k.to(torch.bfloat16).contiguous(), w.contiguous(), params


_STRUCTURED = {}


def structured(S, T, H, seed=0):
    """Generated once per H at the largest S and T of the run (on the CPU), then sliced: the
    first S queries and the first T keys (the generator's locality does not depend on sizes)."""
    if H not in _STRUCTURED:
        _STRUCTURED.clear()
        q, k, w, params = structured_indexer_inputs(1, max(ARGS.S), max(ARGS.T), H, D, seed=seed,
                                                    dtype=torch.bfloat16)
        _STRUCTURED[H] = (q.cuda(), k.cuda(), w.float().cuda(), params)
    q, k, w, params = _STRUCTURED[H]
    return q[:, :S].contiguous(), k[:, :T].contiguous(), w[:, :S].contiguous(), {**params, "S": S, "T": T}


@torch.compile
def _inductor_chunk(q, k, w, m, kk: int):
    scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1))
    scores = F.relu(scores)
    index_scores = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)
    index_scores = index_scores.masked_fill(~m, float("-inf"))
    return index_scores.topk(kk, dim=-1)


def inductor_dense(q, k, w, mask, kk):
    """The transformers pattern compiled by inductor, query-chunked to bound [chunk,H,T]."""
    S, H, T = q.shape[1], q.shape[2], k.shape[1]
    chunk = min(S, 1 << (SCORE_BUDGET_BYTES // (H * T * 4)).bit_length() - 1)
    idx = [_inductor_chunk(q[:, s:s + chunk], k, w[:, s:s + chunk], mask[:, s:s + chunk], kk).indices
           for s in range(0, S, chunk)]
    return torch.cat(idx, 1)


def decode_dense(q, k, w, mask, kk):
    """One decode step in plain torch (the transformers pattern, eager)."""
    scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)))
    index_scores = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2).masked_fill(~mask, float("-inf"))
    return index_scores.topk(kk, dim=-1).indices


def diagnostics(q, k, w, mask, kk, dense_values, n_rows=32):
    """Traced certified call: pruning, survivors, seed gap b and slack delta (SPEC A.6)."""
    trace = []
    cfg = CertifiedTopkConfig(path="certified")
    certified_topk_cuda(q, k, w, kk, mask, config=cfg, trace=trace)
    tr = trace[0]
    S, T = q.shape[1], k.shape[1]
    G = tr.list_queries
    visible = mask[0].sum(-1).float()
    refined = torch.where(tr.list_count > tr.cap, T, tr.list_count).float()[0]
    refined = torch.minimum(refined.repeat_interleave(G)[:S], visible)  # a query refines its list
    out = {
        "pruned_frac": float(1 - refined.sum() / visible.sum()),
        "refined_per_query": float(refined.mean()),
        "list_queries": G,
        "written_per_query": float(tr.cand_count.float().mean()),
        "overflow_lists": int((tr.list_count > tr.cap).sum()),
        "redo_rows": int(tr.redo.sum()),
        "tau_minus_inf_rows": int((tr.tau == float("-inf")).sum()),
        "r_rows": int(tr.plan.g.shape[2]),
    }
    rows = torch.linspace(0, S - 1, n_rows, device="cuda").long()
    nk = round_up_to_float32(key_norm_up(k[0].float()))
    b_sig, d_sig, d_abs, b_abs, prunable = [], [], [], [], []
    for s in rows.tolist():
        vis = mask[0, s]
        x = q[0, s].float() @ k[0].float().T
        sc = (w[0, s, :, None] * F.relu(x)).sum(0)
        sigma = sc[vis].std()
        g = tr.plan.g[0, s].float() @ k[0].float().T
        U = ((tr.plan.alpha[0, s, :, None] * F.relu(g) + tr.plan.beta[0, s, :, None] * g.clamp(max=0)).sum(0)
             + tr.plan.e[0, s] * nk + tr.plan.c[0, s])
        tau_star = dense_values[0, s, kk - 1]
        b = tau_star - tr.tau[0, s]
        delta = (U - sc)[vis]
        gap = (tau_star - sc)[vis]
        b_abs.append(float(b))
        b_sig.append(float(b / sigma))
        d_abs.append(float(delta.median()))
        d_sig.append(float(delta.median() / sigma))
        prunable.append(float((gap > delta + b).float().mean()))
    out.update({"b_median": statistics.median(b_abs), "b_over_sigma_median": statistics.median(b_sig),
                "delta_median": statistics.median(d_abs),
                "delta_over_sigma_median": statistics.median(d_sig),
                "prunable_frac_by_b_delta": statistics.mean(prunable)})
    return out, tr


def stage_times(q, k, w, mask, tr):
    """Screen and refine kernels timed alone, and the screen's distance to the tensor-core floor."""
    nk = round_up_to_float32(key_norm_up(k.float()))
    p = tr.plan
    L = tr.list_count.shape[1]
    screen_ms, _, (ids, counts) = timed(lambda: screen(p.g, p.alpha, p.beta, p.e, p.c, tr.tau, k, nk,
                                                    mask=mask, lists_per_batch=L,
                                                    list_queries=tr.list_queries, cap=tr.cap), 1000)
    cand = torch.empty(q.shape[0], q.shape[1], 4 * TOPK, dtype=torch.int64, device="cuda")
    cnt = torch.zeros(q.shape[:2], dtype=torch.int32, device="cuda")

    def refine():
        cnt.zero_()
        score_keys(q, w, k, ids, counts, cap=tr.cap, tiles_per_list=1, mask=mask, tau=tr.tau,
                   out=cand, out_count=cnt, block_s=tr.list_queries)

    refine_ms, _, _ = timed(refine, 1000)
    return screen_ms, refine_ms


def auto_op(q, k, w, mask, layer):
    """The op as a compiled layer without a plan calls it: path "auto" (the cost model's crossover,
    then the runtime guard of ``layer``, compiler.ops.guard)."""
    return torch.ops.pulsar_dosa.certified_topk(q, k, w, TOPK, mask, layer)


def auto_path(layer):
    """The path the guard keeps for ``layer`` ("dense" when the call never reached the guard)."""
    states = GUARD.summaries().get(layer, [])
    return states[0]["path"] if states else "dense"


def run_config(S, T, H, inputs, kk, ceil, rows, do_inductor):
    gen = transformers_random if inputs == "transformers_random" else structured
    q, k, w, params = gen(S, T, H)
    mask = causal_chunk_mask(S, T)
    base = {"S": S, "T": T, "H": H, "D": D, "topk": TOPK, "dtype": "bfloat16", "input": inputs}

    dense_ms, dense_mem, (dv, di) = timed(lambda: dense_topk_cuda(q, k, w, TOPK, mask))
    diag, tr = diagnostics(q, k, w, mask, kk, dv)
    common = {"pruned_frac": diag["pruned_frac"], "survivors_per_query": diag["refined_per_query"]}
    rows.append({**base, "method": "triton_dense", "ms": dense_ms, "peak_mem_gib": dense_mem,
                 "identical": True, "pruned_frac": 0.0, "survivors_per_query": T})
    layer = f"{inputs}/H{H}/S{S}/T{T}"
    cert_ms, cert_mem, (cv, ci) = timed(lambda: auto_op(q, k, w, mask, layer))
    path = auto_path(layer)
    rows.append({**base, "method": "certified", "ms": cert_ms, "peak_mem_gib": cert_mem,
                 "identical": bool(torch.equal(ci, di) and torch.equal(cv, dv)), "path": path,
                 **common, "diagnostics": diag, "input_params": params})
    if inputs != "structured" and T != 131072:
        return finish(q, k, w, mask, base, rows, S, H)
    forced_ms, forced_mem, (fv, fi) = timed(lambda: certified_topk_cuda(
        q, k, w, TOPK, mask, config=CertifiedTopkConfig(path="certified")))
    screen_ms, refine_ms = stage_times(q, k, w, mask, tr)
    rp = tr.plan.g.shape[2]
    floor_ms = 2 * S * T * D * (diag["r_rows"]) / (ceil["bf16_matmul_tflops"] * 1e9)
    rows.append({**base, "method": "certified_forced", "ms": forced_ms, "peak_mem_gib": forced_mem,
                 "identical": bool(torch.equal(fi, di) and torch.equal(fv, dv)), **common,
                 "screen_ms": screen_ms, "refine_ms": refine_ms, "screen_rows_padded": rp,
                 "screen_tc_floor_ms": floor_ms, "screen_vs_floor": screen_ms / floor_ms})
    if S == max(ARGS.S) and T == 131072 and H == 64 and inputs == "structured":
        BREAKDOWN["certified_forced"] = harness.kernel_breakdown(lambda: certified_topk_cuda(
            q, k, w, TOPK, mask, config=CertifiedTopkConfig(path="certified")))
        BREAKDOWN["triton_dense"] = harness.kernel_breakdown(lambda: dense_topk_cuda(q, k, w, TOPK, mask))
    if do_inductor and inputs == "structured":
        ind_ms, ind_mem, ii = timed(lambda: inductor_dense(q, k, w, mask, kk), 3000, 3)
        same = (ii.long().sort(-1).values == di.sort(-1).values).all(-1).float().mean()
        rows.append({**base, "method": "inductor_dense", "ms": ind_ms,
                     "peak_mem_gib": ind_mem,
                     "identical": bool(torch.equal(ii.long(), di)), "same_set_rows": float(same),
                     "pruned_frac": 0.0, "survivors_per_query": T})
    finish(q, k, w, mask, base, rows, S, H)


def run_quick(S, T, H, inputs, rows):
    """triton_dense, certified (auto) and certified (forced) only: time, peak memory, identical."""
    gen = transformers_random if inputs == "transformers_random" else structured
    q, k, w, _ = gen(S, T, H)
    mask = causal_chunk_mask(S, T)
    base = {"S": S, "T": T, "H": H, "D": D, "topk": TOPK, "dtype": "bfloat16", "input": inputs}
    dense_ms, dense_mem, (dv, di) = timed(lambda: dense_topk_cuda(q, k, w, TOPK, mask), 1000)
    rows.append({**base, "method": "triton_dense", "ms": dense_ms, "peak_mem_gib": dense_mem,
                 "identical": True})
    layer = f"quick/{inputs}/H{H}/S{S}/T{T}"
    for method, fn in (("certified", lambda: auto_op(q, k, w, mask, layer)),
                       ("certified_forced", lambda: certified_topk_cuda(q, k, w, TOPK, mask,
                                                                        config=CertifiedTopkConfig(path="certified")))):
        ms, mem, (cv, ci) = timed(fn, 1000)
        rows.append({**base, "method": method, "ms": ms, "peak_mem_gib": mem,
                     "identical": bool(torch.equal(ci, di) and torch.equal(cv, dv))})


def finish(q, k, w, mask, base, rows, S, H):
    if S == max(ARGS.S) and H == 64:
        decode_rows(q, k, w, mask, base, rows)
    del q, k, w, mask
    torch.cuda.empty_cache()


def decode_rows(q, k, w, mask, base, rows):
    """One query (the chunk's last): the transformers pattern, the dense Triton path, and the op as a
    compiled model calls it (certified from every length: decode must still not lose to dense)."""
    ql, wl, ml = q[:, -1:], w[:, -1:], mask[:, -1:]
    dv, di = dense_topk_cuda(ql, k, wl, TOPK, ml)
    b = {**base, "S": 1}
    ms, mem, ti = timed(lambda: decode_dense(ql, k, wl, ml, TOPK), 500)
    rows.append({**b, "method": "decode_dense", "ms": ms, "peak_mem_gib": mem,
                 "identical": bool(torch.equal(ti, di)),
                 "pruned_frac": 0.0})
    ms, mem, _ = timed(lambda: dense_topk_cuda(ql, k, wl, TOPK, ml), 500)
    rows.append({**b, "method": "decode_triton_dense", "ms": ms, "peak_mem_gib": mem,
                 "identical": True, "pruned_frac": 0.0})
    ms, mem, (cv, ci) = timed(lambda: torch.ops.pulsar_dosa.certified_topk(ql, k, wl, TOPK, ml, layer="decode",
                                                                           min_keys=0), 500)
    rows.append({**b, "method": "decode_op", "ms": ms, "peak_mem_gib": mem, "pruned_frac": 0.0,
                 "identical": bool(torch.equal(ci, di) and torch.equal(cv, dv))})


def _fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def render_markdown(doc) -> str:
    """The results JSON as markdown tables (prefill, decode, kernel breakdown)."""
    rows = [r for r in doc["rows"] if "error" not in r]
    c, v = doc["ceilings"], harness.versions_of(doc)
    matmul = c.get("bf16_matmul_tflops", c.get("bf16_matmul_TFLOPs"))  # the key of results before the harness
    out = [f"Device: {doc['device']}, torch {v['torch']}, triton {v['triton']}. Ceilings measured "
           f"in the same run: device copy {c['copy_GBps']:.0f} GB/s (read + write), bf16 matmul "
           f"{matmul:.0f} TFLOP/s. D = {D}, topk = {TOPK}, bf16, causal chunk mask.",
           "", "pruned = 1 - keys refined / keys visible (a survivor list serves the scorer's tile of "
           "G = 128 / H queries; an overflowed list counts as every key: shown as 0 when negative); "
           "survivors/query = keys refined per query; b = tau* - tau (seed gap), delta = median of "
           "U - s over visible keys, both over 32 sampled queries, in units of the query's score "
           "standard deviation. 'certified' is the op with path='auto'; 'forced' with "
           "path='certified' (what a per-layer plan selects).",
           "", "| input | H | S | T | inductor_dense ms | triton_dense ms | certified ms (path) | "
           "certified forced ms | x inductor | x triton_dense | x triton_dense forced | identical | "
           "pruned | survivors/query | b/sigma | delta/sigma | peak GiB dense / cert |",
           "|" + "---|" * 17]
    by = {}
    for r in rows:
        by.setdefault((r["input"], r["H"], r["S"], r["T"]), {})[r["method"]] = r
    for (inp, H, S, T), m in sorted(by.items(), key=lambda kv: (kv[0][0] != "structured", -kv[0][1],
                                                               -kv[0][2], kv[0][3])):
        if "certified" not in m:
            continue
        dn, ce, fo, ind = m["triton_dense"], m["certified"], m.get("certified_forced"), m.get("inductor_dense")
        dg = ce["diagnostics"]
        ident = all(x["identical"] for x in (ce, fo) if x)
        out.append(
            f"| {inp} | {H} | {S} | {T} | {_fmt(ind and ind['ms'])} | {dn['ms']:.1f} | "
            f"{ce['ms']:.1f} ({ce['path']}) | {_fmt(fo and fo['ms'])} | "
            f"{_fmt(ind and ind['ms'] / ce['ms'], 2)} | {dn['ms'] / ce['ms']:.2f} | "
            f"{_fmt(fo and dn['ms'] / fo['ms'], 2)} | {ident} | {max(0.0, dg['pruned_frac']):.3f} | "
            f"{dg['refined_per_query']:.0f} | {dg['b_over_sigma_median']:.3f} | "
            f"{dg['delta_over_sigma_median']:.3f} | {dn['peak_mem_gib']:.1f} / {ce['peak_mem_gib']:.1f} |")
    out += ["", "Decode (one query; the op as a compiled model calls it):", "",
            "| input | T | decode_dense (torch) ms | decode_triton_dense ms | decode_op ms | "
            "identical (torch / op) |", "|---|---|---|---|---|---|"]
    for (inp, H, S, T), m in sorted(by.items()):
        if "decode_op" in m:
            out.append(f"| {inp} | {T} | {m['decode_dense']['ms']:.2f} | "
                       f"{m['decode_triton_dense']['ms']:.2f} | {m['decode_op']['ms']:.2f} | "
                       f"{m['decode_dense']['identical']} / {m['decode_op']['identical']} |")
    out += ["", "Screen kernel alone against the tensor-core floor of its padded rows "
            "(2 S T D RP / bf16 matmul rate):", "",
            "| input | H | S | T | screen ms | refine ms | rows RP | floor ms | screen / floor |",
            "|---|---|---|---|---|---|---|---|---|"]
    for (inp, H, S, T), m in sorted(by.items()):
        f = m.get("certified_forced")
        if f:
            out.append(f"| {inp} | {H} | {S} | {T} | {f['screen_ms']:.1f} | {f['refine_ms']:.1f} | "
                       f"{f['screen_rows_padded']} | {f['screen_tc_floor_ms']:.2f} | "
                       f"{f['screen_vs_floor']:.1f} |")
    for name, bd in doc.get("breakdown", {}).items():
        out += ["", f"Kernel time of one `{name}` call (structured, H=64, S=16384, T=131072): "
                f"{bd['total_ms']:.1f} ms", "", "| kernel | ms |", "|---|---|"]
        out += [f"| `{n}` | {t:.2f} |" for n, t in bd["kernels"]]
    if doc.get("rerun"):
        rr = doc["rerun"]
        out += ["", f"Rerun ({rr['note']}):", "", "| input | H | S | T | method | ms | peak GiB | identical |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['input']} | {r['H']} | {r['S']} | {r['T']} | {r['method']} | {r['ms']:.1f} | "
                f"{r['peak_mem_gib']:.1f} | {r['identical']} |" for r in rr["rows"] if "error" not in r]
    if doc.get("skipped"):
        out += ["", "Not run (time budget): " + ", ".join(
            f"{x['input']} H={x['H']} S={x['S']} T={x['T']}" for x in doc["skipped"])]
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--render", help="print the markdown tables of a results JSON and exit")
    ap.add_argument("--out")
    ap.add_argument("--S", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--T", type=int, nargs="+", default=[32768, 131072, 524288])
    ap.add_argument("--H", type=int, nargs="+", default=[64, 32])
    ap.add_argument("--inputs", nargs="+", default=["structured", "transformers_random"])
    ap.add_argument("--budget_s", type=float, default=480)
    ap.add_argument("--inductor_max_T", type=int, default=524288)
    ap.add_argument("--quick", action="store_true",
                    help="only triton_dense and certified (auto, forced) for the given shapes")
    global ARGS
    ARGS = ap.parse_args()
    if ARGS.render:
        with open(ARGS.render) as f:
            print(render_markdown(json.load(f)), end="")
        return
    if not ARGS.out:
        ap.error("--out is required to run the benchmark")
    t0 = time.perf_counter()
    ceil = {} if ARGS.quick else harness.ceilings("cuda")
    doc = harness.header("cuda", ceilings=ceil, rows=[], skipped=[])
    print(json.dumps(ceil))
    configs = [(S, T, H, x) for H in ARGS.H for x in ARGS.inputs for S in sorted(ARGS.S, reverse=True)
               for T in sorted(ARGS.T, key=lambda t: (t != 131072, -t))]
    for S, T, H, x in configs:
        if time.perf_counter() - t0 > ARGS.budget_s:
            doc["skipped"].append({"S": S, "T": T, "H": H, "input": x})
            continue
        n0 = len(doc["rows"])
        try:
            if ARGS.quick:
                run_quick(S, T, H, x, doc["rows"])
            else:
                run_config(S, T, H, x, TOPK, ceil, doc["rows"], T <= ARGS.inductor_max_T)
        except Exception as exc:  # recorded, the run goes on with the next shape
            doc["rows"].append({"S": S, "T": T, "H": H, "input": x, "error": repr(exc)[:500]})
            torch.cuda.empty_cache()
        for r in doc["rows"][n0:]:
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
                   if k not in ("diagnostics", "input_params")}, flush=True)
        harness.write_json(ARGS.out, doc)
        doc["breakdown"] = BREAKDOWN
    for name, bd in BREAKDOWN.items():
        print(name, round(bd["total_ms"], 2), [(n[:50], round(t, 2)) for n, t in bd["kernels"]])
    harness.write_results(ARGS.out, doc, render_markdown(doc))
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

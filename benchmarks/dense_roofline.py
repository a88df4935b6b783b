"""The dense indexer path against the machine's limits, on one GPU.

    python3 benchmarks/dense_roofline.py --out benchmarks/results/dense_roofline_h200.json
    python3 benchmarks/dense_roofline.py --sweep --out /tmp/sweep.json    # scorer forms and configs

Measured in the same run: the bf16 matmul rate (8192^3, random data) and the copy bandwidth, then
per (S, T) with H=64, D=128, topk=2048, bf16, causal chunk of S queries at the end of T keys:
``score_ms`` (the Triton scorer writing every order code), ``select_ms`` (the exact selection of
the top-kk codes), ``ms`` (the whole ``dense_topk_cuda`` call) and ``score_tflops`` = 2 S T H D /
score time; ``certified_plan`` = the op as a compiled model calls it with a plan (r=1, its
crossover) on the structured geometry; ``identical``: indices equal to dense's and values bitwise.

``--sweep`` times the scorer alone over tile orientations (keys on the product's rows, KEYS_M, or
heads), launch configs and query tiles, checks that each computes the same scores as the baseline
form (within fp32 reassociation) and that a key scores to the same bits in dense scoring and in a
row list (refine/redo use), and times fp32 operands (bf16 hi + lo, three products) against bf16.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import triton

from compiler.autotune import LaunchConfig
from compiler.lowering import dsa_score_triton as scorer
from compiler.lowering.certified_topk_triton import (_all_keys, _row_codes, certified_topk_cuda,
                                                     dense_topk_cuda)
from compiler.lowering.threshold_select import top_codes
from runtime.certified_topk import CertifiedTopkConfig

H, D, TOPK = 64, 128, 2048
DEVICE = "cuda"
PLAN = CertifiedTopkConfig(r=1)
PLAN_CROSSOVER = 32725
"""The structured geometry's per-layer plan (benchmarks/results/indexer_plan_h200.md): r=1 from
32725 keys, as a model compiled with that plan calls the op."""


def timed(fn, reps=5, warmup=1):
    """Median ms of ``reps`` calls after ``warmup`` (CUDA events; the host clock off CUDA)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if DEVICE != "cuda":
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def ceilings():
    x = torch.empty(2 << 30, dtype=torch.uint8, device=DEVICE)
    y = torch.empty_like(x)
    copy_ms = timed(lambda: y.copy_(x))
    del x, y
    a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    mm_ms = timed(lambda: a @ b, reps=10)
    return {"copy_GBps": round(2 * (2 << 30) / copy_ms / 1e6), "bf16_matmul_tflops": round(2 * 8192**3 / mm_ms / 1e9, 1)}


def random_inputs(S, T, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(1, S, H, D, device=DEVICE, generator=g).to(dtype)
    k = torch.randn(1, T, D, device=DEVICE, generator=g).to(dtype)
    w = torch.randn(1, S, H, device=DEVICE, generator=g)
    return q, k, w


def causal_chunk_mask(S, T):
    return torch.ones(S, T, dtype=torch.bool, device=DEVICE).tril(T - S)[None]


def all_codes(q, w, k, mask=None):
    ids, counts = _all_keys(1, k.shape[1], q.device)
    return _row_codes(q, w, k, mask, ids, counts, k.shape[1], 1 << 30)


def scorer_form(keys_m, config, matrix_rows=128):
    """Set the scorer's form (module constants) and return a label."""
    scorer.KEYS_M = keys_m
    scorer.SCORER_CONFIG = config
    scorer.MATRIX_ROWS = matrix_rows
    meta = dict(config.meta)
    return (f"{'keys_m' if keys_m else 'heads_m'} BT{meta['BLOCK_T']} w{config.num_warps} "
            f"s{config.num_stages} rows{matrix_rows}")


FORMS = [(False, LaunchConfig.of(num_warps=8, num_stages=3, BLOCK_T=128), 128)] + [
    (True, LaunchConfig.of(num_warps=w, num_stages=s, BLOCK_T=bt), rows)
    for (bt, w, s, rows) in [(128, 8, 3, 128), (128, 8, 4, 128), (128, 4, 3, 128), (64, 4, 3, 128),
                             (64, 4, 4, 128), (128, 8, 3, 256), (64, 4, 3, 256), (256, 8, 3, 128)]]


def sweep(emit, S=4096, T=131072):
    q, k, w = random_inputs(S, T)
    flops = 2 * S * T * H * D
    scorer_form(*FORMS[0])
    base = scorer.decode_codes(all_codes(q, w, k), T)[0]
    bound = (w.abs()[0, :64, :, None] * torch.einsum("shd,td->sht", q[0, :64].float().abs(), k[0].float().abs())).sum(1)
    rows = torch.randperm(S, device=DEVICE)[:64].sort().values
    best = None
    for keys_m, config, matrix_rows in FORMS:
        label = scorer_form(keys_m, config, matrix_rows)
        row = {"kind": "scorer_form", "form": label, "S": S, "T": T}
        try:
            codes = all_codes(q, w, k)
            values = scorer.decode_codes(codes, T)[0]
            row["max_rel_err_vs_base"] = float(((values[0, :64] - base[0, :64]).abs() / bound).max())
            listed = _row_codes(q, w, k, None, *_all_keys(1, T, q.device), T, 1 << 30, rows=rows[None])
            row["row_list_bitwise"] = bool(torch.equal(listed[0], codes[0, rows]))
            del codes, listed, values
            row["ms"] = round(timed(lambda: all_codes(q, w, k)), 3)
            row["tflops"] = round(flops / row["ms"] / 1e9, 1)
            if keys_m and (best is None or row["ms"] < best[1]):
                best = ((keys_m, config, matrix_rows), row["ms"])
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        emit(row)
    scorer_form(*best[0])
    q32, k32 = q.float(), k.float()
    fp32_ms = timed(lambda: all_codes(q32, w, k32))
    v32 = scorer.decode_codes(all_codes(q32[:, :64], w[:, :64], k32), T)[0]
    exact = torch.einsum("shd,td->sht", q32[0, :64].double(), k32[0].double())
    exact = (w[0, :64, :, None].double() * exact.clamp_min(0)).sum(1)
    emit({"kind": "fp32_split", "form": scorer_form(*best[0]), "S": S, "T": T, "ms": round(fp32_ms, 3),
          "bf16_ms": best[1], "ratio": round(fp32_ms / best[1], 2),
          "max_rel_err_vs_fp64": float(((v32[0] - exact).abs() / bound).max())})
    return best[0]


def grid(emit, lengths_s, lengths_t, structured_inputs):
    for S in lengths_s:
        for T in lengths_t:
            q, k, w = random_inputs(S, T, seed=S + T)
            mask = causal_chunk_mask(S, T)
            kk = min(TOPK, T)
            rows = min(S, max(1, (4 << 30) // (8 * T)))  # the dense path's chunk of rows (4 GiB of codes)
            part = (q[:, :rows], w[:, :rows], k, mask[:, :rows])
            score_ms = timed(lambda: all_codes(*part), reps=3) * S / rows
            codes = all_codes(*part)
            select_ms = timed(lambda: top_codes(codes, kk), reps=3) * S / rows
            topk_ms = timed(lambda: torch.topk(codes, kk, dim=-1), reps=3) * S / rows
            del codes
            ms = timed(lambda: dense_topk_cuda(q, k, w, TOPK, mask), reps=3)
            emit({"S": S, "T": T, "H": H, "D": D, "topk": TOPK, "method": "dense", "ms": round(ms, 2),
                  "score_ms": round(score_ms, 2), "select_ms": round(select_ms, 2),
                  "select_torch_topk_ms": round(topk_ms, 2),
                  "score_tflops": round(2 * S * T * H * D / score_ms / 1e9, 1), "identical": True})
            del q, k, w
            if structured_inputs is not None:
                sq, sk, sw = (x[:, :n].contiguous() for x, n in zip(structured_inputs, (S, T, S)))
                want = dense_topk_cuda(sq, sk, sw, TOPK, mask)
                dense_ms = timed(lambda: dense_topk_cuda(sq, sk, sw, TOPK, mask), reps=3)
                got = certified_topk_cuda(sq, sk, sw, TOPK, mask, config=PLAN, crossover=PLAN_CROSSOVER)
                same = bool(torch.equal(got[1], want[1]) and torch.equal(got[0].view(torch.int32), want[0].view(torch.int32)))
                ms = timed(lambda: certified_topk_cuda(sq, sk, sw, TOPK, mask, config=PLAN, crossover=PLAN_CROSSOVER), reps=3)
                emit({"S": S, "T": T, "H": H, "D": D, "topk": TOPK, "method": "certified_plan", "ms": round(ms, 2),
                      "dense_ms_same_inputs": round(dense_ms, 2), "speedup": round(dense_ms / ms, 2),
                      "identical": same})
            if DEVICE == "cuda":
                torch.cuda.empty_cache()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--S", nargs="+", type=int, default=[4096, 16384])
    p.add_argument("--T", nargs="+", type=int, default=[32768, 131072, 524288])
    p.add_argument("--no-structured", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU under TRITON_INTERPRET=1")
    args = p.parse_args(argv)
    global H, D, TOPK, DEVICE
    if args.smoke:
        H, D, TOPK, DEVICE = 4, 16, 8, "cpu"
        scorer.SEQUENTIAL = False  # exercise the GPU forms of the scorer with the interpreter's dot
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke)",
           "versions": {"torch": torch.__version__, "triton": triton.__version__},
           **(ceilings() if DEVICE == "cuda" else {}), "rows": []}
    print(json.dumps({k: v for k, v in doc.items() if k != "rows"}), flush=True)

    def emit(row):
        doc["rows"].append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps(doc, indent=1))

    if args.sweep:
        sweep(emit, *((64, 512) if args.smoke else ()))
        return 0
    structured_inputs = None
    if not args.no_structured:
        from runtime.structured_indexer import structured_indexer_inputs

        start = time.perf_counter()
        q, k, w, _ = structured_indexer_inputs(1, max(args.S), max(args.T), H, D, dtype=torch.bfloat16)
        structured_inputs = (q.to(DEVICE), k.to(DEVICE), w.float().to(DEVICE))
        print(f"structured inputs in {time.perf_counter() - start:.1f} s", flush=True)
    grid(emit, args.S, args.T, structured_inputs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

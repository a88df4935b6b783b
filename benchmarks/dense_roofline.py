"""The dense indexer path against the machine's limits, on one GPU.

    python3 benchmarks/dense_roofline.py --out benchmarks/results/dense_roofline_h200.json
    python3 benchmarks/dense_roofline.py --sweep --out /tmp/sweep.json    # scorer forms and configs
    python3 benchmarks/dense_roofline.py --decode-only --out /tmp/decode.json
    python3 benchmarks/dense_roofline.py --fp8 --out benchmarks/results/dense_roofline_fp8_h200.json

The bf16 matmul rate and copy bandwidth (``harness.ceilings``), then per (S, T), H=64, D=128,
topk=2048, bf16, a causal chunk of S queries at the end of T keys: ``score_ms`` and ``select_ms``
(the dense path's scorer and selection, timed on its first chunk of rows and scaled to S), ``ms``
(the whole ``dense_topk_cuda``), ``score_tflops``; ``torch_gemm_topk`` (cuBLAS and ``torch.topk``,
not exact: ``same_index_fraction``); ``certified_plan`` (the structured plan's r=1, forced);
``identical`` to dense. Decode rows time the op, the dense path and the transformers indexer.
``--sweep`` times the scorer's forms and fp32 operands, checking every form's scores. ``--fp8``
(SPEC A.10): the FP8 matmul rates, ``fp8_dot_check``, the FP8 scorer's forms, then per (S, T)
``fp8_dense`` (with ``quant_ms`` the torch definition's quantisation, ``triton_quant_ms`` the Triton
quantiser's and ``triton_quant_bitwise`` whether their bits agree), ``fp8_certified_plan`` and
``fp8_overlap`` (rows described in benchmarks/README.md)."""
from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks import harness
from compiler.lowering import defaults
from compiler.autotune import LaunchConfig
from compiler.lowering.order_codes import codes_of_words, decode_codes
from compiler.lowering.scoring import indexer_scores as scorer
from compiler.lowering.topk_pipeline import (_all_keys, certified_topk_cuda, dense_codes,
                                                     dense_chunk_rows, dense_topk_cuda, scorer_chunks)
from compiler.lowering.selection.threshold_select import top_codes
from runtime.certified_topk import CertifiedTopkConfig, TopkStats
from compiler.lowering.scoring.fp8_quant import quantize_rows
from runtime.fp8_quant import quantize_indexer_inputs

H, D, TOPK = 64, 128, 2048
DEVICE = "cuda"
PLAN = CertifiedTopkConfig(r=1, path="certified")
PLAN_CROSSOVER = 32725
"""The structured geometry's per-layer plan (benchmarks/results/indexer_plan_h200.md): r=1 from
32725 keys; every T of the grid is above it, so the plan's calls run certified with r=1."""


def timed(fn, reps=5, warmup=1):
    """Median device ms of ``reps`` calls after ``warmup`` calls (``harness.measure``)."""
    return harness.measure(fn, DEVICE, reps, warmup=warmup).ms


def fp8_matmul_rates(device) -> dict:
    """The FP8 matmul rates measured in the same run (``torch._scaled_mm`` of 8192^3 E4M3, bf16 out):
    ``fp8_matmul_tflops`` with cuBLAS's promotion, ``fp8_matmul_fast_accum_tflops`` without; empty
    off CUDA, an ``fp8_matmul_error`` where this torch lacks that form of ``_scaled_mm``."""
    if torch.device(device).type != "cuda":
        return {}
    a, b = (torch.randn(8192, 8192, device=device, dtype=torch.bfloat16) for _ in range(2))
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()  # mat2 column-major
    one = torch.ones((), device=device)
    out = {}
    try:
        for key, fast in (("fp8_matmul_tflops", False), ("fp8_matmul_fast_accum_tflops", True)):
            ms = timed(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16, use_fast_accum=fast),
                       reps=10)
            out[key] = round(2 * 8192**3 / ms / 1e9, 1)
    except Exception as exc:  # a torch without this form of _scaled_mm: recorded
        out["fp8_matmul_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return out


def random_inputs(S, T, dtype=torch.bfloat16, seed=0, exact=False, B=1):
    """q [B,S,H,D], k [B,T,D] in ``dtype`` and w [B,S,H] fp32, normal; ``exact``: small integers
    instead, whose scores are exact in any summation order (CPU smoke runs compare scorers whose
    roundings there depend on numpy's BLAS; many ties, which the order breaks by index)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    draw = ((lambda *shape: torch.randint(-2, 3, shape, device=DEVICE, generator=g).float()) if exact
            else (lambda *shape: torch.randn(*shape, device=DEVICE, generator=g)))
    return draw(B, S, H, D).to(dtype), draw(B, T, D).to(dtype), draw(B, S, H)


def causal_chunk_mask(S, T):
    return torch.ones(S, T, dtype=torch.bool, device=DEVICE).tril(T - S)[None]


def row_overlap(got, want, T):
    """(mean, min) over rows of |got_row & want_row| / kk for key-index tensors [..., kk] (keys < T)."""
    got, want = got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])
    offset = torch.arange(got.shape[0], device=got.device)[:, None] * T  # per-row sets, flattened
    same = torch.isin(got + offset, want + offset).float().mean(-1)
    return round(float(same.mean()), 4), round(float(same.min()), 4)


def all_codes(q, w, k, mask=None, maxima=None, words=False, k_scale=None):
    """The dense path's scorer: every key's order code [1,S,T] (int32 high words with ``words``)
    (and the chunk ``maxima``); ``k_scale``: the FP8 scorer."""
    return dense_codes(q, w, k, mask, maxima=maxima, words=words, k_scale=k_scale)


def listed_codes(q, w, k, mask=None, rows=None, k_scale=None):
    """The key-list scorer (seeds, refine) over the list 0..T-1, for the query ``rows`` [R] or all."""
    T = k.shape[1]
    return scorer.score_keys(q, w, k, *_all_keys(1, T, q.device), cap=T, tiles_per_list=1 << 30, mask=mask,
                             rows=None if rows is None else rows[None], k_scale=k_scale)


def dense_maxima(S, T, kk, dtype=torch.bfloat16):
    """The chunk maxima buffer [1,S,n] the dense path gives its scorer, or None (rows that do not
    take the threshold path)."""
    n = scorer_chunks(S, T, kk, dtype, DEVICE)
    return None if n is None else torch.empty((1, S, n), dtype=torch.int64, device=DEVICE)


def scorer_form(config, columns):
    """Set the scorer's launch config and product columns (module constants); return a label."""
    defaults.SCORER_CONFIG = config
    defaults.PRODUCT_COLUMNS = columns
    meta = dict(config.meta)
    return f"BT{meta['BLOCK_T']} w{config.num_warps} s{config.num_stages} cols{columns}"


FORMS = [(LaunchConfig.of(num_warps=w, num_stages=s, BLOCK_T=bt), cols)
         for (bt, w, s, cols) in [(64, 4, 3, 256), (64, 8, 3, 256), (64, 8, 4, 256), (64, 4, 4, 256),
                                  (128, 8, 3, 256)]]
"""Scorer forms of the sweep; the first is the module default (keys on the product's rows since the
first H200 sweep: results/dense_roofline_sweep_h200.json, heads-on-rows 160 TFLOP/s; the second
sweep, results/dense_roofline_sweep2_h200.json, found 8 warps fastest unmasked; 4 warps are the
default: much faster under a mask, results/dense_scorer_mask_ab_h200.json)."""
FP32_CONFIGS = [LaunchConfig.of(num_warps=w, num_stages=s, BLOCK_T=bt)
                for (bt, w, s) in [(64, 8, 3), (64, 4, 3), (64, 4, 2), (64, 8, 2), (32, 4, 3)]]
"""Launch configs tried for fp32 operands (tf32 products); the first is the module default."""


def sweep(emit, S=4096, T=131072):
    # On the CPU (the smoke run) the bitwise row-list check compares two tl.dot calls that numpy's
    # BLAS computes: small-integer inputs make their scores exact in any summation order.
    q, k, w = random_inputs(S, T, exact=DEVICE != "cuda")
    mask = causal_chunk_mask(S, T)
    flops = 2 * S * T * H * D
    default = (defaults.SCORER_CONFIG, defaults.PRODUCT_COLUMNS)
    base = decode_codes(all_codes(q, w, k), T)[0]
    bound = (w.abs()[0, :64, :, None] * torch.einsum("shd,td->sht", q[0, :64].float().abs(), k[0].float().abs())).sum(1)
    rows = torch.randperm(S, device=DEVICE)[:64].sort().values
    for config, columns in FORMS:
        label = scorer_form(config, columns)
        row = {"kind": "scorer_form", "form": label, "S": S, "T": T}
        try:
            codes = all_codes(q, w, k)
            values = decode_codes(codes, T)[0]
            row["max_rel_err_vs_base"] = float(((values[0, :64] - base[0, :64]).abs() / bound).max())
            listed = listed_codes(q, w, k, rows=rows)
            row["row_list_bitwise"] = bool(torch.equal(listed[0], codes[0, rows]))
            del codes, listed, values
            row["ms"] = round(timed(lambda: all_codes(q, w, k)), 3)
            row["tflops"] = round(flops / row["ms"] / 1e9, 1)
            row["masked_ms"] = round(timed(lambda: all_codes(q, w, k, mask)), 3)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        emit(row)
    scorer_form(*default)
    bf16_ms = timed(lambda: all_codes(q, w, k, mask))
    bf16_op_ms = timed(lambda: dense_topk_cuda(q, k, w, TOPK, mask), reps=3)
    q32, k32 = q.float(), k.float()
    exact = torch.einsum("shd,td->sht", q32[0, :64].double(), k32[0].double())
    exact = (w[0, :64, :, None].double() * exact.clamp_min(0)).sum(1)
    chosen = defaults.FP32_SCORER_CONFIG
    for config in FP32_CONFIGS:
        defaults.FP32_SCORER_CONFIG = config
        row = {"kind": "fp32_tf32", "form": scorer_form(config, default[1]), "S": S, "T": T}
        try:
            codes = all_codes(q32, w, k32)
            listed = listed_codes(q32, w, k32, rows=rows)
            row["row_list_bitwise"] = bool(torch.equal(listed[0], codes[0, rows]))
            v32 = decode_codes(codes[:, :64], T)[0]
            row["max_rel_err_vs_fp64"] = float(((v32[0] - exact).abs() / bound).max())
            del codes, listed
            row["masked_ms"] = round(timed(lambda: all_codes(q32, w, k32, mask)), 3)
            row["bf16_masked_ms"] = round(bf16_ms, 3)
            row["ratio"] = round(row["masked_ms"] / bf16_ms, 2)
            if config == chosen:
                op_ms = timed(lambda: dense_topk_cuda(q32, k32, w, TOPK, mask), reps=3)
                row["op_ratio"] = round(op_ms / bf16_op_ms, 2)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        emit(row)
    defaults.FP32_SCORER_CONFIG = chosen
    scorer_form(*default)


def torch_gemm_topk(q, k, w, mask, kk):
    """The plain-torch baseline: per chunk of queries the bf16 logits of every head by one cuBLAS
    GEMM ([rows * H, D] x [D, T], fp32 accumulation, bf16 out), relu in place, the weighted head sum
    as a batched GEMM with bf16 weights, the mask, then ``torch.topk`` of the fp32 scores. Not
    exact (bf16 logits and weights): the indices [S, kk] are compared with the dense op's."""
    S, T = q.shape[1], k.shape[1]
    rows = max(1, (2 << 30) // (2 * H * T))  # 2 GiB of bf16 logits per chunk
    out = []
    for s0 in range(0, S, rows):
        r = min(rows, S - s0)
        x = (q[0, s0:s0 + r].reshape(r * H, D) @ k[0].T).view(r, H, T).relu_()
        scores = torch.bmm(w[0, s0:s0 + r, None, :].to(x.dtype), x)[:, 0].float()
        out.append(torch.topk(scores.masked_fill_(~mask[0, s0:s0 + r], float("-inf")), kk, dim=-1).indices)
    return torch.cat(out)


def grid(emit, lengths_s, lengths_t, structured_inputs):
    for S in lengths_s:
        for T in lengths_t:
            q, k, w = random_inputs(S, T, seed=S + T)
            mask = causal_chunk_mask(S, T)
            kk = min(TOPK, T)
            rows = min(S, dense_chunk_rows(1, S, H, T, kk, q.dtype, q.device))  # the dense path's chunk
            part = (q[:, :rows], w[:, :rows], k, mask[:, :rows])
            maxima = dense_maxima(rows, T, kk)
            words = maxima is not None  # as the dense path: the scorer writes words for the threshold path
            score_ms = timed(lambda: all_codes(*part, maxima=maxima, words=words), reps=3) * S / rows
            codes = all_codes(*part, maxima=maxima, words=words)
            select_ms = timed(lambda: top_codes(codes, kk, maxima), reps=3) * S / rows
            got = top_codes(codes, kk, maxima)
            if words:
                codes = codes_of_words(codes)
            topk_ms = timed(lambda: torch.topk(codes, kk, dim=-1), reps=3) * S / rows
            same_selection = bool(torch.equal(got, torch.topk(codes, kk, dim=-1).values))
            del codes, got
            ms = timed(lambda: dense_topk_cuda(q, k, w, TOPK, mask), reps=3)
            emit({"S": S, "T": T, "H": H, "D": D, "topk": TOPK, "method": "dense", "ms": round(ms, 2),
                  "score_ms": round(score_ms, 2), "select_ms": round(select_ms, 2),
                  "select_torch_topk_ms": round(topk_ms, 2),
                  "score_tflops": round(2 * S * T * H * D / score_ms / 1e9, 1), "identical": same_selection})
            row = {"S": S, "T": T, "H": H, "D": D, "topk": TOPK, "method": "torch_gemm_topk"}
            try:
                want = dense_topk_cuda(q, k, w, TOPK, mask)[1][0]
                got = torch_gemm_topk(q, k, w, mask, kk)
                same, _ = row_overlap(got, want, T)
                row.update(ms=round(timed(lambda: torch_gemm_topk(q, k, w, mask, kk), reps=3), 2),
                           dense_ms=round(ms, 2), same_index_fraction=same)
                del want, got
            except Exception as exc:  # out of memory at some size: recorded
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            emit(row)
            del q, k, w
            if structured_inputs is not None:
                sq, sk, sw = (x[:, :n].contiguous() for x, n in zip(structured_inputs, (S, T, S)))
                want = dense_topk_cuda(sq, sk, sw, TOPK, mask)
                dense_ms = timed(lambda: dense_topk_cuda(sq, sk, sw, TOPK, mask), reps=3)
                got = certified_topk_cuda(sq, sk, sw, TOPK, mask, config=PLAN)
                same = harness.identical(got, want)
                ms = timed(lambda: certified_topk_cuda(sq, sk, sw, TOPK, mask, config=PLAN), reps=3)
                emit({"S": S, "T": T, "H": H, "D": D, "topk": TOPK, "method": "certified_plan", "ms": round(ms, 2),
                      "dense_ms_same_inputs": round(dense_ms, 2), "speedup": round(dense_ms / ms, 2),
                      "identical": same})
            if DEVICE == "cuda":
                torch.cuda.empty_cache()


def decode_inputs(B, T, exact):
    """q [B,1,H,D], k [B,T,D] bf16 and w [B,1,H] fp32 (``random_inputs``, seeded by B)."""
    return random_inputs(1, T, seed=B, exact=exact, B=B)


def stock_decode_topk(q, k, w, kk):
    """The transformers DSA indexer's scoring as an uncompiled model runs it at decode (fp32 logits
    ``q.float() @ k^T``, relu, the weighted head sum as a matmul, ``topk``), without its positive
    scale factors, which change no ranking: indices [B, S, kk]. q [B,S,H,D], k [B,T,D], w [B,S,H]."""
    scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)).relu_()
    return torch.matmul(w.float().unsqueeze(-2), scores).squeeze(-2).topk(kk, dim=-1).indices


def decode(emit, lengths=(32768, 131072), batches=(1, 8, 64), exact=False, reps=20, loop_calls=None):
    """Decode: B sequences of one query each over its own T keys (``decode_inputs``). ``op_ms``: the
    op as a compiled model calls it with the structured plan (path "auto", r=1, the plan's
    crossover; its path choice must send decode to dense scoring); ``dense_ms``: the dense path
    called directly (the difference is the op's own per-call cost: dispatch, checks, statistics);
    ``stock_ms`` / ``stock_compiled_ms``: the transformers indexer's own form
    (``stock_decode_topk``) eager and under ``torch.compile``, what the user runs without this
    backend; ``stock_same_index_fraction``: the fraction of its indices that are the op's (not exact:
    its sums round differently). Each time alone (CUDA events around one call), then ``*_loop_ms``
    (``harness.loop_ms``: calls back to back, the host's pace) and ``*_graph_ms`` (``harness.graph_ms``: the GPU's
    time, as under CUDA graphs). ``identical``: the op's output equals ``torch.topk`` of every key's
    order code (``all_codes``), decoded. ``loop_calls``: the calls behind ``*_loop_ms`` (None: 5 reps)."""
    stock_compiled = torch.compile(stock_decode_topk) if DEVICE == "cuda" else None
    for T in lengths:
        for B in batches:
            q, k, w = decode_inputs(B, T, exact)
            kk = min(TOPK, T)
            op = lambda: torch.ops.pulsar_dosa.certified_topk(q, k, w, TOPK, None, layer=f"decode{B}", r=1,
                                                              min_keys=PLAN_CROSSOVER, path="auto")
            got = op()
            want = decode_codes(torch.topk(all_codes(q, w, k), kk, dim=-1).values, T)
            stock = lambda: stock_decode_topk(q, k, w, kk)
            stock_same, _ = row_overlap(stock(), got[1], T)
            row = {"S": 1, "B": B, "T": T, "H": H, "D": D, "topk": TOPK, "method": "decode",
                   "identical": harness.identical(got, want), "stock_same_index_fraction": stock_same}
            forms = {"op": op, "dense": lambda: dense_topk_cuda(q, k, w, TOPK), "stock": stock}
            if stock_compiled is not None:
                forms["stock_compiled"] = lambda: stock_compiled(q, k, w, kk)
            for name, fn in forms.items():
                row[f"{name}_ms"] = round(timed(fn, reps=reps), 3)
                calls = 5 * reps if loop_calls is None else loop_calls
                row[f"{name}_loop_ms"] = round(harness.loop_ms(fn, DEVICE, calls), 3)
                gpu = harness.graph_ms(fn, DEVICE) if name != "stock_compiled" else None
                if gpu is not None:
                    row[f"{name}_graph_ms"] = round(gpu, 3)
            emit(row)
            del q, k, w


FP8_FORMS = [(defaults.FP8_SCORER_CONFIG, None)] + [
    (config, None) for config in (LaunchConfig.of(num_warps=w, num_stages=3, BLOCK_T=bt) for bt in (64, 128)
                                  for w in (8, 4))
    if config != defaults.FP8_SCORER_CONFIG] + [
    (LaunchConfig.of(num_warps=w, num_stages=3, BLOCK_T=bt), 128) for bt, w in ((64, 4), (128, 8), (128, 4))]
"""(launch config, product columns) of the FP8 scorer timed by ``--fp8``; the first is the default,
None the default columns (``defaults.FP8_PRODUCT_COLUMNS``). At 128 columns a program holds half the
accumulator, so fewer registers a thread and more programs per SM."""
FP8_FAMILIES = ("structured", "gaussian", "random_indexer", "trained")
"""Input families of the FP8/bf16 overlap rows (module docstring)."""


def fp8_forms(emit, S=4096, T=131072):
    """The FP8 scorer per form (``FP8_FORMS``): ms unmasked and under the causal chunk mask, TFLOP/s,
    whether the dense and the key-list scorer give a row the same codes in that form, and whether
    its codes are the default form's."""
    q, k, w = random_inputs(S, T, exact=DEVICE != "cuda")
    q8, k8, w8, ks = quantize_indexer_inputs(q, k, w, "fp8")
    mask = causal_chunk_mask(S, T)
    rows = torch.randperm(S, device=DEVICE)[:64].sort().values
    chosen, columns_default = defaults.FP8_SCORER_CONFIG, defaults.FP8_PRODUCT_COLUMNS
    base = None
    for config, columns in FP8_FORMS:
        defaults.FP8_SCORER_CONFIG = config
        defaults.FP8_PRODUCT_COLUMNS = columns or columns_default
        meta = dict(config.meta)
        row = {"kind": "fp8_scorer_form", "form": f"BT{meta['BLOCK_T']} w{config.num_warps} s{config.num_stages}"
               f" cols{defaults.FP8_PRODUCT_COLUMNS}", "S": S, "T": T}
        try:
            codes = all_codes(q8, w8, k8, k_scale=ks)
            row["row_list_bitwise"] = bool(torch.equal(listed_codes(q8, w8, k8, rows=rows, k_scale=ks)[0], codes[0, rows]))
            base = codes[0, rows] if base is None else base
            row["codes_as_default"] = bool(torch.equal(codes[0, rows], base))
            del codes
            row["ms"] = round(timed(lambda: all_codes(q8, w8, k8, k_scale=ks)), 3)
            row["tflops"] = round(2 * S * T * H * D / row["ms"] / 1e9, 1)
            row["masked_ms"] = round(timed(lambda: all_codes(q8, w8, k8, mask, k_scale=ks)), 3)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        emit(row)
    defaults.FP8_SCORER_CONFIG, defaults.FP8_PRODUCT_COLUMNS = chosen, columns_default


def fp8_family_inputs(family, S, T, gaussian, structured_inputs):
    """(q, k, w) bf16/bf16/fp32 of an overlap family at (S, T) (``FP8_FAMILIES``)."""
    if family == "gaussian":
        return gaussian
    if family == "structured":
        if structured_inputs is None:
            raise ValueError("structured inputs were not made (--no-structured)")
        return tuple(x[:, :n].contiguous() for x, n in zip(structured_inputs, (S, T, S)))
    from runtime.indexer_zoo import zoo_inputs

    return zoo_inputs(family, 1, S, T, H, D, device=DEVICE, dtype=torch.bfloat16)[:3]


def fp8_grid(emit, lengths_s, lengths_t, structured_inputs, rate):
    """``--fp8``'s per-(S, T) rows (module docstring); ``rate`` the FP8 matmul TFLOP/s or None."""
    op = torch.ops.pulsar_dosa.certified_topk
    for S in lengths_s:
        for T in lengths_t:
            q, k, w = random_inputs(S, T, seed=S + T)
            mask = causal_chunk_mask(S, T)
            kk = min(TOPK, T)
            quant_ms = timed(lambda: quantize_indexer_inputs(q, k, w, "fp8"), reps=3)
            q8, k8, w8, ks = quantize_indexer_inputs(q, k, w, "fp8")
            triton_quant = lambda: quantize_indexer_inputs(q, k, w, "fp8", quantize_rows)
            triton_quant_ms = timed(triton_quant, reps=3)
            quant_bits_same = all(torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                                              b.view(torch.uint8) if b.element_size() == 1 else b)
                                  for a, b in zip(triton_quant(), (q8, k8, w8, ks)))
            rows = min(S, dense_chunk_rows(1, S, H, T, kk, q8.dtype, q8.device))
            part = (q8[:, :rows], w8[:, :rows], k8, mask[:, :rows])
            maxima = dense_maxima(rows, T, kk, q8.dtype)
            words = maxima is not None
            score_ms = timed(lambda: all_codes(*part, maxima=maxima, words=words, k_scale=ks), reps=3) * S / rows
            codes = all_codes(*part, maxima=maxima, words=words, k_scale=ks)
            select_ms = timed(lambda: top_codes(codes, kk, maxima), reps=3) * S / rows
            got = top_codes(codes, kk, maxima)
            same = bool(torch.equal(got, torch.topk(codes_of_words(codes) if words else codes, kk, dim=-1).values))
            del codes, got
            fp8_dense = lambda: dense_topk_cuda(q8, k8, w8, TOPK, mask, k_scale=ks)
            fp8_op = lambda: op(q, k, w, TOPK, mask, path="dense", record_stats=False, precision="fp8")
            want = fp8_dense()
            same = same and harness.identical(fp8_op(), want)
            ms, op_ms = timed(fp8_dense, reps=3), timed(fp8_op, reps=3)
            bf16_ms = timed(lambda: dense_topk_cuda(q, k, w, TOPK, mask), reps=3)
            tflops = 2 * S * T * H * D / score_ms / 1e9
            emit({"S": S, "T": T, "H": H, "D": D, "topk": TOPK, "method": "fp8_dense", "quant_ms": round(quant_ms, 2),
                  "triton_quant_ms": round(triton_quant_ms, 2), "triton_quant_bitwise": quant_bits_same,
                  "score_ms": round(score_ms, 2), "select_ms": round(select_ms, 2), "ms": round(ms, 2),
                  "op_ms": round(op_ms, 2), "bf16_dense_ms": round(bf16_ms, 2),
                  "speedup_vs_bf16": round(bf16_ms / op_ms, 2), "score_tflops": round(tflops, 1),
                  "fp8_rate_frac": None if rate is None else round(tflops / rate, 3), "identical": same})
            del want, q8, k8, w8, ks
            for family in FP8_FAMILIES:
                row = {"S": S, "T": T, "H": H, "D": D, "topk": TOPK, "method": "fp8_overlap", "family": family}
                try:
                    fq, fk, fw = fp8_family_inputs(family, S, T, (q, k, w), structured_inputs)
                    fp8 = op(fq, fk, fw, TOPK, mask, path="dense", record_stats=False, precision="fp8")[1]
                    row["mean"], row["min"] = row_overlap(fp8, dense_topk_cuda(fq, fk, fw, TOPK, mask)[1], T)
                    if family == "structured":
                        emit(fp8_certified_row(S, T, fq, fk, fw, mask))
                    del fq, fk, fw, fp8
                except Exception as exc:  # a family not available at this size: recorded
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                emit(row)
            del q, k, w
            if DEVICE == "cuda":
                torch.cuda.empty_cache()


def fp8_certified_row(S, T, q, k, w, mask):
    """The certified FP8 path with the structured plan against dense FP8, on quantised inputs."""
    q8, k8, w8, ks = quantize_indexer_inputs(q, k, w, "fp8")
    want = dense_topk_cuda(q8, k8, w8, TOPK, mask, k_scale=ks)
    dense_ms = timed(lambda: dense_topk_cuda(q8, k8, w8, TOPK, mask, k_scale=ks), reps=3)
    stats = TopkStats()
    same = harness.identical(certified_topk_cuda(q8, k8, w8, TOPK, mask, k_scale=ks, config=PLAN, stats=stats), want)
    ms = timed(lambda: certified_topk_cuda(q8, k8, w8, TOPK, mask, k_scale=ks, config=PLAN), reps=3)
    return {"S": S, "T": T, "H": H, "D": D, "topk": TOPK, "method": "fp8_certified_plan", "ms": round(ms, 2),
            "dense_ms_same_inputs": round(dense_ms, 2), "speedup": round(dense_ms / ms, 2), "identical": same,
            "pruned_frac": round(stats.pruned_frac, 4)}


def fp8(emit, lengths_s, lengths_t, structured_inputs, rate):
    """``--fp8``: the model check, the FP8 scorer's forms, then the grid (module docstring)."""
    from benchmarks.fp8_dot_check import dot_check

    ratios = dot_check(D, DEVICE)
    emit({"kind": "fp8_dot_check", "D": D, "max_ratio": ratios, "holds": all(r <= 1 for r in ratios.values())})
    fp8_forms(emit, *((16, 512) if DEVICE != "cuda" else ()))
    # The grid compares kernels bitwise on general inputs: in the interpreter (the smoke run) that
    # takes its sequential form (the reference's arithmetic), not numpy's BLAS.
    scorer.SEQUENTIAL = scorer.INTERPRET
    fp8_grid(emit, lengths_s, lengths_t, structured_inputs, rate)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--S", nargs="+", type=int, default=[4096, 16384])
    p.add_argument("--T", nargs="+", type=int, default=[32768, 131072, 524288])
    p.add_argument("--no-structured", action="store_true")
    p.add_argument("--decode-only", action="store_true", help="only the decode rows")
    p.add_argument("--fp8", action="store_true", help="the FP8 indexer's rows instead (module docstring)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU under TRITON_INTERPRET=1")
    args = p.parse_args(argv)
    global H, D, TOPK, DEVICE
    if args.smoke:
        H, D, TOPK, DEVICE = 4, 32 if args.fp8 else 16, 8, "cpu"
        scorer.SEQUENTIAL = False  # exercise the GPU forms of the scorer with the interpreter's dot
    rates = fp8_matmul_rates(DEVICE) if args.fp8 else {}
    doc = harness.header(DEVICE, smoke=args.smoke, **harness.ceilings(DEVICE), **rates, rows=[])
    print(json.dumps({k: v for k, v in doc.items() if k != "rows"}), flush=True)

    def emit(row):
        doc["rows"].append(row)
        print(json.dumps(row), flush=True)
        harness.write_json(args.out, doc)

    if args.sweep:
        sweep(emit, *((16, 512) if args.smoke else ()))
    elif args.decode_only:
        decode(emit, *(((256,), (1, 3), True, 1, 1) if args.smoke else ()))
    else:
        fp8_rate = max((v for key, v in rates.items() if key != "fp8_matmul_error"), default=None)
        run_grid(emit, args, fp8_rate)
    harness.write_results(args.out, doc, harness.rows_table(doc["rows"]))
    return 0


def run_grid(emit, args, fp8_rate=None) -> None:
    """The grid of ``args.S`` x ``args.T`` (on structured inputs unless ``--no-structured``), then decode;
    with ``--fp8`` the FP8 rows instead (``fp8_rate``: the larger FP8 matmul rate, or None)."""
    structured_inputs = None
    if not args.no_structured:
        from runtime.structured_indexer import structured_indexer_inputs

        start = time.perf_counter()
        q, k, w, _ = structured_indexer_inputs(1, max(args.S), max(args.T), H, D, dtype=torch.bfloat16,
                                               device=DEVICE)
        structured_inputs = (q, k, w.float())
        print(f"structured inputs in {time.perf_counter() - start:.1f} s", flush=True)
    if args.fp8:
        fp8(emit, args.S, args.T, structured_inputs, fp8_rate)
        return
    grid(emit, args.S, args.T, structured_inputs)
    decode(emit, *(((256,), (1, 3), True, 1, 1) if args.smoke else ()))


if __name__ == "__main__":
    raise SystemExit(main())

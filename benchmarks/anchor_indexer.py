"""``anchors.py``'s indexer rows: DeepGEMM's FP8 indexer logits against the project's FP8 dense
top-K, on one ``anchor_inputs.IndexerCase`` (the same E4M3 operands for both).

Variants (each checked on sampled query rows against a float64 reference, then timed):
  dg_logits          deep_gemm.fp8_mqa_logits(q8, (k8, k_scale), w8, 0, ends, clean_logits=False):
                     logits [S, T] fp32, keys outside [0, end) left unwritten (logits only)
  dg_logits_topk     the same with clean_logits=True, then torch.topk(K) per 2048 query rows
  project_scorer     the project's dense FP8 scorer alone over the dense path's row chunks
                     (topk_pipeline.dense_codes: int32 words or int64 order codes of every key)
  project_dense_fp8  topk_pipeline.dense_topk_cuda(q8, k8, w8, K, mask, k_scale): scoring and the
                     exact top-K (values, indices) on the quantised operands
  project_op_fp8     torch.ops.pulsar_dosa.certified_topk(q, k8, w, K, mask, path="dense",
                     precision="fp8_unrotated", k_scale): the op, quantising q itself (same bits)
  project_op_bf16    the same op on the bf16 q and k (precision "bf16")
Both scorers skip key tiles that are wholly masked: TFLOP/s count 2·H·D per visible (query, key)
pair (DeepGEMM's own count); ``flops_dense`` is 2·S·T·H·D.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from benchmarks.anchor_inputs import (IndexerCase, indexer_case, reference_scores, relative_error, sample_rows,
                                      topk_overlap)
from benchmarks.anchor_runs import Calls, Deadline, memory_shortfall, ratios, run_variants
from compiler.lowering import defaults
from compiler.lowering import topk_pipeline as pipeline
from compiler.lowering.order_codes import codes_of_words, decode_codes
from compiler.lowering.scoring.indexer_scores import mask_bounds

VARIANTS = ("dg_logits", "dg_logits_topk", "project_scorer", "project_dense_fp8", "project_op_fp8",
            "project_op_bf16")
RATIOS = {"dg_topk_over_dense_fp8": ("dg_logits_topk", "project_dense_fp8"),
          "dg_logits_over_scorer": ("dg_logits", "project_scorer"),
          "bf16_over_fp8_op": ("project_op_bf16", "project_op_fp8")}
"""The issue's measures (ratios of median ms): DeepGEMM's logits + top-K over the project's FP8 dense
top-K (target >= 1), DeepGEMM's logits over the project's scorer (the logits-only rate), the bf16 op
over the FP8 op (target >= 1.6 at S 16384, T 131072)."""
TOPK_ROWS = 2048
"""Query rows per torch.topk call after DeepGEMM's logits."""


def _scorer(case: IndexerCase, kk: int) -> Callable[[], tuple[int, torch.Tensor]]:
    """The dense path's FP8 scorer over its row chunks (``dense_codes_topk`` without the selection):
    returns (the last chunk's first row, its codes or words [1, rows, T])."""
    q, w, k, ks = case.q8[None], case.w8[None], case.k8[None], case.k_scale[None]
    step = pipeline.dense_chunk_rows(1, case.S, q.shape[2], case.T, kk, q.dtype, q.device)

    def call():
        for s0 in range(0, case.S, step):
            sl = slice(s0, min(case.S, s0 + step))
            n = pipeline.scorer_chunks(sl.stop - s0, case.T, kk, q.dtype, q.device)
            maxima = None if n is None else torch.empty((1, sl.stop - s0, n), dtype=torch.int64, device=q.device)
            m = case.mask[:, sl]
            codes = pipeline.dense_codes(q[:, sl], w[:, sl], k, m, maxima=maxima, words=n is not None, k_scale=ks,
                                         bounds=mask_bounds(m, 1, sl.stop - s0, case.T))
        return s0, codes
    return call


def _dg_topk(case: IndexerCase, deep_gemm, starts: torch.Tensor, kk: int) -> Callable[[], torch.Tensor]:
    def call():
        logits = deep_gemm.fp8_mqa_logits(case.q8, (case.k8, case.k_scale), case.w8, starts, case.ends, True)
        return torch.cat([logits[a:a + TOPK_ROWS].topk(kk, dim=-1).indices for a in range(0, case.S, TOPK_ROWS)])
    return call


def variant_calls(case: IndexerCase, topk: int, deep_gemm, deep_gemm_missing: str | None) -> Calls:
    """``Calls`` of every variant: kind "logits", "indices", "codes", "topk_fp8" or "topk_bf16"."""
    kk = min(topk, case.T)
    logits_bytes = 4 * case.S * (case.T + 1280)
    calls: Calls = {}
    if deep_gemm is None:
        for name in ("dg_logits", "dg_logits_topk"):
            calls[name] = (None, f"DeepGEMM {deep_gemm_missing}", 0)
    else:
        starts = torch.zeros(case.S, dtype=torch.int32, device=case.q.device)
        calls["dg_logits"] = (lambda: deep_gemm.fp8_mqa_logits(case.q8, (case.k8, case.k_scale), case.w8, starts,
                                                               case.ends, False), "logits", logits_bytes)
        calls["dg_logits_topk"] = (_dg_topk(case, deep_gemm, starts, kk), "indices",
                                   logits_bytes + 12 * TOPK_ROWS * case.T)
    work = defaults.DENSE_CHUNK_BYTES + 16 * case.S * kk
    calls["project_scorer"] = (_scorer(case, kk), "codes", defaults.DENSE_CHUNK_BYTES)
    calls["project_dense_fp8"] = (lambda: pipeline.dense_topk_cuda(case.q8[None], case.k8[None], case.w8[None], kk,
                                                                   case.mask, k_scale=case.k_scale[None]),
                                  "topk_fp8", work)
    op = torch.ops.pulsar_dosa.certified_topk
    calls["project_op_fp8"] = (lambda: op(case.q[None], case.k8[None], case.w[None], topk, case.mask, "anchors",
                                          "dense", None, None, False, "fp8_unrotated", case.k_scale[None], True),
                               "topk_fp8", work)
    calls["project_op_bf16"] = (lambda: op(case.q[None], case.k[None], case.w[None], topk, case.mask, "anchors",
                                           "dense", None, None, False, "bf16", None, True), "topk_bf16", work)
    return calls


def _checker(case: IndexerCase, rows: torch.Tensor, kk: int) -> Callable[[str, Any], dict]:
    """check(kind, out) -> error fields of a variant's output on ``rows`` against the reference."""
    rows_d = rows.to(case.q.device)
    refs = {True: reference_scores(case, rows, fp8=True)}

    def ref(fp8: bool) -> torch.Tensor:
        if fp8 not in refs:
            refs[fp8] = reference_scores(case, rows, fp8=fp8)
        return refs[fp8]

    def check(kind: str, out) -> dict:
        if kind == "logits":
            return {"err_vs_fp64": relative_error(out[rows_d], ref(True))}
        if kind == "indices":
            return {"topk_overlap_min": topk_overlap(out[rows_d], ref(True), kk)}
        if kind == "codes":
            s0, codes = out
            mine = rows_d >= s0
            picked = codes[0, rows_d[mine] - s0]
            if picked.dtype == torch.int32:
                picked = codes_of_words(picked)
            values = decode_codes(picked, case.T)[0]
            return {"err_vs_fp64": relative_error(values, ref(True)[mine]), "rows_checked": int(mine.sum())}
        fp8 = kind == "topk_fp8"
        values, idx = out[0][0, rows_d], out[1][0, rows_d]
        want = ref(fp8)
        return {"err_vs_fp64": relative_error(values, want.gather(1, idx)),
                "topk_overlap_min": topk_overlap(idx, want, kk)}
    return check


def indexer_row(case: IndexerCase, topk: int, deep_gemm, deep_gemm_missing: str | None, reps: int, warmup: int,
                check_rows: int, seed: int) -> dict:
    """Every variant on one case: sizes, ``results`` per variant (``tflops_visible``) and the ratios."""
    H, D = case.q.shape[1], case.q.shape[2]
    kk = min(topk, case.T)
    visible = float(case.ends.double().sum())
    row = {"S": case.S, "T": case.T, "H": H, "D": D, "topk": topk, "visible_pairs": visible,
           "flops_visible": 2.0 * H * D * visible, "flops_dense": 2.0 * case.S * case.T * H * D}
    check = _checker(case, sample_rows(case.S, check_rows, seed), kk)
    row["results"] = run_variants(variant_calls(case, topk, deep_gemm, deep_gemm_missing), check, case.q.device, reps,
                                  warmup, row["flops_visible"], "tflops_visible")
    row.update(ratios(row["results"], RATIOS))
    return row


def indexer_rows(emit: Callable[[dict], None], lengths_s: list[int], lengths_t: list[int], topk: int, device,
                 deep_gemm, deep_gemm_missing: str | None, deadline: Deadline, reps: int, warmup: int,
                 check_rows: int, seed: int, heads: int, dim: int) -> None:
    """``emit`` one row per (S, T) with S <= T; past the deadline, or where the inputs would not fit,
    the row says so (``skipped``)."""
    for S in lengths_s:
        for T in lengths_t:
            if S > T:
                continue
            head = {"part": "indexer", "S": S, "T": T, "topk": topk}
            if deadline.passed():
                emit({**head, "skipped": "deadline"})
                continue
            shortfall = memory_shortfall(S * T + 4 * S * heads * dim + 4 * T * dim, device)
            if shortfall is not None:
                emit({**head, "skipped": f"inputs: {shortfall}"})
                continue
            case = indexer_case(S, T, device, seed + S + T, heads, dim)
            emit({"part": "indexer", **indexer_row(case, topk, deep_gemm, deep_gemm_missing, reps, warmup,
                                                   check_rows, seed)})
            del case
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()

"""The dense and the certified top-K on CUDA: the scorer, seeds, plan, screen, refine and exact
selection in order (SPEC A.2-A.5, C.5). No kernel is defined here.

``dense_topk_cuda(q, k, w, kk, mask)`` and ``certified_topk_cuda(q, k, w, kk, mask, config)``: q
[B,S,H,D] and k [B,T,D] bf16, fp16 or fp32 (mixed dtypes upcast to fp32), weights any float dtype,
mask None, bool or additive float; or the FP8 scorer (``k_scale`` [B,T] fp32: q and k E4M3, weights
fp32; SPEC A.10, its GPU margin ``fp8_dot_error``). Both return (values [B,S,kk] fp32, indices
[B,S,kk] int64), the certified one the same indices and bitwise the same values as the dense one
for every input. Rows the certificate cannot answer are flagged on the device and redone densely
(``redo_dense``): nothing is dropped. No host synchronisation, except where a call of several
rounds reads which of them to certify (``min_keys``): a call can be captured in a CUDA graph after
one call outside the capture. fp32 operands are scored densely (tf32 products are
outside the margins). Config fields used: r, witnesses, anchor_stride, workspace_frac, sample_keys,
sample_sigmas, path, list_queries (the survivor lists' size, ``refine_queries``). ``shared_bound``
(keys sharded over ranks, as in runtime.certified_topk) replaces the witness threshold by its bound
b; a row whose tau is a finite b and that wrote fewer than kk candidates is short instead of
redone: its candidates in THE ORDER, then padding."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from compiler.autotune import graph_capturing
from compiler.lowering.order_codes import decode_codes
from compiler.lowering.scoring.indexer_scores import (
    fp8_interval,
    chunk_multiple,
    key_splits,
    mask_bounds,
    score_dense,
    score_keys,
    score_tile_shape,
    tf32_scores,
)
from compiler.lowering.screen.head_activation import activation_frequency
from compiler.lowering.screen.certificate_screen import screen
from compiler.lowering.selection.few_rows_select import few_rows_fit, few_rows_top_codes, few_rows_topk, takes_few_rows
from compiler.lowering.screen.certificate_plan import plan_certificate_triton
from compiler.lowering.screen.key_norms import key_norms
from compiler.lowering.screen.screen_operands import screen_operands, screen_threshold
from compiler.lowering.selection.radix_select import select_top_codes
from compiler.lowering.selection.redo_rows import call_counts, redo_row_lists, row_flags
from compiler.lowering.selection.threshold_select import chunk_count, kth_largest, takes_threshold, top_candidates, top_codes
from runtime.certificate import default_r, plan_certificate
from runtime.certified_topk import CertifiedTopkConfig, TopkStats
from runtime.indexer_inputs import checked_kk
from runtime.rounding import U32, gamma
from runtime.seeds import sample_keys, sample_rank, sample_size, takes_witnesses
from compiler.lowering import defaults
from runtime.workspace import check_workspace
from compiler.lowering.host_ints import cdiv, next_power_of_2

MMA_FACTOR = 4.0
"""Tensor-core fp32 accumulation is not IEEE round-to-nearest inside the MMA: its error on a
D-term dot is bounded by MMA_FACTOR * gamma_D(u32) * sum_d |a_d b_d| (4x the classical bound)."""
FP8_MMA_BITS = 13
"""FP8 tensor-core sums (SPEC A.10, the model behind ``fp8_dot_error``): every term of an internal
addition step is kept to at least this many fraction bits below the leading bit of the step's
largest term, and each step's sum to this many fraction bits (DeepSeek-V3's report: "around 14
bits" on Hopper; accurate models of the H100's FP8 MMA: 13 fraction bits, truncated)."""
FP8_MMA_STEP = 4
"""FP8 tensor-core sums: products per internal addition step, at least (each further step adds the
running sum to them). Fewer products per step means more truncations: 4 is below any tensor core's
dot-product width."""
FTZ_UNIT = 2.0**-126
"""Absolute error allowed per rounded operation for flushed subnormals (tensor cores may flush)."""


def _operands(q, k, weights, k_scale=None):
    """q, k in one dtype (bf16/fp16 kept, anything mixed -> fp32), weights fp32, contiguous; with
    ``k_scale`` (E4M3 q and k): k and k_scale as they are where their last stride is 1 (views of an
    FP8 key cache's storage are read in place: the kernels take their strides)."""
    if k_scale is not None:
        def unit(x):
            return x if x.stride(-1) == 1 else x.contiguous()

        return q.contiguous(), unit(k), weights.float().contiguous(), unit(k_scale)
    if q.dtype != k.dtype:
        q, k = q.float(), k.float()
    return q.contiguous(), k.contiguous(), weights.float().contiguous(), None


def _row_codes(q, w, k, mask, lists, counts, cap, tiles_per_list, k_scale=None, bounds=None):
    """``score_keys`` in non-compact mode, with key splits for the call's tile count."""
    block_s, _ = score_tile_shape(q.shape[2])
    splits = key_splits(q.shape[0] * cdiv(q.shape[1], block_s), cap)
    return score_keys(q, w, k, lists, counts, cap=cap, tiles_per_list=tiles_per_list, mask=mask,
                      splits=splits, k_scale=k_scale, bounds=bounds)


def dense_codes(q, w, k, mask, rows=None, maxima=None, words=False, k_scale=None, bounds=None, live_tiles=None):
    """``score_dense`` (codes [B,R,T] of every key, or their int32 high words with ``words``), with
    key splits for the call's tile count (``live_tiles``: for that many query tiles per batch row
    instead, where most tiles of a row list are expected empty); ``bounds``: the mask's
    ``mask_bounds`` when the caller has them."""
    block_s, _ = score_tile_shape(q.shape[2], q.dtype)
    n_slots = q.shape[1] if rows is None else rows.shape[1]
    tiles = cdiv(n_slots, block_s) if live_tiles is None else live_tiles
    splits = key_splits(q.shape[0] * tiles, k.shape[1])
    return score_dense(q, w, k, mask=mask, splits=splits, rows=rows, maxima=maxima, words=words,
                       k_scale=k_scale, bounds=bounds)


def _all_keys(B, T, device):
    """The key list of dense scoring: ids [B,1,T] int32 (0..T-1) and counts [B,1] int32 (T)."""
    ids = torch.arange(T, dtype=torch.int32, device=device).view(1, 1, T).expand(B, 1, T)
    return ids, torch.full((B, 1), T, dtype=torch.int32, device=device)


def scorer_chunks(rows: int, T: int, kk: int, dtype: torch.dtype, device) -> int | None:
    """The chunk maxima per row the dense scorer writes for an exact top-kk of ``rows`` rows of T
    keys on ``device`` (threshold_select's chunk count, a multiple of the scorer's key tile), or
    None: the rows do not take threshold_select's threshold path (``takes_threshold``: short rows,
    or few rows on CUDA), or the scorer cannot write that count."""
    multiple = chunk_multiple(dtype)
    n = chunk_count(T, kk, multiple)
    return n if takes_threshold(rows, T, kk, device) and n % multiple == 0 else None


def dense_chunk_rows(B: int, S: int, H: int, T: int, kk: int, dtype: torch.dtype, device) -> int:
    """Query rows per chunk of the dense path (``dense_codes_topk``): its scorer output, int32 words
    when the call takes the threshold path (else int64 codes), at most defaults.DENSE_CHUNK_BYTES, in
    whole query tiles."""
    block_s, _ = score_tile_shape(H)
    width = 4 if scorer_chunks(B * S, T, kk, dtype, device) is not None else 8
    return max(block_s, (defaults.DENSE_CHUNK_BYTES // (width * T * B)) // block_s * block_s)


def dense_codes_topk(q, w, k, mask, kk, k_scale=None, ordered=True, bounds=None):
    """Top-kk order codes [B,S,kk] of every query by dense scoring, queries chunked for memory
    (``dense_chunk_rows``). Chunks that take threshold_select's threshold path get their chunk
    maxima from the scorer, which writes them int32 words instead of codes (half the bytes to
    write and to read). With a mask, the rows' visible extents (``mask_bounds``; ``bounds``: the
    caller's [B,S,2], else computed per chunk) serve the scorer and let the compaction stop where a
    row's keys turn hidden. ``k_scale``: the FP8 scorer's key scales (E4M3 q and k). ``ordered``
    False: each row's codes in an unspecified order."""
    B, S = q.shape[:2]
    T = k.shape[1]
    rows = dense_chunk_rows(B, S, q.shape[2], T, kk, q.dtype, q.device)
    out = []
    for s0 in range(0, S, rows):
        sl = slice(s0, min(S, s0 + rows))
        m = None if mask is None else mask[:, sl]
        n = scorer_chunks(B * (sl.stop - s0), T, kk, q.dtype, q.device)
        maxima = None if n is None else torch.empty((B, sl.stop - s0, n), dtype=torch.int64, device=q.device)
        b = None if m is None else mask_bounds(m, B, sl.stop - s0, T) if bounds is None else bounds[:, sl].contiguous()
        codes = dense_codes(q[:, sl], w[:, sl], k, m, maxima=maxima, words=n is not None, k_scale=k_scale, bounds=b)
        out.append(top_codes(codes, kk, maxima, ordered, ends=None if b is None else b[..., 1]))
    return out[0] if len(out) == 1 else torch.cat(out, dim=1)


def dense_values_topk(q, w, k, mask, kk, k_scale=None, ordered=True, bounds=None):
    """(values [B,S,kk] fp32, indices [B,S,kk] int64) of dense scoring, in THE ORDER (``ordered``
    False: the same pairs per row in an unspecified order). A call of few rows on CUDA (decode)
    selects and decodes in one launch after the scorer (few_rows_select); any other:
    ``dense_codes_topk``, then ``decode_codes``. ``bounds``: the mask's ``mask_bounds`` when the
    caller has them."""
    B, S = q.shape[:2]
    T = k.shape[1]
    n = few_rows_chunks(T, kk, q.dtype)
    if n is not None and takes_few_rows(B * S, T, kk, n, q.device):
        maxima = torch.empty((B, S, n), dtype=torch.int64, device=q.device)
        codes = dense_codes(q, w, k, mask, maxima=maxima, k_scale=k_scale, bounds=bounds)
        values, idx = few_rows_topk(codes.view(B * S, T), maxima.view(B * S, n), kk, T)
        return values.view(B, S, kk), idx.view(B, S, kk)
    return decode_codes(dense_codes_topk(q, w, k, mask, kk, k_scale, ordered, bounds), T)


def dense_topk_cuda(q, k, weights, topk, mask=None, k_scale=None, ordered=True):
    """Dense Triton top-K: (values [B,S,kk] fp32, indices [B,S,kk] int64) in THE ORDER (``ordered``
    False: the same pairs per row in an unspecified order); ``k_scale``: the FP8 scorer (E4M3 q and k)."""
    kk = checked_kk(q, k, weights, topk, mask, k_scale)
    q, k, w, k_scale = _operands(q, k, weights, k_scale)
    return dense_values_topk(q, w, k, mask, kk, k_scale, ordered)


@dataclass
class ScreenPlan:
    """Screen operands (``screen_operands``): g [B,S,RP,D] (screen_dtype), alpha/beta [B,S,RP] fp32, e/c
    [B,S] fp32, ok [B,S] bool (operands finite and within REACH_LIMIT)."""

    g: torch.Tensor
    alpha: torch.Tensor
    beta: torch.Tensor
    e: torch.Tensor
    c: torch.Tensor
    ok: torch.Tensor


def fp8_dot_error(D: int) -> float:
    """phi with |x^ - x| <= phi * sum_d |q_d k_d| for the FP8 scorer's D-term dot on the GPU (SPEC
    A.10): each promotion interval of K = fp8_interval(D) products is summed from zero by the tensor
    cores with n = K + 2 ceil(K / m) - 1 truncations (K products, the running sum of every step but
    the first, every step's stored sum; m = FP8_MMA_STEP), each below 2^-P of the interval's
    absolute sum (P = FP8_MMA_BITS): rho = gamma_n(2^-P); the c = D / K intervals then reach fp32
    (one rounding) and are added in fp32 in any order: phi = rho + gamma_c(u32) (1 + rho)."""
    K = fp8_interval(D)
    n = K + 2 * cdiv(K, FP8_MMA_STEP) - 1
    rho = gamma(n, 2.0**-FP8_MMA_BITS)
    return rho + gamma(cdiv(D, K), U32) * (1 + rho)


def screen_margin(D, H, RP, fp8=False):
    """The GPU rounding margin's constants (a, b, g_eval, f), on top of the runtime's plan margin
    (``screen_operands`` puts them into e and c).

    With m_rho = max(|alpha|, |beta|) and G = sum_rho m_rho ||g^_rho||: the refine scorer's tl.dot
    is off by <= s_D ||q_h|| ||k|| per head, s_D = 4 gamma_D (MMA_FACTOR; ``fp8``: s_D =
    fp8_dot_error(D), the FP8 tensor cores), its weighted head sum in any order by gamma_H more; the
    screen's dots by 4 gamma_D ||g^|| ||k|| (bf16 or wider operands), its (RP + 2)-term evaluation
    (products, e * nk and c included) by gamma_{RP+2} = g_eval times the absolute terms. Hence the
    slope on ||k||_up
        a M_s + b G,   a = s_D + gamma_H (1 + s_D),   b = 4 gamma_D + g_eval (1 + 4 gamma_D),
    and the whole norm coefficient is divided by 1 - g_eval so that the rounding of its own term is
    covered too. Flushed subnormals add at most FTZ_UNIT per operation: an offset of
        f (1 + W + sum_rho m_rho),   f = 2 (D + H + RP + 8) FTZ_UNIT.
    FP8: U and the score are in the units of the unscaled sum; both then take the scorer's last
    step (``scale_and_bias``), monotone for a positive scale, so no term is added for it.
    """
    g_d = MMA_FACTOR * gamma(D, U32)
    s_d = fp8_dot_error(D) if fp8 else g_d
    g_eval = gamma(RP + 2, U32)
    return s_d + gamma(H, U32) * (1 + s_d), g_d + g_eval * (1 + g_d), g_eval, 2 * (D + H + RP + 8) * FTZ_UNIT


def screen_dtype(k_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the screen's rows (and of its products) for keys of ``k_dtype``: the keys' own,
    bf16 for E4M3 keys (their values convert to bf16 exactly)."""
    return torch.bfloat16 if k_dtype == torch.float8_e4m3fn else k_dtype


def screen_rows(r_max: int) -> int:
    """RP, the rows the screen multiplies per query under budgets up to ``r_max``: the retained rows
    and the aux row, in a power of two."""
    return next_power_of_2(r_max + 1)


def plan_screen(q, w, k_dtype, p, r, r_max, nk_max, chunk=None) -> ScreenPlan:
    """Screen rows and coefficients for every query (runtime planning, GPU margin added).

    q [B,S,H,D] (bf16/fp16/fp32, or E4M3 with E4M3 keys), w [B,S,H] fp32, p [B,S,H] activation
    frequencies, r [B,S] int64 budgets, r_max an int >= every r (the screen gets
    ``screen_rows(r_max)`` rows; no host synchronisation), nk_max [B] fp32 the largest key
    norm bound. U(k) = sum_rho alpha relu(g . k) + beta min(g . k, 0) + e ||k||_up + c >= the GPU
    score (the unscaled sum for E4M3 keys), for every query with ok; queries without ok must not be
    pruned. ``chunk``: queries planned at once (None: as many as fit defaults.PLAN_CHUNK_BYTES;
    speed and memory only).
    """
    B, S, H, D = q.shape
    RP = screen_rows(r_max)
    chunk = max(1, defaults.PLAN_CHUNK_BYTES // (8 * B * H * D)) if chunk is None else chunk
    margin = screen_margin(D, H, RP, fp8=k_dtype == torch.float8_e4m3fn)
    planner = plan_certificate_triton if q.is_cuda else plan_certificate
    parts = [screen_operands(planner(q[:, s0:s0 + chunk], w[:, s0:s0 + chunk], p[:, s0:s0 + chunk],
                                  r[:, s0:s0 + chunk], r_max),
                             w[:, s0:s0 + chunk], screen_dtype(k_dtype), RP, margin, nk_max)
             for s0 in range(0, S, chunk)]
    return ScreenPlan(*parts[0]) if len(parts) == 1 else ScreenPlan(*[torch.cat(x, dim=1) for x in zip(*parts)])


@dataclass
class CertifiedTrace:
    """Intermediates of one certified call (for statistics and diagnostics)."""

    tau: torch.Tensor          # [B,S] fp32 threshold used (-inf: no pruning)
    list_count: torch.Tensor   # [B,L] int32 screen survivors per list of list_queries queries (> cap: overflow)
    cand_count: torch.Tensor   # [B,S] int32 keys with s >= tau written (> cap: dense redo)
    redo: torch.Tensor         # [B,S] bool rows recomputed densely
    short: torch.Tensor        # [B,S] bool short rows (only with a shared bound)
    kk: int
    cap: int
    list_queries: int
    plan: ScreenPlan | None


def refine_queries(H: int, config: CertifiedTopkConfig) -> int:
    """Queries sharing a survivor list and a refine program in a call of H heads under ``config``:
    its ``list_queries``, or the scorer tile's query count (``score_tile_shape``) where that is None,
    as the indexer zoo's families were measured. The pipeline's one reading of the list size."""
    return score_tile_shape(H)[0] if config.list_queries is None else config.list_queries


def survivor_cap(T: int, kk: int, workspace_frac: float) -> int:
    """Slots of a query's survivor list: kk + floor(workspace_frac * T) in whole 128s, at most T. A
    query with more survivors has overflowed, and its refine scores every key."""
    return min(T, cdiv(kk + int(workspace_frac * T), 128) * 128)


def _no_mark(stage: str) -> None:
    """The default stage marker: nothing."""


def _screen_stage(q, w, k, mask, kk, config, nk, bounds, screen_config=None, shared_bound=None, k_scale=None,
                  mark=_no_mark, call_queries=None):
    """Seeds, plan and screen (steps 1-4): (tau, ids, list_count, cap, G, plan, b), ids [B,L,cap] the
    survivors of each group of G = ``refine_queries(H, config)`` queries (a key survives for any of
    them), b the shared bound [B,S] (None without ``shared_bound``). ``bounds``: the mask's
    ``mask_bounds`` (None without a mask), which the seeds' scorer and the screen read.
    ``screen_config``: the screen's LaunchConfig, None to let ``screen`` choose it. ``k_scale``: the
    FP8 scorer's key scales. ``mark(stage)`` is called once each stage's work is queued.
    ``call_queries``: as for ``screen``."""
    B, S, H, D = q.shape
    T = k.shape[1]
    dev = q.device
    G, _ = score_tile_shape(H)
    A = max(G, cdiv(config.anchor_stride, G) * G)
    M = sample_size(T, config.sample_keys)
    witness_ids = None
    if takes_witnesses(config.witnesses, M, shared_bound is not None):
        anchors = dense_codes_topk(q[:, ::A], w[:, ::A], k, None if mask is None else mask[:, ::A],
                                   min(T, kk + kk // 4 + 1), k_scale)
        witness_ids = (T - 1 - torch.remainder(anchors, 2**32)).to(torch.int32).contiguous()
    sample_ids = None
    if M:
        sample_ids = _sample_lists(cdiv(S, A), M, T, dev).expand(B, -1, M)
    witness_tau, theta = _seed_thresholds(q, w, k, mask, kk, config, witness_ids, sample_ids, A // G, k_scale,
                                          bounds)
    shared = None
    if shared_bound is not None:
        shared = shared_bound(torch.where(torch.isfinite(witness_tau), witness_tau, float("-inf")))
        witness_tau = shared
    p = activation_frequency(q, k, witness_ids if sample_ids is None else sample_ids, A, defaults.ACTIVATION_SAMPLES)
    mark("seeds")
    r_max = min(H, defaults.DEFAULT_R_CAP if config.r is None else config.r)
    r = default_r(w) if config.r is None else torch.full((B, S), config.r, device=dev)
    plan = plan_screen(q, w, k.dtype, p, r.long(), r_max, nk.amax(-1))
    # The last step is monotone in U only for finite positive scales.
    scales_ok = None if k_scale is None else (torch.isfinite(k_scale) & (k_scale > 0)).all(-1)
    tau = screen_threshold(plan.ok, witness_tau, theta, scales_ok)
    mark("plan")
    cap = survivor_cap(T, kk, config.workspace_frac)
    G = refine_queries(H, config)
    ids, list_count = screen(plan.g, plan.alpha, plan.beta, plan.e, plan.c, tau, k, nk, mask=mask,
                             lists_per_batch=cdiv(S, G), list_queries=G, cap=cap, config=screen_config,
                             k_scale=k_scale, bounds=bounds, call_queries=call_queries)
    mark("screen")
    return tau, ids, list_count, cap, G, plan, shared


@functools.lru_cache(maxsize=64)
def _sample_lists(groups: int, M: int, T: int, device: torch.device) -> torch.Tensor:
    """``runtime.seeds.sample_keys`` as int32 [1, groups, M], built once per shape and device (read
    only: every call's key lists are views of it)."""
    return sample_keys(groups, M, T, device).to(torch.int32)[None]


@functools.lru_cache(maxsize=64)
def _list_counts(B: int, groups: int, n: int, device: torch.device) -> torch.Tensor:
    """int32 [B, groups] filled with n, built once per shape and device (read only)."""
    return torch.full((B, groups), n, dtype=torch.int32, device=device)


def _seed_thresholds(q, w, k, mask, kk, config, witness_ids, sample_ids, tiles_per_group, k_scale=None, bounds=None):
    """(witness_tau, theta) [B,S] fp32, whose max (theta where finite) is tau before the validity
    checks (``screen_threshold``): the kk-th best score over the anchor's witnesses ``witness_ids``
    [B,groups,W] (None without them), and theta, the own threshold of ``runtime.seeds`` over the
    group's strided sample ``sample_ids`` [B,groups,M] (None without it; any value, -inf and NaN
    included, otherwise). One scorer call scores both key lists."""
    T = k.shape[1]
    parts = [x for x in (witness_ids, sample_ids) if x is not None]
    lists = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    B, groups, n = lists.shape
    n_wit = 0 if witness_ids is None else witness_ids.shape[-1]
    counts = _list_counts(B, groups, n, q.device)
    codes = _row_codes(q, w, k, mask, lists, counts, n, tiles_per_group, k_scale, bounds)
    tau = None if witness_ids is None else decode_codes(kth_largest(codes[..., :n_wit], kk), T)[0]
    if sample_ids is None:
        return tau, None
    M = sample_ids.shape[-1]
    rank = sample_rank(kk, M, T, config.sample_sigmas)
    return tau, decode_codes(kth_largest(codes[..., n_wit:], rank), T)[0]


def certified_codes(q, w, k, mask, kk, config, nk=None, screen_config=None, shared_bound=None, k_scale=None,
                    ordered=True, mark=_no_mark, call_queries=None, bounds=None):
    """(top-kk order codes [B,S,kk], CertifiedTrace) by the certified pipeline (SPEC C.5); ``ordered``
    False: a certified row's codes in an unspecified order.
    ``screen_config``: the screen's LaunchConfig (None: autotuned, certificate_screen.screen).
    ``shared_bound``: the hook of the module docstring (short rows are not redone). ``k_scale``:
    the FP8 scorer's key scales (E4M3 q and k). ``mark(stage)``: called once each of the stages
    "seeds", "plan", "screen", "refine" and "select" is queued (a benchmark records events there).
    ``call_queries``: the queries of the whole call whose round these are (None: S; the screen's
    ``split_form`` reads it). ``bounds``: the mask's ``mask_bounds`` when the caller has them."""
    B, S = q.shape[:2]
    nk = key_norms(k) if nk is None else nk
    bounds = mask_bounds(mask, B, S, k.shape[1]) if bounds is None else bounds
    tau, ids, list_count, cap, G, plan, shared = _screen_stage(q, w, k, mask, kk, config, nk, bounds, screen_config,
                                                            shared_bound, k_scale, mark, call_queries)
    cand_cap = min(cap, defaults.CERTIFIED_BUFFER_K * kk)
    cand = torch.empty((B, S, cand_cap), dtype=torch.int64, device=q.device)  # read up to each count
    cand_count = torch.zeros((B, S), dtype=torch.int32, device=q.device)
    score_keys(q, w, k, ids, list_count, cap=cap, tiles_per_list=1, mask=mask, tau=tau, out=cand,
               out_count=cand_count, splits=key_splits(B * ids.shape[1], cap), k_scale=k_scale, block_s=G,
               bounds=bounds)
    mark("refine")
    codes = top_candidates(cand.view(B * S, cand_cap), cand_count.view(B * S), kk, scratch=True,
                           window_factor=defaults.CERTIFIED_WINDOW_FACTOR,
                           ordered=ordered).view(B, S, kk)
    mark("select")
    # Every key with s >= tau was written (pruned keys have s < tau); with at least kk of them
    # the row's top-kk is among them. Fewer: fewer than kk visible keys, or theta > the kk-th score,
    # or (short rows) a shared bound above this call's kk-th score.
    # Short (shared bound only): tau is the finite shared bound, and kk keys held elsewhere reach it.
    redo, short = row_flags(cand_count, kk, cand_cap, tau, shared)
    return codes, CertifiedTrace(tau, list_count, cand_count, redo, short, kk, cap, G, plan)


def redo_slots(B: int, S: int, T: int, H: int) -> int:
    """Rows per round of ``redo_dense``: its [B, slots, T] int64 code buffer fits defaults.REDO_BUFFER_BYTES
    (at least one scorer tile, at most S rounded up to whole tiles)."""
    block_s, _ = score_tile_shape(H)
    fit = (defaults.REDO_BUFFER_BYTES // (8 * T * B)) // block_s * block_s
    return max(block_s, min(fit, cdiv(S, block_s) * block_s))


def few_rows_chunks(T: int, kk: int, dtype: torch.dtype) -> int | None:
    """The chunk maxima per row the scorer writes for the few-rows selection of rows of T keys (a
    multiple of its key tile, ``few_rows_fit``), or None where that selection does not take them."""
    multiple = chunk_multiple(dtype)
    n = chunk_count(T, kk, multiple)
    return n if n % multiple == 0 and few_rows_fit(T, kk, n) else None


def redo_head_rows(S: int, T: int, kk: int, H: int, dtype: torch.dtype) -> int:
    """Flagged rows per batch row that ``redo_dense`` takes first by the few-rows selection
    (defaults.REDO_FEW_ROWS rounded up to whole scorer tiles, at most S), or 0 where that
    selection does not take rows of T keys (``few_rows_chunks``)."""
    if few_rows_chunks(T, kk, dtype) is None:
        return 0
    block_s, _ = score_tile_shape(H)
    return min(cdiv(defaults.REDO_FEW_ROWS, block_s) * block_s, S)


def redo_dense(codes, redo, q, w, k, mask, kk, k_scale=None):
    """Overwrite the rows flagged in ``redo`` [B,S] bool with their dense top-kk codes, in place.

    No host synchronisation (capturable in a CUDA graph). A batch row's first ``redo_head_rows``
    flagged rows (rank order) are scored densely with their chunk maxima and selected by
    ``few_rows_top_codes``, each row split over many programs (a few rows are the usual case). The
    rest, and all of them where the head does not apply, in rounds: each scores up to ``slots`` rows
    densely into a [B, slots, T] buffer and selects their top kk with ``select_top_codes`` (one
    program per row); a fixed number of rounds takes them in rank order (``redo_row_lists``, one
    launch for every list). Unflagged slots cost a program and no key reads; the scorer splits each
    round's keys as for defaults.REDO_LIVE_TILES query tiles, the head's as for one. The same scorer
    as the dense path, so bitwise its codes. codes [B,S,kk] int64 (returned). ``k_scale``: the FP8
    scorer's key scales.
    """
    B, S = redo.shape
    T = k.shape[1]
    flat = codes.view(B * S, kk)
    head = redo_head_rows(S, T, kk, q.shape[2], q.dtype)
    (h_lists, h_valid, h_rows), (lists, valid, out_rows) = redo_row_lists(redo, redo_slots(B, S, T, q.shape[2]), head)
    if head:
        n = few_rows_chunks(T, kk, q.dtype)
        maxima = torch.empty((B, head, n), dtype=torch.int64, device=q.device)
        buf = dense_codes(q, w, k, mask, rows=h_lists, maxima=maxima, k_scale=k_scale, live_tiles=1)
        few_rows_top_codes(buf.view(B * head, T), maxima.view(B * head, n), kk, h_valid.view(-1), flat,
                           h_rows.view(-1))
    for i in range(lists.shape[0]):
        buf = dense_codes(q, w, k, mask, rows=lists[i], k_scale=k_scale, live_tiles=defaults.REDO_LIVE_TILES)
        select_top_codes(buf.view(-1, T), valid[i].view(-1), kk, out=flat, scratch=True, out_rows=out_rows[i].view(-1))
    return codes


def certified_topk_cuda(q, k, weights, topk, mask=None, *, k_scale=None, config=None, stats=None, trace=None,
                        screen_config=None, shared_bound=None):
    """Certified top-K on CUDA: (values [B,S,kk] fp32, indices [B,S,kk] int64).

    Same arguments and contract as runtime.certified_topk.certified_topk (``k_scale``: the FP8
    scorer on E4M3 q and k); output identical to ``dense_topk_cuda`` with the same ``k_scale``
    (bitwise values, identical indices) for every input. ``config.path``:
    "certified" runs the pipeline, "dense" the dense path. ``trace``, a list, receives the
    CertifiedTrace of a certified call. ``screen_config``: the screen kernel's LaunchConfig (one
    of certificate_screen.SCREEN_CONFIGS); None autotunes it on CUDA. Any config gives the same
    output (only the screen is tuned; the scorer's config is fixed). ``shared_bound``: as in
    runtime.certified_topk (called at most once; rows may be short).
    """
    return checked_certified_topk_cuda(q, k, weights, checked_kk(q, k, weights, topk, mask, k_scale), mask,
                                       k_scale=k_scale, config=config, stats=stats, trace=trace,
                                       screen_config=screen_config, shared_bound=shared_bound)


def certified_query_bytes(B: int, T: int, H: int, kk: int, config: CertifiedTopkConfig) -> int:
    """Bytes the certified pipeline holds per query of a call: its candidate buffer (min(cap,
    CERTIFIED_BUFFER_K kk) int64 codes), its share of the survivor lists and words, and its seed
    codes (``workspace_bytes`` adds the screen rows)."""
    cap = survivor_cap(T, kk, config.workspace_frac)
    seeds = kk + kk // 4 + 1 + sample_size(T, config.sample_keys)
    lists = cdiv(4 * (cap + cdiv(T, 32)), refine_queries(H, config))
    return B * (8 * min(cap, defaults.CERTIFIED_BUFFER_K * kk) + lists + 8 * seeds)


def certified_chunk_rows(B: int, S: int, T: int, H: int, kk: int, config: CertifiedTopkConfig) -> int:
    """Queries per round of the certified pipeline: as many as keep ``certified_query_bytes`` within
    defaults.CERTIFIED_CHUNK_BYTES, in whole multiples of defaults.CERTIFIED_CHUNK_QUERIES (so that a
    round's survivor lists and anchor groups are those of one call), at least one multiple, at most
    S. Queries are independent: the rounds give the one call's answer."""
    step = defaults.CERTIFIED_CHUNK_QUERIES
    fit = defaults.CERTIFIED_CHUNK_BYTES // max(1, certified_query_bytes(B, T, H, kk, config)) // step * step
    return min(S, max(step, fit))


def workspace_bytes(B: int, S: int, T: int, H: int, D: int, kk: int, config: CertifiedTopkConfig) -> int:
    """An upper bound of the bytes a call allocates at once: the dense scorer's chunk (at most
    DENSE_CHUNK_BYTES) and its selection, the outputs; on the certified path also, for one round of
    ``certified_chunk_rows`` queries, the anchors, the seed codes, the plan (PLAN_CHUNK_BYTES twice,
    the screen rows), the survivor words and lists, the candidate buffer, the redo's head (its codes,
    candidates and maxima, at most T int64 each per row) and round (REDO_BUFFER_BYTES). Operands are
    contiguous copies at most."""
    dense_chunk = min(defaults.DENSE_CHUNK_BYTES, 8 * B * S * T)
    total = 2 * dense_chunk + 4 * B * (S * H * (D + 1) + T * D) + 24 * B * S * kk
    if config.path == "certified":
        rows = certified_chunk_rows(B, S, T, H, kk, config)
        total += (dense_chunk + 2 * defaults.PLAN_CHUNK_BYTES + B * rows * 16 * (2 * D + 12)
                  + rows * certified_query_bytes(B, T, H, kk, config) + 2 * defaults.REDO_BUFFER_BYTES
                  + 24 * B * (defaults.REDO_FEW_ROWS + score_tile_shape(H)[0]) * T)
    return total


def checked_certified_topk_cuda(q, k, weights, kk, mask=None, *, k_scale=None, config=None, stats=None, trace=None,
                                screen_config=None, shared_bound=None, ordered=True, mark=_no_mark, min_keys=None):
    """``certified_topk_cuda`` of a call already checked (``checked_kk``), given its ``kk``: the
    op's kernel, which checked the call itself. A call whose ``workspace_bytes`` exceed the
    device's memory is refused here, naming q and k, before anything is allocated. ``ordered``
    False: each row's (value, index) pairs in an unspecified order (the final sorts skipped).
    ``mark``: ``certified_codes``'s stage marker, also called with "redo" after the dense redo.
    Queries run in rounds of ``certified_chunk_rows`` (one round with ``shared_bound``, whose hook
    is called once a call); ``trace`` receives one CertifiedTrace per certified round.
    ``min_keys``: with a mask and several rounds, a round none of whose rows sees that many keys
    (``round_spans``) runs the dense path, as consecutive such rounds at once: the early rows of a
    causal prefill (None, or while a CUDA graph is captured: every round certified)."""
    config = CertifiedTopkConfig() if config is None else config
    B, S, H, D = q.shape
    T = k.shape[1]
    check_workspace(workspace_bytes(B, S, T, H, D, kk, config), q.device, "q, k", f"B={B}, S={S}, T={T}")
    q, k, w, k_scale = _operands(q, k, weights, k_scale)
    if config.path == "dense" or tf32_scores(q.dtype):
        _record(stats, q, T, None)
        return dense_values_topk(q, w, k, mask, kk, k_scale, ordered)
    nk = key_norms(k)
    rows = S if shared_bound is not None else certified_chunk_rows(B, S, T, H, kk, config)
    bounds = mask_bounds(mask, B, S, T)
    certify = [True] * cdiv(S, rows)
    if min_keys is not None and bounds is not None and len(certify) > 1 and not graph_capturing(q.device):
        certify = [span >= min_keys for span in round_spans(bounds, rows)]
    parts = []
    for s0, s1, certified in _segments(certify, rows, S):
        sl = slice(s0, s1)  # a round of every query is q itself: contiguous() copies nothing
        qs, ws, ms = q[:, sl].contiguous(), w[:, sl].contiguous(), None if mask is None else mask[:, sl]
        bs = None if bounds is None else bounds[:, sl].contiguous()
        if not certified:
            _record(stats, qs, T, None)
            parts.append(dense_values_topk(qs, ws, k, ms, kk, k_scale, ordered, bs))
            continue
        parts.append(_certified_round(qs, ws, k, ms, kk, config, nk, screen_config, shared_bound, k_scale, ordered,
                                      mark, stats, trace, S, bs))
    if len(parts) == 1:
        return parts[0]
    return torch.cat([v for v, _ in parts], dim=1), torch.cat([i for _, i in parts], dim=1)


def round_spans(bounds: torch.Tensor, rows: int) -> list[int]:
    """Per round of ``rows`` queries, the most keys one of its rows may see: the largest end (one
    past the last visible key, 0 for none) of ``mask_bounds`` [B,S,2] over the batch and the round's
    rows. Read to the host: one synchronisation."""
    span = bounds[..., 1].amax(0)
    span = torch.nn.functional.pad(span, (0, (-span.shape[0]) % rows))
    return span.view(-1, rows).amax(1).tolist()


def _segments(certify: list[bool], rows: int, S: int) -> list[tuple[int, int, bool]]:
    """(start, stop, certified) of each round, consecutive dense rounds merged into one."""
    out = []
    for i, certified in enumerate(certify):
        s0, s1 = i * rows, min(S, (i + 1) * rows)
        if out and not certified and not out[-1][2]:
            out[-1] = (out[-1][0], s1, False)
        else:
            out.append((s0, s1, certified))
    return out


def _certified_round(q, w, k, mask, kk, config, nk, screen_config, shared_bound, k_scale, ordered, mark, stats, trace,
                     call_queries, bounds):
    """(values, indices) of one round of queries by the certified pipeline, the dense redo, the
    counters and the trace; ``call_queries`` the whole call's, ``bounds`` the round's mask bounds."""
    T = k.shape[1]
    codes, tr = certified_codes(q, w, k, mask, kk, config, nk, screen_config, shared_bound, k_scale, ordered, mark,
                                call_queries, bounds)
    codes = redo_dense(codes, tr.redo, q, w, k, mask, kk, k_scale)
    mark("redo")
    _record(stats, q, T, tr)
    if trace is not None:
        trace.append(tr)
    values, indices = decode_codes(codes, T)
    if shared_bound is not None:  # a short row's missing codes decode as hidden key T - 1
        padding = tr.short[..., None] & (torch.arange(kk, device=q.device) >= tr.cand_count[..., None])
        indices = torch.where(padding, -1, indices)
    return values, indices


def _record(stats: TopkStats | None, q, T, tr):
    """Add the call's counters to ``stats``: a dense call's as host ints (no launch), a certified
    call's as one device vector (``call_counts``: one launch, no synchronisation; inside a CUDA graph
    the counters hold the capture-time totals plus the last replay's counts).

    survivors counts refined (query, key) pairs: a list's survivors (all T keys when it overflowed)
    times its list_queries queries."""
    if stats is None:
        return
    B, S = q.shape[:2]
    if tr is None:
        stats.add("queries", B * S)
        stats.add("dense_cheaper", B * S)
        return
    cand_cap = min(tr.cap, defaults.CERTIFIED_BUFFER_K * tr.kk)
    stats.add_counts(call_counts(tr.list_count, tr.cand_count, tr.short, T, tr.cap, tr.list_queries, tr.kk, cand_cap))

"""The certificate screen on the GPU: one Triton kernel, survivors compacted on the device (SPEC C.2).

``screen(...)`` bounds every visible key of every query with U (the prepared rows ``g``, their
coefficients, the key norms rounded up and the rounding margin of ``topk_pipeline.screen_margin``)
and keeps a key for query s when ``not (U < tau[s])`` (strict pruning; NaN survives). The screen
kernel writes each refine list's survivors (a key survives for any query of the list) as a bitmask,
one int32 word per 32 keys, with plain stores; a second kernel compacts each list's words into
``ids[b, list, :cap]`` in ascending key order; ``count[b, list]`` goes on past ``cap`` so that the
scorer rescans an overflowed list densely. The launch config is tuned per shape (``choose_screen_config`` over
``defaults.SCREEN_CONFIGS``); every config keeps every key with ``U >= tau``, so the pipeline's
output does not depend on it. E4M3 keys (SPEC A.10): U in the units of the unscaled sum, the keys
multiplied as bf16 (exact), then the scorer's own last step ``scale_and_bias`` before the test."""
from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from compiler.autotune import LaunchConfig, choose_config, interpreter_active
from compiler.lowering.scoring.indexer_scores import (
    INTERPRET,
    key_splits,
    load_mask_tile,
    mask_bounds,
    mask_operand,
    scale_and_bias,
)
from compiler.lowering.scoring.tile_arith import group_bound
from compiler.lowering import defaults
from compiler.lowering.host_ints import cdiv

DTYPE_CODES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2, torch.float8_e4m3fn: 3}
"""Key dtypes the screen takes, as ints for the tuning key."""


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _screen_tile(t0, t_hi, gt, alpha, beta, e, c, tau, g_ptr, g_off, rok, k_ptr, ks_ptr, nk_ptr, mask_ptr, words_ptr,
                 b, rows, row_ok, lists, lok, bit, n_words, skb, skt, ssb, snb, swb, swl, msb, mss, mst,
                 BLOCK_SS: tl.constexpr, RP: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
                 G: tl.constexpr, MASK_KIND: tl.constexpr, IEEE: tl.constexpr, SEQUENTIAL: tl.constexpr,
                 FP8: tl.constexpr):
    """The survivor words of the key tile at t0 (keys below t_hi); MASK_KIND 0 on a clear tile."""
    NSUB: tl.constexpr = BLOCK_SS // G
    WORDS: tl.constexpr = BLOCK_T // 32
    key = t0 + tl.arange(0, BLOCK_T)
    kok = key < t_hi
    nk = tl.load(nk_ptr + b * snb + key, mask=kok, other=0.0)
    u = group_bound(gt, alpha, beta, g_ptr, g_off, rok, k_ptr, b * skb + key * skt, kok, D, BLOCK_SS, RP,
                    BLOCK_T, SEQUENTIAL, IEEE)
    u = u + e[:, None] * nk[None, :] + c[:, None]
    visible, bias = load_mask_tile(mask_ptr, b, rows, key, row_ok[:, None] & kok[None, :], msb, mss, mst,
                                   MASK_KIND)
    if FP8:  # the scorer's own last step (a monotone function of u)
        u = scale_and_bias(u, tl.load(ks_ptr + b * ssb + key, mask=kok, other=1.0), bias, SEQUENTIAL)
    else:
        u = u + bias
    survive = (visible & ~(u < tau[:, None])).to(tl.int32)
    sub = tl.max(tl.reshape(survive, (NSUB, G, BLOCK_T)), axis=1)
    words = tl.reduce(tl.reshape(sub << bit[None, :], (NSUB, WORDS, 32)), 2, _or)
    col = t0 // 32 + tl.arange(0, WORDS)
    tl.store(words_ptr + b * swb + lists[:, None] * swl + col[None, :], words,
             mask=lok[:, None] & (col < n_words)[None, :])


@triton.jit
def _screen_kernel(
    g_ptr, alpha_ptr, beta_ptr, e_ptr, c_ptr, tau_ptr, k_ptr, ks_ptr, nk_ptr, mask_ptr, bounds_ptr, words_ptr,
    S, T, n_words, n_tiles, n_lists,
    sgb, sgs, sgr, sab, sas, skb, skt, ssb, snb, swb, swl, msb, mss, mst,
    BLOCK_SS: tl.constexpr, RP: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
    G: tl.constexpr, MASK_KIND: tl.constexpr, IEEE: tl.constexpr, TO_FP32: tl.constexpr,
    SEQUENTIAL: tl.constexpr, FP8: tl.constexpr, SPLIT: tl.constexpr,
):
    """Program (query tile, key split): the survivor words [NSUB lists, BLOCK_T / 32] of each key
    tile of its split (splits are whole tiles, BLOCK_T a multiple of 32: no word is shared). With
    SPLIT, under a mask, the rows' ``mask_bounds`` split the key tiles into clear ones (no mask
    read), masked ones, and hidden ones (zero words, no key read), as the dense scorer does; without
    it every tile reads the mask (the same survivors)."""
    pid = tl.program_id(0)
    b = (pid // n_tiles).to(tl.int64)  # b * (stride of a batch row) can pass 2^31
    tile = pid % n_tiles

    r = tl.arange(0, BLOCK_SS * RP)
    qrow = tile * BLOCK_SS + r // RP
    rho = r % RP
    rok = qrow < S
    d = tl.arange(0, D)
    g_off = b * sgb + qrow * sgs + rho * sgr
    gt = tl.load(g_ptr + g_off[:, None] + d[None, :], mask=rok[:, None], other=0.0)
    if TO_FP32:
        gt = gt.to(tl.float32)
    alpha = tl.load(alpha_ptr + b * sab + qrow * sas + rho, mask=rok, other=0.0)
    beta = tl.load(beta_ptr + b * sab + qrow * sas + rho, mask=rok, other=0.0)

    rows = (tile * BLOCK_SS + tl.arange(0, BLOCK_SS)).to(tl.int64)
    row_ok = rows < S
    e = tl.load(e_ptr + b * S + rows, mask=row_ok, other=0.0)
    c = tl.load(c_ptr + b * S + rows, mask=row_ok, other=0.0)
    tau = tl.load(tau_ptr + b * S + rows, mask=row_ok, other=float("inf"))
    tl.static_assert(BLOCK_T % 32 == 0, "BLOCK_T: a multiple of 32 (32 keys a survivor word)")
    NSUB: tl.constexpr = BLOCK_SS // G
    WORDS: tl.constexpr = BLOCK_T // 32
    lists = (tile * NSUB + tl.arange(0, NSUB)).to(tl.int64)
    lok = lists < n_lists
    bit = tl.arange(0, BLOCK_T) % 32

    chunk = tl.cdiv(tl.cdiv(T, tl.num_programs(1)), BLOCK_T) * BLOCK_T
    t_lo = tl.program_id(1) * chunk
    t_hi = tl.minimum(t_lo + chunk, T)
    if SPLIT:  # keys below t_clear are clear for every row of the tile, from t_end on hidden
        t_clear = t_lo
        t_end = t_hi
        if MASK_KIND != 0:
            at = bounds_ptr + (b * S + rows) * 2
            first = tl.min(tl.load(at, mask=row_ok, other=2147483647), axis=0)
            end = tl.max(tl.load(at + 1, mask=row_ok, other=0), axis=0)
            t_clear = tl.minimum(tl.maximum(t_lo, first // BLOCK_T * BLOCK_T), t_hi)
            t_end = tl.minimum(tl.maximum(t_clear, tl.cdiv(end, BLOCK_T) * BLOCK_T), t_hi)
        for t0 in range(t_lo, t_clear, BLOCK_T):
            _screen_tile(t0, t_hi, gt, alpha, beta, e, c, tau, g_ptr, g_off, rok, k_ptr, ks_ptr, nk_ptr, mask_ptr,
                         words_ptr, b, rows, row_ok, lists, lok, bit, n_words, skb, skt, ssb, snb, swb, swl, msb,
                         mss, mst, BLOCK_SS, RP, D, BLOCK_T, G, 0, IEEE, SEQUENTIAL, FP8)
        for t0 in range(t_clear, t_end, BLOCK_T):
            _screen_tile(t0, t_hi, gt, alpha, beta, e, c, tau, g_ptr, g_off, rok, k_ptr, ks_ptr, nk_ptr, mask_ptr,
                         words_ptr, b, rows, row_ok, lists, lok, bit, n_words, skb, skt, ssb, snb, swb, swl, msb,
                         mss, mst, BLOCK_SS, RP, D, BLOCK_T, G, MASK_KIND, IEEE, SEQUENTIAL, FP8)
        for t0 in range(t_end, t_hi, BLOCK_T):  # hidden for every row: no survivor
            col = t0 // 32 + tl.arange(0, WORDS)
            tl.store(words_ptr + b * swb + lists[:, None] * swl + col[None, :], tl.zeros([NSUB, WORDS], tl.int32),
                     mask=lok[:, None] & (col < n_words)[None, :])
    else:  # every tile reads the mask
        for t0 in range(t_lo, t_hi, BLOCK_T):
            _screen_tile(t0, t_hi, gt, alpha, beta, e, c, tau, g_ptr, g_off, rok, k_ptr, ks_ptr, nk_ptr, mask_ptr,
                         words_ptr, b, rows, row_ok, lists, lok, bit, n_words, skb, skt, ssb, snb, swb, swl, msb,
                         mss, mst, BLOCK_SS, RP, D, BLOCK_T, G, MASK_KIND, IEEE, SEQUENTIAL, FP8)


@triton.jit
def _popcount(x, HW: tl.constexpr):
    """The set bits of each int32 of ``x``: the hardware's ``popc`` (HW), else by integer arithmetic
    on any target (arithmetic shifts: every bit a shift brings in is masked off or, in the last
    step, zero)."""
    if HW:
        return tl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    else:
        x = x - ((x >> 1) & 0x55555555)
        x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F
        return (x * 0x01010101) >> 24


@triton.jit
def _compact_words_kernel(words_ptr, ids_ptr, count_ptr, n_words, cap, n_lists, swb, swl, sib, sil, scb,
                          BLOCK_W: tl.constexpr, HW: tl.constexpr):
    """Program (b, list): the keys of the list's set bits, ascending, into ids[:cap]; the bit count
    into count (past cap when the list overflows). A key's slot: the set bits of the words before its
    own (one scan of word counts) plus those below it in its word."""
    pid = tl.program_id(0)
    b = (pid // n_lists).to(tl.int64)
    lst = (pid % n_lists).to(tl.int64)
    bit = tl.arange(0, 32)
    base = 0
    for w0 in range(0, n_words, BLOCK_W):
        col = w0 + tl.arange(0, BLOCK_W)
        word = tl.load(words_ptr + b * swb + lst * swl + col, mask=col < n_words, other=0)
        per_word = _popcount(word, HW)
        on = (word[:, None] >> bit[None, :]) & 1
        below = _popcount(word[:, None] & ((1 << bit[None, :]) - 1), HW)
        slot = base + (tl.cumsum(per_word, 0) - per_word)[:, None] + below
        tl.store(ids_ptr + b * sib + lst * sil + slot, col[:, None] * 32 + bit[None, :],
                 mask=(on != 0) & (slot < cap))
        base += tl.sum(per_word, axis=0)
    tl.store(count_ptr + b * scb + lst, base)


def screen_tile_queries(rp: int, g: int) -> int:
    """Queries per screen program: 128 matrix rows, and a whole number of refine lists."""
    return max(128 // rp, g)


def screen(g, alpha, beta, e, c, tau, k, nk, *, mask, lists_per_batch, list_queries, cap,
           config: LaunchConfig | None = None, k_scale=None, bounds=None, call_queries=None):
    """Screen every key for every query; returns (ids [B,L,cap] int32, count [B,L] int32) as
    ``compact_words`` gives them (each list's survivors in ascending key order).

    g [B,S,RP,D] in k's dtype, bf16 for E4M3 keys (RP a power of two), alpha/beta [B,S,RP] fp32, e/c
    [B,S] fp32, tau [B,S] fp32, k [B,T,D], nk [B,T] fp32 upper bounds of the key norms, mask None |
    [B,S,T]. ``k_scale`` [B,T] fp32 (E4M3 keys): U, in the units of the unscaled sum, goes through
    the scorer's last step (``scale_and_bias``) before the comparison.
    ``list_queries`` (G) consecutive queries share one list; L = lists_per_batch = ceil(S / G).
    ``config``: a launch config (e.g. one of defaults.SCREEN_CONFIGS); None chooses one by measurement on
    CUDA (cached per device and bucketed T), defaults.SCREEN_CONFIGS[0] elsewhere. Every config gives the
    same survivor guarantee (SPEC C.2). ``bounds``: the mask's ``mask_bounds`` when the caller has them
    (read by the split form, ``split_form``). ``call_queries``: the queries of the whole call whose
    round of queries this screen is (None: S), which ``split_form`` reads.
    """
    B, S, RP, D = g.shape
    T = k.shape[1]
    words = torch.empty(B, lists_per_batch, cdiv(T, 32), dtype=torch.int32, device=k.device)
    kind, m, mask_strides = mask_operand(mask, B, S, T)
    split = split_form(list_queries, S if call_queries is None else call_queries, T, mask is not None)
    if split and bounds is None:
        bounds = mask_bounds(mask, B, S, T)

    def launch(cfg: LaunchConfig) -> None:
        _launch_screen(g, alpha, beta, e, c, tau, k, nk, kind, m, mask_strides, bounds, words,
                       lists_per_batch, list_queries, cfg, k_scale, split)

    if config is None:
        config = choose_screen_config(launch, k, kind, RP, list_queries, work=B * S * T * RP * D)
    launch(config)
    return compact_words(words, cap)


def split_form(list_queries: int, S: int, T: int, masked: bool) -> bool:
    """Whether a screen call takes the kernel's SPLIT form (key tiles split by the rows' mask
    bounds, hidden ones skipped): for lists of at least defaults.SCREEN_SPLIT_LIST_QUERIES queries,
    and for a masked call of at least T / defaults.SCREEN_SPLIT_PREFILL_FACTOR queries S (of the
    whole call, all its rounds), a prefill whose causal rows hide about half the tiles."""
    return list_queries >= defaults.SCREEN_SPLIT_LIST_QUERIES or (
        masked and S * defaults.SCREEN_SPLIT_PREFILL_FACTOR >= T)


def compact_words(words: torch.Tensor, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B,L,cap] int32, count [B,L] int32) of survivor words [B,L,W] int32 (bit j of word i:
    key 32 i + j): each list's keys in ascending order in ids[:min(count, cap)], the rest unwritten;
    count the list's set bits."""
    B, L, W = words.shape
    ids = torch.empty(B, L, cap, dtype=torch.int32, device=words.device)
    count = torch.empty(B, L, dtype=torch.int32, device=words.device)
    if B * L:
        _compact_words_kernel[(B * L,)](words, ids, count, W, cap, L, words.stride(0), words.stride(1),
                                        ids.stride(0), ids.stride(1), count.stride(0),
                                        BLOCK_W=defaults.SURVIVOR_WORDS, HW=not INTERPRET,
                                        num_warps=defaults.SURVIVOR_WARPS)
    return ids, count


def choose_screen_config(launch: Callable[[LaunchConfig], None], k, mask_kind: int, rp: int,
                         list_queries: int, work: int) -> LaunchConfig:
    """The screen's config for this call's shape: defaults.SCREEN_CONFIGS[0] off CUDA, under the
    interpreter or for a call of less than ``compiler.autotune.MIN_TUNED_WORK`` multiply-adds
    (``work``: B S T RP D); else the fastest launchable candidate for (device, bucketed T, D, RP, G,
    dtype, mask kind), measured once and cached on disk by ``choose_config``."""
    if k.device.type != "cuda" or interpreter_active():
        return defaults.SCREEN_CONFIGS[0]
    T, D = k.shape[1], k.shape[2]
    shape = {"D": D, "RP": rp, "G": list_queries, "mask_kind": mask_kind,
             "dtype": DTYPE_CODES[k.dtype]}
    return choose_config("dsa_screen", defaults.SCREEN_CONFIGS, launch, device=k.device, length=T, shape=shape,
                         work=work)


def _launch_screen(g, alpha, beta, e, c, tau, k, nk, kind, m, mask_strides, bounds, words,
                   lists_per_batch, list_queries, config: LaunchConfig, k_scale=None, split=False) -> None:
    """One launch of the screen kernel with ``config`` (BLOCK_T, num_warps, num_stages): every
    survivor word of ``words`` [B, L, ceil(T / 32)] written; ``split``: the kernel's SPLIT form (it
    reads ``bounds``)."""
    B, S, RP, D = g.shape
    T = k.shape[1]
    msb, mss, mst = mask_strides
    block_ss = screen_tile_queries(RP, list_queries)
    n_tiles = cdiv(S, block_ss)
    ieee = k.dtype == torch.float32
    launch = config.kwargs()
    splits = key_splits(B * n_tiles, T, launch["BLOCK_T"])
    _screen_kernel[(B * n_tiles, splits)](
        g, alpha, beta, e, c, tau, k, nk if k_scale is None else k_scale, nk,  # nk: unread scale slot
        k if m is None else m, words if bounds is None else bounds, words,  # k, words: unread mask and bounds slots
        S, T, words.shape[-1], n_tiles, lists_per_batch,
        g.stride(0), g.stride(1), g.stride(2), alpha.stride(0), alpha.stride(1),
        k.stride(0), k.stride(1), 0 if k_scale is None else k_scale.stride(0), nk.stride(0),
        words.stride(0), words.stride(1), msb, mss, mst,
        BLOCK_SS=block_ss, RP=RP, D=D, G=list_queries, MASK_KIND=kind, IEEE=ieee,
        TO_FP32=INTERPRET or ieee, SEQUENTIAL=INTERPRET, FP8=k_scale is not None,
        SPLIT=split, **launch,
    )

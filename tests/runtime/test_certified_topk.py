"""certified_topk is dense_topk, bitwise, on adversarial inputs; dense_topk is the brute force.

Inputs are drawn by hypothesis (derandomized, so CI is deterministic) over tiny shapes and
adversarial regimes: integer values with many exact ties (at and around tau), all scores
equal, huge and tiny norms, per-head scales over 40 decades, all-positive / all-negative /
few-positive weights, one or few visible keys, causal, bool and additive masks, NaN / inf in
q, k, weights and mask, bf16 / fp16 inputs, and configurations that force every route.
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from runtime.certified_topk import (
    FALLBACK_REASONS,
    CertifiedTopkConfig,
    TopkStats,
    certified_topk,
)
from runtime.dense_scorer import dense_topk
from runtime.indexer_zoo import zoo_inputs
from runtime.seeds import anchor_rows, sample_keys, sample_rank, sample_size, seed_mask, takes_witnesses
from runtime.structured_indexer import structured_indexer_inputs

NAN, INF = float("nan"), float("inf")
REGIMES = ("normal", "integer", "integer", "constant", "huge", "tiny", "mixed_scale", "sparse")
SIGNS = ("mixed", "positive", "negative", "few_positive")
MASKS = ("none", "bool", "bool_few", "causal", "additive", "additive_nonfinite")
NONFINITE = (None, None, None, None, "nan_q", "inf_q", "nan_k", "ninf_k", "inf_w", "nan_w")


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def _values(regime, shape, g):
    if regime == "integer":
        return torch.randint(-3, 4, shape, generator=g).float()
    if regime == "constant":
        return torch.full(shape, float(torch.randint(1, 4, (), generator=g)))
    x = torch.randn(shape, generator=g)
    if regime == "huge":
        return x * 1e18
    if regime == "tiny":
        return x * 1e-30
    if regime == "mixed_scale":
        return x * 10.0 ** (40 * torch.rand(shape[:-1] + (1,), generator=g) - 20)
    if regime == "sparse":
        return x * (torch.rand(shape, generator=g) < 0.3)
    return x


def _weights(signs, regime, B, S, H, g):
    w = _values(regime, (B, S, H), g)
    if signs == "positive":
        return w.abs()
    if signs == "negative":
        return -w.abs()
    if signs == "few_positive":
        few = torch.rand(B, S, H, generator=g) < 1.5 / H
        return torch.where(few, w.abs(), -0.3 * w.abs())
    return w


def _mask(kind, B, S, T, regime, g):
    if kind == "none":
        return None
    if kind == "bool":
        return torch.rand(B, S, T, generator=g) < torch.rand((), generator=g)
    if kind == "bool_few":
        rank = torch.argsort(torch.rand(B, S, T, generator=g), dim=-1)
        return rank < torch.randint(1, 4, (B, S, 1), generator=g)
    if kind == "causal":
        pos = torch.arange(T - S, T)[:, None]
        return (torch.arange(T)[None, :] <= pos).expand(B, S, T).clone()
    offsets = torch.randint(-2, 3, (B, S, T), generator=g).float()
    if regime not in ("integer", "constant"):
        offsets = offsets * torch.rand(B, S, T, generator=g)
    mask = torch.where(torch.rand(B, S, T, generator=g) < 0.3, -INF, offsets)
    if kind == "additive_nonfinite":
        pick = torch.rand(B, S, T, generator=g)
        mask = torch.where(pick < 0.05, NAN, torch.where(pick > 0.95, INF, mask))
    return mask


def _poison(which, q, k, w, g):
    if which is None:
        return q, k, w
    target = {"q": q, "k": k, "w": w}[which.split("_")[1]]
    flat = target.view(-1)
    value = {"nan": NAN, "inf": INF, "ninf": -INF}[which.split("_")[0]]
    flat[torch.randint(flat.numel(), (), generator=g)] = value
    return q, k, w


@st.composite
def indexer_cases(draw):
    B, S = draw(st.integers(1, 2)), draw(st.integers(1, 6))
    T, H, D = draw(st.integers(1, 40)), draw(st.integers(1, 8)), draw(st.integers(1, 8))
    topk = draw(st.integers(1, 45))
    regime = draw(st.sampled_from(REGIMES))
    signs = draw(st.sampled_from(SIGNS))
    mask_kind = draw(st.sampled_from(MASKS))
    poison = draw(st.sampled_from(NONFINITE))
    dtype = draw(st.sampled_from((torch.float32, torch.float32, torch.bfloat16, torch.float16)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = _values(regime, (B, S, H, D), g)
    k = _values(regime, (B, T, D), g)
    w = _weights(signs, regime, B, S, H, g)
    q, k, w = _poison(poison, q, k, w, g)
    mask = _mask(mask_kind, B, S, T, regime, g)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(dtype)
    return q.to(dtype), k.to(dtype), w.to(dtype), topk, mask, regime


@st.composite
def configs(draw):
    return CertifiedTopkConfig(
        r=draw(st.one_of(st.none(), st.integers(1, 9))),
        anchor_stride=draw(st.integers(1, 4)),
        sink=draw(st.integers(0, 3)),
        window=draw(st.integers(0, 5)),
        workspace_frac=draw(st.sampled_from((0.0, 0.1, 0.5, 4.0))),
        sample_keys=draw(st.sampled_from((None, 0, 1, 4, 16))),
        sample_sigmas=draw(st.sampled_from((4.0, 0.0, -3.0))),
        path=draw(st.sampled_from(("certified", "certified", "certified", "dense"))),
    )


def _assert_same(got, want):
    """Identical indices and bitwise-identical values (NaN where NaN)."""
    (gv, gi), (wv, wi) = got, want
    assert gi.dtype == wi.dtype == torch.int64 and gv.dtype == wv.dtype == torch.float32
    assert torch.equal(gi, wi)
    assert torch.equal(torch.isnan(gv), torch.isnan(wv))
    assert torch.equal(torch.where(torch.isnan(gv), 0, gv.view(torch.int32)),
                       torch.where(torch.isnan(wv), 0, wv.view(torch.int32)))


@settings(max_examples=1600, deadline=None, derandomize=True)
@given(case=indexer_cases(), config=configs())
def test_certified_topk_equals_dense_topk_bitwise_on_adversarial_inputs(case, config):
    q, k, w, topk, mask, _ = case
    stats = TopkStats()
    got = certified_topk(q, k, w, topk, mask, config=config, stats=stats)
    _assert_same(got, dense_topk(q, k, w, topk, mask))
    summary = stats.summary()
    assert summary["queries"] == q.shape[0] * q.shape[1]
    assert sum(summary["fallbacks"].values()) + summary["anchors"] <= summary["queries"]
    assert summary["written"] <= summary["survivors"] <= summary["keys_screened"]


def _brute_force_topk(q, k, w, topk, mask):
    """Independent reference: numpy float32 scorer, python ``sorted`` with THE ORDER."""
    q, k, w = (x.float().numpy() for x in (q, k, w))
    B, S, H, D = q.shape
    T = k.shape[1]
    x = np.zeros((B, S, H, T), dtype=np.float32)
    scores = np.zeros((B, S, T), dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for d in range(D):
            x = x + q[:, :, :, d, None] * k[:, None, None, :, d]
        for h in range(H):
            scores = scores + w[:, :, h, None] * np.maximum(x[:, :, h], np.float32(0))
    if mask is None:
        visible = np.ones((B, S, T), dtype=bool)
    elif mask.dtype == torch.bool:
        visible = mask.numpy()
    else:
        additive = mask.float().numpy()
        visible = additive != -np.inf
        with np.errstate(invalid="ignore"):
            scores = np.where(visible, scores + np.where(visible, additive, 0), scores)
    scores = np.where(visible, scores, np.float32(-np.inf)).astype(np.float32)

    def order(row, vis):
        def key(i):
            value = float(row[i])
            return (0 if value != value else 1, 0.0 if value != value else -value, not vis[i], i)
        return sorted(range(T), key=key)

    kk = min(topk, T)
    idx = np.array([[order(scores[b, s], visible[b, s])[:kk] for s in range(S)] for b in range(B)],
                   dtype=np.int64).reshape(B, S, kk)
    return torch.from_numpy(np.take_along_axis(scores, idx, -1)), torch.from_numpy(idx), scores


@settings(max_examples=1600, deadline=None, derandomize=True)
@given(case=indexer_cases())
def test_dense_topk_equals_an_independent_brute_force(case):
    q, k, w, topk, mask, regime = case
    values, indices, scores = _brute_force_topk(q, k, w, topk, mask)
    _assert_same(dense_topk(q, k, w, topk, mask), (values, indices))
    integral = all(bool(torch.isfinite(x).all()) and torch.equal(x, x.round()) for x in (q, k, w))
    if regime == "integer" and integral and (mask is None or mask.dtype == torch.bool):
        # Small integers: float32 arithmetic is exact, so these are the exact real scores.
        qi, ki, wi = (x.to(torch.int64).numpy() for x in (q, k, w))
        exact = (wi[..., None] * np.maximum(np.einsum("bshd,btd->bsht", qi, ki), 0)).sum(2)
        visible = np.ones_like(exact, dtype=bool) if mask is None else mask.numpy()
        assert np.array_equal(scores[visible], exact[visible].astype(np.float32))


@settings(max_examples=1200, deadline=None, derandomize=True)
@given(
    T=st.integers(1, 40), kk=st.integers(1, 40), sink=st.integers(0, 5), window=st.integers(0, 5),
    density=st.floats(0, 1), seed=st.integers(0, 2**31 - 1),
)
def test_seeds_are_distinct_visible_keys_at_least_kk_and_include_witnesses_sink_and_window(
    T, kk, sink, window, density, seed
):
    g = torch.Generator().manual_seed(seed)
    visible = torch.rand(3, T, generator=g) < density
    witnesses = torch.randint(T, (3, kk), generator=g)
    seeds = seed_mask(visible, witnesses, kk, sink, window)
    assert (seeds <= visible).all()
    assert (seeds.sum(-1) >= torch.minimum(visible.sum(-1), torch.tensor(kk))).all()
    for n in range(3):
        keys = visible[n].nonzero().flatten().tolist()
        wanted = set(keys[:sink]) | set(keys[max(0, len(keys) - window):] if window else []) | (
            set(witnesses[n].tolist()) & set(keys))
        chosen = set(seeds[n].nonzero().flatten().tolist())
        assert wanted <= chosen
        spare = [key for key in keys if key not in wanted]
        extra = max(0, min(kk - len(wanted), len(spare)))
        assert chosen - wanted == set(spare[len(spare) - extra:])  # most recent first


def test_anchor_of_each_query_is_the_last_anchor_at_or_before_it():
    assert anchor_rows(7, 3, torch.device("cpu")).tolist() == [0, 0, 0, 3, 3, 3, 6]


def test_strided_samples_are_distinct_in_range_keys_and_the_rank_errs_low():
    for T, M in ((1000, 7), (2048, 128), (131072, 2048), (5, 5)):
        keys = sample_keys(9, M, T, torch.device("cpu"))
        assert keys.shape == (9, M) and int(keys.min()) >= 0 and int(keys.max()) < T
        assert all(len(set(row.tolist())) == M for row in keys)
    assert (sample_size(4096), sample_size(8192), sample_size(262144), sample_size(2**22)) == (0, 1024, 2048, 4096)
    assert sample_size(100, 500) == 100 and sample_size(10**6, 0) == 0
    # kk M / T sampled keys lie above the kk-th score on average: the rank adds sigmas deviations.
    assert sample_rank(2048, 2048, 131072, 4.0) == 56  # ceil(32 + 4 sqrt(32)) + 1
    assert sample_rank(2048, 2048, 131072, 0.0) == 33
    assert sample_rank(64, 8, 64, 4.0) == 8 and sample_rank(1, 100, 10**6, -9.0) == 1


def _misaligned(S=32, T=2048, H=8, D=32):
    """Topics in runs of 5 queries: a query's anchor (every 16th query) rarely shares its topic."""
    q, k, w, _ = zoo_inputs("misaligned_runs", 1, S, T, H, D, seed=0)
    return q, k, w, torch.ones(S, T, dtype=torch.bool).tril(T - S)[None]


def test_own_threshold_rescues_queries_whose_anchor_does_not_share_their_top_keys():
    q, k, w, mask = _misaligned()
    summaries = {}
    for sampled in (0, 128):
        stats = TopkStats()
        config = CertifiedTopkConfig(sink=0, window=0, sample_keys=sampled)
        _assert_same(certified_topk(q, k, w, 32, mask, config=config, stats=stats), dense_topk(q, k, w, 32, mask))
        summaries[sampled] = (stats.pruned_frac, stats.summary()["fallbacks"])
    assert summaries[0][0] < 0.5 and summaries[0][1]["overflow"] > 10  # anchor witnesses alone
    assert summaries[128][0] > 0.9 and summaries[128][1]["overflow"] == 0


@pytest.mark.parametrize("witnesses", [False, True])
def test_without_witnesses_no_query_is_an_anchor_and_the_sample_threshold_prunes(witnesses):
    q, k, w, mask = _misaligned()
    stats = TopkStats()
    config = CertifiedTopkConfig(witnesses=witnesses, sink=0, window=0, sample_keys=128)
    _assert_same(certified_topk(q, k, w, 32, mask, config=config, stats=stats), dense_topk(q, k, w, 32, mask))
    summary = stats.summary()
    assert summary["anchors"] == (q.shape[1] // config.anchor_stride if witnesses else 0)
    assert stats.pruned_frac > 0.9 and summary["fallbacks"]["overflow"] == 0


def test_a_call_without_a_sample_or_with_sharded_keys_takes_witnesses_anyway():
    assert not takes_witnesses(False, 128, False)
    assert takes_witnesses(True, 128, False) and takes_witnesses(False, 0, False) and takes_witnesses(False, 128, True)
    q, k, w, mask = _misaligned()
    stats = TopkStats()
    config = CertifiedTopkConfig(witnesses=False, sample_keys=0)
    _assert_same(certified_topk(q, k, w, 32, mask, config=config, stats=stats), dense_topk(q, k, w, 32, mask))
    assert stats.summary()["anchors"] == q.shape[1] // config.anchor_stride


def test_an_own_threshold_above_the_kth_score_is_caught_and_answered_densely():
    q, k, w, mask = _misaligned()
    stats = TopkStats()
    config = CertifiedTopkConfig(sink=0, window=0, sample_keys=128, sample_sigmas=-4.0)
    _assert_same(certified_topk(q, k, w, 32, mask, config=config, stats=stats), dense_topk(q, k, w, 32, mask))
    assert stats.summary()["fallbacks"]["threshold_miss"] > 10


def _structured(S=64, T=2048, H=16, D=32, seed=0):
    q, k, w, _ = structured_indexer_inputs(1, S, T, H, D, seed=seed)
    return q, k, w


def test_certificate_prunes_most_keys_of_structured_indexer_inputs():
    q, k, w = _structured()
    stats = TopkStats()
    got = certified_topk(q, k, w, 64, config=CertifiedTopkConfig(), stats=stats)
    _assert_same(got, dense_topk(q, k, w, 64))
    summary = stats.summary()
    assert summary["keys_screened"] > 0.5 * summary["keys_visible"]
    assert stats.pruned_frac > 0.5
    assert sum(summary["fallbacks"].values()) == 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("r", [None, 1, 2])
@pytest.mark.parametrize("variant", ["fp32", "bf16", "integer_ties", "additive_mask"])
def test_pruned_structured_inputs_stay_exact_across_paths_dtypes_ties_and_masks(seed, r, variant):
    q, k, w, _ = structured_indexer_inputs(1, 16, 256, 8, 16, seed=seed, query_run=4, topic_run=16)
    mask = None
    if variant == "bf16":
        q, k, w = q.bfloat16(), k.bfloat16(), w.bfloat16()
    elif variant == "integer_ties":  # coarse integers: many exact ties at and around tau
        q, k, w = (2 * q).round(), (2 * k).round(), (2 * w).round()
    elif variant == "additive_mask":
        causal = torch.arange(256)[None, None, :] <= torch.arange(240, 256)[None, :, None]
        offsets = torch.randint(-1, 2, (1, 16, 256), generator=torch.Generator().manual_seed(seed)) / 4
        mask = torch.where(causal, offsets, -INF)
    stats = TopkStats()
    config = CertifiedTopkConfig(r=r, anchor_stride=4, sink=4, window=16)
    got = certified_topk(q, k, w, 8, mask, config=config, stats=stats)
    _assert_same(got, dense_topk(q, k, w, 8, mask))
    assert stats.summary()["keys_screened"] > 0 and stats.pruned_frac > 0.5


def test_structured_inputs_are_deterministic_with_few_positive_heads_per_query():
    q, k, w, params = structured_indexer_inputs(2, 8, 64, 8, 16, seed=5, positive_heads=2)
    again = structured_indexer_inputs(2, 8, 64, 8, 16, seed=5, positive_heads=2)
    assert all(torch.equal(a, b) for a, b in zip((q, k, w), again[:3]))
    assert (q.shape, k.shape, w.shape) == ((2, 8, 8, 16), (2, 64, 16), (2, 8, 8))
    assert ((w > 0).sum(-1) == 2).all() and params["positive_heads"] == 2
    with pytest.raises(ValueError, match="positive_heads: expected an int in"):
        structured_indexer_inputs(1, 2, 3, 4, 5, positive_heads=5)
    with pytest.raises(ValueError, match="T: expected a positive int"):
        structured_indexer_inputs(1, 2, 0, 4, 5)


def test_causal_structured_inputs_prune_and_stay_exact():
    q, k, w = _structured(S=32, T=1024)
    mask = torch.arange(1024)[None, None, :] <= torch.arange(1024 - 32, 1024)[None, :, None]
    stats = TopkStats()
    got = certified_topk(q, k, w, 32, mask, config=CertifiedTopkConfig(), stats=stats)
    _assert_same(got, dense_topk(q, k, w, 32, mask))
    assert stats.pruned_frac > 0.5


def test_float32_min_additive_mask_of_transformers_eager_prunes_without_range_fallback():
    """transformers' eager causal masks hide keys with float32 min, not -inf: such keys stay
    visible (their values are fl32(score + min)), must not trip the overflow precondition, and
    must not be chosen as witnesses, so the certificate still prunes."""
    q, k, w = _structured(S=32, T=1024)
    causal = torch.arange(1024)[None, None, :] <= torch.arange(512, 544)[None, :, None]
    mask = torch.where(causal, 0.0, torch.finfo(torch.float32).min)
    stats = TopkStats()
    got = certified_topk(q, k, w, 32, mask, config=CertifiedTopkConfig(), stats=stats)
    _assert_same(got, dense_topk(q, k, w, 32, mask))
    summary = stats.summary()
    assert summary["fallbacks"]["numeric_range"] == 0
    assert stats.pruned_frac > 0.5


def test_non_contiguous_inputs_and_expanded_masks_give_the_dense_result():
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 8, 6, 5, generator=g).transpose(2, 3)
    k = torch.randn(2, 6, 30, generator=g).transpose(1, 2)
    w = torch.randn(8, 5, 2, generator=g).permute(2, 0, 1)
    config = CertifiedTopkConfig(anchor_stride=2, sink=1, window=1)
    bool_mask = (torch.arange(30) < 20).expand(2, 8, 30)
    float_mask = torch.zeros(1, 1, 30).masked_fill(torch.arange(30) > 25, -INF).expand(2, 8, 30)
    for mask in (None, bool_mask, float_mask):
        _assert_same(certified_topk(q, k, w, 4, mask, config=config), dense_topk(q, k, w, 4, mask))


def test_empty_batch_queries_or_keys_give_empty_outputs():
    for B, S, T in ((0, 2, 5), (1, 0, 5), (1, 2, 0)):
        q, k, w = torch.ones(B, S, 3, 4), torch.ones(B, T, 4), torch.ones(B, S, 3)
        values, indices = certified_topk(q, k, w, 2)
        assert values.shape == indices.shape == (B, S, min(2, T)) and indices.dtype == torch.int64


def _route_counts(q, k, w, topk, mask=None, **config):
    stats = TopkStats()
    got = certified_topk(q, k, w, topk, mask, config=CertifiedTopkConfig(**config), stats=stats)
    _assert_same(got, dense_topk(q, k, w, topk, mask))
    return stats.summary()


def _random(B=1, S=4, T=30, H=4, D=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, D, generator=g)
    return q, torch.randn(B, T, D, generator=g), torch.randn(B, S, H, generator=g)


def test_nonfinite_query_falls_back_and_is_counted():
    q, k, w = _random()
    q[0, 2, 1, 0] = NAN
    w[0, 3, 0] = INF
    summary = _route_counts(q, k, w, 3, anchor_stride=4)
    assert summary["fallbacks"]["nonfinite"] == 2 and summary["anchors"] == 1


def test_nonfinite_visible_key_or_bias_falls_back_but_a_hidden_one_does_not():
    q, k, w = _random()
    k[0, 5, 2] = -INF
    mask = torch.zeros(1, 4, 30)
    mask[0, 1:, 5] = -INF  # key 5 hidden for queries 1-3, visible to query 0 (the anchor)
    mask[0, 2, 7] = NAN
    summary = _route_counts(q, k, w, 3, mask, anchor_stride=4)
    assert summary["fallbacks"]["nonfinite"] == 2  # the anchor (query 0) and query 2
    assert summary["anchors"] == 0


def test_score_range_that_could_overflow_float32_falls_back_and_is_counted():
    q, k, w = _random()
    q[0, 1] *= 1e19
    k *= 1e19
    summary = _route_counts(q, k, w, 3, anchor_stride=4)
    assert summary["fallbacks"]["numeric_range"] >= 1


def test_topk_not_below_the_visible_count_falls_back_and_is_counted():
    q, k, w = _random(S=3)
    summary = _route_counts(q, k, w, 30)
    assert summary["fallbacks"]["topk_ge_visible"] == 3 and summary["keys_screened"] == 0


def test_the_dense_path_falls_back_as_dense_cheaper():
    q, k, w = _random(S=5)
    assert _route_counts(q, k, w, 3, path="dense")["fallbacks"]["dense_cheaper"] == 5
    assert _route_counts(q, k, w, 3, path="certified")["fallbacks"]["dense_cheaper"] == 0


def test_survivors_beyond_the_workspace_fall_back_as_overflow_and_stay_exact():
    q, k, w = _random(S=6, T=40, H=8, D=8)
    summary = _route_counts(q, k, w, 2, anchor_stride=6, sink=0, window=0,
                            workspace_frac=0.0)
    assert summary["fallbacks"]["overflow"] >= 1
    relaxed = _route_counts(q, k, w, 2, anchor_stride=6, sink=0, window=0,
                            workspace_frac=1.0)
    assert relaxed["fallbacks"]["overflow"] == 0


def test_stats_accumulate_over_calls_and_count_every_reason():
    q, k, w = _random()
    stats = TopkStats()
    for _ in range(2):
        certified_topk(q, k, w, 3, config=CertifiedTopkConfig(anchor_stride=2), stats=stats)
    summary = stats.summary()
    assert summary["queries"] == 8 and summary["anchors"] == 4
    assert summary["keys_visible"] == 8 * 30
    assert set(summary["fallbacks"]) == set(FALLBACK_REASONS)


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("r", 0, "r: expected an int >= 1"),
        ("r", 2.5, "r: expected an int >= 1"),
        ("anchor_stride", 0, "anchor_stride: expected an int >= 1"),
        ("sink", -1, "sink: expected an int >= 0"),
        ("window", True, "window: expected an int >= 0"),
        ("sample_keys", -1, "sample_keys: expected an int >= 0"),
        ("sample_sigmas", INF, "sample_sigmas: expected a finite number"),
        ("workspace_frac", -0.5, "workspace_frac: expected a finite number >= 0"),
        ("workspace_frac", NAN, "workspace_frac: expected a finite number >= 0"),
        ("path", "fast", "path: expected one of"),
        ("path", "auto", "path: expected one of"),
        ("list_queries", 0, "list_queries: expected None or a power-of-two int >= 1"),
        ("list_queries", 3, "list_queries: expected None or a power-of-two int >= 1"),
        ("list_queries", 2.0, "list_queries: expected None or a power-of-two int >= 1"),
        ("list_queries", True, "list_queries: expected None or a power-of-two int >= 1"),
    ],
)
def test_invalid_config_raises_an_error_naming_the_field(field, value, words):
    with pytest.raises(ValueError) as info:
        CertifiedTopkConfig(**{field: value})
    assert words in str(info.value)


def test_list_queries_takes_none_and_powers_of_two():
    assert [CertifiedTopkConfig(list_queries=n).list_queries for n in (None, 1, 2, 4, 64)] == [None, 1, 2, 4, 64]


def test_witnesses_must_be_a_bool():
    with pytest.raises(TypeError, match="witnesses: expected a bool, got 1"):
        CertifiedTopkConfig(witnesses=1)


def test_wrong_config_or_stats_type_raises_type_error():
    q, k, w = _random()
    with pytest.raises(TypeError, match="config: expected a CertifiedTopkConfig"):
        certified_topk(q, k, w, 3, config={"r": 2})
    with pytest.raises(TypeError, match="stats: expected a TopkStats"):
        certified_topk(q, k, w, 3, stats={})
    with pytest.raises(ValueError, match="name: expected a counter"):
        TopkStats().add("pruned", torch.tensor(1))


def test_stats_add_host_counts_and_device_counts_into_one_summary():
    """A dense call's counts are host ints (no launch), a certified call's device tensors; summary,
    totals and merge see both."""
    stats = TopkStats()
    stats.add("queries", 3)
    stats.add("queries", torch.tensor(4))
    stats.add("dense_cheaper", 3)
    other = TopkStats()
    other.add("queries", 5)
    other.add("survivors", torch.tensor(7))
    stats.merge(other)
    assert stats.summary()["queries"] == 12 and stats.summary()["fallbacks"]["dense_cheaper"] == 3
    totals = dict(zip(TopkStats.NAMES, stats.totals().tolist()))
    assert (totals["queries"], totals["survivors"], totals["written"]) == (12, 7, 0)
    only_host = TopkStats()
    only_host.add("queries", 2)
    assert only_host.totals().tolist() == [2] + [0] * (len(TopkStats.NAMES) - 1)
    with pytest.raises(ValueError, match="name"):
        stats.add("nonsense", 1)


def test_stats_add_counts_takes_one_vector_of_every_counter():
    """A certified GPU call adds its counters as one int64 vector in NAMES' order; totals() hands the
    device counts back as they are (no launch) until host counts join them."""
    stats = TopkStats()
    counts = torch.arange(len(TopkStats.NAMES), dtype=torch.int64)
    stats.add_counts(counts)
    assert stats.totals() is counts
    stats.add_counts(counts)
    stats.add("overflow", 2)
    totals = dict(zip(TopkStats.NAMES, stats.totals().tolist()))
    assert totals["queries"] == 0 and totals["survivors"] == 2 * TopkStats.NAMES.index("survivors")
    assert totals["overflow"] == 2 * TopkStats.NAMES.index("overflow") + 2
    assert stats.summary()["fallbacks"]["overflow"] == totals["overflow"]
    for bad in (counts[:-1], counts.to(torch.int32)):
        with pytest.raises(ValueError, match="counts: expected int64"):
            stats.add_counts(bad)

"""The Triton top-K pipeline (run here under TRITON_INTERPRET=1, tiny sizes) against the references.

Integer-valued inputs make every fp32 sum exact in any order, so the Triton scorer must then agree
bitwise with runtime.dense_topk (THE SCORER and THE ORDER, ties included). On general inputs the
certified path must agree bitwise with the dense Triton path (the GPU contract).
"""
import pytest
import torch

from compiler.lowering import defaults
from compiler.lowering.topk_pipeline import (
    certified_chunk_rows,
    certified_query_bytes,
    checked_certified_topk_cuda,
    certified_topk_cuda,
    dense_codes_topk,
    dense_topk_cuda,
    redo_dense,
    redo_head_rows,
    redo_slots,
    refine_queries,
    survivor_cap,
    workspace_bytes,
)
from compiler.lowering.order_codes import decode_codes
from compiler.lowering.scoring.indexer_scores import score_keys, score_tile_shape
from compiler.lowering.screen.certificate_screen import screen
from runtime.certified_topk import CertifiedTopkConfig, TopkStats
from runtime.indexer_zoo import zoo_inputs
from runtime.dense_scorer import dense_topk
from runtime.rounding import key_norm_up, round_up_to_float32
from runtime.structured_indexer import structured_indexer_inputs

CERTIFIED = CertifiedTopkConfig(path="certified", anchor_stride=16, workspace_frac=0.1)


def integer_inputs(S, T, H, D, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-3, 4, (1, S, H, D), generator=g).float()
    k = torch.randint(-3, 4, (1, T, D), generator=g).float()
    w = torch.randint(-2, 3, (1, S, H), generator=g).float()
    return q, k, w


def structured(S=32, T=1024, H=8, D=32):
    q, k, w, _ = structured_indexer_inputs(1, S, T, H, D, positive_heads=1, dtype=torch.bfloat16)
    mask = torch.ones(S, T, dtype=torch.bool).tril(T - S)[None]
    return q, k, w, mask


def assert_same(a, b):
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0, equal_nan=True)
    assert torch.equal(a[1], b[1])


@pytest.fixture(scope="module")
def structured_16():
    """structured(S=16, T=1024, H=4, D=16) and its dense Triton top-32, computed once for the tests
    that take them (none modifies them)."""
    q, k, w, mask = structured(S=16, T=1024, H=4, D=16)
    return q, k, w, mask, dense_topk_cuda(q, k, w, 32, mask)


HOST_READS = ("item", "tolist", "nonzero", "__bool__", "__int__", "__float__", "__index__")


def _host_read(*args, **kwargs):
    raise AssertionError("a tensor value was read back to the host")


@pytest.fixture(scope="module")
def structured_16_calls(structured_16):
    """The calls on structured_16 that the host-read, screen and overflow tests check, made once with
    every way of reading a tensor value back to the host patched to raise: config name ->
    (output, trace). ``certified``: CERTIFIED; ``no_room``: no survivor workspace (lists overflow);
    ``own``: own sample thresholds, too high (misses redone); ``dense``: dense_topk_cuda."""
    q, k, w, mask, _ = structured_16
    configs = {"certified": CERTIFIED,
               "no_room": CertifiedTopkConfig(path="certified", anchor_stride=16, workspace_frac=0.0),
               "own": CertifiedTopkConfig(sample_keys=64, sample_sigmas=-4.0)}
    calls = {}
    with pytest.MonkeyPatch.context() as patch:
        for name in HOST_READS:
            patch.setattr(torch.Tensor, name, _host_read)
        for name, config in configs.items():
            trace = []
            calls[name] = certified_topk_cuda(q, k, w, 32, mask, config=config, trace=trace), trace
        calls["dense"] = dense_topk_cuda(q, k, w, 32, mask), None
    return calls


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_dense_triton_equals_runtime_reference_bitwise_with_ties(mask_kind):
    S, T = 9, 300
    q, k, w = integer_inputs(S, T, 4, 16, seed=1)
    g = torch.Generator().manual_seed(2)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(1, S, T, generator=g) < 0.7
    elif mask_kind == "additive":
        mask = torch.randint(-2, 3, (1, S, T), generator=g).float()
        mask[torch.rand(1, S, T, generator=g) < 0.3] = float("-inf")
        mask[0, 0, 5], mask[0, 1, 7], mask[0, 2, 9] = float("inf"), float("nan"), float("-inf")
    assert_same(dense_topk_cuda(q, k, w, 40, mask), dense_topk(q, k, w, 40, mask))


@pytest.mark.parametrize("masked", [False, True])
def test_decode_rows_take_the_one_launch_selection_and_equal_the_reference(masked, monkeypatch):
    """Decode-shaped calls (2 batch rows of 1 query, long rows) on the few-rows selection, which the
    CPU does not choose by itself: bitwise the runtime reference, ties and hidden keys included."""
    from compiler.lowering import topk_pipeline
    from compiler.lowering.selection import few_rows_select

    taken = []
    monkeypatch.setattr(topk_pipeline, "takes_few_rows",
                        lambda *args: taken.append(args) or few_rows_select.takes_few_rows(*args[:4], "cuda"))
    B, T, kk = 2, 300, 16
    g = torch.Generator().manual_seed(3)
    q = torch.randint(-3, 4, (B, 1, 4, 16), generator=g).float()
    k = torch.randint(-3, 4, (B, T, 16), generator=g).float()
    w = torch.randint(-2, 3, (B, 1, 4), generator=g).float()
    mask = (torch.rand(B, 1, T, generator=g) < 0.6) if masked else None
    assert_same(dense_topk_cuda(q, k, w, kk, mask), dense_topk(q, k, w, kk, mask))
    assert taken and topk_pipeline.takes_few_rows(*taken[0])


def test_certified_equals_runtime_reference_on_integer_inputs():
    q, k, w = integer_inputs(12, 700, 4, 16, seed=3)  # 2 anchors, a partial last query tile and key tile
    config = CertifiedTopkConfig(path="certified", anchor_stride=8)
    assert_same(certified_topk_cuda(q, k, w, 16, config=config), dense_topk(q, k, w, 16))


def test_certified_equals_dense_triton_and_prunes_on_structured_bf16():
    # 16 queries (4 query tiles of H=8); T=512 prunes more of its keys than T=1024 (lists ~20% of T, not ~30%)
    q, k, w, mask = structured(S=16, T=512)
    trace = []
    out = certified_topk_cuda(q, k, w, 64, mask, config=CERTIFIED, trace=trace)
    assert_same(out, dense_topk_cuda(q, k, w, 64, mask))
    assert trace[0].list_count.float().median() < 0.5 * k.shape[1]


@pytest.fixture(scope="module")
def misaligned_runs():
    """The zoo's misaligned_runs inputs (S=8, T=1024, H=8, D=32) and their dense Triton top-32,
    computed once for both thresholds. (At 8 queries as at 16, sigmas=4 prunes ~90% / 82% of the
    keys, some rows writing more than 4 kk candidates, and sigmas=-4 misses in every row.)"""
    S, T = 8, 1024
    q, k, w, _ = zoo_inputs("misaligned_runs", 1, S, T, 8, 32, seed=0, dtype=torch.bfloat16)
    mask = torch.ones(S, T, dtype=torch.bool).tril(T - S)[None]
    return q, k, w, mask, dense_topk_cuda(q, k, w, 32, mask)


@pytest.mark.parametrize("sigmas", [4.0, -4.0])
def test_own_sample_threshold_prunes_misaligned_queries_and_a_too_high_one_is_redone(sigmas, misaligned_runs):
    """Topics in runs of 5 queries: anchor witnesses are poor; each query's own sample threshold
    (64 strided keys) keeps the screen pruning. A rank far too optimistic (sigmas=-4) puts the
    threshold above the kk-th score: those rows write fewer than kk candidates and are redone."""
    q, k, w, mask, dense = misaligned_runs
    stats = TopkStats()
    config = CertifiedTopkConfig(path="certified", sample_keys=64, sample_sigmas=sigmas)
    out = certified_topk_cuda(q, k, w, 32, mask, config=config, stats=stats)
    assert_same(out, dense)
    fallbacks = stats.summary()["fallbacks"]
    assert fallbacks["overflow"] == 0 and stats.pruned_frac > 0.8
    assert (fallbacks["threshold_miss"] > 0) == (sigmas < 0)


@pytest.mark.parametrize("witnesses, list_queries", [(False, 1), (True, 1), (False, 2), (False, 4), (True, 8)])
def test_without_witnesses_no_anchor_is_scored_and_lists_serve_their_queries(witnesses, list_queries,
                                                                               misaligned_runs, monkeypatch):
    """The sample alone sets the threshold: the pipeline scores no anchor query densely (with
    witnesses it scores one per group); each list holds the survivors of the config's list_queries
    queries (one: each query's own; 8: the call's every query), and the output is the dense one,
    bitwise."""
    from compiler.lowering import topk_pipeline

    q, k, w, mask, dense = misaligned_runs
    anchors = []
    real = topk_pipeline.dense_codes_topk
    monkeypatch.setattr(topk_pipeline, "dense_codes_topk", lambda *a, **kw: anchors.append(a[0].shape) or real(*a, **kw))
    trace = []
    config = CertifiedTopkConfig(witnesses=witnesses, sample_keys=64, list_queries=list_queries)
    assert_same(certified_topk_cuda(q, k, w, 32, mask, config=config, trace=trace), dense)
    assert len(anchors) == int(witnesses)
    assert trace[0].list_queries == list_queries and trace[0].list_count.shape == (1, q.shape[1] // list_queries)
    assert (trace[0].list_count < 0.5 * k.shape[1]).all()  # every list pruned


def test_the_list_size_comes_from_the_config_and_the_workspace_bound_holds_its_lists():
    assert refine_queries(8, CertifiedTopkConfig()) == score_tile_shape(8)[0]
    assert refine_queries(8, CertifiedTopkConfig(list_queries=2)) == 2
    B, S, T, kk = 1, 64, 4096, 32

    def bound(n):
        return workspace_bytes(B, S, T, 8, 32, kk, CertifiedTopkConfig(list_queries=n))

    cap = survivor_cap(T, kk, CertifiedTopkConfig().workspace_frac)
    assert bound(1) - bound(2) == 4 * B * (S - S // 2) * (cap + T // 32)  # a list's ids and survivor words


def test_a_call_past_the_chunk_bytes_runs_in_rounds_of_queries_with_the_one_call_answer(monkeypatch):
    """Two batch rows of 24 causal queries; rounds of 8 queries (certified_chunk_rows under a small
    CERTIFIED_CHUNK_BYTES): three traces, the counters of every query, the dense answer bitwise; the
    workspace bound shrinks with the rounds; each round's screen decides its form on the whole
    call's queries."""
    import compiler.lowering.screen.certificate_screen as screen_mod
    S, T, kk = 24, 256, 16
    q, k, w, _ = zoo_inputs("misaligned_runs", 2, S, T, 8, 32, seed=1, dtype=torch.bfloat16)
    mask = torch.ones(S, T, dtype=torch.bool).tril(T - S)[None].expand(2, S, T)
    config = CertifiedTopkConfig(path="certified", sample_keys=64, list_queries=2, anchor_stride=4)
    whole = workspace_bytes(2, S, T, 8, 32, kk, config)
    monkeypatch.setattr(defaults, "CERTIFIED_CHUNK_QUERIES", 8)
    monkeypatch.setattr(defaults, "CERTIFIED_CHUNK_BYTES", 8 * certified_query_bytes(2, T, 8, kk, config) + 1)
    assert certified_chunk_rows(2, S, T, 8, kk, config) == 8 and workspace_bytes(2, S, T, 8, 32, kk, config) < whole
    seen, split_form = [], screen_mod.split_form
    monkeypatch.setattr(screen_mod, "split_form", lambda g, s, t, m: seen.append(s) or split_form(g, s, t, m))
    trace, stats = [], TopkStats()
    out = checked_certified_topk_cuda(q, k, w, kk, mask, config=config, trace=trace, stats=stats)
    assert len(trace) == 3 and stats.summary()["queries"] == 2 * S and seen == [S, S, S]
    assert stats.pruned_frac > 0  # the rounds screened
    assert_same(out, dense_topk_cuda(q, k, w, kk, mask))


def test_rounds_whose_rows_see_fewer_than_min_keys_run_dense_and_the_answer_stays_the_dense_one(monkeypatch):
    """Rounds of 8 of 24 causal queries over 256 keys (rows see 233..256 keys, rounds at most 240,
    248, 256): min_keys 245 runs the first round dense (no trace, its queries counted dense
    cheaper), 300 every round dense; the dense answer bitwise each time (without min_keys every
    round is certified: the test above)."""
    S, T, kk = 24, 256, 16
    q, k, w, _ = zoo_inputs("misaligned_runs", 2, S, T, 8, 32, seed=1, dtype=torch.bfloat16)
    mask = torch.ones(S, T, dtype=torch.bool).tril(T - S)[None].expand(2, S, T)
    config = CertifiedTopkConfig(path="certified", sample_keys=64, list_queries=2, anchor_stride=4)
    monkeypatch.setattr(defaults, "CERTIFIED_CHUNK_QUERIES", 8)
    monkeypatch.setattr(defaults, "CERTIFIED_CHUNK_BYTES", 8 * certified_query_bytes(2, T, 8, kk, config) + 1)
    dense = dense_topk_cuda(q, k, w, kk, mask)
    for min_keys, traces, dense_rows in ((245, 2, 16), (300, 0, 2 * S)):
        trace, stats = [], TopkStats()
        out = checked_certified_topk_cuda(q, k, w, kk, mask, config=config, trace=trace, stats=stats,
                                          min_keys=min_keys)
        summary = stats.summary()
        assert len(trace) == traces and summary["queries"] == 2 * S, min_keys
        assert summary["fallbacks"]["dense_cheaper"] == dense_rows, min_keys
        assert_same(out, dense)


def test_screen_keeps_every_key_scoring_at_least_tau(structured_16, structured_16_calls):
    q, k, w, mask, (values, _) = structured_16
    trace = structured_16_calls["certified"][1]  # the CERTIFIED call's trace
    tr, p, T = trace[0], trace[0].plan, k.shape[1]
    tau = values[..., -1].contiguous()  # the exact kk-th score: the tightest valid threshold
    nk = round_up_to_float32(key_norm_up(k.float()))
    ids, count = screen(p.g, p.alpha, p.beta, p.e, p.c, tau, k, nk, mask=mask,
                        lists_per_batch=tr.list_count.shape[1], list_queries=tr.list_queries, cap=T)
    all_ids = torch.arange(T, dtype=torch.int32).view(1, 1, T)
    codes = score_keys(q, w.float(), k, all_ids, torch.full((1, 1), T, dtype=torch.int32), cap=T,
                       tiles_per_list=1 << 30, mask=mask)
    scores, _ = decode_codes(codes, T)
    G = tr.list_queries
    for s in range(q.shape[1]):
        kept = set(ids[0, s // G, : count[0, s // G]].tolist())
        needed = set((mask[0, s] & (scores[0, s] >= tau[0, s])).nonzero().flatten().tolist())
        assert len(needed) >= 32 and needed <= kept, (s, sorted(needed - kept))
    assert count.max() < T  # the screen pruned something


def test_scorer_row_list_scores_listed_rows_bitwise_and_leaves_empty_slots_alone():
    q, k, w, mask = structured(S=24, T=300, H=4, D=16)
    w = w.float()
    T = k.shape[1]
    ids = torch.arange(T, dtype=torch.int32).view(1, 1, T)
    counts = torch.full((1, 1), T, dtype=torch.int32)
    dense = score_keys(q, w, k, ids, counts, cap=T, tiles_per_list=1 << 30, mask=mask)
    rows = torch.tensor([[17, 3, -1, 22, -1, -1, -1, -1, 0, 9, -1]])  # the last tiles: empty
    out = score_keys(q, w, k, ids, counts, cap=T, tiles_per_list=1 << 30, mask=mask, rows=rows,
                     fill=True)
    for j, row in enumerate(rows[0].tolist()):
        if row >= 0:
            assert torch.equal(out[0, j], dense[0, row])
        else:
            assert (out[0, j] == torch.iinfo(torch.int64).min).all()


@pytest.mark.parametrize("few_rows", [0, 8, 32])
def test_redo_answers_every_flagged_row_densely_in_several_rounds(monkeypatch, few_rows):
    """Rounds only (``few_rows`` 0: two of them), a head of one scorer tile then a round, every row in
    the head."""
    q1, k1, w1, m1 = structured(S=12, T=256, H=4, D=16)
    q2, k2, w2, m2 = structured(S=12, T=256, H=4, D=16)
    q, k, w = torch.cat((q1, q2.flip(1))), torch.cat((k1, k2.flip(1))), torch.cat((w1, w2)).float()
    mask = torch.cat((m1, m2))
    # 8 slots (one scorer tile of queries, the fewest): 12 queries take 2 rounds
    monkeypatch.setattr(defaults, "REDO_BUFFER_BYTES", 8 * 256 * 2 * 8)
    monkeypatch.setattr(defaults, "REDO_FEW_ROWS", few_rows)
    assert redo_slots(2, 12, 256, 4) == 8
    assert redo_head_rows(12, 256, 24, 4, q.dtype) == {0: 0, 8: 8, 32: 12}[few_rows]
    redo = torch.zeros(2, 12, dtype=torch.bool)
    redo[0, [0, 5, 6, 9, 11]] = True  # 5 rows, scattered: the first round, ranked
    redo[1, :] = True  # 12 rows: two rounds, or the head and a round
    sentinel = torch.full((2, 12, 24), 7, dtype=torch.int64)
    codes = redo_dense(sentinel.clone(), redo, q, w, k, mask, 24)
    dense = dense_codes_topk(q, w, k, mask, 24)
    assert torch.equal(codes[redo], dense[redo])
    assert (codes[~redo] == 7).all()


def test_overflowed_survivor_lists_are_rescanned_densely(structured_16, structured_16_calls):
    *_, dense = structured_16
    out, trace = structured_16_calls["no_room"]  # no survivor workspace beyond kk
    assert (trace[0].list_count > trace[0].cap).any()
    assert_same(out, dense)


def test_rows_with_fewer_visible_keys_than_topk_return_hidden_keys_in_index_order():
    q, k, w = integer_inputs(8, 512, 4, 16, seed=4)
    mask = torch.ones(1, 8, 512, dtype=torch.bool)
    mask[0, 3, 20:] = False
    mask[0, 7, :] = False
    out = certified_topk_cuda(q, k, w, 64, mask, config=CertifiedTopkConfig(path="certified"))
    assert_same(out, dense_topk(q, k, w, 64, mask))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the NaN inputs, in numpy
def test_nonfinite_keys_and_weights_give_the_dense_answer():
    q, k, w, mask = structured(S=8, T=1024, H=4, D=16)
    k = k.clone()
    w = w.clone()
    k[0, 100, 3] = float("nan")
    k[0, 200, 0] = float("inf")
    w[0, 5, 1] = float("nan")
    out = certified_topk_cuda(q, k, w, 32, mask, config=CERTIFIED)
    assert_same(out, dense_topk_cuda(q, k, w, 32, mask))


def test_bad_arguments_raise_errors_naming_the_argument():
    q, k, w = integer_inputs(4, 64, 2, 16, seed=5)
    with pytest.raises(ValueError, match="topk"):
        certified_topk_cuda(q, k, w, 0)
    with pytest.raises(ValueError, match="mask"):
        certified_topk_cuda(q, k, w, 8, torch.ones(1, 4, 63, dtype=torch.bool))
    with pytest.raises(ValueError, match="k"):
        certified_topk_cuda(q, k.to("meta"), w, 8)


def test_the_dense_path_runs_the_dense_scorer_without_the_certified_stages(monkeypatch):
    import compiler.lowering.topk_pipeline as triton_topk

    q, k, w = integer_inputs(4, 64, 2, 16, seed=6)
    stages = []
    monkeypatch.setattr(triton_topk, "_screen_stage", lambda *a: stages.append(1))
    stats = TopkStats()
    out = certified_topk_cuda(q, k, w, 8, config=CertifiedTopkConfig(path="dense"), stats=stats)
    assert_same(out, dense_topk(q, k, w, 8))
    assert stages == [] and stats.summary()["fallbacks"]["dense_cheaper"] == 4


def test_order_codes_decode_to_their_value_and_key_bitwise():
    T = 1000
    scores = torch.tensor([0.0, -0.0, 1.5, -1.5, float("inf"), float("-inf"), float("nan"),
                           3e38, -3e38, 1e-45, -1e-45, 7.0])
    visible = torch.tensor([True] * 11 + [False])
    keys = torch.tensor([0, 1, 2, 3, 500, 998, 999, 10, 11, 12, 13, 14])
    bits = (scores + 0.0).view(torch.int32)
    c32 = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    c32 = torch.where(scores.isnan(), torch.tensor(0x7FFFFFFF, dtype=torch.int32), c32)
    c32 = torch.where(visible, c32, torch.tensor(-(2**31), dtype=torch.int32))
    codes = c32.long() * 2**32 + (T - 1 - keys)
    values, idx = decode_codes(codes.view(3, 4), T)
    assert torch.equal(idx.flatten(), keys)
    expected = torch.where(visible, scores + 0.0, torch.tensor(float("-inf")))
    assert torch.equal(values.flatten().view(torch.int32)[~scores.isnan()],
                       expected.view(torch.int32)[~scores.isnan()])
    assert values.flatten()[scores.isnan()].isnan().all()
    assert decode_codes(torch.full((2, 0), 5, dtype=torch.int64), T)[0].shape == (2, 0)


def test_certified_and_dense_calls_never_read_a_value_back_to_the_host(structured_16, structured_16_calls):
    *_, dense = structured_16
    # the calls ran with every host read patched to raise (structured_16_calls): certified, lists
    # overflowing, own thresholds too high (misses redone), and dense
    assert sorted(structured_16_calls) == ["certified", "dense", "no_room", "own"]
    for out, _ in structured_16_calls.values():
        assert_same(out, dense)


def test_the_guarded_cuda_op_path_reads_nothing_back_and_settles_on_one_path():
    """The op's CUDA kernel (run here on CPU tensors, Triton interpreted): path choice and runtime
    guard included, eight calls (certified warm-up, dense warm-up, measured dense, measured
    certified, then each rung of the guard's ladder warmed up and measured while certified loses)
    read no tensor value back, all return the dense answer and leave the layer on one path. S=32: the op's fewest rows for
    the guard (MIN_CERTIFIED_ROWS); T=256: its certified calls screen (most keys pruned, no fallback)."""
    from compiler import defaults as guard_defaults
    from compiler.ops.certified_topk import _certified_topk_cuda
    from compiler.ops.guard import GUARD

    q, k, w, mask = structured(S=32, T=256, H=4, D=16)
    dense = dense_topk_cuda(q, k, w, 32, mask)
    GUARD.reset()
    with pytest.MonkeyPatch.context() as patch:
        for name in HOST_READS:
            patch.setattr(torch.Tensor, name, _host_read)
        outs = [_certified_topk_cuda(q, k, w, 32, mask, layer="guarded", min_keys=0, record_stats=False)
                for _ in range(4 + 2 * len(guard_defaults.GUARD_LADDER))]
    for out in outs:
        assert_same(out, dense)
    (state,) = GUARD.summaries()["guarded"]
    assert state["path"] in ("dense", "certified")
    assert state["certified_calls"] + state["dense_calls"] == len(outs) and state["dense_calls"] >= 1
    GUARD.reset()


def _by_index(out):
    order = out[1].argsort(dim=-1)
    return out[0].gather(-1, order), out[1].gather(-1, order)


@pytest.mark.parametrize("path", ["dense", "certified"])
def test_unordered_calls_return_the_same_pairs_per_row(path, structured_16):
    """``ordered=False`` (the op's ``sorted=False``): the ordered call's (value, index) pairs per
    row, without the final sort of the [rows, kk] codes (other sorts, e.g. of the key sample, stay)."""
    from compiler.lowering.selection import threshold_select
    from compiler.lowering.topk_pipeline import checked_certified_topk_cuda

    q, k, w, mask, want = structured_16
    config = CertifiedTopkConfig(path=path, anchor_stride=16, workspace_frac=0.1)
    sorts = []
    real_sort = torch.sort

    def counting_sort(*args, **kwargs):
        sorts.append(args[0].shape)
        return real_sort(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threshold_select.torch, "sort", counting_sort)
        got = checked_certified_topk_cuda(q, k, w, 32, mask, config=config, ordered=False)
    assert_same(_by_index(got), _by_index(want))
    assert not [shape for shape in sorts if shape[-1] == 32]  # torch.sort of the [rows, kk] codes

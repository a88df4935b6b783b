"""The context-parallel certified top-K (2, 3 and 4 gloo processes on the CPU) returns on every rank
exactly the single-process op's output on adversarial inputs; the shared threshold prunes at least
as much as each rank's own; the Triton pipeline honours the shared bound; bad arguments raise clear
errors before any collective."""
import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.certified_topk import CertifiedTopkConfig, TopkStats, certified_topk
from runtime.certified_topk_cp import certified_topk_cp
from runtime.dense_scorer import dense_topk, select_topk
from runtime.order_codes import PADDING, decode_order_codes, encode_order_codes
from runtime.structured_indexer import structured_indexer_inputs
from tests.runtime.test_distributed import free_port

SMALL = CertifiedTopkConfig(anchor_stride=4, sink=2, window=4)
"""Few seeds at these sizes, so that most keys are screened."""


def _integer(g, *shape):
    return torch.randint(-2, 3, shape, generator=g).float()


def _contiguous(sizes):
    """Shards of the given sizes in key order: [(global indices, key_offset as an int)]."""
    starts = torch.tensor([0] + list(sizes)).cumsum(0).tolist()
    return [(torch.arange(a, a + n), a) for a, n in zip(starts, sizes)]


def _interleaved(R, T):
    """Rank r holds keys r, r + R, ...: key_offset as a tensor."""
    return [(torch.arange(r, T, R),) * 2 for r in range(R)]


def _even(R, T):
    return _contiguous([T // R + (r < T % R) for r in range(R)])


def case_inputs(name, R):
    """(q, k, weights, topk, mask, config, shards) of one case for R ranks (deterministic)."""
    g = torch.Generator().manual_seed(7)
    if name == "ties_across_ranks":  # small integers: exact sums, many ties; the second half repeats the first
        S, T, H, D = 12, 96, 3, 4
        q, w, k = _integer(g, 1, S, H, D), _integer(g, 1, S, H), _integer(g, 1, T // 2, D).repeat(1, 2, 1)
        return q, k, w, 10, None, SMALL, _interleaved(R, T)
    if name == "few_visible_windows":  # each query sees a window of 3..60 keys: most shards see fewer than K
        S, T = 16, 150
        q, k, w, _ = structured_indexer_inputs(1, S, T, 4, 8, generator=g)
        lo = torch.randint(0, T - 60, (S, 1), generator=g)
        width = torch.linspace(3, 60, S).long()[:, None]
        pos = torch.arange(T)
        mask = ((pos >= lo) & (pos < lo + width))[None]
        return q, k, w, 12, mask, SMALL, _even(R, T)
    if name == "empty_shard_additive_mask":  # rank 1 holds no key; finite biases, float32-min "soft" hiding
        S, T = 10, 80
        q, k, w, _ = structured_indexer_inputs(1, S, T, 4, 8, generator=g)
        mask = torch.randint(-1, 2, (1, S, T), generator=g).float() * 0.25
        mask[torch.rand(1, S, T, generator=g) < 0.3] = float("-inf")
        mask[:, :, :5] = torch.finfo(torch.float32).min
        rest = T - T // 2
        sizes = [T, 0] if R == 2 else [T // 2, 0] + [rest // (R - 2) + (r < rest % (R - 2)) for r in range(R - 2)]
        return q, k, w, 8, mask, SMALL, _contiguous(sizes)
    if name == "nonfinite":  # NaN and inf in keys, a query, weights and the mask
        S, T, H, D = 9, 64, 3, 4
        q, k = torch.randn(1, S, H, D, generator=g), torch.randn(1, T, D, generator=g)
        w = torch.randn(1, S, H, generator=g)
        k[0, 5, 1] = float("nan")
        k[0, 40, 0] = float("inf")
        q[0, 2, 1, 3] = float("inf")
        w[0, 6, 0] = float("nan")
        mask = torch.zeros(1, S, T)
        mask[0, 3, 17], mask[0, 4, 50], mask[0, 7, 60] = float("nan"), float("inf"), float("-inf")
        return q, k, w, 6, mask, SMALL, _interleaved(R, T)
    if name == "fewer_keys_than_topk":  # T < topk: kk = T, hidden keys listed
        S, T = 5, 7
        q, k, w, _ = structured_indexer_inputs(1, S, T, 2, 4, generator=g, positive_heads=1)
        mask = torch.rand(1, S, T, generator=g) < 0.6
        return q, k, w, 10, mask, SMALL, _interleaved(R, T)
    if name == "own_threshold_too_high":  # theta above the kk-th score: rows redone densely, still exact
        S, T = 16, 256
        q, k, w, _ = structured_indexer_inputs(2, S, T, 4, 8, generator=g)
        config = CertifiedTopkConfig(anchor_stride=4, sink=2, window=4, sample_keys=32, sample_sigmas=-4.0)
        return q, k, w, 8, None, config, _interleaved(R, T)
    if name == "dense_path":
        q, k, w, _ = structured_indexer_inputs(1, 6, 40, 2, 4, generator=g, positive_heads=1)
        return q, k, w, 5, None, CertifiedTopkConfig(path="dense"), _even(R, 40)
    if name == "triton_kernel":  # bf16 on the Triton pipeline (interpreter), which prunes here
        S, T = 16, 512
        q, k, w, _ = structured_indexer_inputs(1, S, T, 8, 16, generator=g, positive_heads=1, dtype=torch.bfloat16)
        mask = torch.ones(S, T, dtype=torch.bool).tril(T - S)[None]
        return q, k, w, 16, mask, CertifiedTopkConfig(path="certified", workspace_frac=0.1), _even(R, T)
    if name == "structured_causal":  # pruned; also run without sharing
        S, T = 32, 480
        q, k, w, _ = structured_indexer_inputs(1, S, T, 8, 16, generator=g, topic_run=16, query_run=4,
                                               positive_heads=2)
        mask = torch.ones(S, T, dtype=torch.bool).tril(T - S)[None]
        return q, k, w, 16, mask, SMALL, _even(R, T)
    raise KeyError(name)


CASES = ("ties_across_ranks", "few_visible_windows", "empty_shard_additive_mask", "nonfinite",
         "fewer_keys_than_topk", "own_threshold_too_high", "dense_path", "structured_causal")
TRITON_CASES = ("triton_kernel",)
"""Run by the 2-rank group only, with the Triton shard kernel."""


def cases(world_size):
    return CASES + TRITON_CASES if world_size == 2 else CASES


def worker(rank, world_size, port, workdir):
    """One rank: every case's output (shared threshold), and the structured case's counters with
    and without sharing; saved for the parent. The 2-rank group calls the public
    ``compiler.certified_topk_cp``, and runs TRITON_CASES on the Triton shard kernel."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=60))
    try:
        run = certified_topk_cp
        if world_size == 2:
            import compiler

            run = compiler.certified_topk_cp
        results = {}
        for name in cases(world_size):
            q, k, w, topk, mask, config, shards = case_inputs(name, world_size)
            keys, offset = shards[rank]
            args = (q, k[:, keys], w, topk, None if mask is None else mask[..., keys])
            kernel = {}
            if name in TRITON_CASES:
                from compiler.lowering.topk_pipeline import certified_topk_cuda

                kernel = dict(kernel=certified_topk_cuda)
            for share in (True, False) if name == "structured_causal" else (True,):
                stats = TopkStats()
                call = certified_topk_cp if kernel else run
                out = call(*args, key_offset=offset, config=config, stats=stats, share_threshold=share, **kernel)
                results[name, share] = out, stats.summary()
        torch.save(results, os.path.join(workdir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """``spawned(world_size)``: every rank's saved results of one gloo run of ``worker`` (cached).
    The ranks are forked: they start with this process's modules loaded (seconds per rank saved)."""
    runs = {}

    def run(world_size):
        if world_size not in runs:
            workdir = tmp_path_factory.mktemp(f"cp{world_size}")
            mp.start_processes(worker, args=(world_size, free_port(), str(workdir)), nprocs=world_size,
                               start_method="fork")
            runs[world_size] = [torch.load(workdir / f"rank{r}.pt") for r in range(world_size)]
        return runs[world_size]

    return run


def assert_identical(got, want, what=""):
    """Indices equal; values bitwise, NaN where NaN."""
    assert torch.equal(got[1], want[1]), what
    nan = want[0].isnan()
    assert torch.equal(got[0].isnan(), nan), what
    bits = [x.masked_fill(nan, 0).view(torch.int32) for x in (got[0], want[0])]
    assert torch.equal(*bits), what


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_rank_returns_the_single_process_op_output(spawned, world_size):
    import compiler  # noqa: F401  (registers the op)

    ranks = spawned(world_size)
    for name in cases(world_size):
        q, k, w, topk, mask, _, _ = case_inputs(name, world_size)
        want = torch.ops.pulsar_dosa.certified_topk(q, k, w, topk, mask)
        assert_identical(want, dense_topk(q, k, w, topk, mask))
        for rank, results in enumerate(ranks):
            assert_identical(results[name, True][0], want, f"{name}, rank {rank}")


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_shared_threshold_prunes_at_least_as_much_as_the_local_ones(spawned, world_size):
    ranks = spawned(world_size)
    q, k, w, topk, mask, _, _ = case_inputs("structured_causal", world_size)
    want = dense_topk(q, k, w, topk, mask)
    gained = 0
    for results in ranks:
        screened, pruned = {}, {}
        for share in (True, False):
            out, stats = results["structured_causal", share]
            assert_identical(out, want)
            screened[share] = stats["keys_screened"]
            pruned[share] = stats["keys_screened"] - stats["survivors"]
        assert screened[True] == screened[False] > 0
        assert pruned[True] >= pruned[False]
        gained += pruned[True] - pruned[False]
    assert gained > 0


def test_order_codes_sort_in_the_order_and_decode_bitwise():
    g = torch.Generator().manual_seed(0)
    values = torch.randint(-3, 4, (4, 40), generator=g).float()
    values[0, :4] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0])
    values[1, 3] = float("nan")
    visible = torch.rand(4, 40, generator=g) < 0.8
    values = torch.where(visible, values, float("-inf"))
    keys = torch.arange(40).expand(4, 40)
    codes = encode_order_codes(values, visible, keys, 1 << 32)
    order = codes.sort(dim=-1, descending=True).indices
    assert torch.equal(order, select_topk(values, visible, 40)[1])
    decoded, back = decode_order_codes(codes, 1 << 32)
    assert torch.equal(back, keys)
    assert_identical((decoded, back), (values + 0.0, keys))
    assert decode_order_codes(torch.tensor([PADDING]), 1 << 32)[1].item() == (1 << 32) - 1
    from compiler.lowering.order_codes import decode_codes

    short_codes = encode_order_codes(values, visible, keys, 40)  # the scorer's limit: the row's key count
    triton_values, triton_keys = decode_codes(short_codes, 40)
    assert torch.equal(triton_keys, keys)
    assert torch.equal(triton_values.view(torch.int32), decode_order_codes(short_codes, 40)[0].view(torch.int32))


def test_triton_pipeline_lists_every_key_reaching_the_shared_bound_then_pads():
    """One shard (the first half of the keys) given b = the global kk-th score, as a rank whose
    keys hold few of the global top-kk receives it: short rows list exactly the shard's keys
    scoring >= b in THE ORDER, then (-inf, -1); full rows are the shard's top-kk."""
    from compiler.lowering.topk_pipeline import certified_topk_cuda

    S, T, kk = 16, 512, 16
    q, k, w, _ = structured_indexer_inputs(1, S, T, 8, 16, positive_heads=1, dtype=torch.bfloat16)
    mask = torch.ones(S, T, dtype=torch.bool).tril(T - S)[None]
    b = dense_topk(q, k, w, kk, mask)[0][..., -1]
    half = T // 2
    calls, trace = [], []

    def shared_bound(bound):
        calls.append(bound)
        return torch.maximum(bound, b)

    config = CertifiedTopkConfig(path="certified", anchor_stride=16, workspace_frac=0.1)
    values, indices = certified_topk_cuda(q, k[:, :half], w, kk, mask[..., :half], config=config,
                                          shared_bound=shared_bound, trace=trace)
    (bound,) = calls
    assert bound.shape == (1, S) and not bound.isnan().any() and not (bound == float("inf")).any()
    short = trace[0].short
    assert short.any()
    local = dense_topk(q, k[:, :half], w, kk, mask[..., :half])
    reach = local[0] >= trace[0].tau[..., None]
    assert torch.equal(torch.where(short[..., None] & ~reach, -1, local[1]), indices)
    assert torch.equal(torch.where(short[..., None] & ~reach, float("-inf"), local[0]), values)


def test_certified_topk_reference_short_rows_hold_the_keys_reaching_the_bound():
    q, k, w, topk, mask, config, _ = case_inputs("structured_causal", 2)
    b = dense_topk(q, k, w, topk, mask)[0][..., -1]
    half = k.shape[1] // 2
    values, indices = certified_topk(q, k[:, :half], w, topk, mask[..., :half], config=config,
                                     shared_bound=lambda bound: torch.maximum(bound, b))
    local = dense_topk(q, k[:, :half], w, topk, mask[..., :half])
    keep = (local[0] >= b[..., None]) | (indices >= 0).all(-1, keepdim=True)
    assert (~keep).any()
    assert torch.equal(torch.where(keep, local[1], -1), indices)
    assert torch.equal(torch.where(keep, local[0], float("-inf")), values)


@pytest.mark.parametrize("change, message", [
    (dict(k_shard=torch.zeros(1, 5, 4)), r"k_shard: expected shape \[B,T,D\]"),
    (dict(mask_shard=torch.ones(1, 4, 6, dtype=torch.bool)), r"mask_shard: expected shape \[B,S,T\]"),
    (dict(topk=0), r"topk: expected a positive int"),
    (dict(key_offset=-1), r"key_offset: expected an int in"),
    (dict(key_offset=True), r"key_offset: expected an int or an integer tensor"),
    (dict(key_offset=torch.tensor([0, 2, 2, 5, 6])), r"key_offset: expected strictly increasing"),
    (dict(key_offset=torch.arange(4)), r"key_offset: expected an int32/int64 tensor of shape \[T_r\] = \[5\]"),
    (dict(key_offset=torch.arange(5.0)), r"key_offset: expected an int32/int64 tensor"),
    (dict(config="certified"), r"config: expected a CertifiedTopkConfig"),
    (dict(share_threshold=1), r"share_threshold: expected a bool"),
    (dict(), r"group: expected an initialised torch.distributed process group"),
    (dict(group="x"), r"group: expected a torch.distributed ProcessGroup or None"),
    (dict(q=torch.zeros(1, 4, 2, 3, device="meta"), k_shard=torch.zeros(1, 5, 3, device="meta"),
          weights=torch.zeros(1, 4, 2, device="meta")), r"q: expected tensors with values, got the meta device"),
    (dict(kernel=lambda *a, **k: None), r"kernel: compiler.certified_topk_cp runs the shard kernel of q's device"),
])
def test_bad_arguments_raise_naming_the_argument_before_any_collective(change, message):
    import compiler

    args = dict(q=torch.zeros(1, 4, 2, 3), k_shard=torch.zeros(1, 5, 3), weights=torch.zeros(1, 4, 2), topk=3,
                mask_shard=None, key_offset=0)
    args.update(change)
    with pytest.raises((TypeError, ValueError), match=message):
        compiler.certified_topk_cp(args.pop("q"), args.pop("k_shard"), args.pop("weights"), args.pop("topk"),
                                   args.pop("mask_shard"), **args)


def test_cp_benchmark_smoke_is_exact_and_sharing_prunes_at_least_as_much(tmp_path):
    import json

    from benchmarks import cp_topk

    out = tmp_path / "cp_topk.json"
    assert cp_topk.main(["--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["input"], r["R"]) for r in rows] == [(i, R) for i in cp_topk.INPUTS for R in cp_topk.SMOKE["ranks"]]
    for r in rows:
        assert r["one_gpu_identical"] and r["identical_local"] and r["identical_shared"]
        assert len(r["shared"]) == len(r["local"]) == r["R"] and sum(r["T_per_rank"]) == cp_topk.SMOKE["T"]
        assert all(s["pruned"] >= own["pruned"] for s, own in zip(r["shared"], r["local"]))
        assert r["bytes_per_rank"]["all_gather_payload"] == 8 * (cp_topk.SMOKE["S"] * cp_topk.SMOKE["topk"] + 1)
    assert result["nccl"].startswith("not run")


def test_without_a_config_the_shards_are_scored_densely_and_a_certified_config_prunes(tmp_path):
    """The default never costs more than dense shards; pruning is opted into with a config."""
    import compiler

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        q, k, w, topk, mask, config, _ = case_inputs("structured_causal", 1)
        want = dense_topk(q, k, w, topk, mask)
        summary = {}
        for name, given in (("default", None), ("certified", config)):
            stats = TopkStats()
            got = compiler.certified_topk_cp(q, k, w, topk, mask, key_offset=0, config=given, stats=stats)
            assert_identical(got, want, name)
            summary[name] = (stats.summary(), stats.pruned_frac)
        (default, default_pruned), (certified, certified_pruned) = summary["default"], summary["certified"]
        assert default["fallbacks"]["dense_cheaper"] == q.shape[0] * q.shape[1] and default_pruned == 0.0
        assert certified["fallbacks"]["dense_cheaper"] == 0 and certified_pruned > 0.3
    finally:
        dist.destroy_process_group()


def test_a_topk_whose_exchange_cannot_fit_is_refused_by_name_before_any_collective(tmp_path):
    """The single-device op caps topk at T; a rank learns T only in the exchange, which is padded to topk."""
    import compiler

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        q, k, w = torch.zeros(1, 2, 2, 4), torch.zeros(1, 5, 4), torch.zeros(1, 2, 2)
        with pytest.raises(ValueError, match=r"topk: B=1, S=2, topk=1099511627776, R=1 ranks need about .* "
                                             r"pass topk <= T"):
            compiler.certified_topk_cp(q, k, w, 2**40, key_offset=0)
        assert compiler.certified_topk_cp(q, k, w, 7, key_offset=0)[1].shape == (1, 2, 5)
    finally:
        dist.destroy_process_group()

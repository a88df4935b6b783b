"""Call time: the path of one certified top-K call and the runtime guard (its state machine on
given times, and the real op on the CPU)."""
import torch

from compiler import defaults
from compiler.cost_model import default_min_keys
from compiler.ops.guard import GUARD, GuardBucket, call_path, guard_ladder
from compiler.ops.stats import TOPK_STATS
from compiler.topk_settings import TopkSettings
from runtime.certified_topk import CertifiedTopkConfig
from runtime.dense_scorer import dense_topk


def test_call_time_path_obeys_a_forced_choice_and_dispatches_auto_on_static_sizes():
    GUARD.reset()
    common = dict(layer="call", device=torch.device("cpu"), H=64, D=128, kk=2048)
    assert call_path(TopkSettings("dense"), B=1, S=4096, T=2**20, **common).path == "dense"
    assert call_path(TopkSettings("certified"), B=1, S=1, T=100, **common).path == "certified"
    auto = TopkSettings("auto", min_keys=50000)
    assert call_path(auto, B=1, S=4096, T=40000, **common).path == "dense"          # below min_keys
    assert call_path(auto, B=1, S=16, T=2**20, **common).path == "dense"            # too few queries
    assert call_path(TopkSettings("auto", min_keys=0), B=1, S=4096, T=2048, **common).path == "dense"  # kk >= T
    ticket = call_path(auto, B=1, S=4096, T=2**20, **common)
    assert ticket.path == "certified" and ticket.min_keys == 50000  # the guard's warm-up; the rounds' crossover
    assert GUARD.summaries()["call"][0]["certified_calls"] == 1
    unplanned = call_path(TopkSettings("auto"), B=1, S=2**20, T=2**20, **common)
    assert unplanned.min_keys == default_min_keys(64, 128, 2048, None, "cpu")  # a prefill's modelled crossover
    assert call_path(TopkSettings("certified"), B=1, S=4096, T=2**20, **common).min_keys is None
    GUARD.reset()


def run(bucket, path, ms=None):
    """Take the bucket's next path (it must be ``path``) and, when measured, record ``ms``."""
    got, measured = bucket.next_path()
    assert got == path
    bucket.issued(got, measured)
    if measured and ms is not None:
        bucket.record(got, ms)
    return measured


def test_guard_warms_up_then_measures_both_paths_and_keeps_the_faster():
    bucket = GuardBucket()
    assert run(bucket, "certified") is False  # warm-up, not measured
    assert run(bucket, "dense", 60.0) is False  # the dense path's warm-up (it compiles too): not measured
    run(bucket, "dense", 10.0)
    run(bucket, "certified", 6.0)
    assert bucket.favoured == "certified"
    for _ in range(5):
        run(bucket, "certified", 6.5)
    run(bucket, "certified", 12.0)  # one slow call: the better of the last two still wins
    assert bucket.favoured == "certified"
    run(bucket, "certified", 11.0)  # two: the layer goes dense
    assert bucket.favoured == "dense"
    assert bucket.summary()["path"] == "dense" and bucket.capture_path() == "dense"


def test_guard_retries_a_losing_certified_path_with_a_doubling_wait():
    bucket = GuardBucket()
    run(bucket, "certified")
    run(bucket, "dense")
    run(bucket, "dense", 10.0)
    run(bucket, "certified", 30.0)
    assert bucket.favoured == "dense"
    for wait in (defaults.RETRY_FIRST, 2 * defaults.RETRY_FIRST, 4 * defaults.RETRY_FIRST):
        for _ in range(wait):
            run(bucket, "dense", 10.0)
        run(bucket, "certified", 30.0)  # the retry loses again
        assert bucket.favoured == "dense" and bucket.backoff == 2 * wait
    for _ in range(8 * defaults.RETRY_FIRST):
        run(bucket, "dense", 10.0)
    run(bucket, "certified", 4.0)  # the input changed: certified wins again
    assert bucket.favoured == "certified" and bucket.backoff == defaults.RETRY_FIRST and bucket.retries == 4


def test_guard_waits_on_the_safe_path_while_measurements_are_in_flight():
    bucket = GuardBucket()
    run(bucket, "certified")
    assert run(bucket, "dense") is False  # warm-up
    run(bucket, "dense")  # measured, not yet read
    run(bucket, "certified")  # measured, not yet read
    assert run(bucket, "dense") and bucket.favoured is None and bucket.capture_path() == "certified"
    bucket.record("dense", 10.0)
    bucket.record("certified", 5.0)
    assert bucket.favoured == "certified" and bucket.next_path() == ("certified", True)


def test_guard_goes_dense_on_the_counters_of_a_certified_call_that_cannot_have_won():
    bucket = GuardBucket()
    run(bucket, "certified")
    bucket.record("certified", None, (0.5, 0.1))  # the warm-up could have won: wait for the times
    assert bucket.favoured is None
    bucket.record("certified", None, (0.97, 0.0))  # refined nearly every key: lost
    assert bucket.favoured == "dense" and bucket.sure_losses == 1
    assert bucket.next_path() == ("dense", False)  # the dense path's warm-up, counted among the wait's calls
    run(bucket, "dense")
    for _ in range(defaults.RETRY_FIRST - 1):
        run(bucket, "dense", 10.0)
    assert bucket.next_path() == ("certified", True)
    bucket.issued("certified", True)
    bucket.record("certified", 4.0, (0.1, 0.8))  # fast, but most queries redone densely: lost, once
    assert bucket.favoured == "dense" and bucket.backoff == 2 * defaults.RETRY_FIRST and bucket.sure_losses == 2


def test_guard_climbs_its_rungs_while_certified_loses_and_keeps_the_first_that_wins():
    bucket = GuardBucket(ladder=guard_ladder(TopkSettings()))
    run(bucket, "certified")
    run(bucket, "dense")
    run(bucket, "dense", 10.0)
    run(bucket, "certified", 30.0)  # rung 0 lost: the next rung, undecided
    assert (bucket.rung, bucket.favoured) == (1, None)
    assert run(bucket, "certified", 1.0) is False  # rung 1's warm-up: compiles, its time means nothing
    run(bucket, "certified", 20.0)
    assert (bucket.rung, bucket.favoured) == (2, None)
    run(bucket, "certified")
    run(bucket, "certified", 6.0)
    assert (bucket.rung, bucket.favoured) == (2, "certified") and bucket.summary()["rung"] == 2
    assert bucket.dense_calls == 2  # the dense path was measured once, for every rung


def test_guard_goes_dense_once_every_rung_lost_and_retries_the_fastest():
    bucket = GuardBucket(ladder=guard_ladder(TopkSettings()))
    run(bucket, "certified")
    run(bucket, "dense")
    run(bucket, "dense", 10.0)
    for rung, ms in enumerate((30.0, 15.0, 20.0)):
        assert bucket.rung == rung
        if rung:
            run(bucket, "certified")  # the rung's warm-up
        run(bucket, "certified", ms)
    assert (bucket.favoured, bucket.rung, bucket.backoff) == ("dense", 1, defaults.RETRY_FIRST)
    for _ in range(defaults.RETRY_FIRST):
        run(bucket, "dense", 10.0)
    run(bucket, "certified", 12.0)  # the retry, on rung 1: lost again, no rung left to climb
    assert (bucket.favoured, bucket.rung, bucket.backoff) == ("dense", 1, 2 * defaults.RETRY_FIRST)


def test_guard_ignores_a_rung_it_has_left_and_climbs_on_a_warm_up_that_cannot_have_won():
    bucket = GuardBucket(ladder=guard_ladder(TopkSettings())[:2])
    run(bucket, "certified")
    run(bucket, "dense")
    bucket.issued("certified", True)  # rung 0 timed, still in flight
    bucket.record("certified", None, (0.97, 0.0), rung=0)  # the warm-up's counters: a sure loss
    assert (bucket.rung, bucket.favoured, bucket.sure_losses) == (1, None, 1)
    bucket.record("certified", 1.0, (0.1, 0.0), rung=0)  # rung 0's timed call lands late: ignored
    assert bucket.certified_ms is None and bucket.pending["certified"] == 0
    assert bucket.next_path() == ("certified", False)  # rung 1's warm-up


def test_the_guard_ladder_is_for_layers_that_leave_the_budget_to_the_defaults():
    auto = TopkSettings("auto", min_keys=100)
    ladder = guard_ladder(auto)
    assert ladder[0] == auto and len(ladder) == 1 + len(defaults.GUARD_LADDER)
    assert [(s.r, s.list_queries, s.witnesses, s.min_keys) for s in ladder[1:]] == [
        (r, g, wit, 100) for r, g, wit in defaults.GUARD_LADDER]
    for planned in (TopkSettings("auto", r=15), TopkSettings("auto", list_queries=1), TopkSettings("auto", witnesses=True)):
        assert guard_ladder(planned) == (planned,)


def test_the_op_runs_each_rung_s_settings_and_climbs_on_sure_losses(monkeypatch):
    """A layer left to the defaults (CPU reference, SURE_LOSS_SURVIVAL lowered so that the
    defaults' 5% survival on this input is a sure loss): its warm-up loses on its counters, and so
    do the ladder's rungs (no witnesses: most queries redone), so the certified calls run r = None,
    15 and 31 with the rungs' list sizes and witnesses, one each, then every call is dense; every
    answer is the dense one."""
    from compiler.ops.certified_topk import _reference_kernel, _run

    GUARD.reset()
    TOPK_STATS.reset()
    monkeypatch.setattr(defaults, "GUARD_LADDER", ((15, 2, False), (31, 2, False)))
    monkeypatch.setattr(defaults, "SURE_LOSS_SURVIVAL", 0.01)
    certified = []

    def reference(a, kk, config, stats, min_keys):
        if config.path == "certified":
            certified.append((config.r, config.list_queries, config.witnesses))
        return _reference_kernel(a, kk, config, stats, min_keys)

    g = torch.Generator().manual_seed(1)
    q, k, w = torch.randn(1, 64, 64, 16, generator=g), torch.randn(1, 2048, 16, generator=g), torch.rand(1, 64, 64, generator=g)
    want = dense_topk(q, k, w, 32)
    for _ in range(6):
        got = _run(reference, (q, k, w, 32), {"layer": "ladder", "min_keys": 0})
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    default_witnesses = CertifiedTopkConfig().witnesses
    assert certified == [(None, None, default_witnesses), (15, 2, False), (31, 2, False)]
    (state,) = GUARD.summaries()["ladder"]
    assert (state["path"], state["sure_losses"], state["dense_calls"]) == ("dense", 3, 3)
    assert (state["rung"], state["r"], state["list_queries"], state["witnesses"]) == (2, 31, 2, False)
    GUARD.reset()
    TOPK_STATS.reset()


def test_the_op_on_an_input_that_does_not_prune_goes_dense_after_its_first_call():
    """16 positive heads of random directions and one retained (r=1): the bound of the 15 others
    is loose, so the first (warm-up) certified call of the CPU reference refines nearly every key
    and its counters alone send the layer dense; the retry after defaults.RETRY_FIRST dense calls loses the
    same way and doubles the wait."""
    GUARD.reset()
    TOPK_STATS.reset()
    g = torch.Generator().manual_seed(0)
    q, k, w = torch.randn(1, 64, 16, 16, generator=g), torch.randn(1, 4096, 16, generator=g), torch.rand(1, 64, 16, generator=g)
    want = dense_topk(q, k, w, 32)
    calls = 1 + defaults.RETRY_FIRST + 1 + 2
    for _ in range(calls):
        got = torch.ops.pulsar_dosa.certified_topk(q, k, w, 32, layer="random", r=1, min_keys=0)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    (state,) = GUARD.summaries()["random"]
    assert state["path"] == "dense" and state["retries"] == 1 and state["next_retry_after"] == 2 * defaults.RETRY_FIRST
    assert (state["certified_calls"], state["dense_calls"], state["sure_losses"]) == (2, calls - 2, 2)
    assert state["dense_ms_per_Gpair"] > 0
    summary = TOPK_STATS.summaries()["random"]
    assert summary["fallbacks"]["dense_cheaper"] == 64 * (calls - 2) and summary["queries"] == 64 * calls
    GUARD.reset()
    TOPK_STATS.reset()


def test_an_auto_calls_crossover_reaches_the_cuda_kernel_whose_short_rounds_run_dense(monkeypatch):
    """The op's CUDA kernel (on CPU tensors under TRITON_INTERPRET=1) in rounds of 16 of 32 causal
    queries over 272 keys (rows see 241..272 keys): min_keys 260 reaches the kernel through the
    guard's ticket, which runs the first round dense (its 16 queries counted dense cheaper) and
    certifies the second; the answer is the dense one."""
    from compiler.lowering import defaults as kernel_defaults
    from compiler.lowering.topk_pipeline import certified_query_bytes, dense_topk_cuda
    from compiler.ops.certified_topk import _cuda_kernel, _run
    from runtime.certified_topk import CertifiedTopkConfig
    from runtime.indexer_zoo import zoo_inputs

    GUARD.reset()
    TOPK_STATS.reset()
    S, T, kk = 32, 272, 16
    q, k, w, _ = zoo_inputs("misaligned_runs", 1, S, T, 8, 32, seed=2, dtype=torch.bfloat16)
    mask = torch.ones(S, T, dtype=torch.bool).tril(T - S)[None]
    config = CertifiedTopkConfig(list_queries=2)
    monkeypatch.setattr(kernel_defaults, "CERTIFIED_CHUNK_QUERIES", 16)
    monkeypatch.setattr(kernel_defaults, "CERTIFIED_CHUNK_BYTES", 16 * certified_query_bytes(1, T, 8, kk, config) + 1)
    got = _run(_cuda_kernel, (q, k, w, kk, mask), {"layer": "rounds", "min_keys": 260, "list_queries": 2})
    assert GUARD.summaries()["rounds"][0]["certified_calls"] == 1  # the guard's warm-up: a certified call
    summary = TOPK_STATS.summaries()["rounds"]
    assert summary["queries"] == S and summary["fallbacks"]["dense_cheaper"] == 16
    want = dense_topk_cuda(q, k, w, kk, mask)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    GUARD.reset()
    TOPK_STATS.reset()


class _Indexer(torch.nn.Module):
    def forward(self, q, k, w):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k))
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).topk(4, dim=-1).indices


def test_explain_reports_the_guard_of_every_guarded_layer():
    import compiler
    from compiler.plan.schema import LayerPlan, Plan
    from compiler.cost_model import CPU_REFERENCE

    entry = LayerPlan(layer="", settings=TopkSettings("auto", 3, 8), heads=8, head_dim=16, topk=4,
                      predicted_pruned_frac=0.5, predicted_speedup=1.5, reason="tests", dense_ms=None,
                      calibration_calls=(), candidates=(), seed_gap=None, slack=None)
    plan = Plan(model={}, inputs={}, design_length=64, queries=None, constants=CPU_REFERENCE, layers=(entry,))
    g = torch.Generator().manual_seed(0)
    args = torch.randn(1, 40, 8, 16, generator=g), torch.randn(1, 64, 16, generator=g), torch.randn(1, 40, 8, generator=g)
    report = compiler.explain(_Indexer(), *args, options={"downstream": "eager", "stock_below": 0, "plan": plan})
    (rewrite,) = report.rewrites
    assert (rewrite.path, rewrite.r, rewrite.details["min_keys"]) == ("auto", 3, 8)
    (state,) = report.guard[""]
    assert (state["certified_calls"], state["dense_calls"], state["path"]) == (1, 0, "undecided")
    assert "runtime guard" in str(report) and "undecided" in str(report)

"""Launch configs of the DSA indexer kernels (interpreter, tiny sizes): the screen may use any of its
candidates without changing the survivor sets or the pipeline's output; the scorer always runs with
its one fixed config (the refine its own, of the same head-sum order); a candidate that cannot
launch is skipped; survivor words compact to their
keys in ascending order."""
import contextlib

import pytest
import torch
from triton.runtime.errors import InterpreterError

from compiler.lowering import defaults
import compiler.lowering.scoring.indexer_scores as score_mod
from compiler.autotune import LaunchConfig, launchable_configs
from compiler.lowering.topk_pipeline import (
    certified_topk_cuda,
    dense_topk_cuda,
)
from compiler.lowering.screen.certificate_screen import (
    choose_screen_config,
    compact_words,
    screen,
    split_form,
)
from runtime.certified_topk import CertifiedTopkConfig
from runtime.rounding import key_norm_up, round_up_to_float32
from runtime.structured_indexer import structured_indexer_inputs

CERTIFIED = CertifiedTopkConfig(path="certified", anchor_stride=16, workspace_frac=0.1)
KK = 32


@pytest.fixture(scope="module")
def inputs():
    S, T = 16, 1024
    q, k, w, _ = structured_indexer_inputs(1, S, T, 4, 16, positive_heads=1, dtype=torch.bfloat16)
    mask = torch.ones(S, T, dtype=torch.bool).tril(T - S)[None]
    return q, k, w, mask


@contextlib.contextmanager
def scorer_launch_configs(seen):
    """Inside: the key-list scorer (seeds, refine, redo) is a spy that adds the (COMPACT, BLOCK_T,
    warps, stages) of every launch to ``seen`` (COMPACT: the refine)."""
    kernel = score_mod._indexer_score_kernel

    class Spy:
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                seen.add((kwargs["COMPACT"], kwargs["BLOCK_T"], kwargs["num_warps"], kwargs["num_stages"]))
                return kernel[grid](*args, **kwargs)
            return run

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(score_mod, "_indexer_score_kernel", Spy())
        yield


@pytest.fixture(scope="module")
def traced(inputs):
    """The dense answer, one certified call with the first screen candidate (the interpreter's
    choice) and its trace, and the scorer launch configs that call used: shared by the tests that
    read the trace's plan and threshold and by the scorer config test."""
    q, k, w, mask = inputs
    trace, seen = [], set()
    with scorer_launch_configs(seen):
        out = certified_topk_cuda(q, k, w, KK, mask, config=CERTIFIED, trace=trace, screen_config=defaults.SCREEN_CONFIGS[0])
    return dense_topk_cuda(q, k, w, KK, mask), out, trace[0], seen


@pytest.fixture(scope="module")
def per_tile(inputs, traced):
    """The whole certified op once with the first screen candidate of each other key tile
    (BLOCK_T 64: defaults.SCREEN_CONFIGS[1], 256: defaults.SCREEN_CONFIGS[2]), under the scorer spy: BLOCK_T ->
    (screen config, output, the scorer launch configs seen). Shared by the every-config test (the
    answers) and the scorer config test (the launches)."""
    q, k, w, mask = inputs
    calls, tiles = {}, {dict(defaults.SCREEN_CONFIGS[0].meta)["BLOCK_T"]}
    for config in defaults.SCREEN_CONFIGS:
        tile = dict(config.meta)["BLOCK_T"]
        if tile not in tiles:
            tiles.add(tile)
            seen = set()
            with scorer_launch_configs(seen):
                calls[tile] = config, certified_topk_cuda(q, k, w, KK, mask, config=CERTIFIED, screen_config=config), seen
    return calls


def survivor_sets(ids, count):
    return [set(ids[0, i, : count[0, i]].tolist()) for i in range(ids.shape[1])]


def assert_same(a, b):
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0, equal_nan=True)
    assert torch.equal(a[1], b[1])


def test_screen_candidates_are_distinct_and_vary_only_tile_warps_and_stages():
    assert 3 <= len(defaults.SCREEN_CONFIGS) <= 6 and len(set(defaults.SCREEN_CONFIGS)) == len(defaults.SCREEN_CONFIGS)
    for config in defaults.SCREEN_CONFIGS:
        assert set(config.kwargs()) == {"BLOCK_T", "num_warps", "num_stages"}


def test_screen_takes_the_first_candidate_under_the_interpreter_without_launching(inputs):
    _, k, _, _ = inputs

    def launch(config):
        raise AssertionError("no candidate is launched under the interpreter")

    assert choose_screen_config(launch, k, 1, 4, 8, work=1 << 40) == defaults.SCREEN_CONFIGS[0]


def test_every_screen_config_gives_the_same_survivor_sets_and_the_dense_output(inputs, traced, per_tile):
    _, k, _, mask = inputs
    dense, out, tr, _ = traced
    assert_same(out, dense)  # the whole op with the first candidate
    p = tr.plan
    nk = round_up_to_float32(key_norm_up(k.float()))
    sets = []
    for config in defaults.SCREEN_CONFIGS:
        ids, count = screen(p.g, p.alpha, p.beta, p.e, p.c, tr.tau, k, nk, mask=mask,
                            lists_per_batch=tr.list_count.shape[1], list_queries=tr.list_queries,
                            cap=tr.cap, config=config)
        assert torch.equal(count, tr.list_count), config
        sets.append(survivor_sets(ids, count))
    assert all(s == sets[0] for s in sets[1:])
    # the whole op once per key tile (same survivor sets: same answer)
    first_tile = dict(defaults.SCREEN_CONFIGS[0].meta)["BLOCK_T"]
    assert sorted(per_tile) == sorted({dict(c.meta)["BLOCK_T"] for c in defaults.SCREEN_CONFIGS} - {first_tile})
    for _, got, _ in per_tile.values():
        assert_same(got, dense)
    assert max(len(s) for s in sets[0]) < k.shape[1]  # the screen pruned something


def test_a_screen_candidate_that_fails_to_launch_is_skipped(inputs, traced):
    q, k, w, mask = inputs
    tr = traced[2]
    p = tr.plan
    nk = round_up_to_float32(key_norm_up(k.float()))
    broken = LaunchConfig.of(num_warps=4, num_stages=2, BLOCK_T=48)  # not a multiple of 32
    launched = []

    def launch(config):
        screen(p.g, p.alpha, p.beta, p.e, p.c, tr.tau, k, nk, mask=mask,
               lists_per_batch=tr.list_count.shape[1], list_queries=tr.list_queries, cap=tr.cap,
               config=config)
        launched.append(config)

    assert launchable_configs([broken, defaults.SCREEN_CONFIGS[0]], launch) == (defaults.SCREEN_CONFIGS[0],)
    assert launched == [defaults.SCREEN_CONFIGS[0]]
    with pytest.raises(InterpreterError, match="multiple of 32"):
        launchable_configs([broken], launch)


def test_the_scorer_launches_with_its_one_config_on_every_path(inputs, traced, per_tile):
    """The certified calls with the first screen candidate (``traced``) and with the first of each
    other key tile (``per_tile``, defaults.SCREEN_CONFIGS[1] among them) launch the key-list scorer
    with its one config for the seeds and the redo, the refine's for the refine, and give the dense
    answer."""
    q = inputs[0]
    dense, out, _, seen = traced
    seen = set(seen)
    assert defaults.SCREEN_CONFIGS[1] in [config for config, _, _ in per_tile.values()]
    assert_same(out, dense)
    for _, got, launched in per_tile.values():
        assert_same(got, dense)
        seen |= launched
    fixed = score_mod.scorer_config(q.dtype).kwargs()
    refine = score_mod.scorer_config(q.dtype, refine=True, device=q.device).kwargs()
    assert refine == defaults.REFINE_CONFIG.kwargs() != fixed  # the interpreter takes the refine's own
    assert refine["num_warps"] == fixed["num_warps"] == 4 and refine["BLOCK_T"] % 64 == fixed["BLOCK_T"] % 64 == 0
    assert seen == {(False, fixed["BLOCK_T"], fixed["num_warps"], fixed["num_stages"]),
                    (True, refine["BLOCK_T"], refine["num_warps"], refine["num_stages"])}


@pytest.mark.parametrize("density", [0.0, 0.05, 0.5, 1.0])
def test_survivor_words_compact_to_their_keys_in_order(density):
    """Every set bit (bit 31 included) gives its key 32 i + j, ascending, up to cap; count is the
    bit count, past cap for an overflowed list; several blocks of words per list."""
    gen = torch.Generator().manual_seed(int(density * 100))
    B, L, T, cap = 2, 3, 32 * 3 * defaults.SURVIVOR_WORDS + 17, 200
    bits = torch.rand(B, L, T, generator=gen) < density
    padded = torch.zeros(B, L, -(-T // 32) * 32, dtype=torch.bool)
    padded[..., :T] = bits
    weights = torch.tensor([1 << j for j in range(32)], dtype=torch.int64)
    words = (padded.view(B, L, -1, 32).long() * weights).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    ids, count = compact_words(words, cap)
    for b in range(B):
        for lst in range(L):
            keys = bits[b, lst].nonzero().flatten()
            assert int(count[b, lst]) == keys.numel()
            n = min(cap, keys.numel())
            assert torch.equal(ids[b, lst, :n].long(), keys[:n])


@pytest.mark.parametrize("lists", ["traced", 1])
@pytest.mark.parametrize("additive", [False, True])
@pytest.mark.parametrize("threshold", ["traced", "none"])
def test_clear_and_hidden_key_tiles_give_the_survivors_of_reading_the_whole_mask(inputs, traced, additive, threshold,
                                                                                 lists, monkeypatch):
    """A mask with a clear prefix, holes (and biases) in the middle and a hidden suffix that
    differ per row: the screen that skips the mask on clear tiles and the keys on hidden ones (the
    split form, forced at every list size) keeps the same survivors as one told by its bounds that
    every tile is masked, and at lists of one query as the unsplit form (the one that list size
    runs); with no threshold (tau = -inf) a list's survivors are exactly the keys visible to one of
    its queries."""
    import compiler.lowering.screen.certificate_screen as screen_mod

    _, k, _, base = inputs
    _, _, tr, _ = traced
    p = tr.plan
    S, T = base.shape[1:]
    G = tr.list_queries if lists == "traced" else lists
    gen = torch.Generator().manual_seed(5)
    key = torch.arange(T)
    holes = (torch.rand(S, T, generator=gen) < 0.7) & (key >= 300)  # clear below key 300
    end = 500 + 19 * torch.arange(S)[:, None]  # hidden from end on: no row sees a whole last tile
    visible = base[0] & ~holes & (key < end)
    if additive:
        bias = torch.where(key >= 300, torch.randn(S, T, generator=gen) * 0.1, 0.0)
        mask = torch.where(visible, bias, float("-inf"))[None]
    else:
        mask = visible[None]
    nk = round_up_to_float32(key_norm_up(k.float()))
    tau = tr.tau if threshold == "traced" else torch.full_like(tr.tau, float("-inf"))

    def run():
        return screen(p.g, p.alpha, p.beta, p.e, p.c, tau, k, nk, mask=mask,
                      lists_per_batch=-(-S // G), list_queries=G, cap=T, config=defaults.SCREEN_CONFIGS[1])

    monkeypatch.setattr(defaults, "SCREEN_SPLIT_LIST_QUERIES", 1)
    ids, count = run()
    if threshold == "none":
        assert survivor_sets(ids, count) == [set(visible[i * G:(i + 1) * G].any(0).nonzero().flatten().tolist())
                                             for i in range(count.shape[1])]
    if G == 1:
        monkeypatch.setattr(defaults, "SCREEN_SPLIT_LIST_QUERIES", 2)
    else:
        everything_masked = lambda m, B, S_, T_: torch.tensor([0, T_], dtype=torch.int32).expand(B, S_, 2).contiguous()  # noqa: E731
        monkeypatch.setattr(screen_mod, "mask_bounds", everything_masked)
    ids_all, count_all = run()
    assert torch.equal(count, count_all)
    assert survivor_sets(ids, count) == survivor_sets(ids_all, count_all)
    assert 0 < int(count.min()) and int(count.max()) < T  # some keys survive, some do not


def test_the_split_form_serves_lists_of_several_queries_and_masked_prefills():
    """Lists of 2+ queries split key tiles by the mask bounds; a single-query list only in a masked
    call of at least T / SCREEN_SPLIT_PREFILL_FACTOR queries (a causal prefill hides about half its
    tiles), never without a mask or for a few queries at the end of many keys."""
    T = 131072
    assert split_form(2, 4096, T, True) and split_form(4, 1, T, False)
    assert split_form(1, T, T, True) and split_form(1, T // defaults.SCREEN_SPLIT_PREFILL_FACTOR, T, True)
    assert not split_form(1, T // defaults.SCREEN_SPLIT_PREFILL_FACTOR - 1, T, True)
    assert not split_form(1, 4096, T, True) and not split_form(1, T, T, False)


def test_a_refine_of_more_product_columns_than_refine_columns_takes_the_scorer_config(inputs, traced, monkeypatch):
    """Past defaults.REFINE_COLUMNS product columns a program (queries x heads) the refine launches
    with the scorer's own config, and the answer stays the dense one."""
    q, k, w, mask = inputs
    dense, _, tr, _ = traced
    columns = tr.list_queries * q.shape[2]
    monkeypatch.setattr(defaults, "REFINE_COLUMNS", columns - 1)
    seen = set()
    with scorer_launch_configs(seen):
        out = certified_topk_cuda(q, k, w, KK, mask, config=CERTIFIED, screen_config=defaults.SCREEN_CONFIGS[0])
    assert_same(out, dense)
    fixed = score_mod.scorer_config(q.dtype).kwargs()
    assert seen == {(c, fixed["BLOCK_T"], fixed["num_warps"], fixed["num_stages"]) for c in (False, True)}

"""Compile time (compiler.policy): each rewritten indexer layer's settings, and the calls too small
for the op that keep the stock subgraph: the threshold, its guard on symbolic sizes (one recompile
when a growing cache crosses it), the report, the CUDA-graph exception, and a decode step that
would re-expand a cached latent."""
import pytest
import torch

from compiler import defaults
from compiler.backend import pulsar_dosa, replays_cuda_graphs
from compiler.options import CompileOptions
from compiler.cost_model import default_min_keys
from compiler.policy import ALWAYS_STOCK, keeps_stock, layer_settings, stock_threshold
from compiler.report import collecting
from compiler.topk_settings import TopkSettings

H, D, TOPK = 4, 8, 3


class Indexer(torch.nn.Module):
    def forward(self, q, k, w):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k))
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).topk(TOPK, dim=-1).indices


def _inputs(S, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, S, H, D, generator=g), torch.randn(1, T, D, generator=g), torch.rand(1, S, H, generator=g)


def settings(plan=None, path="auto", **sizes):
    return layer_settings("layers.0", plan=plan, path=path, device_type="cuda",
                          **{**dict(heads=64, head_dim=128, topk=2048), **sizes})


def test_layer_settings_come_from_the_cost_model_or_the_options_and_say_so():
    default = settings()
    assert (default.topk.path, default.topk.r, default.source) == ("auto", None, "cost model")
    assert default.topk.min_keys == default_min_keys(64, 128, 2048, None, "cuda")
    assert settings(path="certified").topk == TopkSettings("certified")
    assert settings(path="dense").topk == TopkSettings("dense")
    symbolic = settings(heads=None)
    assert (symbolic.topk, symbolic.source) == (TopkSettings(), "runtime defaults")
    assert settings(heads=2).topk == TopkSettings("dense")
    with pytest.raises(ValueError, match="path"):
        settings(path="fast")
    assert default.report_fields() == {"path": "auto", "r": None, "min_keys": default.topk.min_keys,
                                       "list_queries": None, "witnesses": None, "predicted_pruned_frac": None,
                                       "settings_from": "cost model"}


def test_threshold_comes_from_the_option_else_the_device_unless_cuda_graphs_or_a_forced_op():
    default = CompileOptions()
    for kind in ("dsa_indexer", "sparse_attention"):
        assert stock_threshold(default, kind, "cuda", cuda_graphs=False) == defaults.STOCK_BELOW[kind]["cuda"] > 0
        assert stock_threshold(default, kind, "cuda", cuda_graphs=True) == 0
        for cuda_graphs in (False, True):  # no native kernels: the plain-torch reference never pays
            assert stock_threshold(default, kind, "cpu", cuda_graphs) == ALWAYS_STOCK
        assert stock_threshold(CompileOptions(stock_below=7), kind, "cuda", cuda_graphs=True) == 7
        assert stock_threshold(CompileOptions(stock_below=7), kind, "cpu", cuda_graphs=False) == 7
    forced = CompileOptions(path="dense")
    assert stock_threshold(forced, "dsa_indexer", "cuda", cuda_graphs=False) == 0
    assert stock_threshold(forced, "sparse_attention", "cuda", cuda_graphs=False) > 0


def test_an_fp8_indexer_precision_rewrites_every_indexer_call_and_nothing_else():
    """A stock indexer subgraph would score in the model's precision: under an fp8 precision the
    indexer's threshold is 0 on every device, whatever stock_below says; other families keep theirs."""
    for options in (CompileOptions(indexer_precision="fp8"), CompileOptions(indexer_precision="fp8_unrotated",
                                                                            stock_below=7)):
        for device in ("cpu", "cuda"):
            assert stock_threshold(options, "dsa_indexer", device, cuda_graphs=False) == 0
    assert stock_threshold(CompileOptions(indexer_precision="fp8", stock_below=7), "sparse_attention", "cpu",
                           cuda_graphs=False) == 7
    assert stock_threshold(CompileOptions(indexer_precision="fp8"), "sparse_attention", "cpu",
                           cuda_graphs=False) == ALWAYS_STOCK


def test_keeps_stock_below_the_threshold_only():
    assert "B*S*T*H = 63" in keeps_stock(64, 63)
    assert keeps_stock(64, 64) is None
    assert keeps_stock(0, 1) is None
    assert "plain-torch reference" in keeps_stock(ALWAYS_STOCK, 1 << 60)


def test_a_data_dependent_size_is_rewritten_without_a_guard():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    unbacked = env.create_unbacked_symint()
    assert keeps_stock(64, 4 * unbacked) is None and not env.guards


@pytest.mark.parametrize("value", [-1, True, 2.5, "big"])
def test_bad_stock_below_names_the_option(value):
    with pytest.raises(TypeError, match="'stock_below': expected None or an int >= 0"):
        CompileOptions.from_user({"stock_below": value})


def test_cuda_graph_modes_are_recognised():
    assert replays_cuda_graphs("inductor", "reduce-overhead")
    assert replays_cuda_graphs("inductor", "max-autotune")
    assert not replays_cuda_graphs("inductor", "max-autotune-no-cudagraphs")
    assert not replays_cuda_graphs("inductor", None)
    assert not replays_cuda_graphs("eager", "reduce-overhead")


def _ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_a_growing_cache_runs_stock_then_the_op_after_one_guarded_recompile():
    graphs = []

    def backend(gm, example_inputs):
        compiled = pulsar_dosa(gm, example_inputs, options={"downstream": "eager", "stock_below": S * H * 40})
        graphs.append(gm)
        return compiled

    S = 2
    torch._dynamo.reset()
    compiled = torch.compile(Indexer(), backend=backend, dynamic=True)
    with collecting() as report:
        for T in (16, 24, 39, 40, 64):  # products S*T*H: below 160*S*H up to T = 39
            q, k, w = _inputs(S, T, seed=T)
            got = compiled(q, k, w)
            want = Indexer()(q, k, w)
            assert torch.equal(got.sort(-1).values, want.sort(-1).values), T
    op = torch.ops.pulsar_dosa.certified_topk.default
    assert len(graphs) == 2, "one graph below the threshold, one above"
    assert op not in _ops(graphs[0]) and op in _ops(graphs[1])
    assert report.counters["dsa_indexer.declined"] == 1 and len(report.rewrites) == 1
    (miss,) = report.near_misses
    assert miss.reason.startswith("kept stock: B*S*T*H") and "stock_below" in miss.reason


@pytest.mark.parametrize("cache_kind", ["transformers", "latent"])
def test_a_decode_step_keeps_its_indexer_stock_and_reads_the_cached_latent_unexpanded(cache_kind):
    """Prefill of 40 tokens (1*40*41*H products and more) is rewritten. At decode (one query over
    T = 41, 42 keys) the indexer (1*1*T*H) stays stock; the sparse attention's stock subgraph would
    expand all T cached keys for every head at every step, T*Hq*(1 + E) products
    (``policy.latent_expansion_products``): it reads the latent instead wherever the cache holds it
    (a latent cache; transformers' own in releases after 5.17), so no step expands more than its
    own token. Over 5.17's cache of expanded rows there is no latent and it stays stock. The logits
    follow the uncompiled model throughout."""
    from transformers import DynamicCache

    from scripts.demo import build_model, tiny_config
    from compiler.latent_cache import latent_cache
    from compiler.passes.matcher import tensor_meta
    from runtime.pulsar import cache_keyword
    from tests.passes.test_cache_path import caches_expanded_rows

    model = build_model(tiny_config(layers=1, dense_layers=1), torch.float32)
    kw = cache_keyword(type(model))
    ids = torch.randint(0, 128, (1, 42), generator=torch.Generator().manual_seed(3))
    graphs = []

    def backend(gm, example_inputs):
        compiled = pulsar_dosa(gm, example_inputs, options={"downstream": "eager", "stock_below": 1000})
        graphs.append(gm)
        return compiled

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    ours = latent_cache(model) if cache_kind == "latent" else DynamicCache(config=model.config)
    theirs = DynamicCache(config=model.config)
    with collecting() as report, torch.no_grad():
        for start, stop in ((0, 40), (40, 41), (41, 42)):
            want = model(ids[:, start:stop], use_cache=True, **{kw: theirs}).logits
            got = compiled(ids[:, start:stop], use_cache=True, **{kw: ours}).logits
            torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    prefill = [r.kind for r in report.rewrites if r.compile_index == 0]
    assert sorted(prefill) == ["dsa_indexer", "dsa_mask", "sparse_attention"]
    decode = [r for r in report.rewrites if r.compile_index > 0]
    stock = [m for m in report.near_misses if m.reason.startswith("kept stock")]
    if cache_kind == "transformers" and caches_expanded_rows(model):
        assert {m.kind for m in stock} == {"dsa_indexer", "sparse_attention"} and not decode
        return
    assert {m.kind for m in stock} == {"dsa_indexer"}
    assert {(r.kind, r.path) for r in decode} == {("sparse_attention", "absorbed")}
    weight = "kv_b_proj"
    for gm in graphs[1:]:
        expansions = [n for n in gm.graph.nodes if n.op == "call_function" and len(n.args) > 1
                      and weight in getattr(n.args[1], "name", "")]
        assert all(tensor_meta(n.args[0]).shape[-2] == 1 for n in expansions), "a decode step expands the cache"
        assert "latent_cached_kv" not in {str(n.target) for n in gm.graph.nodes}


def test_reduce_overhead_mode_reaches_the_pass_and_rewrites_what_the_default_mode_keeps(monkeypatch):
    """With a device threshold above the call's size, the default mode keeps stock and
    mode="reduce-overhead" (CUDA graphs: the host cost is paid once) rewrites."""
    monkeypatch.setitem(defaults.STOCK_BELOW, "dsa_indexer", {"cpu": 1 << 30})
    q, k, w = _inputs(2, 16)
    rewritten = {}
    for mode in (None, "reduce-overhead"):
        torch._dynamo.reset()
        with collecting() as report:
            got = torch.compile(Indexer(), backend="pulsar_dosa", mode=mode)(q, k, w)
        assert torch.equal(got.sort(-1).values, Indexer()(q, k, w).sort(-1).values)
        rewritten[mode] = (len(report.rewrites), report.counters["dsa_indexer.declined"])
    assert rewritten == {None: (0, 1), "reduce-overhead": (1, 0)}

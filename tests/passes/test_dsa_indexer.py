"""The DSA indexer pass on a zoo of small modules: every spelling it must rewrite, every near miss
it must leave untouched (with its reason), and outputs equal to eager.

Inputs are random with positive head weights and kk well below T, so the kk-th score lies far
above 0 and above any pair of keys closer than rounding: the selected indices are then the same
for any correct top-K, and the compiled indices must equal eager's exactly. Values are the op's
(THE SCORER's fp32 sums), compared with eager's matmul sums within fp32 rounding (both round the
same real sum of H*D products; default float32 tolerances of ``assert_close``).
"""
import pytest
import torch
import torch.nn.functional as F

import compiler
from compiler.passes.dsa_indexer import PATTERN_VARIANTS

EAGER_OPS = {"downstream": "eager", "stock_below": 0}
"""Eager downstream, the ops on every call (on the CPU the backend otherwise keeps every stock subgraph)."""

B, S, T, H, D, KK = 2, 6, 24, 4, 8, 5
SCALE = D ** -0.5


def make_inputs(seed=0, T=T):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, D, generator=g)
    k = torch.randn(B, T, D, generator=g)
    w = torch.rand(B, S, H, generator=g) + 0.1
    visible = torch.rand(B, S, T, generator=g) > 0.2
    visible[..., :KK + 2] = True
    additive = torch.zeros(B, S, T).masked_fill(~visible, float("-inf"))
    return q, k, w, visible, additive


class TransformersStyle(torch.nn.Module):
    """DeepseekV32Indexer's spelling: matmul, scale before relu, matmul head weighting, additive mask."""

    def forward(self, q, k, w, mask):
        scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * SCALE
        scores = F.relu(scores)
        index_scores = torch.matmul((w.float() * H ** -0.5).unsqueeze(-2), scores).squeeze(-2)
        index_scores = index_scores + mask
        return index_scores.topk(min(KK, index_scores.shape[-1]), dim=-1).indices.to(torch.int32)


class EinsumMulSumBoolMask(torch.nn.Module):
    """einsum q·k, scale after relu, (relu * w[..., None]).sum(dim=2), masked_fill(~bool, -inf), values used."""

    def forward(self, q, k, w, visible):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k)) * SCALE
        s = (x * w[..., None]).sum(dim=2)
        s = s.masked_fill(~visible, float("-inf"))
        values, indices = torch.topk(s, KK)
        return values, indices


class EinsumOtherLayouts(torch.nn.Module):
    """q given head-major [B,H,S,D] and k as [B,D,T]; einsum head weighting; clamp_min; division scale."""

    def forward(self, q, k, w, visible):
        x = torch.einsum("zhyc,zcx->zyhx", q.transpose(1, 2), k.transpose(1, 2)) / 3.0
        s = torch.einsum("zyh,zyhx->zyx", w, x.clamp_min(0))
        return s.masked_fill(visible.logical_not(), float("-inf")).topk(KK, dim=2)[1]


class BmmNoMask(torch.nn.Module):
    """bmm after reshapes, clamp(min=0), no mask, negative scale before relu (folded into q)."""

    def forward(self, q, k, w):
        b, s, h, d = q.shape
        x = torch.bmm(q.reshape(b, s * h, d), k.transpose(1, 2)).view(b, s, h, -1)
        x = torch.clamp(x * -0.5, min=0)
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).topk(KK, dim=-1).indices


class CacheCat(torch.nn.Module):
    """k is a cache concatenated with new keys (just an input to the op)."""

    def forward(self, q, k_cache, k_new, w):
        k = torch.cat([k_cache, k_new], dim=1)
        x = F.relu(torch.matmul(q, k.transpose(-1, -2).unsqueeze(1)))
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).topk(KK, dim=-1).indices


REWRITTEN = {
    "transformers": (TransformersStyle, "additive", "qk_matmul+scale_pre_relu+heads_matmul+mask_add"),
    "einsum_mul_sum": (EinsumMulSumBoolMask, "bool", "qk_einsum+scale_post_relu+heads_mul_sum+mask_fill"),
    "einsum_layouts": (EinsumOtherLayouts, "bool", "qk_einsum+scale_pre_relu+heads_einsum+mask_fill"),
    "bmm": (BmmNoMask, None, "qk_bmm+scale_pre_relu+heads_matmul+no_mask"),
}


def _args(mask_kind, seed=0):
    q, k, w, visible, additive = make_inputs(seed)
    if mask_kind is None:
        return (q, k, w)
    return (q, k, w, additive if mask_kind == "additive" else visible)


def _assert_same_selection(got, want):
    got = got if isinstance(got, tuple) else (None, got)
    want = want if isinstance(want, tuple) else (None, want)
    assert got[1].dtype == want[1].dtype
    assert torch.equal(got[1], want[1])
    if want[0] is not None:
        assert got[0].dtype == want[0].dtype == torch.float32
        torch.testing.assert_close(got[0], want[0])


@pytest.mark.parametrize("name", sorted(REWRITTEN))
def test_variant_is_rewritten_once_and_matches_eager(name):
    cls, mask_kind, variant = REWRITTEN[name]
    assert variant in PATTERN_VARIANTS
    args = _args(mask_kind)
    report = compiler.explain(cls(), *args, options=EAGER_OPS)
    assert [r.variant for r in report.rewrites] == [variant]
    assert report.near_misses == []
    assert report.counters[f"dsa_indexer.variant.{variant}"] == 1
    _assert_same_selection(report.output, cls()(*args))


def test_rewrite_records_operand_shapes_and_path():
    report = compiler.explain(TransformersStyle(), *_args("additive"),
                              options={**EAGER_OPS, "path": "dense"})
    (rw,) = report.rewrites
    assert rw.kind == "dsa_indexer" and rw.path == "dense" and rw.r is None
    assert rw.shapes == {"q": (str(B), str(S), str(H), str(D)), "k": (str(B), str(T), str(D)),
                         "weights": (str(B), str(S), str(H)), "mask": (str(B), str(S), str(T))}


def test_cache_cat_on_keys_is_an_input():
    q, k, w, _, _ = make_inputs(1)
    args = (q, k[:, :10], k[:, 10:], w)
    report = compiler.explain(CacheCat(), *args, options=EAGER_OPS)
    assert [r.variant for r in report.rewrites] == ["qk_matmul+no_scale+heads_matmul+no_mask"]
    assert torch.equal(report.output, CacheCat()(*args))


def test_dynamic_shapes_rewrite_once_and_serve_new_lengths():
    model = EinsumMulSumBoolMask()
    report = compiler.explain(model, *_args("bool"), options=EAGER_OPS, dynamic=True)
    assert len(report.rewrites) == 1
    for seed, t in ((3, 40), (4, 17)):
        q, k, w, visible, _ = make_inputs(seed, T=t)
        _assert_same_selection(report.compiled(q, k, w, visible), model(q, k, w, visible))
    assert len(report.rewrites) == 1 and len(report.compiles) == 1


def test_inductor_downstream_matches_eager():
    args = _args("additive", seed=5)
    report = compiler.explain(TransformersStyle(), *args, options={"stock_below": 0})
    assert len(report.rewrites) == 1
    assert torch.equal(report.output, TransformersStyle()(*args))


class NoRelu(torch.nn.Module):
    def forward(self, q, k, w):
        x = torch.matmul(q, k.transpose(-1, -2).unsqueeze(1))
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).topk(KK, dim=-1).indices


class SoftmaxInsteadOfRelu(torch.nn.Module):
    def forward(self, q, k, w):
        x = torch.softmax(torch.einsum("bshd,btd->bsht", q, k), dim=-1)
        return (x * w[..., None]).sum(dim=2).topk(KK, dim=-1).indices


class SumOverWrongDim(torch.nn.Module):
    def forward(self, q, k, w):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k))
        return (x * w[..., None]).sum(dim=1).topk(KK, dim=-1).indices


class TopkOverWrongDim(torch.nn.Module):
    def forward(self, q, k, w):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k))
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).topk(2, dim=1).indices


class SmallestK(torch.nn.Module):
    def forward(self, q, k, w):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k))
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).topk(KK, dim=-1, largest=False).indices


class IntermediateEscapes(torch.nn.Module):
    def forward(self, q, k, w):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k))
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).topk(KK, dim=-1).indices, x.mean()


NEAR_MISSES = {
    "no_relu": (NoRelu, "no relu between the q·k contraction and the head weighting"),
    "softmax": (SoftmaxInsteadOfRelu, "softmax instead of relu"),
    "sum_wrong_dim": (SumOverWrongDim, "sum over dim 1, expected the head dim 2"),
    "topk_wrong_dim": (TopkOverWrongDim, "topk over dim 1, expected the key dim"),
    "largest_false": (SmallestK, "largest=False"),
    "escapes": (IntermediateEscapes, "is used outside the matched region"),
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_near_miss_is_left_untouched_with_its_reason(name):
    cls, reason = NEAR_MISSES[name]
    args = _args(None, seed=2)
    report = compiler.explain(cls(), *args, options=EAGER_OPS)
    assert report.rewrites == []
    assert len(report.near_misses) == 1 and reason in report.near_misses[0].reason
    assert report.counters["dsa_indexer.near_miss"] == 1
    got, want = report.output, cls()(*args)
    for g, e in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(g, e)


class RouterLike(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(D, 8)

    def forward(self, x):
        return torch.topk(self.gate(x).sigmoid() + 0.1, 2, dim=-1).indices


def test_unrelated_topk_is_neither_rewritten_nor_a_near_miss():
    report = compiler.explain(RouterLike(), torch.randn(3, D), options=EAGER_OPS)
    assert report.rewrites == [] and report.near_misses == []
    assert report.counters["dsa_indexer.not_candidate"] == 1


def test_disabled_pass_family_rewrites_nothing():
    report = compiler.explain(TransformersStyle(), *_args("additive"), options={**EAGER_OPS, "passes": []})
    assert report.rewrites == [] and report.pass_times == []


class NarrowedScores(torch.nn.Module):
    def forward(self, q, k, w):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k))
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).half().topk(KK, dim=-1).indices


class BroadcastCausalMask(torch.nn.Module):
    """A causal mask built by comparison, [1,S,T] against [B,S,T] scores (position ids shared by the batch)."""

    def forward(self, q, k, w, position_ids):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k))
        s = torch.matmul(w.unsqueeze(-2), x).squeeze(-2)
        future = torch.arange(s.shape[-1])[None, None, :] > position_ids[:, :, None]
        return s.masked_fill(future, float("-inf")).topk(KK, dim=-1).indices


def test_narrowing_cast_is_a_near_miss():
    q, k, w, _, _ = make_inputs(6)
    report = compiler.explain(NarrowedScores(), q, k, w, options=EAGER_OPS)
    assert report.rewrites == []
    assert "cast of the scores from torch.float32 to torch.float16" in report.near_misses[0].reason
    assert torch.equal(report.output, NarrowedScores()(q, k, w))


@pytest.mark.parametrize("dynamic", [False, True])
def test_broadcast_mask_is_expanded_for_the_op(dynamic):
    q, k, w, _, _ = make_inputs(8)
    position_ids = torch.arange(T - S, T)[None]
    report = compiler.explain(BroadcastCausalMask(), q, k, w, position_ids, options=EAGER_OPS,
                              dynamic=dynamic)
    assert [r.variant for r in report.rewrites] == ["qk_einsum+no_scale+heads_matmul+mask_fill"]
    assert report.rewrites[0].shapes["mask"] == report.rewrites[0].shapes["k"][:1] + (
        report.rewrites[0].shapes["q"][1], report.rewrites[0].shapes["k"][1])
    assert torch.equal(report.output, BroadcastCausalMask()(q, k, w, position_ids))


class HiddenMaskNotInverted(torch.nn.Module):
    """masked_fill(hidden, -inf) with hidden = True where masked: the pass passes logical_not(hidden)."""

    def forward(self, q, k, w, hidden):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k))
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).masked_fill(hidden, float("-inf")).topk(KK, dim=-1)


def test_masked_fill_with_a_hidden_mask_is_inverted_for_the_op():
    q, k, w, visible, _ = make_inputs(7)
    args = (q, k, w, ~visible)
    report = compiler.explain(HiddenMaskNotInverted(), *args, options=EAGER_OPS)
    assert [r.variant for r in report.rewrites] == ["qk_einsum+no_scale+heads_matmul+mask_fill"]
    _assert_same_selection(tuple(report.output), tuple(HiddenMaskNotInverted()(*args)))


class LowestFill(torch.nn.Module):
    """masked_fill with torch.finfo(float32).min, as some DSA variants write it."""

    def __init__(self, values_too=False):
        super().__init__()
        self.values_too = values_too

    def forward(self, q, k, w, visible):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k))
        s = torch.matmul(w.unsqueeze(-2), x).squeeze(-2).masked_fill(~visible, torch.finfo(torch.float32).min)
        top = s.topk(KK, dim=-1)
        return (top.values, top.indices) if self.values_too else top.indices


def test_lowest_finite_fill_is_rewritten_only_when_values_are_unused():
    q, k, w, visible, _ = make_inputs(9)
    report = compiler.explain(LowestFill(), q, k, w, visible, options=EAGER_OPS)
    assert [r.variant for r in report.rewrites] == ["qk_einsum+no_scale+heads_matmul+mask_fill"]
    assert torch.equal(report.output, LowestFill()(q, k, w, visible))
    report = compiler.explain(LowestFill(values_too=True), q, k, w, visible, options=EAGER_OPS)
    assert report.rewrites == [] and "values used" in report.near_misses[0].reason



def rewritten_graph(model, *args, options=EAGER_OPS, dynamic=False, **kwargs):
    """(the graph the backend rewrote, its one certified_topk node, the compiled output of
    ``model(*args, **kwargs)``): backend "pulsar_dosa" with ``options``, one graph."""
    from compiler.backend import pulsar_dosa

    graphs = []

    def backend(gm, example_inputs):
        compiled = pulsar_dosa(gm, example_inputs, options=options)
        graphs.append(gm.graph)
        return compiled

    torch._dynamo.reset()
    out = torch.compile(model, backend=backend, fullgraph=True, dynamic=dynamic)(*args, **kwargs)
    (graph,) = graphs
    (op,) = [n for n in graph.nodes if n.target is torch.ops.pulsar_dosa.certified_topk.default]
    return graph, op, out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_upcast_operands_reach_the_op_in_their_own_dtype(dtype):
    """transformers upcasts bf16 q and k with .float() before the q·k matmul: the op gets the bf16
    tensors (exact products, tensor cores on CUDA), the fp32 casts are gone, and the output is the
    same as with fp32 operands (the CPU op upcasts exactly)."""
    q, k, w, _, additive = make_inputs(seed=5)
    q, k = q.to(dtype), k.to(dtype)
    model = TransformersStyle()
    graph, op, out = rewritten_graph(model, q, k, w, additive)
    assert [a.meta["example_value"].dtype for a in op.args[:2]] == [dtype, dtype]
    casts = [n.args[0].meta["example_value"].shape for n in graph.nodes if n.op == "call_method" and n.target == "float"]
    assert casts == [w.shape]  # only the weights' own cast is left
    assert torch.equal(out, model(q, k, w, additive))


class AttributeScale(torch.nn.Module):
    """The scale before relu is a module attribute, as DeepseekV32Indexer's softmax_scale is: under
    dynamic shapes Dynamo traces it as a scalar input whose sign is unknown when compiling."""

    def __init__(self, scale, divide):
        super().__init__()
        self.scale, self.divide = scale, divide

    def forward(self, q, k, w):
        x = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1))
        x = torch.relu(x / self.scale if self.divide else x * self.scale)
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).topk(KK)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("scale,divide", [(SCALE, False), (-0.5, False), (0.0, False), (-2.0, True)])
def test_a_scale_before_relu_of_any_sign_keeps_the_operands_narrow(scale, divide, dynamic):
    """relu(c·x) = |c|·relu(sign(c)·x): the op scores the bf16 operands (q times sign(c), exact) for
    a constant or traced factor (or divisor) of either sign, and selects what the model selects."""
    q, k, w, _, _ = make_inputs(seed=6)
    q, k = integer_valued(q).bfloat16(), integer_valued(k).bfloat16()
    model = AttributeScale(scale, divide)
    _, op, got = rewritten_graph(model, q, k, w, dynamic=dynamic)
    assert [a.meta["example_value"].dtype for a in op.args[:2]] == [torch.bfloat16, torch.bfloat16]
    want = model(q, k, w)
    torch.testing.assert_close(got.values, want.values, rtol=1e-6, atol=0)  # the scale is applied elsewhere
    if scale != 0.0:  # all scores tie at 0: the op breaks ties by index, torch.topk its own way
        assert torch.equal(got.indices, want.indices)


def integer_valued(x):
    """Small integers: every q·k is exact whatever the summation order, so that rounding decides
    no selection."""
    return torch.round(x * 4)


def test_operands_stay_fp32_when_a_scale_before_relu_is_not_finite():
    class InfiniteScale(torch.nn.Module):
        def forward(self, q, k, w):
            x = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * float("inf"))
            return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).topk(KK).indices

    q, k, w, _, _ = make_inputs(seed=6)
    _, op, _ = rewritten_graph(InfiniteScale(), q.bfloat16(), k.bfloat16(), w)
    assert op.args[0].meta["example_value"].dtype == torch.float32

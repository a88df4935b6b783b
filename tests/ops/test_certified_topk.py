"""torch.ops.pulsar_dosa.certified_topk: registration, opcheck, fake kernel with symbolic sizes,
equality with the dense reference, per-layer statistics."""
import pytest
import torch

import compiler
from compiler.topk_settings import TopkSettings
from compiler.ops.stats import TOPK_STATS
from runtime.certified_topk import CertifiedTopkConfig
from runtime.dense_scorer import dense_topk


def _inputs(B=2, S=5, H=3, D=8, T=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, w = torch.randn(B, S, H, D, generator=g), torch.randn(B, T, D, generator=g), torch.randn(B, S, H, generator=g)
    visible = torch.rand(B, S, T, generator=g) > 0.3
    return q, k, w, visible


def test_registered_on_import_and_exposed():
    assert compiler.certified_topk._opoverload is torch.ops.pulsar_dosa.certified_topk.default
    schema = str(torch.ops.pulsar_dosa.certified_topk.default._schema)
    assert "Scalar topk, Tensor? mask=None, str layer=\"\"" in schema


@pytest.mark.parametrize("mask_kind", [None, "bool", "additive"])
def test_opcheck(mask_kind):
    q, k, w, visible = _inputs()
    mask = {None: None, "bool": visible,
            "additive": torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))}[mask_kind]
    torch.library.opcheck(torch.ops.pulsar_dosa.certified_topk.default, (q, k, w, 4, mask),
                          {"layer": "opcheck", "record_stats": False, "witnesses": False})


@pytest.mark.parametrize("path", ["auto", "dense", "certified"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_dense_reference_bitwise(path, dtype):
    q, k, w, visible = (t.to(dtype) if t.is_floating_point() else t for t in _inputs(seed=1))
    got = torch.ops.pulsar_dosa.certified_topk(q, k, w, 6, visible, path=path, record_stats=False)
    want = dense_topk(q, k, w, 6, visible)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.int64
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_topk_above_T_returns_T_columns():
    q, k, w, _ = _inputs(T=4)
    values, indices = torch.ops.pulsar_dosa.certified_topk(q, k, w, 9, record_stats=False)
    assert values.shape == indices.shape == (2, 5, 4)


def test_fake_kernel_keeps_symbolic_sizes_without_guards():
    def f(q, k, w):
        return torch.ops.pulsar_dosa.certified_topk(q, k, w, 3, record_stats=False)

    gm = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="symbolic")(*_inputs()[:3])
    (out,) = [n for n in gm.graph.nodes if n.op == "call_function" and "certified_topk" in str(n.target)]
    values = out.meta["val"][0]
    assert any(isinstance(s, torch.SymInt) for s in values.shape[:2])
    assert values.shape[2] == 3


def test_bad_rank_is_a_value_error_naming_the_arguments():
    q, k, w, _ = _inputs()
    with pytest.raises(ValueError, match="q"):
        torch.ops.pulsar_dosa.certified_topk(q[0], k, w, 3, record_stats=False)


def test_scalar_arguments_map_to_the_runtime_config_and_bad_ones_are_named():
    assert TopkSettings(r=None).runtime_config("certified") == CertifiedTopkConfig()
    assert TopkSettings(r=5).runtime_config("dense") == CertifiedTopkConfig(r=5, path="dense")
    q, k, w, _ = _inputs()
    for kwargs, name in (({"path": "fast"}, "path"), ({"min_keys": -2}, "min_keys"), ({"r": -3}, "r"), ({"r": 0}, "r"),
                         ({"list_queries": 3}, "list_queries")):
        with pytest.raises(ValueError, match=f"{name}: expected"):
            torch.ops.pulsar_dosa.certified_topk(q, k, w, 3, record_stats=False, **kwargs)
    with pytest.raises(RuntimeError, match="'witnesses'"):  # the schema's bool? refuses it
        torch.ops.pulsar_dosa.certified_topk(q, k, w, 3, record_stats=False, witnesses="yes")


def test_the_list_size_and_the_witnesses_reach_the_runtime_config(monkeypatch):
    import importlib

    op = importlib.import_module("compiler.ops.certified_topk")  # the package's attribute is the op itself
    configs = []
    real = op.reference_certified_topk
    monkeypatch.setattr(op, "reference_certified_topk", lambda *a, config, **kw: configs.append(config)
                        or real(*a, config=config, **kw))
    q, k, w, visible = _inputs()
    torch.ops.pulsar_dosa.certified_topk(q, k, w, 4, visible, path="certified", r=2, list_queries=2, record_stats=False)
    torch.ops.pulsar_dosa.certified_topk(q, k, w, 4, visible, path="certified", r=2, witnesses=False,
                                         record_stats=False)
    # positionally: witnesses is the last argument, after list_queries
    torch.ops.pulsar_dosa.certified_topk(q, k, w, 4, visible, "", "certified", 2, None, False, "bf16", None, True, 1,
                                         False)
    assert configs == [CertifiedTopkConfig(r=2, path="certified", list_queries=2),
                       CertifiedTopkConfig(r=2, path="certified", witnesses=False),
                       CertifiedTopkConfig(r=2, path="certified", list_queries=1, witnesses=False)]
    assert CertifiedTopkConfig().witnesses  # so that False is the op's, not the default


def test_statistics_accumulate_per_layer_only_when_recorded():
    TOPK_STATS.reset()
    q, k, w, visible = _inputs()
    for _ in range(2):
        torch.ops.pulsar_dosa.certified_topk(q, k, w, 4, visible, layer="layers.3")
    torch.ops.pulsar_dosa.certified_topk(q, k, w, 4, visible, layer="layers.4", record_stats=False)
    summaries = TOPK_STATS.summaries()
    assert list(summaries) == ["layers.3"]
    assert summaries["layers.3"]["queries"] == 2 * q.shape[0] * q.shape[1]
    TOPK_STATS.reset()
    assert TOPK_STATS.summaries() == {}


# Bad inputs: a clear error naming the argument, or the right empty answer, on every path into the op.

def test_a_meta_operand_among_cpu_tensors_is_a_device_error_not_uninitialised_memory():
    q, k, w, visible = _inputs()
    with pytest.raises(ValueError, match=r"k: expected device cpu \(the device of q\), got meta"):
        torch.ops.pulsar_dosa.certified_topk(q, k.to("meta"), w, 3)
    with pytest.raises(ValueError, match="mask: expected device cpu"):
        torch.ops.pulsar_dosa.certified_topk(q, k, w, 3, visible.to("meta"))
    values, indices = torch.ops.pulsar_dosa.certified_topk(*(x.to("meta") for x in (q, k, w)), 3)
    assert values.device.type == indices.device.type == "meta" and values.shape == (2, 5, 3)


@pytest.mark.parametrize("topk, error", [(True, TypeError), (False, TypeError), (2.5, TypeError), (0, ValueError)])
def test_topk_must_be_a_positive_int_through_the_op_and_compiler_certified_topk(topk, error):
    q, k, w, _ = _inputs()
    for op in (torch.ops.pulsar_dosa.certified_topk, compiler.certified_topk):
        with pytest.raises(error, match="topk: expected a positive int"):
            op(q, k, w, topk, record_stats=False)


@pytest.mark.parametrize("B, S, T", [(0, 5, 20), (2, 0, 20), (2, 5, 0)])
def test_empty_inputs_give_empty_outputs_on_every_kernel(B, S, T):
    from compiler.ops.certified_topk import _certified_topk_cuda, fake_certified_topk

    q, k, w, visible = _inputs(B=max(B, 1), S=max(S, 1), T=max(T, 1))
    q, k, w, visible = q[:B, :S], k[:B, :T], w[:B, :S], visible[:B, :S, :T]
    kk = min(4, T)
    TOPK_STATS.reset()
    answers = [torch.ops.pulsar_dosa.certified_topk(q, k, w, 4, visible, layer="empty"),
               _certified_topk_cuda(q, k, w, 4, visible),  # the CUDA kernel answers before any launch
               fake_certified_topk(q, k, w, 4, visible)]
    for values, indices in answers:
        assert values.shape == indices.shape == (B, S, kk)
        assert values.dtype == torch.float32 and indices.dtype == torch.int64
    assert TOPK_STATS.summaries() == {}


def test_bad_shapes_are_refused_before_the_cuda_pipeline():
    from compiler.ops.certified_topk import _certified_topk_cuda

    q, k, w, _ = _inputs()
    with pytest.raises(ValueError, match="weights: expected shape"):
        _certified_topk_cuda(q, k, w[:, :2], 3)
    with pytest.raises(ValueError, match="path: expected one of"):
        _certified_topk_cuda(q, k, w, 3, path="fast")


def test_sizes_beyond_the_kernels_or_the_memory_are_named_on_every_kernel():
    from compiler.lowering.topk_pipeline import certified_topk_cuda

    q, k, w, _ = _inputs()
    long_k = k[:, :1].expand(2, 2**31, 8)  # zero-stride: the size costs no memory
    for op in (torch.ops.pulsar_dosa.certified_topk, certified_topk_cuda):
        with pytest.raises(ValueError, match=r"k: expected fewer than 2\^31 keys T"):
            op(q, long_k, w, 3)
    huge = (torch.zeros(1, 1, 1, 8).expand(1, 2**20, 1, 8), torch.zeros(1, 1, 8).expand(1, 2**20, 8),
            torch.zeros(1, 1, 1).expand(1, 2**20, 1))
    message = r"q, k: B=1, S=1048576, T=1048576 need about .* GiB of workspace on cpu"
    with pytest.raises(ValueError, match=message):
        torch.ops.pulsar_dosa.certified_topk(*huge, 2**15, record_stats=False)
    for path in ("dense", "certified"):
        with pytest.raises(ValueError, match=message):  # the CUDA pipeline's own estimate, before it starts
            certified_topk_cuda(*huge, 2**15, config=CertifiedTopkConfig(path=path))

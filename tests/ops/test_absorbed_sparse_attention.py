"""``torch.ops.pulsar_dosa.absorbed_sparse_attention``: schema and fake kernel (opcheck, symbolic
sizes), the CPU kernel is the reference, and the op refuses to run under a Pulsar layout."""
import pytest
import torch

import compiler.ops  # noqa: F401  (registers pulsar_dosa::absorbed_sparse_attention)
from runtime.absorbed_attention import absorbed_sparse_attention
from runtime.attention_layout import QueryPhase, use_layout

OP = torch.ops.pulsar_dosa.absorbed_sparse_attention


def op_inputs(mask: bool, index_dtype=torch.int64, seed=0, s=5):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, s, 6 + 4, generator=g)
    latent, rope_key = torch.randn(2, 9, 12, generator=g), torch.randn(2, 9, 4, generator=g)
    weight = torch.randn(4 * (6 + 5), 12, generator=g)
    indices = torch.randint(-1, 9, (2, s, 4), generator=g).to(index_dtype)
    bool_mask = (torch.rand(2, 1, s, 9, generator=g) < 0.7) if mask else None
    return q, latent, rope_key, weight, indices, bool_mask


@pytest.mark.parametrize("mask,index_dtype,masked_rows", [(True, torch.int64, "zero"), (False, torch.int32, "mean")])
def test_opcheck_and_the_cpu_kernel_is_the_reference(mask, index_dtype, masked_rows):
    args = (*op_inputs(mask, index_dtype), 0.3, masked_rows, False, "auto", "layers.0")
    torch.library.opcheck(OP, args)
    out = OP(*args)
    want, _ = absorbed_sparse_attention(*args[:6], scale=0.3, masked_rows=masked_rows)
    assert torch.equal(out, want) and out.shape == (2, 4, 5, 5)


def test_fake_kernel_takes_symbolic_query_and_key_lengths():
    def attend(q, latent, rope_key, weight, indices):
        return OP(q, latent, rope_key, weight, indices, None, 0.3, "zero", True, "absorbed", "") * 2

    torch._dynamo.reset()
    compiled = torch.compile(attend, backend="eager", dynamic=True, fullgraph=True)
    for s in (5, 7):
        args = op_inputs(False, s=s)[:5]
        assert compiled(*args).shape == (2, 4, s, 5)


def test_refuses_to_run_under_a_pulsar_layout():
    args = (*op_inputs(True), 0.3, "zero", True, "auto", "")
    with use_layout(QueryPhase(kept=4)), pytest.raises(RuntimeError, match="does not follow Pulsar layouts"):
        OP(*args)


def test_bad_arguments_are_named_before_any_work():
    q, latent, rope_key, weight, indices, mask = op_inputs(True)
    with pytest.raises(ValueError, match="masked_rows must be one of"):
        OP(q, latent, rope_key, weight, indices, mask, 0.3, "nan", False, "auto", "")
    with pytest.raises(ValueError, match="kv_b_weight must be"):
        OP(q, latent, rope_key, weight[:, :-1], indices, mask, 0.3, "zero", False, "auto", "")
    with pytest.raises(ValueError, match="form must be one of"):
        OP(q, latent, rope_key, weight, indices, mask, 0.3, "zero", False, "union", "")
    with pytest.raises(TypeError, match="scale must be a float, got True"):
        OP(q, latent, rope_key, weight, indices, mask, True, "zero", False, "absorbed", "")
    with pytest.raises(TypeError, match="scale must be a float, got True"):
        OP(*(x.to("meta") for x in (q, latent, rope_key, weight, indices, mask)), True, "zero", False, "absorbed", "")


@pytest.mark.parametrize("name", ["latent", "rope_key", "kv_b_weight", "indices", "mask"])
def test_a_tensor_on_another_device_is_named_even_on_the_meta_device(name):
    args = dict(zip(("q", "latent", "rope_key", "kv_b_weight", "indices", "mask"), op_inputs(True)))
    args[name] = args[name].to("meta")
    with pytest.raises(ValueError, match=f"{name} must be on q's device cpu, got meta"):
        OP(*args.values(), 0.3, "zero", False, "absorbed", "")
    out = OP(*(x.to("meta") for x in op_inputs(True)), 0.3, "zero", False, "absorbed", "")  # all on meta: shapes
    assert out.device.type == "meta" and out.shape == (2, 4, 5, 5)


def test_a_call_beyond_the_memory_is_refused_by_name_before_any_allocation():
    q, latent, rope_key, weight, _, _ = op_inputs(False)
    queries = q[:1, :, :1].expand(1, 4, 3_000_000, 10)
    indices = torch.zeros(1, 1, 1, dtype=torch.int64).expand(1, 3_000_000, 200_000)
    with pytest.raises(ValueError, match="q, latent, indices: B=1, H=4, S=3000000, K=200000 need about .* GiB"):
        OP(queries, latent[:1], rope_key[:1], weight, indices, None, 0.3, "zero", False, "absorbed", "")

"""``torch.ops.pulsar_dosa.sparse_attention``: schema and fake kernel (opcheck), the CPU kernel is the
reference, and the op refuses to run under a Pulsar layout."""
import pytest
import torch

import compiler.ops  # noqa: F401  (registers pulsar_dosa::sparse_attention)
from runtime.attention_layout import QueryPhase, use_layout
from runtime.union_attention import sparse_attention

OP = torch.ops.pulsar_dosa.sparse_attention


def op_inputs(mask: bool, index_dtype=torch.int64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(2, 4, 5, 24, generator=g), torch.randn(2, 2, 9, 24, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    indices = torch.randint(-1, 9, (2, 5, 4), generator=g).to(index_dtype)
    bool_mask = (torch.rand(2, 1, 5, 9, generator=g) < 0.7) if mask else None
    return q, k, v, indices, bool_mask


@pytest.mark.parametrize("mask,index_dtype,masked_rows", [(True, torch.int64, "zero"), (False, torch.int32, "mean")])
def test_opcheck_and_the_cpu_kernel_is_the_reference(mask, index_dtype, masked_rows):
    args = (*op_inputs(mask, index_dtype), 0.3, masked_rows)
    torch.library.opcheck(OP, args)
    out = OP(*args)
    want, _ = sparse_attention(*args[:5], scale=0.3, masked_rows=masked_rows)
    assert torch.equal(out, want) and out.shape == (2, 4, 5, 16)


def test_refuses_to_run_under_a_pulsar_layout():
    args = (*op_inputs(True), 0.3, "zero")
    with use_layout(QueryPhase(kept=4)), pytest.raises(RuntimeError, match="does not follow Pulsar layouts"):
        OP(*args)


def test_bad_arguments_are_named_before_any_work():
    q, k, v, indices, mask = op_inputs(True)
    with pytest.raises(ValueError, match="masked_rows must be one of"):
        OP(q, k, v, indices, mask, 0.3, "nan")
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        OP(q, k, v, indices, mask.float(), 0.3, "zero")


def test_a_tensor_on_another_device_is_named_even_on_the_meta_device():
    q, k, v, indices, mask = op_inputs(True)
    with pytest.raises(ValueError, match="k must be on q's device cpu, got meta"):
        OP(q, k.to("meta"), v, indices, mask, 0.5, "zero")
    with pytest.raises(ValueError, match="k must be on q's device meta, got cpu"):
        OP(q.to("meta"), k, v, indices, mask, 0.5, "zero")
    with pytest.raises(ValueError, match="mask must be on q's device cpu, got meta"):
        OP(q, k, v, indices, mask.to("meta"), 0.5, "zero")
    out = OP(*(x.to("meta") for x in (q, k, v, indices, mask)), 0.5, "zero")  # all on meta: shapes only
    assert out.device.type == "meta" and out.shape == (2, 4, 5, 16)


def test_scale_must_be_a_number_and_float64_is_refused_by_name():
    q, k, v, indices, mask = op_inputs(True)
    with pytest.raises(TypeError, match="scale must be a float, got True"):
        OP(q, k, v, indices, mask, True, "zero")
    with pytest.raises(TypeError, match="q must be bfloat16, float16 or float32, got torch.float64"):
        OP(q.double(), k.double(), v.double(), indices, mask, 0.5, "zero")
    assert torch.equal(OP(q, k, v, indices, mask, 1, "zero"), OP(q, k, v, indices, mask, 1.0, "zero"))


def test_a_key_that_is_not_attended_to_never_reaches_the_output():
    q, k, v, _, _ = op_inputs(False)
    bad = v.clone()
    bad[0, 0, 0, 0] = float("inf")
    out = OP(q[:1, :, :1], k[:1], bad[:1], torch.tensor([[[-1, 3]]]), None, 0.5, "zero")
    want = OP(q[:1, :, :1], k[:1], v[:1], torch.tensor([[[3]]]), None, 0.5, "zero")
    assert torch.isfinite(out).all() and torch.equal(out, want)

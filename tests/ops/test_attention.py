"""``torch.ops.pulsar_dosa.attention``: arguments on another device than q are named, the meta
device included (the op's meta kernel would otherwise answer with uninitialised memory)."""
import pytest
import torch

import compiler.ops  # noqa: F401  (registers pulsar_dosa::attention)

OP = torch.ops.pulsar_dosa.attention


@pytest.mark.parametrize("name", ["k", "v", "attn_mask"])
def test_a_tensor_on_another_device_is_named_even_on_the_meta_device(name):
    g = torch.Generator().manual_seed(0)
    args = dict(q=torch.randn(1, 2, 3, 8, generator=g), k=torch.randn(1, 2, 5, 8, generator=g),
                v=torch.randn(1, 2, 5, 8, generator=g), attn_mask=torch.ones(1, 1, 3, 5, dtype=torch.bool))
    args[name] = args[name].to("meta")
    with pytest.raises(ValueError, match=f"{name} must be on q's device cpu, got meta"):
        OP(*args.values(), False, None, False, "sdpa")
    out = OP(*(x.to("meta") for x in args.values()), False, None, False, "sdpa")  # all on meta: shapes only
    assert out.device.type == "meta" and out.shape == (1, 2, 3, 8)

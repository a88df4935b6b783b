"""The attention pass: SDPA and eager attention chains become ``pulsar_dosa.attention``, which is
ordinary attention with no layout and follows the Pulsar layout when one is active."""

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

import compiler.ops.attention  # noqa: F401  (registers pulsar_dosa::attention)
from compiler.report import collecting
from runtime.assembly import assemble
from runtime.attention_layout import PackedPhase, use_layout
from runtime.attention_reference import two_interval_attention
from runtime.pulsar import PulsarConfig, encode_context, generate
from tests.runtime.test_pulsar import assert_same_kv, naive_kept_kv

BACKEND = dict(backend="pulsar_dosa", options={"downstream": "eager"})


def qkv(sq=6, sk=6, hq=4, hkv=2, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, hq, sq, d, generator=g), torch.randn(1, hkv, sk, d, generator=g),
            torch.randn(1, hkv, sk, d, generator=g))


def repeat_kv(x, n):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def sdpa_keywords(q, k, v):
    return F.scaled_dot_product_attention(query=q, key=k, value=v, is_causal=True, enable_gqa=True)


def sdpa_mixed_keywords_masked(q, k, v, mask):
    return F.scaled_dot_product_attention(q, key=repeat_kv(k, 2), value=repeat_kv(v, 2), attn_mask=mask)


def sdpa_masked_repeat(q, k, v, mask):
    return F.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), attn_mask=mask)


def eager_chain(q, k, v, mask):
    k, v = repeat_kv(k, 2), repeat_kv(v, 2)
    weights = torch.matmul(q, k.transpose(2, 3)) * 0.35 + mask
    weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
    weights = F.dropout(weights, p=0.0, training=False)
    return torch.matmul(weights, v)


def eager_div_chain(q, k, v):
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    return torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / 3.0, dim=-1), v)


def weights_returned(q, k, v):
    w = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.5, dim=-1)
    return torch.matmul(w, v), w


def softmax_over_queries(q, k, v):
    return torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.5, dim=2), v)


def tensor_scale(q, k, v):
    return torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * torch.full((), 0.5), dim=-1), v)


def sdpa_with_dropout(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)


def compile_and_run(fn, *args):
    torch._dynamo.reset()
    with collecting() as report:
        out = torch.compile(fn, **BACKEND)(*args)
    return out, report


def causal_mask(sq, sk):
    return torch.zeros(sq, sk).masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq), float("-inf"))


@pytest.mark.parametrize("fn, variant, with_mask, gqa_inputs", [
    (sdpa_causal, "sdpa+gqa", False, True),
    (sdpa_masked_repeat, "sdpa+gqa+mask", True, True),
    (sdpa_keywords, "sdpa+gqa", False, True),
    (sdpa_mixed_keywords_masked, "sdpa+gqa+mask", True, True),
    (eager_chain, "eager_mul_softmax_fp32+gqa+mask", True, True),
    (eager_div_chain, "eager_div+gqa", False, True),
])
def test_rewritten_attention_is_bitwise_the_original_without_a_layout(fn, variant, with_mask, gqa_inputs):
    q, k, v = qkv()
    args = (q, k, v, causal_mask(6, 6)) if with_mask else (q, k, v)
    out, report = compile_and_run(fn, *args)
    assert [r.variant for r in report.rewrites] == [variant]
    assert report.rewrites[0].kind == "attention" and not report.near_misses
    assert report.counters["attention.rewritten"] == 1 and report.counters[f"attention.variant.{variant}"] == 1
    assert report.counters["attention.unsupported"] == 0
    assert torch.equal(out, fn(*args))


def test_rewritten_attention_follows_the_active_layout():
    q, k, v = qkv(sq=7, sk=7)
    prefix_end = torch.tensor([0, 0, 0, 3, 3, 3, 3])
    segment_start = torch.tensor([0, 0, 0, 3, 3, 5, 5])
    torch._dynamo.reset()
    compiled = torch.compile(sdpa_causal, **BACKEND)
    with use_layout(PackedPhase(prefix_end, segment_start)) as layout:
        out = compiled(q, k, v)
    want, _ = two_interval_attention(q, k, v, prefix_end[None], segment_start[None], scale=8 ** -0.5)
    assert layout.calls == 1
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(out, sdpa_causal(q, k, v), atol=1e-3)  # the layout changed visibility


@pytest.mark.parametrize("fn, reason", [
    (weights_returned, "used outside the attention chain"),
    (softmax_over_queries, "softmax over dim 2"),
    (sdpa_with_dropout, "dropout_p=0.1"),
    (tensor_scale, "not a Python number or a symbolic float"),
])
def test_near_misses_are_reported_and_left_untouched(fn, reason):
    q, k, v = qkv(hkv=4)
    torch.manual_seed(0)
    out, report = compile_and_run(fn, q, k, v)
    assert not report.rewrites
    assert [m.kind for m in report.near_misses] == ["attention"]
    assert reason in report.near_misses[0].reason
    assert report.counters["attention.near_miss"] == 1 and report.counters["attention.rewritten"] == 0
    if fn is not sdpa_with_dropout:
        torch.testing.assert_close(out, fn(q, k, v))


def test_attention_op_passes_opcheck():
    q, k, v = qkv()
    for args in [(q, k, v, None, True, None, True, "sdpa"),
                 (q, k, v, causal_mask(6, 6), False, 0.5, True, "eager_div_softmax_fp32")]:
        torch.library.opcheck(torch.ops.pulsar_dosa.attention.default, args)
    with pytest.raises(ValueError, match="form"):
        torch.ops.pulsar_dosa.attention(q, k, v, None, True, None, True, "flash")
    with pytest.raises(ValueError, match="scale"):
        torch.ops.pulsar_dosa.attention(q, k, v, None, False, None, True, "eager_mul")


@pytest.mark.parametrize("implementation,dynamic", [("sdpa", False), ("eager", False), ("sdpa", True), ("eager", True)])
def test_compiled_llama_follows_pulsar_phases_like_the_uncompiled_model(implementation, dynamic):
    """Phase 1 through the pass keeps the naive per-input KV; generate gives the uncompiled tokens;
    without a layout the compiled model is the same model. Under dynamic shapes Dynamo traces the
    attention scale (a module float) as a symbolic float, which the op takes as it is."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation=implementation)
    model = LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    ids, query = torch.randint(0, 256, (100,), generator=g), torch.randint(0, 256, (5,), generator=g)
    pulsar = PulsarConfig(32, sink=4, chunk=4, ratio=0.25)
    torch._dynamo.reset()
    with collecting() as report:
        compiled = torch.compile(model, **BACKEND, dynamic=dynamic)
        kept = encode_context(compiled, ids, pulsar.layout(ids))
        tokens = generate(compiled, ids, query, pulsar, max_new_tokens=5)
        with torch.no_grad():
            plain_ids = torch.randint(0, 256, (1, 9), generator=g)
            assert torch.equal(compiled(plain_ids).logits, model(plain_ids).logits)
    modules = {r.module for r in report.rewrites}  # module names, not Dynamo's L['args'][0]...
    assert modules == {"model.layers.0.self_attn", "model.layers.1.self_attn"} and not report.near_misses
    assert torch.equal(tokens, generate(model, ids, query, pulsar, max_new_tokens=5))
    separate = assemble(ids, 32, sink=4, chunk=4, ratio=0.25)
    assert_same_kv(kept, naive_kept_kv(model, ids, separate))


def test_layouts_accept_the_triton_kernel_as_attention_function():
    """The op passes ``two_interval_attention_triton`` on CUDA; here it runs under the interpreter."""
    from compiler.lowering.attention.two_interval_attention import two_interval_attention_triton
    from runtime.attention_layout import QueryPhase

    q, k, v = qkv(sq=3, sk=9)
    for layout in (QueryPhase(kept=6, owner=True), QueryPhase(kept=6, owner=False)):
        got = layout.attend(q, k, v, scale=0.3, attention_fn=two_interval_attention_triton)
        want = layout.attend(q, k, v, scale=0.3)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    q, k, v = qkv(sq=7, sk=7)
    packed = PackedPhase(torch.tensor([0, 0, 0, 3, 3, 3, 3]), torch.tensor([0, 0, 0, 3, 3, 5, 5]))
    torch.testing.assert_close(packed.attend(q, k, v, scale=0.3, attention_fn=two_interval_attention_triton),
                               packed.attend(q, k, v, scale=0.3), atol=1e-5, rtol=1e-5)

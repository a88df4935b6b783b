"""Graphs for a running Pulsar layout: the attention mask computed in the graph is dropped from the
copy that runs under a layout, and only there."""
import pytest
import torch
import torch.fx as fx
from transformers import LlamaConfig, LlamaForCausalLM

import compiler  # noqa: F401  (registers the pulsar_dosa ops)
from compiler.layout_variant import LayoutDispatch, without_attention_masks
from compiler.report import collecting
from runtime.attention_layout import QueryPhase, use_layout
from runtime.pulsar import PulsarConfig, generate


class MaskedAttention(torch.nn.Module):
    """A causal mask built from the query length, then the layout-aware attention op."""

    def forward(self, q, k, v):
        n = q.shape[2]
        rows = torch.arange(n, device=q.device)
        mask = rows[:, None] >= rows[None, :]
        return torch.ops.pulsar_dosa.attention.default(q, k, v, mask[None, None], False, None, False, "sdpa")


class MaskInput(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return torch.ops.pulsar_dosa.attention.default(q, k, v, mask, False, None, False, "sdpa")


def attention_masks(gm):
    return [n.args[3] for n in gm.graph.nodes if n.target is torch.ops.pulsar_dosa.attention.default]


def test_the_copy_has_no_mask_and_no_mask_computation_and_the_original_is_unchanged():
    gm = fx.symbolic_trace(MaskedAttention())
    before = [n.name for n in gm.graph.nodes]
    variant = without_attention_masks(gm)
    assert variant is not None
    assert attention_masks(variant) == [None]
    assert not any(n.target in (torch.arange, "__ge__") or "arange" in n.name for n in variant.graph.nodes)
    assert [n.name for n in gm.graph.nodes] == before and attention_masks(gm)[0] is not None
    assert [n.name for n in variant.graph.nodes if n.op == "placeholder"] == ["q", "k", "v"]


def test_no_copy_when_nothing_would_be_removed():
    assert without_attention_masks(fx.symbolic_trace(MaskInput())) is None  # the mask is an input


def test_dispatch_follows_the_active_layout_and_keeps_the_calling_convention():
    def plain(args):
        return "plain", args

    def under_layout(args):
        return "layout", args

    plain._boxed_call = under_layout._boxed_call = True
    dispatch = LayoutDispatch(plain, under_layout)
    assert dispatch._boxed_call
    assert dispatch([1]) == ("plain", [1])
    with use_layout(QueryPhase(kept=0)):
        assert dispatch([1]) == ("layout", [1])
    with pytest.raises(ValueError, match="calling convention"):
        LayoutDispatch(plain, lambda *args: None)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    return model


def test_compiled_generate_runs_the_maskless_graph_and_gives_the_eager_tokens(model, monkeypatch):
    calls = []
    original = LayoutDispatch.__call__

    def spy(self, *args):
        calls.append(self)
        return original(self, *args)

    monkeypatch.setattr(LayoutDispatch, "__call__", spy)
    g = torch.Generator().manual_seed(3)
    context, query = torch.randint(1, 256, (160,), generator=g), torch.randint(1, 256, (5,), generator=g)
    config = PulsarConfig(40, sink=4, chunk=4, ratio=0.25)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="pulsar_dosa", options={"downstream": "eager"})
    with collecting() as report:
        tokens = generate(compiled, context, query, config, max_new_tokens=3)
    assert torch.equal(tokens, generate(model, context, query, config, max_new_tokens=3))
    # Phase 2 (5 query tokens after the kept KV) builds a mask in every transformers version.
    assert any("layout_variant_nodes" in c for c in report.compiles) and calls
    # A graph captured outside a layout is compiled once, and applies the model's padding mask.
    ids = torch.randint(1, 256, (2, 24), generator=g)
    padding = torch.ones_like(ids)
    padding[0, :5] = 0
    with collecting() as report, torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=ids, attention_mask=padding).logits,
                                   model(input_ids=ids, attention_mask=padding).logits, atol=1e-5, rtol=1e-5)
    assert report.compiles and not any("layout_variant_nodes" in c for c in report.compiles)

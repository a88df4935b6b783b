"""benchmarks/phase1_flops.py: the weights counted are the model's, causal and two-interval counts
agree, per-host lengths of Star and Pulsar layouts."""
import pytest
import torch

from benchmarks.phase1_flops import DecoderShape, host_lengths, visible_pairs
from runtime.assembly import assemble


def test_the_linear_weights_counted_are_the_models_projection_and_mlp_weights():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    model = LlamaForCausalLM(config)
    shape = DecoderShape.from_config(config)
    per_layer = sum(p.numel() for name, p in model.named_parameters()
                    if name.startswith("model.layers.0.") and p.dim() == 2)
    assert shape.linear_weights_per_layer == per_layer
    assert shape.layers == 3 and shape.attention_width == 64


def test_a_causal_input_counts_as_the_two_interval_rule_without_prefix():
    shape = DecoderShape(layers=2, attention_width=8, linear_weights_per_layer=100)
    zeros = torch.zeros(7, dtype=torch.int64)
    assert shape.causal_input_flops(7) == shape.flops(7, visible_pairs(zeros, zeros)) == 2 * (2 * 7 * 100 + 4 * 8 * 28)


def test_host_lengths_of_star_and_pulsar_layouts():
    ids = torch.randint(0, 50, (64,), generator=torch.Generator().manual_seed(0))
    assert host_lengths(assemble(ids, 16, mode="star")) == [16, 32, 32, 32]
    pulsar = host_lengths(assemble(ids, 16, mode="pulsar", sink=4, chunk=2, ratio=0.25))
    assert pulsar == [16, 4 + 4 + 16, 4 + 8 + 16, 4 + 12 + 16]
    with pytest.raises(ValueError, match="spine"):
        host_lengths(assemble(ids, 16, mode="pulsar", sink=4, chunk=2, ratio=0.25, shared_spine=True))

"""The single-device Pulsar driver: phase-1 KV equals naive per-input encoding; generation agrees
with dense decoding where it must; misuse is reported."""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from runtime.assembly import assemble
from runtime.pulsar import PulsarConfig, cache_keyword, encode_context, generate

CONTEXT_LENGTH, BLOCK = 100, 32  # four blocks, the last one short
SETTINGS = dict(sink=4, chunk=4, ratio=0.25)
CACHE_ARG = cache_keyword(LlamaForCausalLM)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def context():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (CONTEXT_LENGTH,), generator=g), torch.randint(0, 256, (6,), generator=g)


def naive_kept_kv(model, context_ids, layout):
    """Each assembled input run on its own as an ordinary causal forward; KV of its block tokens."""
    per_layer = [([], []) for _ in range(model.config.num_hidden_layers)]
    bounds = layout.cu_seqlens.tolist()
    for start, stop in zip(bounds[:-1], bounds[1:]):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=context_ids[layout.source_index[start:stop]][None],
                  position_ids=layout.position_ids[start:stop][None],
                  attention_mask=torch.ones(1, stop - start, dtype=torch.long),
                  use_cache=True, **{CACHE_ARG: cache})
        keep = layout.keep[start:stop]
        for layer, (keys, values) in zip(cache.layers, per_layer):
            keys.append(layer.keys[:, :, keep])
            values.append(layer.values[:, :, keep])
    return [(torch.cat(k, 2), torch.cat(v, 2)) for k, v in per_layer]


def assert_same_kv(got, want):
    assert len(got) == len(want)
    for (k1, v1), (k2, v2) in zip(got, want):
        torch.testing.assert_close(k1, k2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v1, v2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", ["sparse", "contiguous"])
def test_shared_spine_keeps_the_same_kv_as_each_input_alone_and_a_naive_forward(model, context, positions):
    ids, _ = context
    shared = assemble(ids, BLOCK, positions=positions, shared_spine=True, **SETTINGS)
    separate = assemble(ids, BLOCK, positions=positions, shared_spine=False, **SETTINGS)
    assert shared.source_index.numel() < separate.source_index.numel()  # the spine is encoded once
    kept_shared = encode_context(model, ids, shared)
    assert kept_shared[0][0].shape[2] == CONTEXT_LENGTH
    assert_same_kv(kept_shared, encode_context(model, ids, separate))
    assert_same_kv(kept_shared, naive_kept_kv(model, ids, separate))


def test_star_phase_one_keeps_the_same_kv_as_a_naive_forward(model, context):
    ids, _ = context
    layout = assemble(ids, BLOCK, mode="star")
    assert_same_kv(encode_context(model, ids, layout), naive_kept_kv(model, ids, layout))


def test_one_block_pulsar_equals_dense_generation(model, context):
    ids, query = context
    pulsar = PulsarConfig(CONTEXT_LENGTH, **SETTINGS)
    dense = PulsarConfig(BLOCK, mode="dense", **SETTINGS)
    assert_same_kv(encode_context(model, ids, pulsar.layout(ids)), encode_context(model, ids, dense.layout(ids)))
    assert torch.equal(generate(model, ids, query, pulsar, max_new_tokens=6),
                       generate(model, ids, query, dense, max_new_tokens=6))


def test_dense_mode_equals_ordinary_greedy_decoding(model, context):
    ids, query = context
    tokens = torch.cat([ids, query])[None]
    want = []
    with torch.no_grad():
        for _ in range(6):
            next_token = model(input_ids=tokens).logits[0, -1].argmax()
            want.append(int(next_token))
            tokens = torch.cat([tokens, next_token.view(1, 1)], 1)
    got = generate(model, ids, query, PulsarConfig(BLOCK, mode="dense"), max_new_tokens=6, stop_ids=())
    assert got.tolist() == want


def test_generation_stops_at_a_stop_id_and_restores_the_attention_implementation(model, context):
    ids, query = context
    config = PulsarConfig(BLOCK, **SETTINGS)
    full = generate(model, ids, query, config, max_new_tokens=5)
    stopped = generate(model, ids, query, config, max_new_tokens=5, stop_ids=(int(full[1]),))
    assert stopped.tolist() == full[: full.tolist().index(int(full[1])) + 1].tolist()
    assert generate(model, ids, query, config, max_new_tokens=0).numel() == 0
    assert model.config._attn_implementation == "sdpa"


def test_a_model_whose_attention_ignores_the_layout_is_refused(model, context):
    ids, query = context
    compiled_elsewhere = torch.compile(model, backend="eager")
    with pytest.raises(RuntimeError, match="followed the Pulsar layout"):
        generate(compiled_elsewhere, ids, query, PulsarConfig(BLOCK, **SETTINGS), max_new_tokens=1)


@pytest.mark.parametrize("kwargs, error, name", [
    (dict(block_size=0), ValueError, "block_size"),
    (dict(block_size=8, mode="ring"), ValueError, "mode"),
    (dict(block_size=8, heuristic="random"), ValueError, "heuristic"),
    (dict(block_size=8, positions="absolute"), ValueError, "positions"),
    (dict(block_size=8, ratio=0.0), ValueError, "ratio"),
    (dict(block_size=8, sink=-1), ValueError, "sink"),
])
def test_bad_config_values_raise_errors_naming_the_field(kwargs, error, name):
    with pytest.raises(error, match=name):
        PulsarConfig(**kwargs)


def test_hf_shaped_ids_give_the_same_tokens_as_one_dimensional_ids(model, context):
    ids, query = context
    config = PulsarConfig(BLOCK, **SETTINGS)
    want = generate(model, ids, query, config, max_new_tokens=4, stop_ids=())
    assert torch.equal(generate(model, ids[None], query[None], config, max_new_tokens=4, stop_ids=()), want)
    assert torch.equal(generate(model, ids.int()[None], query, config, max_new_tokens=4, stop_ids=()), want)


def test_any_iterable_of_stop_ids_is_read_once_and_obeyed(model, context):
    ids, query = context
    config = PulsarConfig(BLOCK, **SETTINGS)
    full = generate(model, ids, query, config, max_new_tokens=5, stop_ids=())
    stop = int(full[2])
    want = full[: full.tolist().index(stop) + 1]
    assert len(want) < len(full)
    for stop_ids in (iter([stop]), (s for s in [999 % 256, stop]), {stop}, stop, torch.tensor([stop]),
                     range(stop, stop + 1)):
        assert torch.equal(generate(model, ids, query, config, max_new_tokens=5, stop_ids=stop_ids), want), stop_ids


def test_the_models_eos_ids_stop_generation_when_stop_ids_is_not_given(model, context):
    ids, query = context
    config = PulsarConfig(BLOCK, **SETTINGS)
    full = generate(model, ids, query, config, max_new_tokens=5, stop_ids=())
    eos = model.generation_config.eos_token_id
    try:
        model.generation_config.eos_token_id = int(full[1])
        assert torch.equal(generate(model, ids, query, config, max_new_tokens=5), full[:2])
        model.generation_config.eos_token_id = [255 if int(full[3]) != 255 else 254, int(full[3])]
        assert torch.equal(generate(model, ids, query, config, max_new_tokens=5), full[:4])
        model.generation_config.eos_token_id = None
        assert torch.equal(generate(model, ids, query, config, max_new_tokens=5), full)
        model.generation_config.eos_token_id = int(full[1])
        assert torch.equal(generate(model, ids, query, config, max_new_tokens=5, stop_ids=()), full)
    finally:
        model.generation_config.eos_token_id = eos


def test_pulsar_sink_longer_than_a_block_is_refused_at_construction():
    with pytest.raises(ValueError, match="sink must not exceed block_size=32"):
        PulsarConfig(32, sink=33)
    assert PulsarConfig(32, sink=32).sink == 32
    assert PulsarConfig(32, mode="star").sink == 64  # star and dense modes have no sink


def good_arguments(ids, query):
    return dict(context_ids=ids, query_ids=query, config=PulsarConfig(BLOCK, **SETTINGS), max_new_tokens=1,
                stop_ids=None)


@pytest.mark.parametrize("change, error, message", [
    (lambda ids, q: dict(query_ids=q[None].expand(2, -1)), ValueError, r"query_ids must be \[L\] or \[1, L\]"),
    (lambda ids, q: dict(context_ids=ids.float()), TypeError, "context_ids must have an integer dtype"),
    (lambda ids, q: dict(context_ids=ids[:0]), ValueError, "context_ids must hold at least one token"),
    (lambda ids, q: dict(context_ids=ids.tolist()), TypeError, "context_ids must be a torch.Tensor"),
    (lambda ids, q: dict(context_ids=torch.cat([ids, torch.tensor([256])])), ValueError,
     r"context_ids holds token id 256 outside the model's vocabulary \[0, 256\)"),
    (lambda ids, q: dict(query_ids=q - 1000), ValueError, "query_ids holds token id -"),
    (lambda ids, q: dict(max_new_tokens=-1), ValueError, "max_new_tokens"),
    (lambda ids, q: dict(max_new_tokens=True), ValueError, "max_new_tokens"),
    (lambda ids, q: dict(config={"block_size": 8}), TypeError, "config must be a PulsarConfig"),
    (lambda ids, q: dict(stop_ids=[256]), ValueError, "stop_ids holds token id 256"),
    (lambda ids, q: dict(stop_ids=[1.5]), TypeError, "stop_ids must hold int token ids"),
    (lambda ids, q: dict(stop_ids=[True]), TypeError, "stop_ids must hold int token ids"),
    (lambda ids, q: dict(stop_ids="2"), TypeError, "stop_ids must be a token id"),
    (lambda ids, q: dict(stop_ids=2.0), TypeError, "stop_ids must be a token id"),
    (lambda ids, q: dict(stop_ids=torch.tensor([2.0])), TypeError, "stop_ids must hold integer token ids"),
])
def test_bad_generate_arguments_raise_naming_the_argument_before_any_model_work(model, context, change, error,
                                                                               message):
    ids, query = context
    args = good_arguments(ids, query) | change(ids, query)
    forwards = []
    hook = model.register_forward_pre_hook(lambda module, inputs: forwards.append(module))
    try:
        with pytest.raises(error, match=message):
            generate(model, args.pop("context_ids"), args.pop("query_ids"), args.pop("config"), **args)
    finally:
        hook.remove()
    assert forwards == []


def tiny_dsa_model():
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM

    torch.manual_seed(0)
    return DeepseekV32ForCausalLM(DeepseekV32Config(
        vocab_size=256, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=2, kv_lora_rank=8, q_lora_rank=16,
        qk_rope_head_dim=8, v_head_dim=8, qk_nope_head_dim=8, n_group=1, topk_group=1, num_experts_per_tok=1,
        first_k_dense_replace=1, index_topk=4, index_head_dim=16, index_n_heads=8)).eval()


def sliding_window_model():
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1, sliding_window=16)).eval()


def meta_model(model):
    with torch.device("meta"):
        return LlamaForCausalLM(model.config)


@pytest.mark.parametrize("change, message", [
    (lambda model, ids, q: dict(model=tiny_dsa_model()),
     r"model DeepseekV32ForCausalLM has DSA indexers \(index_n_heads=8 .*does not follow Pulsar layouts"),
    (lambda model, ids, q: dict(model=meta_model(model)), "model has parameters on the meta device"),
    (lambda model, ids, q: dict(model=torch.nn.ReLU()), "model must have parameters"),
    (lambda model, ids, q: dict(model=sliding_window_model()), "model has a sliding-window cache layer"),
    (lambda model, ids, q: dict(context_ids=ids.to("meta")), "context_ids must hold token ids, got a tensor on the meta"),
    (lambda model, ids, q: dict(query_ids=q.to("meta")), "query_ids must hold token ids, got a tensor on the meta"),
    (lambda model, ids, q: dict(stop_ids=q[:1].to("meta")), "stop_ids must hold token ids, got a tensor on the meta"),
])
def test_models_and_ids_without_values_or_with_dsa_layers_are_refused_before_any_model_work(model, context, change,
                                                                                            message):
    ids, query = context
    args = dict(model=model, **good_arguments(ids, query)) | change(model, ids, query)
    forwards = []
    hook = torch.nn.modules.module.register_module_forward_pre_hook(lambda module, inputs: forwards.append(module))
    try:
        with pytest.raises(ValueError, match=message):
            generate(args.pop("model"), args.pop("context_ids"), args.pop("query_ids"), args.pop("config"), **args)
    finally:
        hook.remove()
    assert forwards == []

"""benchmarks/e2e_decode.py's measurement on a tiny transformers model, run eagerly on the CPU (the
script's compiled runs are GPU benchmarks): a decode row times new and seen cache lengths, compares
greedy tokens with the first method's, and renders."""
from types import SimpleNamespace

import torch

from benchmarks.e2e import SMOKE_SIZES, build
from benchmarks.e2e_decode import WARMUP_STEPS, cache_argument, decode_row, decode_steps, render_markdown
from compiler.report import Report


def test_decode_rows_time_new_and_seen_lengths_and_compare_tokens():
    from transformers import DynamicCache

    model, config = build("DeepseekV32ForCausalLM", 1, SMOKE_SIZES, "cpu", torch.float32)
    cache = DynamicCache(config=config)
    prompt = torch.randint(0, config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(prompt, use_cache=True, logits_to_keep=1, **cache_argument(model, cache))
    length = cache.get_seq_length()
    args = SimpleNamespace(steps=2)
    reference = {}
    rows = [decode_row(model, Report(), "tiny", method, 2, 40, cache, prompt[:, :1], reference, args, "cpu")
            for method in ("stock", "pulsar_dosa")]
    assert cache.get_seq_length() == length  # every run decodes from a copy
    assert all(r["error"] is None and r["ms"] > 0 and r["ms_seen_lengths"] > 0 for r in rows)
    assert len(rows[0]["ms_all"]) == args.steps and rows[1]["argmax_agree"] is True
    with torch.no_grad():
        times, logits, ids = decode_steps(model, cache, prompt[:, :1], WARMUP_STEPS, "cpu")
    assert len(times) == WARMUP_STEPS and logits.shape[:2] == (WARMUP_STEPS, 2) and ids.shape == (2, 1)
    assert cache.get_seq_length() == length + WARMUP_STEPS
    table = render_markdown({"device": "cpu", "versions": {}, "layers": 1, "steps": 2, "rows": rows})
    assert "| 2 | 40 |" in table and "x / " in table


def test_a_synthetic_cache_grows_along_its_token_axis_and_decodes_through_the_absorbed_op():
    import copy

    from transformers import DynamicCache

    from benchmarks.e2e_decode import SYNTHETIC_PROMPT, grow_cache
    from compiler.report import collecting

    model, config = build("DeepseekV32ForCausalLM", 1, SMOKE_SIZES, "cpu", torch.float32)
    cache = DynamicCache(config=config)
    with torch.no_grad():
        model(torch.randint(0, config.vocab_size, (2, SYNTHETIC_PROMPT)), use_cache=True, **cache_argument(model, cache))
    before = cache.layers[0].keys
    grow_cache(cache, 300, seed=0)
    layer = cache.layers[0]
    assert cache.get_seq_length() == 300 and layer.keys.shape == (2, 1, 300, before.shape[3])
    assert layer.indexer_keys.shape[1] == 300 and layer.keys.dtype == before.dtype
    assert abs(float(layer.keys.std()) - float(before.std())) < 0.2 * float(before.std())
    step = torch.randint(0, config.vocab_size, (2, 1), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="pulsar_dosa", options={"downstream": "eager", "stock_below": 0})
    with torch.no_grad(), collecting() as report:
        want = model(step, use_cache=True, **cache_argument(model, copy.deepcopy(cache))).logits
        got = compiled(step, use_cache=True, **cache_argument(compiled, copy.deepcopy(cache))).logits
    assert [r.path for r in report.rewrites if r.kind == "sparse_attention"] == ["absorbed"]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_decoding_over_a_converted_fp8_indexer_cache_gives_the_fp8_indexer_output():
    """pulsar_dosa_fp8_cache decodes over the copy converted to FP8 indexer keys
    (``to_fp8_indexer_cache``): the same logits as pulsar_dosa_fp8 over the bf16 copy, to the bit."""
    from transformers import DynamicCache

    from benchmarks.e2e_decode import method_cache
    from compiler.fp8_indexer_cache import Fp8IndexedLayer

    model, config = build("DeepseekV32ForCausalLM", 1, SMOKE_SIZES, "cpu", torch.bfloat16)
    cache = DynamicCache(config=config)
    prompt = torch.randint(0, config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(prompt, use_cache=True, logits_to_keep=1, **cache_argument(model, cache))
    converted = method_cache("pulsar_dosa_fp8_cache", cache)
    assert isinstance(converted.layers[0], Fp8IndexedLayer) and not isinstance(cache.layers[0], Fp8IndexedLayer)
    assert converted.layers[0].indexer_keys.dtype == torch.float8_e4m3fn
    assert converted.get_seq_length() == cache.get_seq_length()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="pulsar_dosa", dynamic=True,
                             options={"downstream": "eager", "indexer_precision": "fp8"})
    reference = {}
    rows = [decode_row(compiled, Report(), "tiny", method, 1, 40, cache, prompt[:, :1], reference,
                       SimpleNamespace(steps=2), "cpu") for method in ("pulsar_dosa_fp8", "pulsar_dosa_fp8_cache")]
    assert all(r["error"] is None for r in rows), rows
    assert rows[1]["argmax_agree"] is True and rows[1]["max_abs_diff"] == 0.0

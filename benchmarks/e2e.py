"""End to end, as a user meets it: prefill of a DSA transformers model compiled with
``torch.compile(model)`` (stock inductor) against ``torch.compile(model, backend="pulsar_dosa")``,
in the same run, on one GPU.

Run from the repository root on a CUDA machine (the package installed, so the entry point resolves):

    python3 benchmarks/e2e.py --out benchmarks/results/e2e_h200.json
    python3 benchmarks/e2e.py --shape v32 --out benchmarks/results/e2e_v32_h200.json
    python3 benchmarks/e2e.py --smoke --out /tmp/e2e_smoke.json        # tiny, on the CPU

Models (``--shape``): ``small``: ``DeepseekV32ForCausalLM`` and ``GlmMoeDsaForCausalLM`` with random
weights in bf16, both with DeepSeek-V3.2's indexer (64 heads x 128, topk 2048) and a small rest
(``--layers`` layers, default 2, hidden 1024, 8 MLA heads, q_lora 512, kv_lora 256, dense MLP, sdpa
attention); ``v32``: one DeepSeek-V3.2-shaped decoder layer (``DeepseekV32ForCausalLM``, hidden
7168, 128 MLA heads, q_lora 1536, kv_lora 512, qk 128 + 64, v 128, dense MLP 18432, the same
indexer, vocab 2048, S up to 131072). One prefill of S tokens, batch 1, ``use_cache=False``,
logits of the last position only (``logits_to_keep=1``, as ``generate``'s prefill does). Each method compiles once with ``dynamic=True`` (one graph serves
every S), then per S: one warm-up call, then the median of ``--reps`` calls (CUDA events) and the
peak memory of one call. A method that fails at some S (out of memory) records the error there.

Methods: ``stock`` = torch.compile(model); ``pulsar_dosa`` = the backend with its defaults;
``pulsar_dosa_union`` = the backend with option ``sparse_form="union"`` (the sparse attention on
the expanded keys and values, where the default takes MLA's absorbed form at 128 heads);
``pulsar_dosa_plan`` = the backend with a per-layer plan made by ``python -m compiler.plan`` on
``--plan-tokens`` random tokens (random-init indexers do not prune, so the plan should say dense);
``pulsar_dosa_fp8`` = the backend with option ``indexer_precision="fp8"`` (the indexer in E4M3 as
DeepSeek-V3.2 scores it, SPEC A.10; its row also compares its logits with ``pulsar_dosa``'s, the
bf16 indexer's, where that method ran: ``argmax_agree_bf16_indexer``).
``argmax_agree``: the last position's argmax equals stock's (null where stock failed), with the
largest absolute logit difference; the models have random weights, so near-ties can flip an
argmax without any error: read it with ``max_abs_diff``. ``--profile S ...``: at those lengths one
more call per method runs under ``torch.profiler``; the row's ``kernels_ms`` holds the total GPU
time and the largest kernels by name. ``sparse_forms``: the forms the sparse-attention calls of the
first call took at run time (``compiler.ops.sparse_form.picks``; the "auto" form's choice per call).

``--mode generate`` times what users run: ``model.generate`` (greedy, ``--new-tokens`` tokens: a
prefill through the cache, then one decode step per token), the model's ``forward`` compiled as the
method says, in one run:

    python3 benchmarks/e2e.py --mode generate --shape tiny-dsa --out benchmarks/results/e2e_generate_tiny_dsa_h100.json
    python3 benchmarks/e2e.py --mode generate --shape v32 --out benchmarks/results/e2e_generate_v32_h100.json
    python3 benchmarks/e2e.py --mode generate --shape v32 --batches 64 --lengths 131072 \
        --methods stock pulsar_dosa_latent --out benchmarks/results/e2e_generate_v32_b64_h100.json
    python3 benchmarks/e2e.py --mode generate --smoke --out /tmp/e2e_generate_smoke.json   # tiny, on the CPU

Shapes: ``tiny-dsa`` is the trained ``benchmarks/models/tiny-dsa`` (bf16), its prompts held-out text
(``models/heldout_tokens.npy``, one window per batch row), prompt lengths 8K-64K; ``v32`` the
DeepSeek-V3.2 layer above (random weights and prompts), 16K-128K. Methods: ``eager`` (the model as
it is), ``stock`` (``torch.compile``), ``pulsar_dosa`` (the backend's defaults, transformers' cache)
and ``pulsar_dosa_latent`` (the backend over ``compiler.latent_cache.latent_cache(model)``). A batch
B > 1 of the v32 shape (and of its smoke stand-in) decodes over a SYNTHETIC cache by default
(``--synthetic``: a short real prefill grown to S tokens per row with random values,
``e2e_decode.grow_cache``; the prefill is then the one token after it): its prefill of B·S tokens
would not fit. Per (method, B, S) two
``generate`` calls: the first compiles (``first_total_s``), the second is timed: ``ttft_ms`` (start to
the end of the first forward, each forward synchronised), ``decode_ms`` (median time between the ends
of consecutive forwards: a decode step as generate paces it, host work included; every step in
``decode_ms_all``), ``total_ms``, ``peak_gib`` (peak memory above what was allocated before),
``compiles`` (frames Dynamo compiled during the timed call: a recompile per new cache length shows
here) and ``alloc_retries`` (the CUDA caching allocator's retries after freeing its cache, in the
timed call), ``tokens_match_eager`` / ``first_mismatch`` (the generated tokens against eager's where
eager ran), ``cache_gib`` (the cache after the call) and ``cache_bytes_per_token`` (its first layer
per token and sequence), the first call's ``first_compiles``, and of the graphs the backend
compiled at this size the sparse attention's forms, each with its queries per row (``attention_forms``:
"absorbed at S=1" is a decode graph's), and the near misses.
``--profile S ...``: at those prompt lengths one more call runs under ``torch.profiler``
(``kernels_ms``: the GPU time of the whole call, its largest kernels; a synthetic cache's growth
included), and one of a single token: ``decode_device_ms``, the GPU time of a decode step (the
difference over the decode steps, ``device_ms_per_step``), beside ``decode_ms``'s wall time shows how
much of a step is host work. A method that fails (out of memory) records the error.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch

from benchmarks.harness import kernel_breakdown, median_ms, notes_lines
from compiler.ops import sparse_form

SIZES = dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=8, num_key_value_heads=8,
             q_lora_rank=512, kv_lora_rank=256, qk_nope_head_dim=128, qk_rope_head_dim=64,
             v_head_dim=128, index_n_heads=64, index_head_dim=128, index_topk=2048, vocab_size=32768,
             moe_intermediate_size=256, n_routed_experts=8, num_experts_per_tok=2, n_group=1,
             topk_group=1)
SMOKE_SIZES = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                   q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
                   v_head_dim=16, index_n_heads=8, index_head_dim=32, index_topk=16, vocab_size=128,
                   moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                   topk_group=1)
V32_SIZES = dict(hidden_size=7168, intermediate_size=18432, num_attention_heads=128, num_key_value_heads=128,
                 q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                 index_n_heads=64, index_head_dim=128, index_topk=2048, vocab_size=2048,
                 moe_intermediate_size=2048, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1)
"""One DeepSeek-V3.2 decoder layer (its MoE sizes unused: with first_k_dense_replace = layers = 1
the layer's MLP is dense)."""
SHAPES = {"small": dict(sizes=SIZES, layers=2, models=("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"),
                        lengths=[4096, 16384, 32768, 65536]),
          "v32": dict(sizes=V32_SIZES, layers=1, models=("DeepseekV32ForCausalLM",),
                      lengths=[16384, 32768, 65536, 131072])}
"""``--shape``: sizes, default layers, models and prefill lengths."""
MODELS = SHAPES["small"]["models"]
METHOD_OPTIONS = {"pulsar_dosa_every_call": {"stock_below": 0}, "pulsar_dosa_union": {"sparse_form": "union"},
                  "pulsar_dosa_fp8": {"indexer_precision": "fp8"}, "pulsar_dosa_fp8_cache": {"indexer_precision": "fp8"}}
"""Backend options of the pulsar_dosa methods besides the defaults (the plan method adds its plan;
``pulsar_dosa_fp8_cache``, decode only, also runs on an FP8 indexer key cache)."""
PROFILE_TOP = 15
"""Kernels listed per profiled row (``--profile``), largest GPU time first."""
PLAN_TIMEOUT_S = 150
"""A plan that takes longer is recorded as the plan rows' error."""


def build(name: str, layers: int, sizes: dict, device: str, dtype: torch.dtype, seed: int = 0):
    """The randomly initialised model ``name`` (eval mode) and its config."""
    import transformers

    config_cls = getattr(transformers, name.replace("ForCausalLM", "Config"))
    config = config_cls(num_hidden_layers=layers, first_k_dense_replace=layers,
                        max_position_embeddings=1 << 20, attn_implementation="sdpa", **sizes)
    torch.manual_seed(seed)
    model = getattr(transformers, name)(config).eval().to(device=device, dtype=dtype)
    return model, config


@contextlib.contextmanager
def recorded_failure(row: dict, device: str):
    """Any exception of the block becomes ``row["error"]`` (its type and the first line of its
    message); the cached CUDA memory is freed after it."""
    try:
        yield
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def make_plan(model_name: str, config, tokens_count: int, device: str, workdir: Path) -> Path:
    """A per-layer plan from ``python -m compiler.plan`` on random calibration tokens."""
    cfg = workdir / f"{model_name}.json"
    config.to_json_file(cfg)
    tokens = workdir / "calib.txt"
    ids = torch.randint(0, config.vocab_size, (tokens_count,), generator=torch.Generator().manual_seed(1))
    tokens.write_text(" ".join(map(str, ids.tolist())))
    out = workdir / f"{model_name}.plan.json"
    cmd = [sys.executable, "-m", "compiler.plan", "--model", str(cfg), "--tokens", str(tokens), "--out", str(out),
           "--device", device, "--seq-len", str(tokens_count)]
    subprocess.run(cmd, check=True, timeout=PLAN_TIMEOUT_S, capture_output=True, text=True)
    return out


def plan_for(name: str, config, args, device: str) -> Path:
    """The model's plan from ``python -m compiler.plan`` (kept beside the results)."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        made = make_plan(name, config, args.plan_tokens, device, Path(tmp))
        plan = Path(args.workdir) / made.name
        plan.write_text(made.read_text())
    print(f"[{name}] plan made in {time.perf_counter() - start:.1f} s: {plan}", flush=True)
    return plan


def method_module(model, method: str, plan: Path | None, smoke: bool = False):
    """``model`` compiled as ``method`` runs it. A smoke run (the CPU) passes ``stock_below=0`` to
    every pulsar_dosa method: there the backend would otherwise keep every stock subgraph
    (compiler.defaults.STOCK_BELOW), and the smoke exists to run the ops; and it compiles with
    eager downstreams (Dynamo's "eager" backend for stock, ``downstream="eager"`` for the others):
    inductor's CPU code generation would take minutes."""
    if method == "stock":
        return torch.compile(model, dynamic=True, **({"backend": "eager"} if smoke else {}))
    options = {**METHOD_OPTIONS, "pulsar_dosa_plan": {"plan": str(plan)}}.get(method, {})
    options = {**options, "stock_below": 0, "downstream": "eager"} if smoke else options
    return torch.compile(model, backend="pulsar_dosa", options=options, dynamic=True)


def run_model(name: str, args, emit) -> None:
    device = "cpu" if args.smoke else "cuda"
    sizes = SMOKE_SIZES if args.smoke else SHAPES[args.shape]["sizes"]
    dtype = torch.float32 if args.smoke else torch.bfloat16
    model, config = build(name, args.layers, sizes, device, dtype)
    lengths = args.lengths
    methods = args.methods
    references: dict[str, dict[int, torch.Tensor]] = {"stock": {}, "pulsar_dosa": {}}  # last logits per S
    plan, plan_error = None, None
    for method in methods:
        if method == "pulsar_dosa_plan":
            try:
                plan = plan_for(name, config, args, device)
            except Exception as exc:  # recorded in every row of the method
                detail = (getattr(exc, "stderr", None) or str(exc)).strip().splitlines() or [""]
                plan_error = f"plan: {type(exc).__name__}: {detail[-1][:300]}"
        torch._dynamo.reset()
        compiled = method_module(model, method, plan, smoke=args.smoke)
        for S in lengths:
            row = {"model": name, "S": S, "method": method, "ms": None, "peak_gib": None, "error": None,
                   "argmax_agree": None, "max_abs_diff": None}
            ids = torch.randint(0, config.vocab_size, (1, S), generator=torch.Generator().manual_seed(S)).to(device)
            with recorded_failure(row, device):  # out of memory, or any failure of this method at this S
                if method == "pulsar_dosa_plan" and plan_error:
                    raise RuntimeError(plan_error)
                with torch.no_grad():
                    before = sparse_form.picks()
                    start = time.perf_counter()
                    logits = compiled(ids, use_cache=False, logits_to_keep=1).logits[0, -1].float()
                    sync(device)
                    row["first_call_s"] = round(time.perf_counter() - start, 2)
                    row["sparse_forms"] = {form: n - before.get(form, 0) for form, n in sparse_form.picks().items()
                                           if n > before.get(form, 0)}
                    if device == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                        base = torch.cuda.memory_allocated()
                    compiled(ids, use_cache=False, logits_to_keep=1)
                    sync(device)
                    if device == "cuda":
                        row["peak_gib"] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 3)
                    row["ms"] = round(median_ms(lambda: compiled(ids, use_cache=False, logits_to_keep=1),
                                                args.reps, device), 2)
                    if device == "cuda" and S in args.profile:
                        row["kernels_ms"] = kernel_breakdown(lambda: compiled(ids, use_cache=False, logits_to_keep=1),
                                                             top=PROFILE_TOP)
                if method in ("stock", "pulsar_dosa"):
                    references[method][S] = logits
                if method != "stock" and S in references["stock"]:
                    row["argmax_agree"] = bool(logits.argmax() == references["stock"][S].argmax())
                    row["max_abs_diff"] = float((logits - references["stock"][S]).abs().max())
                if method == "pulsar_dosa_fp8" and S in references["pulsar_dosa"]:
                    bf16 = references["pulsar_dosa"][S]
                    row["argmax_agree_bf16_indexer"] = bool(logits.argmax() == bf16.argmax())
                    row["max_abs_diff_bf16_indexer"] = float((logits - bf16).abs().max())
            emit(row)
        del compiled


# --mode generate

TINY_DSA = Path(__file__).resolve().parent / "models" / "tiny-dsa"
HELDOUT = Path(__file__).resolve().parent / "models" / "heldout_tokens.npy"
GENERATE_SHAPES = {"v32": dict(lengths=[16384, 32768, 65536, 131072], batches=[1, 64]),
                   "tiny-dsa": dict(lengths=[8192, 16384, 32768, 65536], batches=[1]),
                   "smoke": dict(lengths=[64], batches=[1, 2])}
"""``--mode generate``: prompt lengths and batches per shape (the smoke shape: SMOKE_SIZES on the CPU)."""
GENERATE_METHODS = ("eager", "stock", "pulsar_dosa", "pulsar_dosa_latent")


class StepClock:
    """A model's ``forward`` that records when each call ends, its device synchronised first."""

    def __init__(self, forward, device: str):
        self.forward, self.device, self.ends = forward, device, []

    def __call__(self, *args, **kwargs):
        out = self.forward(*args, **kwargs)
        sync(self.device)
        self.ends.append(time.perf_counter())
        return out


def generate_model(shape: str, device: str, dtype: torch.dtype):
    """``(model, config)`` of a generate shape: the trained tiny-dsa, or a random-weight one."""
    if shape == "tiny-dsa":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(TINY_DSA, dtype=dtype).to(device).eval()
        return model, model.config
    sizes = SMOKE_SIZES if shape == "smoke" else V32_SIZES
    return build("DeepseekV32ForCausalLM", 1, sizes, device, dtype)


def prompt_ids(shape: str, config, batch: int, length: int, device: str) -> torch.Tensor:
    """[batch, length] prompt ids: held-out text for tiny-dsa (row b starts b·length tokens in),
    random ids otherwise."""
    if shape == "tiny-dsa":
        import numpy as np

        tokens = np.load(HELDOUT).astype(np.int64)
        if tokens.size < batch * length:
            raise ValueError(f"{HELDOUT}: {tokens.size} tokens, fewer than {batch}x{length}")
        return torch.from_numpy(tokens[:batch * length].reshape(batch, length)).to(device)
    g = torch.Generator().manual_seed(length + batch)
    return torch.randint(0, config.vocab_size, (batch, length), generator=g).to(device)


def method_forward(forward, method: str, smoke: bool):
    """The forward ``method`` runs (module docstring; the smoke run compiles with eager downstreams
    and ``stock_below=0``, as ``method_module`` explains)."""
    if method == "eager":
        return forward
    if method == "stock":
        return torch.compile(forward, **({"backend": "eager"} if smoke else {}))
    options = {"stock_below": 0, "downstream": "eager"} if smoke else {}
    return torch.compile(forward, backend="pulsar_dosa", options=options)


def method_cache(model, method: str, config):
    """The cache ``method`` generates over: a latent cache for pulsar_dosa_latent, transformers' otherwise."""
    from transformers import DynamicCache

    from compiler.latent_cache import latent_cache

    return latent_cache(model) if method == "pulsar_dosa_latent" else DynamicCache(config=config)


def synthetic_cache(model, forward, method: str, config, ids: torch.Tensor, seed: int):
    """A cache of ``method`` holding ``ids.shape[1] - 1`` tokens per row: a prefill of
    ``e2e_decode.SYNTHETIC_PROMPT`` tokens by the uncompiled ``forward``, grown with random values
    (``e2e_decode.grow_cache``)."""
    from benchmarks.e2e_decode import SYNTHETIC_PROMPT, cache_argument, grow_cache

    cache = method_cache(model, method, config)
    with torch.no_grad():
        forward(ids[:, :SYNTHETIC_PROMPT], use_cache=True, **cache_argument(model, cache))
    grow_cache(cache, ids.shape[1] - 1, seed)
    return cache


def cache_bytes(cache) -> list[int]:
    """The bytes of each layer's cache tensors."""
    return [sum(t.numel() * t.element_size() for t in vars(layer).values() if isinstance(t, torch.Tensor))
            for layer in cache.layers]


def generate_once(model, ids, new_tokens: int, cache, device: str) -> dict:
    """One timed ``generate`` (module docstring's fields) over ``cache``."""
    from benchmarks.e2e_decode import cache_argument

    clock = model.forward
    clock.ends.clear()
    kwargs = cache_argument(model, cache)
    frames = torch._dynamo.utils.counters["frames"]["ok"]
    retries = torch.cuda.memory_stats().get("num_alloc_retries", 0) if device == "cuda" else 0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             **kwargs)
    sync(device)
    end = time.perf_counter()
    steps = [1000 * (b - a) for a, b in zip(clock.ends, clock.ends[1:])]
    row = {"ttft_ms": round(1000 * (clock.ends[0] - start), 2), "decode_ms": round(statistics.median(steps), 3)
           if steps else None, "decode_ms_first": round(steps[0], 3) if steps else None,
           "decode_ms_all": [round(t, 3) for t in steps], "total_ms": round(1000 * (end - start), 2),
           "compiles": torch._dynamo.utils.counters["frames"]["ok"] - frames, "tokens": out[:, ids.shape[1]:]}
    if device == "cuda":
        row["peak_gib"] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 3)
        row["alloc_retries"] = torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries
    return row


def run_generate(name: str, args, emit) -> None:
    """Every method of ``args.methods`` at every (B, S) of the shape (module docstring)."""
    from compiler.report import collecting

    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    shape = "smoke" if args.smoke and args.shape != "tiny-dsa" else args.shape
    model, config = generate_model(shape, device, dtype)
    forward = model.forward
    eager_tokens: dict[tuple[int, int], torch.Tensor] = {}
    for method in args.methods:
        torch._dynamo.reset()
        model.forward = StepClock(method_forward(forward, method, args.smoke), device)
        for B in args.batches:
            for S in args.lengths:
                synthetic = args.synthetic if args.synthetic is not None else (shape in ("v32", "smoke") and B > 1)
                row = {"model": name, "method": method, "B": B, "S": S, "new_tokens": args.new_tokens,
                       "cache": "latent" if method == "pulsar_dosa_latent" else "transformers",
                       "synthetic_cache": synthetic, "error": None, "tokens_match_eager": None}
                with recorded_failure(row, device):  # out of memory, or any failure of this method at this size
                    ids = prompt_ids(shape, config, B, S + 1 if synthetic else S, device)
                    # generate's first forward takes every id it is given: over a grown cache, the uncached one
                    prompt = ids[:, S:] if synthetic else ids

                    def new_cache():
                        return synthetic_cache(model, forward, method, config, ids, seed=S + B) if synthetic \
                            else method_cache(model, method, config)

                    runs = []
                    for _ in range(2):  # the first compiles, the second is timed
                        cache = new_cache()
                        start = time.perf_counter()
                        with collecting() as report:
                            runs.append(generate_once(model, prompt, args.new_tokens, cache, device))
                        runs[-1]["wall_s"] = time.perf_counter() - start
                        row.setdefault("attention_forms", []).extend(
                            f"{r.path} at S={r.shapes['q'][2]}" for r in report.rewrites
                            if r.kind == "sparse_attention")
                        row.setdefault("near_misses", []).extend(
                            f"{m.kind}: {m.reason[:120]}" for m in report.near_misses)
                        per_layer = cache_bytes(cache)
                        row["cache_gib"] = round(sum(per_layer) / 2**30, 3)
                        row["cache_bytes_per_token"] = per_layer[0] // (B * cache.get_seq_length())
                        del cache
                        if device == "cuda":
                            torch.cuda.empty_cache()
                    row["attention_forms"] = sorted(set(row["attention_forms"]))
                    row["near_misses"] = sorted(set(row["near_misses"]))
                    first, timed = runs
                    tokens = timed.pop("tokens")
                    timed.pop("wall_s")
                    row.update(timed, first_total_s=round(first["wall_s"], 2), first_compiles=first["compiles"])
                    if device == "cuda" and S in args.profile:
                        def profiled(tokens: int) -> dict:
                            return kernel_breakdown(lambda: generate_once(model, prompt, tokens, new_cache(), device),
                                                    top=PROFILE_TOP)

                        row["kernels_ms"] = profiled(args.new_tokens)
                        if args.new_tokens > 1:
                            row["decode_device_ms"] = device_ms_per_step(row["kernels_ms"], profiled(1),
                                                                         args.new_tokens)
                    if method == "eager":
                        eager_tokens[B, S] = tokens
                    elif (B, S) in eager_tokens:
                        same = (tokens == eager_tokens[B, S]).all(0)
                        row["tokens_match_eager"] = bool(same.all())
                        row["first_mismatch"] = None if same.all() else int((~same).nonzero()[0])
                emit(row)
        model.forward = forward
    del model


def device_ms_per_step(whole: dict, prefill: dict, new_tokens: int) -> float:
    """GPU ms per decode step: the profiled GPU time of a ``new_tokens`` generate less that of a
    1-token one (its prefill alone), over the ``new_tokens - 1`` decode steps (``kernel_breakdown``'s
    ``total_ms`` of each)."""
    if new_tokens < 2:
        raise ValueError(f"new_tokens: expected at least 2 (a decode step), got {new_tokens}")
    return round((whole["total_ms"] - prefill["total_ms"]) / (new_tokens - 1), 4)


def _steps_cell(method: str, row: dict) -> str:
    device = row.get("decode_device_ms")
    return (f"{method} {_fmt(row.get('decode_ms_first'))} / {_fmt(row.get('decode_ms'))}"
            + ("" if device is None else f" ({device:.2f} on the GPU)"))


def render_generate(doc: dict) -> str:
    lines = [f"# End to end: generate on a compiled DSA model ({doc['device']})", "",
             f"versions: {doc['versions']}; {doc['new_tokens']} greedy tokens per sequence; the second of two "
             "generate calls per size (the first compiles); each forward synchronised. Cells: time to first "
             "token / ms per decode step (median) / total ms, peak GiB.", *notes_lines(doc), ""]
    for model in dict.fromkeys(r["model"] for r in doc["rows"]):
        rows = [r for r in doc["rows"] if r["model"] == model]
        methods = list(dict.fromkeys(r["method"] for r in rows))
        lines += [f"## {model}", "", "| B | S | " + " | ".join(methods) + " | total vs stock | decode steps "
                  "first / median | compiles in timed call | tokens match eager |",
                  "|" + "---|" * (len(methods) + 6)]
        for key in dict.fromkeys((r["B"], r["S"]) for r in rows):
            by = {r["method"]: r for r in rows if (r["B"], r["S"]) == key}
            cells = []
            for m in methods:
                r = by.get(m)
                cells.append("-" if r is None else r["error"].split(":")[0] if r["error"] else
                             f"{r['ttft_ms']:.1f} / {_fmt(r['decode_ms'])} / {r['total_ms']:.1f}"
                             + (f", {r['peak_gib']}" if r.get("peak_gib") is not None else ""))
            ours = [m for m in methods if m.startswith("pulsar_dosa") and m in by and not by[m]["error"]]
            stock = by.get("stock")
            speed = ", ".join(f"{m} {stock['total_ms'] / by[m]['total_ms']:.2f}x" for m in ours
                              if stock and not stock["error"]) or "-"
            steps = ", ".join(_steps_cell(m, r) for m, r in by.items() if not r["error"])
            compiles = ", ".join(f"{m} {r['compiles']}" for m, r in by.items() if not r["error"])
            match = ", ".join(f"{m} {r['tokens_match_eager']}" for m, r in by.items()
                              if r.get("tokens_match_eager") is not None) or "-"
            lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + f" | {speed} | {steps} | {compiles} | "
                         f"{match} |")
        lines.append("")
    return "\n".join(lines)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def render_markdown(doc: dict) -> str:
    lines = [f"# End to end: prefill of a compiled DSA model ({doc['device']})", "",
             f"versions: {doc['versions']}; layers: {doc['layers']}; bf16, random weights, batch 1, "
             "use_cache=False, logits of the last position; median of "
             f"{doc['reps']} calls after a warm-up; peak = extra memory of one call.", *notes_lines(doc), ""]
    for model in dict.fromkeys(r["model"] for r in doc["rows"]):
        rows = [r for r in doc["rows"] if r["model"] == model]
        methods = list(dict.fromkeys(r["method"] for r in rows))
        lines += [f"## {model}", "", "| S | " + " | ".join(f"{m} ms (peak GiB)" for m in methods)
                  + " | speed-up vs stock | argmax agree |", "|" + "---|" * (len(methods) + 3)]
        for S in dict.fromkeys(r["S"] for r in rows):
            cells, by = [], {r["method"]: r for r in rows if r["S"] == S}
            for m in methods:
                r = by.get(m)
                cells.append("-" if r is None else (f"{r['error'].split(':')[0]}" if r["error"]
                                                    else f"{r['ms']:.1f} ({r['peak_gib']})"))
            stock, ours = by.get("stock"), by.get("pulsar_dosa")
            speed = (f"{stock['ms'] / ours['ms']:.2f}x" if stock and ours and stock["ms"] and ours["ms"]
                     else ("stock fails" if stock and ours and ours["ms"] else "-"))
            forms = ours.get("sparse_forms") if ours else None
            speed += f" ({', '.join(f'{k} x{v}' for k, v in forms.items())})" if forms else ""
            agree = ", ".join([str(r["argmax_agree"]) for r in by.values() if r["argmax_agree"] is not None]
                              + [f"fp8 vs bf16 indexer {r['argmax_agree_bf16_indexer']}" for r in by.values()
                                 if "argmax_agree_bf16_indexer" in r]) or "-"
            lines.append(f"| {S} | " + " | ".join(cells) + f" | {speed} | {agree} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON results path (a .md table is written beside it)")
    p.add_argument("--mode", default="prefill", choices=["prefill", "generate"],
                   help="prefill: one forward without a cache; generate: model.generate (module docstring)")
    p.add_argument("--shape", default=None, choices=list(SHAPES) + ["tiny-dsa"],
                   help="model sizes (module docstring; tiny-dsa with --mode generate). Default: small (prefill), "
                        "tiny-dsa (generate)")
    p.add_argument("--models", nargs="+", default=None, choices=SHAPES["small"]["models"])
    p.add_argument("--methods", nargs="+", default=None,
                   choices=["stock", "pulsar_dosa", "pulsar_dosa_union", "pulsar_dosa_plan", "pulsar_dosa_fp8",
                            *GENERATE_METHODS],
                   help="default: stock, pulsar_dosa and pulsar_dosa_plan (small), stock and pulsar_dosa (v32); "
                        f"generate: {', '.join(GENERATE_METHODS)}")
    p.add_argument("--batches", nargs="+", type=int, default=None, help="generate: sequences per call")
    p.add_argument("--new-tokens", type=int, default=32, help="generate: greedy tokens per sequence")
    p.add_argument("--synthetic", action=argparse.BooleanOptionalAction, default=None,
                   help="generate: decode over a grown cache (default: v32 at B > 1)")
    p.add_argument("--lengths", nargs="+", type=int, default=None)
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--plan-tokens", type=int, default=4096)
    p.add_argument("--profile", nargs="+", type=int, default=[], metavar="S",
                   help="lengths at which one call per method (generate: one generate call) is also profiled "
                        "(GPU time per kernel name)")
    p.add_argument("--smoke", action="store_true", help="tiny models on the CPU (checks the script)")
    args = p.parse_args(argv)
    if args.mode == "generate":
        return generate_main(args)
    args.shape = args.shape or "small"
    if args.shape not in SHAPES:
        p.error(f"--shape {args.shape}: only with --mode generate")
    shape = SHAPES[args.shape]
    args.models = args.models or list(shape["models"])
    args.layers = args.layers or shape["layers"]
    args.methods = args.methods or (["stock", "pulsar_dosa", "pulsar_dosa_plan"] if args.shape == "small"
                                    else ["stock", "pulsar_dosa"])
    if args.lengths is None:
        args.lengths = [64, 128] if args.smoke else shape["lengths"]
    if args.smoke:
        args.plan_tokens = min(args.plan_tokens, 128)
    args.workdir = tempfile.mkdtemp(prefix="e2e_plans_")  # the plans live for the run only
    return run_document(args, run_model, render_markdown, reps=args.reps, shape=args.shape)


def generate_main(args) -> int:
    """``--mode generate`` (module docstring)."""
    args.shape = args.shape or "tiny-dsa"
    if args.shape == "small":
        raise SystemExit("--mode generate: --shape v32 or tiny-dsa")
    methods = [m for m in (args.methods or GENERATE_METHODS) if m in GENERATE_METHODS]
    if args.methods and len(methods) != len(args.methods):
        raise SystemExit(f"--mode generate: methods are {', '.join(GENERATE_METHODS)}")
    args.methods = methods
    sizes = GENERATE_SHAPES["smoke" if args.smoke and args.shape != "tiny-dsa" else args.shape]
    args.lengths = args.lengths or ([64] if args.smoke else sizes["lengths"])  # tiny-dsa's smoke: 64 tokens too
    args.batches = args.batches or ([1] if args.smoke and args.shape == "tiny-dsa" else sizes["batches"])
    if args.smoke:
        args.new_tokens = min(args.new_tokens, 4)
    args.models = ["tiny-dsa" if args.shape == "tiny-dsa" else "DeepseekV32ForCausalLM"]
    args.layers = 5 if args.shape == "tiny-dsa" else 1
    return run_document(args, run_generate, render_generate, shape=args.shape, new_tokens=args.new_tokens,
                        mode="generate")


def run_document(args, run_model, render_markdown, **fields) -> int:
    """Run ``run_model(name, args, emit)`` for every model of ``args.models``; every emitted row is
    printed and rewrites ``args.out`` (the JSON document: device, versions, layers, ``fields``,
    rows) and the markdown table beside it (``render_markdown(doc)``)."""
    import transformers
    import triton

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"device": torch.cuda.get_device_name() if not args.smoke else "cpu (smoke)",
           "versions": {"torch": torch.__version__, "triton": triton.__version__,
                        "transformers": transformers.__version__},
           "layers": args.layers, **fields, "rows": []}

    def emit(row):
        doc["rows"].append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps(doc, indent=1))
        out.with_suffix(".md").write_text(render_markdown(doc))

    for name in args.models:
        run_model(name, args, emit)
    print(render_markdown(doc))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())

"""End to end at decode: one generated token of a DSA transformers model over a KV cache of T
tokens, ``torch.compile(model)`` against ``torch.compile(model, backend="pulsar_dosa")``, one GPU.

    python3 benchmarks/e2e_decode.py --out benchmarks/results/e2e_decode_h200.json
    python3 benchmarks/e2e_decode.py --shape v32 --out benchmarks/results/e2e_decode_v32_h200.json
    python3 benchmarks/e2e_decode.py --smoke --out /tmp/e2e_decode_smoke.json   # tiny, on the CPU

Models as in ``e2e.py`` (``--shape small``, or ``v32``: one DeepSeek-V3.2-shaped layer, whose
cache of B = 1 at T = 131072 grows from a SYNTHETIC_PROMPT-token prefill with random values of the
same mean and spread, ``grow_cache``; transformers' cache of its expanded keys and values would
take ~690 GB at B = 64). Per batch B and context T a ``DynamicCache``; per
method (compiled once, ``dynamic=True``), on a copy of it: WARMUP_STEPS untimed steps, then
``--steps`` greedy steps, each timed alone with its host time (default mode, no CUDA graphs).
Row fields: ``ms`` (median, every step at a cache length not run before, as generate runs it),
``ms_seen_lengths`` (the steps replayed at lengths run before), ``indexer_rewrites``,
``attention_forms`` (the sparse-attention forms in the decode graphs), and against the first method
``argmax_agree`` and ``max_abs_diff``. Methods: ``stock``, ``pulsar_dosa`` (small calls keep their
stock subgraph, ``compiler.policy.keeps_stock``; an MLA layer's sparse attention at decode takes
the absorbed form), ``pulsar_dosa_every_call`` (``stock_below=0``), ``pulsar_dosa_union``
(``sparse_form="union"``), ``pulsar_dosa_fp8`` (``indexer_precision="fp8"``: every indexer call
quantises q and the model's bf16 indexer key cache) and ``pulsar_dosa_fp8_cache`` (the same over
an FP8 indexer key cache, ``compiler.fp8_indexer_cache.to_fp8_indexer_cache`` of the copy).
"""
from __future__ import annotations

import argparse
import copy
import os

import torch

from benchmarks import harness
from benchmarks.e2e import SHAPES, SMOKE_SIZES, build, method_module, run_document, sync
from runtime.pulsar import cache_keyword

WARMUP_STEPS = 2
"""Untimed steps first: the first compiles the decode graph for one cache length, the second
recompiles it with the length dynamic."""
SYNTHETIC_PROMPT = 24
"""Tokens of the real prefill a synthetic cache grows from (a size no other cache axis has)."""


def grow_cache(cache, length: int, seed: int) -> None:
    """Grow every tensor of ``cache`` and of its layers from SYNTHETIC_PROMPT tokens to ``length``
    along its token axis (the one axis of that size), in place, with normal values of the tensor's
    mean and standard deviation (drawn on its device); ValueError when a tensor has no such axis or
    several, or when the cache does not then hold ``length`` tokens."""
    for layer in [*cache.layers, cache]:
        for name, value in list(vars(layer).items()):
            if not isinstance(value, torch.Tensor) or value.dim() < 2:
                continue
            axes = [d for d, size in enumerate(value.shape) if size == SYNTHETIC_PROMPT]
            if len(axes) != 1:
                raise ValueError(f"cache tensor {name} {tuple(value.shape)}: expected one token axis of "
                                 f"{SYNTHETIC_PROMPT}")
            shape = list(value.shape)
            shape[axes[0]] = length
            g = torch.Generator(device=value.device).manual_seed(seed)
            grown = torch.randn(shape, generator=g, device=value.device, dtype=value.dtype)
            setattr(layer, name, grown.mul_(value.float().std()).add_(value.float().mean()))
    if cache.get_seq_length() != length:
        raise ValueError(f"the grown cache holds {cache.get_seq_length()} tokens, expected {length}")


def cache_argument(model, cache) -> dict:
    """``{name: cache}`` for the cache argument of ``model`` (compiled or not): ``cache`` in
    transformers versions that renamed ``past_key_values``."""
    return {cache_keyword(type(getattr(model, "_orig_mod", model))): cache}


def decode_steps(compiled, cache, ids, steps: int, device: str):
    """(per-step ms, logits of each step [steps, B, V], the next ids [B, 1]) of ``steps`` greedy
    decode steps from ``ids`` [B, 1] over ``cache`` (extended in place), each timed alone
    (``harness.measure``: CUDA events around the call, the host clock off CUDA)."""
    times, logits = [], []
    for _ in range(steps):
        step = harness.measure(lambda: compiled(ids, use_cache=True, **cache_argument(compiled, cache)), device,
                               reps=1, warmup=0)
        times.append(step.ms)
        last = step.out.logits[:, -1].float()
        logits.append(last)
        ids = last.argmax(-1, keepdim=True)
    return times, torch.stack(logits), ids


def median(times) -> float:
    return round(sorted(times)[len(times) // 2], 3)


def fill_caches(model, config, args, device: str, emit) -> dict:
    """{(B, T): (DynamicCache of T prompt tokens per sequence, first decode ids [B, 1])}, filled by
    the pulsar_dosa-compiled model (``args.synthetic``: grown from a short prefill, ``grow_cache``);
    a size whose prefill fails is recorded and left out."""
    from transformers import DynamicCache

    torch._dynamo.reset()
    filler = model if args.synthetic else method_module(model, "pulsar_dosa", None, smoke=args.smoke)
    caches = {}
    for B in args.batches:
        for T in args.contexts:
            g = torch.Generator().manual_seed(T + B)
            prompt = torch.randint(0, config.vocab_size, (B, SYNTHETIC_PROMPT if args.synthetic else T),
                                   generator=g).to(device)
            first = torch.randint(0, config.vocab_size, (B, 1), generator=g).to(device)
            try:
                cache = DynamicCache(config=config)
                with torch.no_grad():
                    filler(prompt, use_cache=True, logits_to_keep=1, **cache_argument(filler, cache))
                if args.synthetic:
                    grow_cache(cache, T, seed=T + B)
                sync(device)
                caches[B, T] = cache, first
            except Exception as exc:  # out of memory at this size: recorded, next size
                emit({"model": type(model).__name__, "B": B, "T": T, "method": "prefill",
                      "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
            if device == "cuda":
                torch.cuda.empty_cache()
    return caches


def run_model(name: str, args, emit) -> None:
    from compiler.report import collecting

    device = "cpu" if args.smoke else "cuda"
    sizes = SMOKE_SIZES if args.smoke else SHAPES[args.shape]["sizes"]
    dtype = torch.float32 if args.smoke else torch.bfloat16
    model, config = build(name, args.layers, sizes, device, dtype)
    caches = fill_caches(model, config, args, device, emit)
    reference = {}
    for method in args.methods:
        torch._dynamo.reset()
        compiled = method_module(model, method, None, smoke=args.smoke)
        with collecting() as report:
            for (B, T), (cache, first) in caches.items():
                emit(decode_row(compiled, report, name, method, B, T, cache, first, reference, args, device))
                if device == "cuda":
                    torch.cuda.empty_cache()
        del compiled


def method_cache(method: str, cache):
    """The copy of ``cache`` that ``method`` decodes over (with FP8 indexer keys for pulsar_dosa_fp8_cache)."""
    from compiler.fp8_indexer_cache import to_fp8_indexer_cache

    running = copy.deepcopy(cache)
    return to_fp8_indexer_cache(running) if method == "pulsar_dosa_fp8_cache" else running


def decode_row(compiled, report, name, method, B, T, cache, first, reference, args, device) -> dict:
    """One result row (module docstring) of ``compiled`` at batch B, context T; ``report``
    collects the method's compiles, ``reference`` the first method's logits per size."""
    row = {"model": name, "B": B, "T": T, "method": method, "ms": None, "error": None,
           "indexer_rewrites": None, "attention_forms": None, "argmax_agree": None, "max_abs_diff": None}
    try:
        with torch.no_grad():
            running = method_cache(method, cache)
            ids = decode_steps(compiled, running, first, WARMUP_STEPS, device)[2]
            times = decode_steps(compiled, running, ids, args.steps, device)[0]
            seen, logits, _ = decode_steps(compiled, method_cache(method, cache), first, WARMUP_STEPS + args.steps,
                                           device)
        row["indexer_rewrites"] = len({r.module for r in report.rewrites if r.kind == "dsa_indexer"})
        row["attention_forms"] = sorted({r.path for r in report.rewrites if r.kind == "sparse_attention"})
        row["ms"], row["ms_seen_lengths"] = median(times), median(seen)
        row["ms_all"] = [round(t, 3) for t in times]
        if (B, T) not in reference:
            reference[B, T] = logits
        else:
            row["argmax_agree"] = bool(torch.equal(logits.argmax(-1), reference[B, T].argmax(-1)))
            row["max_abs_diff"] = float((logits[0] - reference[B, T][0]).abs().max())
    except Exception as exc:  # any failure of this method at this size
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    return row


def _ms(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def render_markdown(doc: dict) -> str:
    lines = [f"# End to end: decode of a compiled DSA model ({doc['device']})", "",
             f"versions: {doc['versions']}; layers: {doc['layers']}; bf16, random weights; one token per "
             f"sequence over a cache of T tokens; median of {doc['steps']} steps after a warm-up, each timed "
             "alone (host time included, default torch.compile mode).", ""]
    if doc.get("note"):
        lines += [doc["note"], ""]
    rows = [r for r in doc["rows"] if r["method"] != "prefill"]
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        methods = list(dict.fromkeys(r["method"] for r in mine))
        lines += [f"## {model}", "", "ms per step: new cache lengths (as generate runs) / lengths seen before", "",
                  "| B | T | " + " | ".join(f"{m} ms" for m in methods)
                  + " | speed-up vs stock (new / seen) | indexer rewrites | attention forms | argmax agree |",
                  "|" + "---|" * (len(methods) + 6)]
        for key in dict.fromkeys((r["B"], r["T"]) for r in mine):
            by = {r["method"]: r for r in mine if (r["B"], r["T"]) == key}
            cells = [("-" if m not in by else (by[m]["error"].split(":")[0] if by[m]["error"]
                                               else f"{by[m]['ms']:.2f} / {_ms(by[m].get('ms_seen_lengths'))}"))
                     for m in methods]
            stock, ours = by.get("stock"), by.get("pulsar_dosa")
            speed = "-"
            if stock and ours and stock["ms"] and ours["ms"]:
                seen = (stock.get("ms_seen_lengths"), ours.get("ms_seen_lengths"))
                speed = f"{stock['ms'] / ours['ms']:.2f}x / " + (f"{seen[0] / seen[1]:.2f}x" if all(seen) else "-")
            rewrites = ", ".join(str(r["indexer_rewrites"]) for r in by.values() if r["indexer_rewrites"] is not None)
            forms = ", ".join("+".join(r.get("attention_forms") or ["-"]) for r in by.values() if not r["error"])
            agree = ", ".join(str(r["argmax_agree"]) for r in by.values() if r["argmax_agree"] is not None) or "-"
            lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + f" | {speed} | {rewrites} | {forms} | "
                         f"{agree} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON results path (a .md table is written beside it)")
    p.add_argument("--shape", default="small", choices=list(SHAPES), help="model sizes (module docstring)")
    p.add_argument("--models", nargs="+", default=[SHAPES["small"]["models"][0]], choices=SHAPES["small"]["models"])
    p.add_argument("--methods", nargs="+", default=None,
                   choices=["stock", "pulsar_dosa", "pulsar_dosa_every_call", "pulsar_dosa_union", "pulsar_dosa_fp8",
                            "pulsar_dosa_fp8_cache"],
                   help="pulsar_dosa_every_call: the op on every indexer call (option stock_below=0); "
                        "pulsar_dosa_union: option sparse_form='union'. Default: stock and pulsar_dosa (small), "
                        "and pulsar_dosa_union (v32)")
    p.add_argument("--contexts", nargs="+", type=int, default=None, help="cache lengths T")
    p.add_argument("--batches", nargs="+", type=int, default=None, help="sequences per step B")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--synthetic", action=argparse.BooleanOptionalAction, default=None,
                   help="grow the caches from a short prefill (default: with --shape v32)")
    p.add_argument("--smoke", action="store_true", help="tiny models on the CPU (checks the script)")
    args = p.parse_args(argv)
    v32 = args.shape == "v32"
    args.layers = args.layers or SHAPES[args.shape]["layers"]
    args.synthetic = v32 if args.synthetic is None else args.synthetic
    args.methods = args.methods or ["stock", "pulsar_dosa"] + (["pulsar_dosa_union"] if v32 else [])
    if args.contexts is None:
        args.contexts = [200] if args.smoke else [131072] if v32 else [8192, 32768, 131072]
    if args.batches is None:
        args.batches = [1, 2] if args.smoke else [1] if v32 else [1, 8]
    if args.smoke:
        args.steps = min(args.steps, 2)
    return run_document(args, run_model, render_markdown, steps=args.steps, shape=args.shape,
                        synthetic_cache=args.synthetic)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())

"""``python -m compiler.demo``: compile a tiny DeepseekV32ForCausalLM with ``backend="pulsar_dosa"``.

Builds a randomly initialised transformers ``DeepseekV32ForCausalLM`` (fixed seed), runs it eagerly
and compiled, and prints: the rewrites per layer, the per-layer selection check, the logits
difference against eager, and the top-K statistics (fallbacks, pruned fraction).

Selection check, per indexer layer: the eager run records the indexer's top-K input scores and
indices (a ``TorchFunctionMode`` on ``Tensor.topk`` inside the indexer); the indexer module alone is
then compiled with the backend and run on that layer's eager inputs. A row is "equal" when both
select the same visible keys; "tie" when the keys differ only among keys whose eager score equals
the kk-th score (torch.topk breaks ties arbitrarily, the op by lower index: both are exact top-K);
"differ" otherwise. Keys whose score is -inf or a finite additive mask value (<= -1e37,
transformers' finfo.min) are hidden: attention masks them whichever is selected.
Random-init indexers do not prune (SPEC A.8): expect dense fallbacks in the statistics. A last
section runs the op alone on ``runtime.structured_indexer`` inputs (the geometry of trained
indexers), where the certificate prunes, and checks it against the dense reference.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from torch.overrides import TorchFunctionMode

import compiler
from compiler.path_choice import CHOICES
from compiler.report import format_table

HIDDEN_SCORE = -1e37


def tiny_config(layers: int = 3, attn: str = "sdpa", topk: int = 8, heads: int = 8, head_dim: int = 64,
                dense_layers: int = 1):
    """A DeepseekV32 config small enough for CPU: MLA + DSA indexer in every layer, MoE after ``dense_layers``."""
    from transformers import DeepseekV32Config

    return DeepseekV32Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
        n_routed_experts=4, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16,
        qk_nope_head_dim=16, n_group=2, topk_group=1, num_experts_per_tok=2, index_topk=topk,
        index_head_dim=head_dim, index_n_heads=heads, first_k_dense_replace=dense_layers,
        max_position_embeddings=1024, attn_implementation=attn)


def build_model(config, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """The randomly initialised model (``torch.manual_seed(seed)``), in eval mode and ``dtype``."""
    from transformers import DeepseekV32ForCausalLM

    torch.manual_seed(seed)
    return DeepseekV32ForCausalLM(config).eval().to(dtype)


def indexers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Module path -> DeepseekV32Indexer module."""
    return {name: mod for name, mod in model.named_modules() if type(mod).__name__ == "DeepseekV32Indexer"}


class _TopkRecorder(TorchFunctionMode):
    """Records (scores, indices) of the ``Tensor.topk`` call made inside the current indexer."""

    def __init__(self) -> None:
        super().__init__()
        self.layer: str | None = None
        self.records: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.inputs: dict[str, tuple[tuple, dict]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.layer is not None and func is torch.Tensor.topk:
            self.records[self.layer] = (args[0].detach().clone(), out.indices.clone())
        return out


@dataclasses.dataclass
class EagerRun:
    logits: torch.Tensor
    records: dict[str, tuple[torch.Tensor, torch.Tensor]]
    inputs: dict[str, tuple[tuple, dict]]


def eager_run(model: torch.nn.Module, input_ids: torch.Tensor, use_cache: bool = False) -> EagerRun:
    """Eager logits, and per indexer layer its top-K input scores, indices and call arguments."""
    recorder = _TopkRecorder()
    handles = []
    for name, mod in indexers(model).items():
        def pre(module, args, kwargs, name=name):
            recorder.layer = name
            recorder.inputs[name] = (args, {k: v for k, v in kwargs.items() if k != "cache"})

        def post(module, args, output):
            recorder.layer = None

        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post))
    try:
        with torch.no_grad(), recorder:
            logits = model(input_ids, use_cache=use_cache).logits
    finally:
        for h in handles:
            h.remove()
    return EagerRun(logits, recorder.records, recorder.inputs)


def compare_selection(scores: torch.Tensor, eager_idx: torch.Tensor, ours_idx: torch.Tensor) -> dict[str, int]:
    """Rows classified as equal / tie / differ (see the module docstring). scores [B,S,T] are eager's."""
    counts = {"equal": 0, "tie": 0, "differ": 0}
    kk = eager_idx.shape[-1]
    kth = scores.gather(-1, eager_idx.long()).min(dim=-1).values
    for b in range(scores.shape[0]):
        for s in range(scores.shape[1]):
            row = scores[b, s]
            e = {i for i in eager_idx[b, s].tolist() if row[i] > HIDDEN_SCORE}
            o = {i for i in ours_idx[b, s].tolist() if row[i] > HIDDEN_SCORE}
            if e == o:
                counts["equal"] += 1
            elif all(row[i] == kth[b, s] for i in e ^ o) and len(ours_idx[b, s].unique()) == kk:
                counts["tie"] += 1
            else:
                counts["differ"] += 1
    return counts


def per_layer_selection(model: torch.nn.Module, run: EagerRun, options: dict) -> dict[str, dict[str, int]]:
    """Compile each indexer alone with the backend, run it on its eager inputs, compare selections."""
    out = {}
    for name, mod in indexers(model).items():
        args, kwargs = run.inputs[name]
        report = compiler.explain(mod, *args, options=options, **kwargs)
        if len(report.rewrites) != 1:
            raise RuntimeError(f"{name}: expected one rewrite of the indexer alone, got {len(report.rewrites)}")
        scores, eager_idx = run.records[name]
        out[name] = compare_selection(scores, eager_idx, report.output)
    return out


def structured_check(S: int = 64, T: int = 4096, H: int = 16, D: int = 64, topk: int = 64) -> dict:
    """The op on structured inputs (path "certified"): its statistics and equality with ``dense_topk``."""
    from compiler.lowering.stats import TOPK_STATS
    from runtime.dense_scorer import dense_topk
    from runtime.structured_indexer import structured_indexer_inputs

    q, k, w, _ = structured_indexer_inputs(1, S, T, H, D, seed=0)
    causal = torch.ones(S, T, dtype=torch.bool).tril(T - S)[None]
    TOPK_STATS.reset()
    got = compiler.certified_topk(q, k, w, topk, causal, layer="structured", path="certified")
    want = dense_topk(q, k, w, topk, causal)
    summary = TOPK_STATS.summaries()["structured"]
    return {"shape": (1, S, T, H, D), "topk": topk, "pruned_frac": summary["pruned_frac"],
            "fallbacks": {r: n for r, n in summary["fallbacks"].items() if n},
            "identical": torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compiler.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--downstream", choices=("eager", "inductor"), default="eager",
                        help="compiler after the passes (inductor's first CPU compile takes minutes)")
    parser.add_argument("--certified", choices=CHOICES, default="auto")
    parser.add_argument("--dynamic", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)

    start = time.perf_counter()
    model = build_model(tiny_config(a.layers, a.attn), getattr(torch, a.dtype), a.seed)
    input_ids = torch.randint(0, model.config.vocab_size, (1, a.seq), generator=torch.Generator().manual_seed(a.seed))
    options = {"downstream": a.downstream, "certified": a.certified}
    eager = eager_run(model, input_ids)
    report = compiler.explain(model, input_ids, options=options, dynamic=a.dynamic, use_cache=False)
    logits = report.output.logits
    selection = per_layer_selection(model, eager, {**options, "downstream": "eager"})

    cfg = model.config
    print(f"DeepseekV32ForCausalLM (random init, seed {a.seed}): {cfg.num_hidden_layers} layers, "
          f"index_n_heads {cfg.index_n_heads}, index_head_dim {cfg.index_head_dim}, index_topk {cfg.index_topk}, "
          f"seq {a.seq}, {a.dtype}, attention {a.attn}, downstream {a.downstream}, certified={a.certified}\n")
    rows = []
    for name in indexers(model):
        rewrites = [r for r in report.rewrites if r.module == name]
        stats = report.stats.get(name, {})
        fallbacks = ", ".join(f"{k}={v}" for k, v in stats.get("fallbacks", {}).items() if v) or "-"
        sel = selection[name]
        rows.append([name, len(rewrites), rewrites[0].variant if rewrites else "-",
                     f"{sel['equal']}/{sel['tie']}/{sel['differ']}", stats.get("queries", 0),
                     f"{stats['pruned_frac']:.3f}" if stats.get("keys_screened") else "-", fallbacks])
    print(format_table(["indexer", "rewrites", "variant", "rows equal/tie/differ", "queries", "pruned", "fallbacks"],
                       rows))
    print("(pruned: fraction of screened keys the certificate ruled out; '-' where no query took the "
          "certified path: below the cost model's crossover length every query is scored densely)")
    for miss in report.near_misses:
        print(f"near miss ({miss.kind}): {miss.module}: {miss.reason}")
    diff = (logits.float() - eager.logits.float()).abs().max().item()
    print(f"\nlogits vs eager: max |diff| = {diff:.3e}, bitwise equal: {torch.equal(logits, eager.logits)}")
    if any(s["tie"] for s in selection.values()):
        print("(rows marked 'tie' select different keys of equal score: the logits may then differ legitimately)")
    if a.downstream == "inductor":
        print("(inductor reassociates the fp32 reductions of the rest of the graph: expect ~1e-7, not bitwise)")
    print(f"other rewrites: {sum(1 for r in report.rewrites if r.kind != 'dsa_indexer')}; "
          f"pass times: " + ", ".join(f"{n} {1e3 * s:.1f} ms" for _, n, s in report.pass_times))
    structured = structured_check()
    print(f"\ncertified_topk alone on structured inputs [B,S,T,H,D]={list(structured['shape'])}, "
          f"topk {structured['topk']}: pruned {structured['pruned_frac']:.3f} of the screened keys, "
          f"fallbacks {structured['fallbacks'] or '-'}, identical to dense_topk: {structured['identical']}")
    print(f"total {time.perf_counter() - start:.1f} s")
    ok = structured["identical"] and all(s["differ"] == 0 for s in selection.values()) and \
        all(sum(1 for r in report.rewrites if r.module == name) == 1 for name in indexers(model))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

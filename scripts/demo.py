"""``scripts/demo.py``: compile a tiny DeepseekV32ForCausalLM with ``backend="pulsar_dosa"``.

Builds a small transformers ``DeepseekV32ForCausalLM`` (fixed seed), runs it eagerly and compiled,
and prints the rewrites per layer, the per-layer selection check, the logits difference against
eager, and each indexer layer's top-K statistics (certified queries, keys screened and pruned,
fallbacks). The weights are random except that :func:`set_trained_geometry` gives every indexer a
trained indexer's geometry (SPEC A.8; ``--random-indexers`` keeps the random ones, which do not
prune). Selection check per layer: the indexer alone, compiled, on the eager run's inputs of that
layer; a row is "equal" when both select the same visible keys, "tie" when they differ only among
keys scoring the kk-th value (both are exact top-K), "differ" otherwise. Keys scoring -inf or a
finite mask value (<= -1e37) are hidden. Exit status 0 when every layer is rewritten once, no row
differs and the logits agree."""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from torch.overrides import TorchFunctionMode

import compiler
from compiler.report import format_table
from compiler.topk_settings import CHOICES

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


TOPICS = 8
"""Topics of the trained geometry: token id t belongs to topic t % TOPICS."""


def _zero_mean_units(n: int, dims: int, generator: torch.Generator) -> torch.Tensor:
    x = torch.randn(n, dims, generator=generator)
    x = x - x.mean(dim=-1, keepdim=True)
    return x / x.norm(dim=-1, keepdim=True)


@torch.no_grad()
def set_trained_geometry(model: torch.nn.Module, seed: int = 0, positive_heads: int = 4) -> torch.nn.Module:
    """Give every DSA indexer of ``model`` a trained indexer's geometry (SPEC A.8), in place.

    Hidden dims 0..TOPICS-1 hold the token's topic (one-hot, from the embedding) and dim TOPICS a
    constant; the rest stays random. Keys: wk maps the topic to a unit direction of the indexer's
    non-rotary dims, the constant to a shared offset m and to a rotary component (RoPE then makes
    the score depend on the relative position, so repeated tokens do not tie). Queries (through
    ``q_a_proj`` and ``wq_b``): ``positive_heads`` heads point at the current token's topic plus
    the rotary component, the others along +m or -m (always or never active). Head weights
    (``weights_proj``) read the constant: positive for the first, negative for the others.
    """
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    H, D, rope, lora = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim, cfg.q_lora_rank
    const = TOPICS
    emb = model.get_input_embeddings().weight
    emb.normal_(0.0, 0.5, generator=g)
    emb[:, :const + 1] = 0.0
    ids = torch.arange(emb.shape[0])
    emb[ids, ids % TOPICS] = 3.0
    emb[:, const] = 3.0
    for name, mod in indexers(model).items():
        attn = model.get_submodule(name.rsplit(".", 1)[0])
        dirs = torch.zeros(TOPICS + 1, D)
        dirs[:, rope:] = _zero_mean_units(TOPICS + 1, D - rope, g)
        topic_dirs, offset = dirs[:TOPICS], dirs[TOPICS]
        rotary = torch.zeros(D)
        rotary[:rope] = _zero_mean_units(1, rope, g)[0]
        wk = 0.05 * torch.randn(D, emb.shape[1], generator=g)
        wk[:, :TOPICS] = topic_dirs.T
        wk[:, const] = 0.5 * offset + 0.5 * rotary
        mod.wk.weight.copy_(wk)
        qa = attn.q_a_proj.weight
        qa[:TOPICS + 1] = 0.0
        qa[0, const] = 1.0
        qa[1:TOPICS + 1, :TOPICS] = torch.eye(TOPICS)
        positive = torch.randperm(H, generator=g)[:positive_heads]
        wq = 0.05 * torch.randn(H, D, lora, generator=g)
        w = torch.zeros(H, emb.shape[1])
        for h in range(H):
            if h in positive:
                wq[h, :, 1:TOPICS + 1] += topic_dirs.T
                wq[h, :, 0] += 0.5 * rotary
                w[h, const] = 0.5 + torch.rand((), generator=g)
            else:
                wq[h, :, 0] += offset * (1.0 if h % 2 else -1.0)
                w[h, const] = -0.3 * (0.5 + torch.rand((), generator=g))
        mod.wq_b.weight.copy_(wq.reshape(H * D, lora))
        mod.weights_proj.weight.copy_(w)
    return model


def topic_run_ids(seq: int, vocab: int, run: int = 40, seed: int = 0) -> torch.Tensor:
    """Input ids [1, seq] that stay on one topic (id % TOPICS) for runs of ``run`` tokens."""
    g = torch.Generator().manual_seed(seed)
    topics = torch.randint(TOPICS, ((seq + run - 1) // run,), generator=g).repeat_interleave(run)[:seq]
    return (torch.randint(vocab // TOPICS, (seq,), generator=g) * TOPICS + topics)[None]


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


LOGITS_TOLERANCE = 1e-3
"""Largest logit difference accepted when the compiled graph legitimately reorders fp32 sums."""


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


DEMO_INDEXER = dict(topk=16, heads=16, head_dim=32)
"""Indexer geometry of the demo model: at 1024 tokens a quarter of the queries see more keys than
the cost model's CPU crossover (~770) and take the certified path."""


def _stats_cells(stats: dict) -> list[str]:
    """certified queries, keys screened, pruned fraction and fallbacks of one layer's statistics."""
    fallbacks = stats.get("fallbacks", {})
    certified = stats.get("queries", 0) - stats.get("anchors", 0) - sum(n for r, n in fallbacks.items() if r != "overflow")
    pruned = f"{stats['pruned_frac']:.3f}" if stats.get("keys_screened") else "-"
    return [f"{certified}/{stats.get('queries', 0)}", f"{stats.get('keys_screened', 0)}/{stats.get('keys_visible', 0)}",
            pruned, ", ".join(f"{k}={v}" for k, v in fallbacks.items() if v) or "-"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/demo.py", description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--downstream", choices=("eager", "inductor"), default="eager",
                        help="compiler after the passes (inductor's first CPU compile takes minutes)")
    parser.add_argument("--path", choices=CHOICES, default="auto")
    parser.add_argument("--random-indexers", action="store_true",
                        help="keep the random-init indexers (they do not prune: every query is scored densely)")
    parser.add_argument("--dynamic", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)

    start = time.perf_counter()
    model = build_model(tiny_config(a.layers, a.attn, **DEMO_INDEXER), getattr(torch, a.dtype), a.seed)
    if not a.random_indexers:
        set_trained_geometry(model, a.seed)
    input_ids = topic_run_ids(a.seq, model.config.vocab_size, seed=a.seed)
    # On the CPU the backend keeps every stock subgraph by default (the ops run their plain-torch
    # references there, compiler.defaults.STOCK_BELOW); the demo exists to show the ops at work.
    options = {"downstream": a.downstream, "path": a.path, "stock_below": 0}
    eager = eager_run(model, input_ids)
    report = compiler.explain(model, input_ids, options=options, dynamic=a.dynamic, use_cache=False)
    logits = report.output.logits
    selection = per_layer_selection(model, eager, {**options, "downstream": "eager"})

    cfg = model.config
    geometry = "random-init indexers" if a.random_indexers else "indexers with a trained geometry"
    print(f"DeepseekV32ForCausalLM ({geometry}, seed {a.seed}): {cfg.num_hidden_layers} layers, "
          f"index_n_heads {cfg.index_n_heads}, index_head_dim {cfg.index_head_dim}, index_topk {cfg.index_topk}, "
          f"seq {a.seq}, {a.dtype}, attention {a.attn}, downstream {a.downstream}, path={a.path}, "
          "stock_below=0 (the ops on every call: on the CPU the default keeps stock)\n")
    rows = []
    for name in indexers(model):
        rewrites = [r for r in report.rewrites if r.module == name]
        sel = selection[name]
        rows.append([name, len(rewrites), rewrites[0].variant if rewrites else "-",
                     rewrites[0].details.get("min_keys", "-") if rewrites else "-",
                     f"{sel['equal']}/{sel['tie']}/{sel['differ']}", *_stats_cells(report.stats.get(name, {}))])
    print(format_table(["indexer", "rewrites", "variant", "min_keys", "rows equal/tie/differ", "certified queries",
                        "keys screened/visible", "pruned", "fallbacks"], rows))
    print("(certified queries: answered by seeds, screen and refine; the others are anchors or fell back to dense "
          "scoring, e.g. dense_cheaper below min_keys. pruned: fraction of the screened keys that the "
          "certificate ruled out, so they were never scored)")
    for miss in report.near_misses:
        print(f"near miss ({miss.kind}): {miss.module}: {miss.reason}")
    equal = torch.equal(logits, eager.logits)
    diff = (logits.float() - eager.logits.float()).abs().max().item()
    print(f"\nlogits vs eager: max |diff| = {diff:.3e}, bitwise equal: {equal}")
    ties = any(s["tie"] for s in selection.values())
    if ties:
        print("(rows marked 'tie' select different keys of equal score: the logits may then differ legitimately)")
    sparse = sum(1 for r in report.rewrites if r.kind == "sparse_attention")
    if sparse:
        print(f"({sparse} attention layers rewritten by sparse_attention attend to the selected keys only; "
              "the softmax sums run in another order than the masked dense attention: expect ~1e-6, not bitwise)")
    if a.downstream == "inductor":
        print("(inductor reassociates the fp32 reductions of the rest of the graph: expect ~1e-7, not bitwise)")
    print(f"other rewrites: {sum(1 for r in report.rewrites if r.kind != 'dsa_indexer')}; "
          f"pass times: " + ", ".join(f"{n} {1e3 * s:.1f} ms" for _, n, s in report.pass_times))
    print(f"total {time.perf_counter() - start:.1f} s")
    logits_ok = equal or ties or ((a.downstream != "eager" or sparse) and diff <= LOGITS_TOLERANCE)
    ok = logits_ok and all(s["differ"] == 0 for s in selection.values()) and \
        all(sum(1 for r in report.rewrites if r.module == name) == 1 for name in indexers(model))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

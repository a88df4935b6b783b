"""Train the measuring models (GPU): a small DeepseekV32ForCausalLM whose DSA indexer has
DeepSeek-V3.2's geometry (64 heads x 128), and a small LlamaForCausalLM for Pulsar.

Data: the token corpus of ``benchmarks/models/tiny_corpus.py`` (standard library sources and the Python
documentation, BPE of 8192 ids) with key-value facts planted at random depths and asked for at
the end of every sequence (``benchmarks/models/tiny_data.py``). Stages, as DeepSeek-V3.2 trains DSA:

* ``dense`` (``--model dsa`` or ``llama``): LM loss, every query attending to all earlier keys
  (the indexer unused), context 4096 (batch 8) then 16384 (batch 2);
* ``indexer`` (``--model dsa``, from a dense checkpoint): warm-up, the main model frozen, the
  indexer trained by KL(head-mean main attention || softmax of index scores) at 4096; then
  sparse training at 16384 with index_topk 2048: LM loss on the main model attending to the
  indexer's selection, KL on the indexer over the selected keys (its inputs detached).

Each phase runs ``--steps`` steps, or as many as its time budget allows (``--budget-s``, decided
from the rate of its first steps; the step counts are logged: rerunning with them as ``--steps``
repeats the run). Seeds are fixed. A stage writes its checkpoint (``save_pretrained``, bf16,
files <= 15 MB, with the tokenizer) and ``train_config.json`` / ``train_log.jsonl`` to ``--out``;
a stage starts from ``--init`` (a checkpoint directory), so stages resume one another.

    python benchmarks/models/train_tiny_dsa.py --stage dense --model dsa --out ckpt/dsa-dense --budget-s 200 80
    python benchmarks/models/train_tiny_dsa.py --stage indexer --model dsa --init ckpt/dsa-dense --out ckpt/dsa \\
        --budget-s 90 100
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_data import FactTokens, answer_accuracy, load_tokens, training_batch  # noqa: E402

from runtime.dsa_forward import IndexerQKW, LayerCapture, causal_index_scores, dsa_forward, indexer_qkw, indexer_topk  # noqa: E402

ROOT = Path(__file__).resolve().parent
TOKENIZER = ROOT / "tokenizer"
SPARSE_TOPK = 2048


def dsa_config(vocab: int):
    """The DSA measuring model: 5 layers, hidden 256, 4 MLA heads, V3.2's indexer (64 x 128)."""
    from transformers import DeepseekV32Config

    return DeepseekV32Config(
        vocab_size=vocab, hidden_size=256, intermediate_size=768, num_hidden_layers=5, first_k_dense_replace=5,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=96, kv_lora_rank=128, qk_nope_head_dim=64,
        qk_rope_head_dim=64, v_head_dim=128, index_n_heads=64, index_head_dim=128, index_topk=SPARSE_TOPK,
        max_position_embeddings=131072, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})


def llama_config(vocab: int):
    """The Pulsar measuring model: 5 layers, hidden 256, 4 query / 2 key-value heads of 64."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab, hidden_size=256, intermediate_size=768, num_hidden_layers=5, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=131072, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})


@dataclass
class Phase:
    """One phase: its kind, context length, batch, facts per sequence, peak LR, budget."""

    name: str
    kind: str  # "lm" (all keys), "warmup" (indexer KL, main frozen), "sparse" (selected keys + KL)
    length: int
    batch: int
    facts: int
    lr: float
    budget_s: float
    steps: int | None = None


def phases(stage: str, budgets: list[float], steps: list[int | None], scale: float) -> list[Phase]:
    """The stage's phases; ``scale`` divides the context lengths (CPU smoke runs)."""
    def n(length: int) -> int:
        return max(64, int(length / scale))

    if stage == "dense":
        plan = [Phase("dense_4k", "lm", n(4096), 8, 4, 2e-3, 0.0), Phase("dense_16k", "lm", n(16384), 2, 16, 1e-3, 0.0)]
    else:
        plan = [Phase("indexer_warmup_4k", "warmup", n(4096), 4, 4, 1e-3, 0.0),
                Phase("sparse_16k", "sparse", n(16384), 1, 16, 2e-4, 0.0)]
    for p, b, s in zip(plan, budgets, steps):
        p.budget_s, p.steps = b, s
        p.facts = max(1, min(p.facts, p.length // 256))
    return plan


def lr_at(step: int, steps: int, peak: float, warmup: int = 30) -> float:
    """Linear warm-up, flat, then a linear decay to 10% over the last 30% of the steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    decay_from = int(0.7 * steps)
    if step < decay_from:
        return peak
    return peak * (1.0 - 0.9 * (step - decay_from) / max(1, steps - decay_from))


class JsonLog:
    """Appends records to a JSON-lines file and prints them, each with the seconds since the log
    was opened (``elapsed_s``)."""

    def __init__(self, path: Path):
        self.file = path.open("a")
        self.started = time.time()

    def __call__(self, record: dict) -> None:
        record["elapsed_s"] = round(time.time() - self.started, 2)
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        print(json.dumps(record), flush=True)


class StepBudget:
    """A phase's step count: ``steps`` when given, else decided from the time of steps 3 to
    ``2 + rate_steps`` to fill ``budget_s`` seconds (``planned`` is 10^9 until then); a phase
    without given steps is stopped past 1.2x its budget."""

    def __init__(self, steps: int | None, budget_s: float, rate_steps: int, device: torch.device):
        self.given, self.decided = steps is not None, False
        self.budget_s, self.rate_steps, self.device = budget_s, rate_steps, device
        self.planned = steps if steps is not None else 10 ** 9
        self.t0 = self.t_rate = time.time()

    def after(self, step: int) -> dict | None:
        """Call after every step (``step`` steps done); returns the decision, once, when it is made."""
        if self.given or self.decided or step not in (2, 2 + self.rate_steps):
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        if step == 2:
            self.t_rate = time.time()
            return None
        rate = (time.time() - self.t_rate) / self.rate_steps
        self.decided = True
        self.planned = max(step + 1, int((self.budget_s - (self.t_rate - self.t0)) / rate) + 2)
        return {"decided_steps": self.planned, "s_per_step": round(rate, 4)}

    def over(self) -> bool:
        """Whether a phase without given steps has run past 1.2x its budget."""
        return not self.given and time.time() - self.t0 > 1.2 * self.budget_s


def train_phase(name: str, lr: float, params: list[torch.nn.Parameter], budget: StepBudget,
                next_batch: Callable[[int], tuple[torch.Tensor, ...]], step: Callable[..., dict],
                log: Callable[[dict], None], log_every: int) -> dict:
    """One phase: AdamW (betas 0.9/0.95, weight decay 0.1, fused on CUDA) at ``lr_at``'s schedule
    over ``budget.planned`` steps, gradients clipped to norm 1. ``next_batch(i)`` gives step i's
    tensors (the first one's ``numel`` counts the tokens), ``step(*batch)`` computes and
    backpropagates the loss and returns its statistics; logs every ``log_every`` steps, the
    budget's decision and an early stop. Returns the phase's steps, tokens and seconds."""
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=params[0].device.type == "cuda")
    done, tokens = 0, 0
    while done < budget.planned:
        batch = next_batch(done)
        for group in opt.param_groups:
            group["lr"] = lr_at(done, budget.planned, lr)
        stats = step(*batch)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done += 1
        tokens += batch[0].numel()
        decision = budget.after(done)
        if decision is not None:
            log({"phase": name, **decision})
        if budget.over():
            log({"phase": name, "stopped_at_step": done, "reason": "over 1.2x its time budget"})
            break
        if done % log_every == 0 or done == budget.planned:
            log({"phase": name, "step": done, "of": budget.planned, "lr": lr_at(done - 1, budget.planned, lr),
                 "tokens_per_s": round(tokens / (time.time() - budget.t0)), **{k: round(v, 4) for k, v in stats.items()}})
    return {"phase": name, "steps": done, "tokens": tokens, "seconds": round(time.time() - budget.t0, 1)}


def lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def kl_rows(p_main: torch.Tensor, index_scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Sum over rows of KL(p_main || softmax(index_scores)) over visible keys; [..., N] inputs."""
    logq = torch.log_softmax(index_scores.masked_fill(~visible, float("-inf")), dim=-1).masked_fill(~visible, 0.0)
    logp = torch.log(p_main.clamp_min(1e-30))
    return (p_main * (logp - logq)).sum()


def main_attention_probs(cap: LayerCapture, rows: slice, select: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Head-mean main attention probabilities of query rows ``rows`` over all earlier keys [B,c,T]
    (``select`` None) or over the selected keys [B,c,K]; and the visible mask of the same shape."""
    with torch.no_grad():
        q, k = cap.query[:, :, rows], cap.key
        logits = torch.matmul(q.float(), k.float().transpose(-1, -2)) * cap.scaling
        T = k.shape[2]
        pos = torch.arange(rows.start, rows.stop, device=q.device)
        causal = torch.arange(T, device=q.device)[None, :] <= pos[:, None]
        if select is None:
            visible = causal.expand(q.shape[0], -1, -1)
        else:
            sel = select[:, rows]
            visible = sel >= 0
            logits = logits.gather(-1, sel.clamp_min(0)[:, None].expand(-1, q.shape[1], -1, -1))
        p = torch.softmax(logits.masked_fill(~visible[:, None], float("-inf")), dim=-1).mean(1)
    return p, visible


def selected_index_scores(qkw: IndexerQKW, select: torch.Tensor) -> torch.Tensor:
    """Index scores [B,R,K] of ``qkw``'s query rows at their selected keys ``select`` [B,R,K]
    (-1 entries score key 0; callers mask them), differentiable."""
    sel = select.clamp_min(0)
    b = torch.arange(sel.shape[0], device=sel.device)[:, None, None]
    keys = qkw.k[b, sel].to(torch.bfloat16)  # [B,R,K,D]
    s = F.relu(torch.einsum("brhd,brkd->brhk", qkw.q.to(torch.bfloat16), keys))
    return torch.einsum("brh,brhk->brk", qkw.weights.to(torch.bfloat16), s).float()


def indexer_kl_backward(captures: list[LayerCapture], selects: list[torch.Tensor] | None, chunk: int) -> float:
    """KL of every layer's indexer against its main attention, backpropagated into the indexers
    only (inputs detached), in chunks of ``chunk`` query rows; returns the mean KL per row."""
    total, rows_seen = torch.zeros(()), 0
    for layer, cap in enumerate(captures):
        S = cap.x.shape[1]
        for start in range(0, S, chunk):
            rows = slice(start, min(start + chunk, S))
            select = None if selects is None else selects[layer]
            p, visible = main_attention_probs(cap, rows, select)
            with torch.autocast(cap.x.device.type, dtype=torch.bfloat16):
                qkw = indexer_qkw(cap.attention.indexer, cap.x.detach(), cap.q_resid.detach(), cap.cos, cap.sin, rows)
                if select is None:
                    scores = causal_index_scores(qkw, None, torch.bfloat16)
                else:
                    scores = selected_index_scores(qkw, select[:, rows])
            kl = kl_rows(p, scores.float(), visible)
            n = cap.x.shape[0] * (rows.stop - rows.start)
            (kl / (S * cap.x.shape[0] * len(captures))).backward()
            total = total.to(kl.device) + kl.detach()
            rows_seen += n
    return total.item() / rows_seen


class Trainer:
    """Runs the phases of one stage on one model and logs every ``log_every`` steps."""

    def __init__(self, args, model, tokenizer, tokens: np.ndarray, device: torch.device):
        self.args, self.model, self.tokenizer, self.tokens, self.device = args, model, tokenizer, tokens, device
        self.encoder = FactTokens(tokenizer)
        self.log = JsonLog(args.out / "train_log.jsonl")

    def trainable(self, phase: Phase) -> list[torch.nn.Parameter]:
        for name, p in self.model.named_parameters():
            indexer = ".indexer." in name
            if phase.kind == "lm":
                p.requires_grad_(not indexer)  # dense pretraining leaves the indexer untouched
            elif phase.kind == "warmup":
                p.requires_grad_(indexer)  # the main model frozen
            else:
                p.requires_grad_(True)
        return [p for p in self.model.parameters() if p.requires_grad]

    def forward_lm(self, ids: torch.Tensor) -> torch.Tensor:
        if self.args.model == "llama":
            return self.model(input_ids=ids).logits
        return dsa_forward(self.model, ids)

    def step(self, phase: Phase, ids: torch.Tensor, answers: torch.Tensor) -> dict:
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16)
        chunk = max(1, min(phase.length, self.args.kl_chunk))
        if phase.kind == "lm":
            with autocast:
                logits = self.forward_lm(ids)
            loss = lm_loss(logits, ids)
            loss.backward()
            return {"loss": loss.item(), "answer_acc": answer_accuracy(logits.detach(), ids, answers).float().mean().item()}
        captures: list[LayerCapture] = []
        if phase.kind == "warmup":
            with torch.no_grad(), autocast:
                dsa_forward(self.model, ids, on_layer=captures.append, hidden_only=True)
            return {"kl": indexer_kl_backward(captures, None, chunk)}
        selects: list[torch.Tensor] = []

        def select(layer: int, cap: LayerCapture) -> torch.Tensor:
            with torch.no_grad():
                qkw = indexer_qkw(cap.attention.indexer, cap.x.detach(), cap.q_resid.detach(), cap.cos, cap.sin)
                selects.append(indexer_topk(qkw, SPARSE_TOPK, chunk=chunk, dtype=torch.bfloat16))
            return selects[-1]

        with autocast:
            logits = dsa_forward(self.model, ids, select=select, on_layer=captures.append)
        loss = lm_loss(logits, ids)
        loss.backward()
        kl = indexer_kl_backward(captures, selects, chunk)
        return {"loss": loss.item(), "kl": kl,
                "answer_acc": answer_accuracy(logits.detach(), ids, answers).float().mean().item()}

    def run(self, phase: Phase, seed: int) -> dict:
        params = self.trainable(phase)
        rng = np.random.default_rng(seed)

        def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            ids, answers = training_batch(rng, self.tokens, phase.length, phase.batch, phase.facts, self.encoder)
            return ids.to(self.device), answers.to(self.device)

        budget = StepBudget(phase.steps, phase.budget_s, self.args.rate_steps, self.device)
        return train_phase(phase.name, phase.lr, params, budget, next_batch,
                           lambda ids, answers: self.step(phase, ids, answers), self.log, self.args.log_every)


def load_or_init(args, vocab: int, device: torch.device):
    from transformers import AutoModelForCausalLM, DeepseekV32ForCausalLM, LlamaForCausalLM

    if args.init is not None:
        model = AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32, attn_implementation="sdpa")
    else:
        torch.manual_seed(args.seed)
        config = dsa_config(vocab) if args.model == "dsa" else llama_config(vocab)
        config._attn_implementation = "sdpa"
        model = (DeepseekV32ForCausalLM if args.model == "dsa" else LlamaForCausalLM)(config)
    return model.to(device).train()


def save(model, tokenizer, out: Path, record: dict) -> None:
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size="15MB")
    tokenizer.save_pretrained(out)
    (out / "train_config.json").write_text(json.dumps(record, indent=1))
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    print(json.dumps({"saved": str(out), "bytes": sum(sizes.values()), "largest": max(sizes.values())}), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=("dense", "indexer"), required=True)
    parser.add_argument("--model", choices=("dsa", "llama"), required=True)
    parser.add_argument("--init", type=Path, help="checkpoint directory to start from (required for --stage indexer)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, default=Path(".corpus"), help="folder with train.npy")
    parser.add_argument("--budget-s", type=float, nargs=2, default=[200.0, 80.0], help="seconds per phase")
    parser.add_argument("--steps", type=int, nargs=2, help="steps per phase (overrides --budget-s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0, help="divide context lengths (CPU smoke runs)")
    parser.add_argument("--kl-chunk", type=int, default=1024, help="query rows per KL / selection chunk")
    parser.add_argument("--rate-steps", type=int, default=8, help="steps timed to turn a budget into steps")
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.stage == "indexer" and (args.model != "dsa" or args.init is None):
        parser.error("--stage indexer needs --model dsa and --init (a dense checkpoint)")
    if args.init is not None and not (args.init / "config.json").is_file():
        parser.error(f"--init: {args.init} holds no config.json")
    if not (args.corpus / "train.npy").is_file():
        parser.error(f"--corpus: {args.corpus}/train.npy not found (run benchmarks/models/tiny_corpus.py)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.init or TOKENIZER)
    tokens = load_tokens(args.corpus / "train.npy")
    device = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    model = load_or_init(args, len(tokenizer), device)
    steps = args.steps or [None, None]
    plan = phases(args.stage, args.budget_s, steps, args.scale)
    trainer = Trainer(args, model, tokenizer, tokens, device)
    params = sum(p.numel() for p in model.parameters())
    trainer.log({"start": args.stage, "model": args.model, "parameters": params, "device": str(device),
                 "torch": torch.__version__, "phases": [asdict(p) for p in plan]})
    done = [trainer.run(phase, args.seed * 1000 + i + (0 if args.stage == "dense" else 100))
            for i, phase in enumerate(plan)]
    record = {"stage": args.stage, "model": args.model, "init": str(args.init) if args.init else None,
              "seed": args.seed, "parameters": params, "phases": [asdict(p) for p in plan], "done": done,
              "steps": [d["steps"] for d in done], "sparse_topk": SPARSE_TOPK,
              "corpus": json.loads((args.corpus / "manifest.json").read_text()) if (args.corpus / "manifest.json").is_file() else None}
    trainer.log({"end": args.stage, "done": done})
    save(model, tokenizer, args.out, record)


if __name__ == "__main__":
    main()

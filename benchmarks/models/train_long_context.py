"""Train the Llama measuring model to read 65536 tokens (GPU): a curriculum from 4096 to 65536
tokens that continues a checkpoint (``benchmarks/models/tiny-llama``, trained to 16384).

RoPE: the stage raises the base from 500000 to ``ROPE_THETA`` (2e6, the NTK-aware base for 4x the
trained length: 500000 * 4^(64/62) ~ 2.1e6) and keeps the default rope type. Why: past the length a
model was trained to, the slow RoPE dimensions turn by angles it never saw, and the committed model's
loss rises steeply beyond 16384 tokens; a larger base keeps those angles within what it saw while the fast
dimensions (local order) barely move, so training at 32K and 64K starts from a model that already
reads them roughly (benchmarks/README.md, Measuring models, has the zero-shot comparison with
position interpolation, YaRN and other bases). The default rope type reads the same in every
transformers release and needs no scaling code, so the checkpoint loads as before with
``from_pretrained``.

Data: ``--corpus``/train.npy windows with the tasks of ``tiny_tasks`` planted (single facts,
two-hop chains, counts; their lines spread over ``--blocks`` blocks), every question answered at
the end. Loss: the LM loss plus ``--answer-weight`` times the answers' cross-entropy, averaged per
task (``answer_loss``; a 64K sequence holds ~100 answer tokens, which the LM mean alone weighs at
~0.15%). On
CUDA the forward runs under bf16 autocast, on the CPU (smoke runs) in fp32.

Phases (``PHASES``): 4096 x 8, 16384 x 2, 32768 x 1, then two phases of 65536 x 1; each phase starts
a fresh AdamW (warm-up, flat, decay: ``train_tiny_dsa.lr_at``) from the previous phase's weights
rounded to bf16, runs ``--steps`` steps or as many as its ``--budget-s`` allows (decided from the
rate of its first steps and logged, so ``--steps`` repeats a run), and its batches are drawn from a
generator seeded by (seed, phase, step).

Resumable: after every phase the checkpoint in ``--out`` (bf16 ``save_pretrained``, the tokenizer,
the earlier stages' ``train_config_part*.json`` / ``train_log_part*.jsonl``) and
``train_progress_part<N>.json`` (what is done, and the settings that define the run) are written;
rerun with the same settings and ``--out``, the stage goes on with the next phase, and a run split
this way ends with the same weights as one run straight through. ``--max-phases`` and
``--deadline-s`` (no phase is started that could end after it: 1.2x its budget) end a call early;
exit status 0 either way, 3 when phases remain. When all phases are done the stage writes
``train_config_part<N>.json`` (settings, steps, tokens and seconds per phase, corpus manifest) and
removes the progress file; the log is ``train_log_part<N>.jsonl``.

    python benchmarks/models/train_long_context.py --out ckpt/llama-64k --deadline-s 470
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_data import load_tokens  # noqa: E402
from tiny_tasks import KINDS, TaskTokens, answer_hits, task_batch  # noqa: E402
from train_tiny_dsa import JsonLog, StepBudget, lm_loss, train_phase  # noqa: E402

ROOT = Path(__file__).resolve().parent
ROPE_THETA = 2_000_000.0
EXIT_PHASES_LEFT = 3


@dataclass
class Phase:
    """One phase: context length, batch, peak LR, time budget (seconds) or fixed steps."""

    name: str
    length: int
    batch: int
    lr: float
    budget_s: float
    steps: int | None = None


PHASES = (("long_4k", 4096, 8, 1e-3), ("long_16k", 16384, 2, 7e-4), ("long_32k", 32768, 1, 5e-4),
          ("long_64k_a", 65536, 1, 4e-4), ("long_64k_b", 65536, 1, 2e-4))
BUDGETS_S = (40.0, 40.0, 100.0, 180.0, 180.0)


def phases(budgets: list[float], steps: list[int] | None, scale: float) -> list[Phase]:
    """``PHASES`` with their budgets or steps; ``scale`` divides the lengths (at least 256: CPU
    smoke runs)."""
    return [Phase(name, max(256, int(length / scale)), batch, lr, budget, None if steps is None else steps[i])
            for i, ((name, length, batch, lr), budget) in enumerate(zip(PHASES, budgets))]


def answer_loss(logits: torch.Tensor, ids: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the answer tokens (positions ``answers`` [B, Q, A], -1 ignored), averaged
    over each task's tokens, then over the tasks: a count's one digit weighs as much as a value's
    five."""
    b = torch.arange(ids.shape[0], device=ids.device)[:, None, None].expand_as(answers)
    keep = answers >= 0
    pos = answers.clamp_min(1)
    ce = F.cross_entropy(logits[b, pos - 1].float().flatten(0, 2), ids[b, pos].flatten(), reduction="none")
    per_task = (ce.view(answers.shape) * keep).sum(-1) / keep.sum(-1).clamp_min(1)
    return per_task[keep.any(-1)].mean()


class Stage:
    """The curriculum on one model: runs phases, logs, saves after each phase."""

    def __init__(self, args, model, encoder: TaskTokens, tokens: np.ndarray, device: torch.device):
        self.args, self.model, self.encoder, self.tokens, self.device = args, model, encoder, tokens, device
        self.log = JsonLog(args.out / f"train_log_part{args.part}.jsonl")

    def step(self, ids: torch.Tensor, kinds: torch.Tensor, answers: torch.Tensor) -> dict:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            logits = self.model(input_ids=ids).logits
        lm, ans = lm_loss(logits, ids), answer_loss(logits, ids, answers)
        (lm + self.args.answer_weight * ans).backward()
        hits = answer_hits(logits.detach().argmax(-1), ids, answers)
        stats = {"loss": lm.item(), "answer_loss": ans.item()}
        for k, kind in enumerate(KINDS):
            if (kinds == k).any():
                stats[f"acc_{kind}"] = hits[kinds == k].float().mean().item()
        return stats

    def run(self, phase: Phase, index: int) -> dict:
        """Run ``phase`` (the ``index``-th) to its end; returns its steps, tokens and seconds."""
        def next_batch(step: int) -> tuple[torch.Tensor, ...]:
            rng = np.random.default_rng([self.args.seed, index, step])
            batch = task_batch(rng, self.tokens, phase.length, phase.batch, self.args.blocks, self.encoder)
            return tuple(x.to(self.device) for x in batch)

        params = [p for p in self.model.parameters() if p.requires_grad]
        budget = StepBudget(phase.steps, phase.budget_s, self.args.rate_steps, self.device)
        return train_phase(phase.name, phase.lr, params, budget, next_batch, self.step, self.log, self.args.log_every)


def weights_digest(folder: Path) -> str:
    """sha256 of a checkpoint's weight files (the init's identity wherever the repository lies)."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def fingerprint(args, plan: list[Phase]) -> dict:
    """The settings that define the run (a resumed run must match them)."""
    return {"init": args.init.name, "init_sha256": weights_digest(args.init), "seed": args.seed,
            "scale": args.scale, "blocks": args.blocks, "answer_weight": args.answer_weight, "rope_theta": ROPE_THETA,
            "phases": [{k: v for k, v in asdict(p).items() if k not in ("budget_s", "steps")} for p in plan]}


def write_json(path: Path, doc: dict) -> None:
    """Write ``doc`` to ``path`` through a temporary file (a killed call leaves the old file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def load_model(args, resuming: bool, device: torch.device):
    """The model in fp32: the last phase's checkpoint in ``--out`` when resuming, else ``--init``
    with the base raised to ``ROPE_THETA``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    source = args.out if resuming else args.init
    config = AutoConfig.from_pretrained(source)
    if config.model_type != "llama":
        raise SystemExit(f"{source}: a {config.model_type} checkpoint; this stage trains the Llama measuring model")
    config.rope_parameters = {"rope_type": "default", "rope_theta": ROPE_THETA}
    model = AutoModelForCausalLM.from_pretrained(source, config=config, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    return model.to(device).train()


def save_checkpoint(model, tokenizer, out: Path) -> dict:
    """bf16 ``save_pretrained`` (files <= 15 MB) and the tokenizer into ``out``; the model's
    parameters are rounded to bf16 in place (it trains on from what was saved, in fp32, as a run
    resumed from the files does); its buffers (RoPE's frequencies) stay as they are. Returns the
    files' sizes."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16))
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out, max_shard_size="15MB")
    tokenizer.save_pretrained(out)
    return {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}


def copy_history(init: Path, out: Path, part: int) -> None:
    """The earlier stages' configs and logs travel with the checkpoint (not this part's own)."""
    for path in sorted(init.glob("train_config_part*.json")) + sorted(init.glob("train_log_part*.jsonl")):
        if f"_part{part}." not in path.name:
            shutil.copy2(path, out / path.name)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--init", type=Path, default=ROOT / "tiny-llama", help="the checkpoint to continue")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, default=Path(".corpus"), help="folder with train.npy")
    parser.add_argument("--budget-s", type=float, nargs=len(PHASES), default=list(BUDGETS_S), help="seconds per phase")
    parser.add_argument("--steps", type=int, nargs=len(PHASES), help="steps per phase (overrides --budget-s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0, help="divide context lengths (CPU smoke runs)")
    parser.add_argument("--blocks", type=int, default=8, help="blocks the tasks' lines are spread over")
    parser.add_argument("--answer-weight", type=float, default=1.0)
    parser.add_argument("--part", type=int, default=4, help="N of train_config_partN.json / train_log_partN.jsonl")
    parser.add_argument("--max-phases", type=int, help="run at most this many phases in this call")
    parser.add_argument("--deadline-s", type=float, help="start no phase that could end after this many seconds")
    parser.add_argument("--rate-steps", type=int, default=8, help="steps timed to turn a budget into steps")
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if not (args.init / "config.json").is_file():
        parser.error(f"--init: {args.init} holds no config.json")
    if not (args.corpus / "train.npy").is_file():
        parser.error(f"--corpus: {args.corpus}/train.npy not found (run benchmarks/models/tiny_corpus.py)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    if args.steps is not None and min(args.steps) < 1:
        parser.error(f"--steps: expected positive integers, got {args.steps}")
    if args.blocks < 1 or (args.max_phases is not None and args.max_phases < 1):
        parser.error("--blocks and --max-phases must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the stage's remaining phases; 0 when all are done, ``EXIT_PHASES_LEFT`` otherwise."""
    started = time.time()
    args = parse(argv)
    from transformers import AutoTokenizer

    plan = phases(args.budget_s, args.steps, args.scale)
    config_path = args.out / f"train_config_part{args.part}.json"
    progress_path = args.out / f"train_progress_part{args.part}.json"
    if config_path.is_file():
        print(json.dumps({"done": str(config_path)}), flush=True)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = fingerprint(args, plan)
    progress = json.loads(progress_path.read_text()) if progress_path.is_file() else None
    if progress is not None and progress["settings"] != wanted:
        raise SystemExit(f"{progress_path}: the run there has other settings ({progress['settings']}); "
                         f"pass the same ones or another --out")
    resuming = progress is not None and bool(progress["done"])
    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.out if resuming else args.init)
    torch.manual_seed(args.seed)
    model = load_model(args, resuming, device)
    if progress is None:
        copy_history(args.init, args.out, args.part)
        progress = {"settings": wanted, "done": []}
        write_json(progress_path, progress)
    stage = Stage(args, model, TaskTokens(tokenizer), load_tokens(args.corpus / "train.npy"), device)
    stage.log({"start": "long", "resumed_after": [d["phase"] for d in progress["done"]],
               "parameters": sum(p.numel() for p in model.parameters()), "device": str(device),
               "torch": torch.__version__, "phases": [asdict(p) for p in plan]})
    ran = 0
    for index, phase in enumerate(plan):
        if index < len(progress["done"]):
            continue
        late = (args.deadline_s is not None and phase.steps is None
                and time.time() - started + 1.2 * phase.budget_s > args.deadline_s)
        if late or (args.max_phases is not None and ran == args.max_phases):
            stage.log({"paused_before": phase.name, "reason": "deadline" if late else "max_phases"})
            return EXIT_PHASES_LEFT
        progress["done"].append(stage.run(phase, index))
        ran += 1
        sizes = save_checkpoint(model, tokenizer, args.out)
        write_json(progress_path, progress)
        stage.log({"saved": str(args.out), "after": phase.name, "bytes": sum(sizes.values()),
                   "largest": max(sizes.values())})
    done = progress["done"]
    manifest = args.corpus / "manifest.json"
    write_json(config_path, {
        "stage": "long", "model": "llama", **wanted, "parameters": sum(p.numel() for p in model.parameters()),
        "phases": [asdict(p) for p in plan], "done": done, "steps": [d["steps"] for d in done],
        "corpus": json.loads(manifest.read_text()) if manifest.is_file() else None})
    progress_path.unlink()
    stage.log({"end": "long", "done": done})
    return 0


if __name__ == "__main__":
    sys.exit(main())

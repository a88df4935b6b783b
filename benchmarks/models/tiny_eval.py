"""Evidence that the measuring models are models (GPU): held-out loss against unigram and bigram
baselines, retrieval of planted facts, and how much of the main attention's mass the DSA
indexer's top-K holds, per layer.

* ``loss``: bits per token and per byte on held-out windows (the corpus' held-out split, never
  trained on) of ``--loss-lengths`` tokens (4096 and 16384) for the DSA model attending to all keys
  (``dense``) and to its indexer's top-2048 (``sparse``), and for the Llama model; the unigram and interpolated-bigram baselines are
  estimated on the training split and scored on the same tokens (the bigram's interpolation
  weight is the best of a grid on those tokens: a baseline favoured, not tuned against).
* ``retrieval``: 4 facts planted at uniform depths of a held-out window, two asked for at the
  end and the second scored: correct when the argmax at every answer position is the answer
  (teacher forced, which is what greedy decoding produces when it is right). The first question
  is a primer: it reads exactly like a planted fact (the models learned questions as a block at
  the end), so the models answer a lone first question mostly by guessing (``PRIMER``). Each row
  carries its Wilson 95% interval. With ``--retrieval-lengths`` every model runs ``--trials``
  trials at each of those lengths instead of the fixed plan (16K and 32K for every model).
* ``mass``: per layer, over query rows with more than K visible keys, the mean share of the
  head-mean main attention probability (dense attention) on the indexer's top-K keys (indexer
  scored in fp32 as transformers does), K = 2048 and T/16; beside it the share on the K most
  recent keys (a sliding window), for scale; only with ``--dsa``.

Without ``--dsa`` only the Llama model is evaluated (the long-context evidence below);
``--llama-rope`` (JSON ``rope_parameters``) evaluates it under another RoPE than its configuration's
(the zero-shot probe behind ``train_long_context.ROPE_THETA``).

    python benchmarks/models/tiny_eval.py --dsa ckpt/dsa --llama ckpt/llama --out tiny_models_h200.json
    python benchmarks/models/tiny_eval.py --llama ckpt/llama-64k --loss-lengths 16384 32768 65536 \\
        --retrieval-lengths 32768 65536 --out tiny_llama_64k.json
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proportions import wilson_interval  # noqa: E402
from tiny_data import FactTokens, answer_accuracy, load_tokens, planted_sequence, random_facts  # noqa: E402

from runtime.dsa_forward import dsa_forward, indexer_qkw, indexer_topk, causal_index_scores  # noqa: E402

ROOT = Path(__file__).resolve().parent
HELDOUT = ROOT / "heldout_tokens.npy"
TOPK = 2048


def windows(tokens: np.ndarray, length: int, count: int) -> list[torch.Tensor]:
    """``count`` disjoint windows of ``length`` tokens spread over ``tokens``."""
    count = min(count, tokens.size // length)
    step = tokens.size // count
    return [torch.from_numpy(tokens[i * step:i * step + length].astype(np.int64)) for i in range(count)]


def baselines(train: np.ndarray, scored: np.ndarray, vocab: int) -> dict:
    """Unigram (add-one) and interpolated bigram bits per token of ``scored`` tokens [N] given their
    predecessors, estimated on ``train``."""
    uni = (np.bincount(train, minlength=vocab) + 1.0)
    uni /= uni.sum()
    prev, nxt = scored[:-1].astype(np.int64), scored[1:].astype(np.int64)
    pair_ids = train[:-1].astype(np.int64) * vocab + train[1:]
    pairs, counts = np.unique(pair_ids, return_counts=True)
    row_totals = np.bincount(train[:-1], minlength=vocab).astype(np.float64)
    looked = prev * vocab + nxt
    at = np.searchsorted(pairs, looked)
    found = (at < pairs.size) & (pairs[np.minimum(at, pairs.size - 1)] == looked)
    c = np.where(found, counts[np.minimum(at, pairs.size - 1)], 0).astype(np.float64)
    p_bigram = np.divide(c, row_totals[prev], out=np.zeros_like(c), where=row_totals[prev] > 0)
    best = min((float(-np.log2(lam * p_bigram + (1 - lam) * uni[nxt]).mean()), lam)
               for lam in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95))
    return {"unigram_bits_per_token": float(-np.log2(uni[nxt]).mean()),
            "bigram_bits_per_token": best[0], "bigram_lambda": best[1], "tokens": int(nxt.size)}


class Models:
    """The DSA (None without ``dsa_dir``) and Llama checkpoints on one device, with the forwards
    the evidence needs; ``names`` lists the forwards there are."""

    def __init__(self, dsa_dir: Path | None, llama_dir: Path, device: torch.device, llama_rope: dict | None = None):
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        def load(path: Path, rope: dict | None = None):
            config = AutoConfig.from_pretrained(path)
            if rope is not None:
                config.rope_parameters = rope
            return AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.bfloat16,
                                                        attn_implementation="sdpa").to(device).eval()

        self.dsa, self.llama = (None if dsa_dir is None else load(dsa_dir)), load(llama_dir, llama_rope)
        self.tokenizer = AutoTokenizer.from_pretrained(llama_dir if dsa_dir is None else dsa_dir)
        self.device = device
        self.names = ("llama",) if self.dsa is None else ("dsa_dense", "dsa_sparse", "llama")

    @staticmethod
    def topk_select(layer: int, capture) -> torch.Tensor:
        qkw = indexer_qkw(capture.attention.indexer, capture.x, capture.q_resid, capture.cos, capture.sin)
        return indexer_topk(qkw, TOPK, chunk=256, dtype=torch.float32)

    @torch.no_grad()
    def logits(self, how: str, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(self.device)[None] if ids.dim() == 1 else ids.to(self.device)
        if how == "llama":
            return self.llama(input_ids=ids).logits
        return dsa_forward(self.dsa, ids, select=self.topk_select if how == "dsa_sparse" else None)


def held_out_loss(models: Models, tokens: np.ndarray, bytes_per_token: float, args) -> list[dict]:
    rows = []
    for full_length in args.loss_lengths:
        length, count = full_length // args.scale, args.loss_windows * (2 if full_length <= 4096 else 1)
        for how in models.names:
            total, n = 0.0, 0
            for ids in windows(tokens, length, count if how != "dsa_sparse" else max(1, count // 2)):
                logits = models.logits(how, ids)[0, :-1].float()
                target = ids[1:].to(logits.device)
                total += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
                n += target.numel()
            bits = total / n / math.log(2)
            rows.append({"model": how, "length": length, "tokens": n, "bits_per_token": round(bits, 4),
                         "bits_per_byte": round(bits / bytes_per_token, 4)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def retrieval(models: Models, tokens: np.ndarray, args) -> list[dict]:
    encoder = FactTokens(models.tokenizer)
    rows = []
    plan = [("dsa_dense", 16384, args.trials), ("llama", 16384, args.trials), ("dsa_sparse", 16384, args.sparse_trials),
            ("dsa_dense", 32768, args.trials // 2), ("llama", 32768, args.trials // 2),
            ("dsa_sparse", 32768, args.sparse_trials // 2), ("dsa_dense", 4096, args.trials)]
    if args.retrieval_lengths:
        plan = [(how, length, args.sparse_trials if how == "dsa_sparse" else args.trials)
                for length in args.retrieval_lengths for how in models.names]
    for how, length, trials in plan:
        if how not in models.names:
            continue
        length //= args.scale
        rng = np.random.default_rng(12345 + length)
        correct, depths, t0 = [], [], time.time()
        for _ in range(trials):
            facts = random_facts(rng, 4)
            planted = planted_sequence(rng, tokens, length, facts, [int(i) for i in rng.permutation(4)[:2]], encoder)
            logits = models.logits(how, planted.ids)
            ok = answer_accuracy(logits.argmax(-1), planted.ids[None].to(models.device),
                                 planted.answers[None].to(models.device))
            correct.append(bool(ok[0, -1].item()))  # the second question (the first is the primer)
            depths.append(planted.depths[-1])
        rows.append({"model": how, "length": length, "trials": trials, "accuracy": sum(correct) / max(1, trials),
                     "wilson_95": [round(x, 4) for x in wilson_interval(sum(correct), trials)], "correct": correct, "depths": [round(d, 3) for d in depths],
                     "seconds": round(time.time() - t0, 1)})
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("correct", "depths")}), flush=True)
    return rows


@torch.no_grad()
def attention_mass(models: Models, tokens: np.ndarray, args) -> list[dict]:
    rows = []
    for length in (16384 // args.scale, 32768 // args.scale):
        ks = sorted({TOPK, length // 16})
        sums = {}
        for ids in windows(tokens, length, args.mass_windows):
            captures = []
            dsa_forward(models.dsa, ids.to(models.device)[None], on_layer=captures.append, hidden_only=True)
            for cap in captures:
                qkw = indexer_qkw(cap.attention.indexer, cap.x, cap.q_resid, cap.cos, cap.sin)
                for start in range(0, length, args.mass_chunk):
                    rows_ = slice(start, min(start + args.mass_chunk, length))
                    logits = torch.matmul(cap.query[:, :, rows_].float(), cap.key.float().transpose(-1, -2)) * cap.scaling
                    pos = torch.arange(rows_.start, rows_.stop, device=logits.device)
                    future = torch.arange(length, device=logits.device)[None, :] > pos[:, None]
                    p = torch.softmax(logits.masked_fill(future, float("-inf")), -1).mean(1)[0]  # [c, T]
                    scores = causal_index_scores(qkw, rows_, torch.float32)[0]
                    for k in ks:
                        keep = pos >= k  # rows with more than k visible keys
                        if not keep.any():
                            continue
                        idx = scores[keep].topk(k, dim=-1).indices
                        mass = p[keep].gather(-1, idx).sum(-1)
                        recent = torch.arange(length, device=p.device)[None, :] > (pos[keep, None] - k)
                        window = (p[keep] * recent).sum(-1)
                        s = sums.setdefault((cap.index, k), [0.0, 0.0, 0])
                        s[0] += mass.sum().item()
                        s[1] += window.sum().item()
                        s[2] += int(keep.sum())
        for (layer, k), (mass, window, n) in sorted(sums.items()):
            rows.append({"length": length, "layer": layer, "k": k, "rows": n, "indexer_mass": round(mass / n, 4),
                         "recent_k_mass": round(window / n, 4)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsa", type=Path, help="the DSA checkpoint (without it: the Llama model only)")
    parser.add_argument("--llama", type=Path, required=True)
    parser.add_argument("--llama-rope", type=json.loads, help="JSON rope_parameters for the Llama model")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, default=Path(".corpus"), help="folder with train.npy (baselines)")
    parser.add_argument("--loss-windows", type=int, default=8)
    parser.add_argument("--loss-lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--retrieval-lengths", type=int, nargs="+", help="every model at each (default: the fixed plan)")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--sparse-trials", type=int, default=40)
    parser.add_argument("--mass-windows", type=int, default=2)
    parser.add_argument("--mass-chunk", type=int, default=256)
    parser.add_argument("--scale", type=int, default=1, help="divide every length (CPU smoke runs)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    for flag in ("dsa", "llama"):
        if getattr(args, flag) is not None and not (getattr(args, flag) / "config.json").is_file():
            parser.error(f"--{flag}: {getattr(args, flag)} holds no config.json")
    if not args.out.parent.is_dir():
        parser.error(f"--out: directory {args.out.parent} does not exist")
    if not (args.corpus / "train.npy").is_file():
        parser.error(f"--corpus: {args.corpus}/train.npy not found")
    heldout = load_tokens(HELDOUT)
    manifest = json.loads((args.corpus / "manifest.json").read_text())
    bytes_per_token = manifest["heldout"]["bytes"] / manifest["heldout"]["tokens"]
    models = Models(args.dsa, args.llama, torch.device(args.device), args.llama_rope)
    scored = np.concatenate([w.numpy() for w in windows(heldout, 16384 // args.scale, args.loss_windows)])
    result = {"device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "bytes_per_token": bytes_per_token, "llama_rope": models.llama.config.rope_parameters,
              "baselines": baselines(load_tokens(args.corpus / "train.npy"), scored, len(models.tokenizer))}
    print(json.dumps(result["baselines"]), flush=True)
    sections = (("loss", held_out_loss), ("retrieval", retrieval), ("mass", attention_mass))
    for name, section in sections[:3 if args.dsa is not None else 2]:
        result[name] = section(models, heldout, bytes_per_token, args) if name == "loss" else section(models, heldout, args)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

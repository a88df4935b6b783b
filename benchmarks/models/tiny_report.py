"""Tables and plots of the measuring models' results (CPU): training curves from the checkpoints'
logs, held-out loss, retrieval, the indexer's attention-mass share, Pulsar's accuracy.

    python benchmarks/models/tiny_report.py --models benchmarks/models --results benchmarks/results \\
        --md benchmarks/results/tiny_models_h200.md
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def training_rows(models: Path) -> dict[str, list[dict]]:
    """Per model directory, the logged steps of every stage (the dense-stage logs are kept beside
    the final ones as train_log_<stage>.jsonl)."""
    out = {}
    for model in sorted(p for p in models.iterdir() if (p / "config.json").is_file()):
        rows = []
        for log in sorted(model.glob("train_log*.jsonl")):
            rows += [r for r in read_log(log) if "step" in r]
        out[model.name] = rows
    return out


def plot(models: Path, evidence: dict, pulsar: dict | None, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for name, rows in training_rows(models).items():
        lm = [r for r in rows if "loss" in r]
        if lm:
            axes[0].plot(range(len(lm)), [r["loss"] for r in lm], label=name, lw=0.8)
    axes[0].set(title="training LM loss (nats) per logged step", xlabel="logged step (every 25 steps)")
    axes[0].legend()
    mass = [r for r in evidence.get("mass", []) if r["k"] == 2048]
    for length in sorted({r["length"] for r in mass}):
        sel = [r for r in mass if r["length"] == length]
        axes[1].plot([r["layer"] for r in sel], [r["indexer_mass"] for r in sel], "o-", label=f"indexer top-2048, T={length}")
        axes[1].plot([r["layer"] for r in sel], [r["recent_k_mass"] for r in sel], "x--", label=f"last 2048 keys, T={length}")
    axes[1].set(title="share of main attention mass", xlabel="layer", ylim=(0, 1.02))
    axes[1].legend(fontsize=7)
    if pulsar:
        acc = defaultdict(list)
        for r in pulsar["rows"]:
            acc[(r["mode"] + ("" if r["heuristic"] is None else f":{r['heuristic']}"), r["length"], r["blocks"])].append(r["correct"])
        labels = sorted(acc)
        axes[2].barh(range(len(labels)), [sum(acc[k]) / len(acc[k]) for k in labels])
        axes[2].set_yticks(range(len(labels)), [f"{m} L={l} b={b}" for m, l, b in labels], fontsize=6)
        axes[2].set(title="Pulsar retrieval accuracy (Llama measuring model)", xlim=(0, 1))
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def markdown(evidence: dict, pulsar: dict | None) -> str:
    lines = [f"# Measuring models on {evidence['device']}", "",
             f"torch {evidence['torch']}, transformers {evidence['transformers']}. Produced by "
             "`benchmarks/models/tiny_eval.py` and `benchmarks/pulsar_accuracy.py`.", "",
             "## Held-out loss", "",
             f"Baselines on the same held-out tokens: unigram {evidence['baselines']['unigram_bits_per_token']:.2f} "
             f"bits/token, interpolated bigram {evidence['baselines']['bigram_bits_per_token']:.2f} "
             f"({evidence['bytes_per_token']:.2f} bytes per token).", "",
             "| model | context | tokens | bits/token | bits/byte |", "|---|---|---|---|---|"]
    for r in evidence.get("loss", []):
        lines.append(f"| {r['model']} | {r['length']} | {r['tokens']} | {r['bits_per_token']:.3f} | {r['bits_per_byte']:.3f} |")
    lines += ["", "## Retrieval of planted facts (held-out haystack, second question scored)", "",
              "| model | context | trials | accuracy |", "|---|---|---|---|"]
    for r in evidence.get("retrieval", []):
        lines.append(f"| {r['model']} | {r['length']} | {r['trials']} | {r['accuracy']:.3f} |")
    lines += ["", "## Share of the main attention's mass on the indexer's top-K", "",
              "| T | layer | K | indexer top-K | last K keys |", "|---|---|---|---|---|"]
    for r in evidence.get("mass", []):
        lines.append(f"| {r['length']} | {r['layer']} | {r['k']} | {r['indexer_mass']:.3f} | {r['recent_k_mass']:.3f} |")
    if pulsar:
        acc, ms = defaultdict(list), defaultdict(list)
        for r in pulsar["rows"]:
            key = (r["mode"], r["heuristic"] or "-", r["length"], r["blocks"] or "-")
            acc[key].append(r["correct"])
            ms[key].append(r["ms"])
        lines += ["", "## Pulsar: retrieval accuracy and generate time (Llama measuring model)", "",
                  "| mode | heuristic | L | blocks | trials | accuracy | median ms |", "|---|---|---|---|---|---|---|"]
        for key in acc:
            times = sorted(ms[key])
            lines.append(f"| {' | '.join(str(x) for x in key)} | {len(acc[key])} | "
                         f"{sum(acc[key]) / len(acc[key]):.2f} | {times[len(times) // 2]:.1f} |")
        if pulsar.get("skipped"):
            lines.append(f"\nNot run (time budget): {len(pulsar['skipped'])} configurations.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=Path("benchmarks/models"))
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--md", type=Path, required=True)
    args = parser.parse_args()
    evidence = json.loads((args.results / "tiny_models_h200.json").read_text())
    pulsar_path = args.results / "pulsar_accuracy_h200.json"
    pulsar = json.loads(pulsar_path.read_text()) if pulsar_path.is_file() else None
    args.md.write_text(markdown(evidence, pulsar))
    plot(args.models, evidence, pulsar, args.md.with_suffix(".png"))


if __name__ == "__main__":
    main()

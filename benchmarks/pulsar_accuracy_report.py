"""Tables and the plot of ``benchmarks/pulsar_accuracy.py``'s results (CPU).

``write_report(path, result)`` writes the result as JSON at ``path``, its tables beside it as
``.md`` (per task kind: accuracy and Wilson 95% interval per length, block count and mode; then the
phase-1 cost per block) and one plot as ``.png``: accuracy against length per mode, a panel per task
kind (rows) and block count (columns), the intervals as error bars, each mode's points shifted a
little along the length axis so that equal values stay apart.

    python benchmarks/pulsar_accuracy_report.py --render benchmarks/results/NAME.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import harness  # noqa: E402


def mode_name(mode: str, heuristic: str | None) -> str:
    return mode if heuristic is None else f"{mode}:{heuristic}"


def modes_of(result: dict) -> list[str]:
    """The modes in run order: dense, star, then Pulsar per heuristic."""
    return ["dense", "star"] + [mode_name("pulsar", h) for h in result["heuristics"]]


def cell_lookup(result: dict) -> dict[tuple, dict]:
    """(mode name, length, blocks, kind) -> cell; dense cells answer for every block count."""
    out = {}
    for cell in result.get("cells", []):
        name = mode_name(cell["mode"], cell["heuristic"])
        for blocks in (result["blocks"] if cell["blocks"] is None else [cell["blocks"]]):
            out[(name, cell["length"], blocks, cell["kind"])] = cell
    return out


def accuracy_tables(result: dict) -> list[str]:
    cells, modes, lines = cell_lookup(result), modes_of(result), []
    for kind in result["kinds"]:
        lines += ["", f"### {kind}", "", "| L | blocks | " + " | ".join(modes) + " |",
                  "|---:|---:|" + "---|" * len(modes)]
        for length in result["lengths"]:
            for blocks in result["blocks"]:
                entries = []
                for name in modes:
                    cell = cells.get((name, length, blocks, kind))
                    entries.append("-" if cell is None else
                                   f"{cell['accuracy']:.2f} ({cell['wilson_95'][0]:.2f}-{cell['wilson_95'][1]:.2f})")
                lines.append(f"| {length} | {blocks} | " + " | ".join(entries) + " |")
    return lines


def cost_table(result: dict) -> list[str]:
    star = {(c["length"], c["blocks"]): c for c in result.get("cost", []) if c["mode"] == "star"}
    rows = []
    for c in result.get("cost", []):
        ref = star.get((c["length"], c["blocks"]))
        rows.append([mode_name(c["mode"], c["heuristic"]), c["length"], c["blocks"], max(c["tokens_per_block"]),
                     round(c["max_flops"] / 1e9, 2), c["max_ms"], c["mean_ms"],
                     None if ref is None else round(ref["max_flops"] / c["max_flops"], 2),
                     None if ref is None else round(ref["max_ms"] / c["max_ms"], 2)])
    columns = ["mode", "L", "blocks", "tokens (largest block)", "GFLOPs (largest block)", "ms (largest block)",
               "ms (mean block)", "star / this, FLOPs", "star / this, ms"]
    return ["", "## Phase 1 per block (per-host inputs, each run alone)", "",
            harness.markdown_table(columns, rows)]


def markdown(result: dict) -> str:
    v = harness.versions_of(result)
    trials = sorted({c["trials"] for c in result.get("cells", [])})
    lines = [f"# Pulsar accuracy on {result['device']}", "",
             f"torch {v.get('torch')}, transformers {v.get('transformers')}; model `{result['model']}` "
             f"({result['dtype']}); sink {result['sink']}, chunk {result['chunk']}, summary ratio {result['ratio']}; "
             f"trials per cell {trials} of {result['trials_asked']} asked, every task's lines in distinct blocks of "
             f"L / {result['trials_placed_in_blocks']}. Accuracy (Wilson 95% interval)."]
    if result.get("stopped"):
        lines += ["", f"Stopped early: {result['stopped']}."]
    return "\n".join(lines + accuracy_tables(result) + cost_table(result)) + "\n"


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells, kinds, blocks, modes = cell_lookup(result), result["kinds"], result["blocks"], modes_of(result)
    fig, axes = plt.subplots(len(kinds), len(blocks), figsize=(4.2 * len(blocks), 3.2 * len(kinds)),
                             squeeze=False, sharex=True, sharey=True)
    for r, kind in enumerate(kinds):
        for c, n in enumerate(blocks):
            ax = axes[r][c]
            for i, name in enumerate(modes):
                points = [(length, cells[(name, length, n, kind)]) for length in result["lengths"]
                          if (name, length, n, kind) in cells]
                if not points:
                    continue
                shift = 2 ** (0.2 * (i / max(1, len(modes) - 1) - 0.5))
                x = [p[0] * shift for p in points]
                y = [p[1]["accuracy"] for p in points]
                err = [[a - p[1]["wilson_95"][0] for a, p in zip(y, points)],
                       [p[1]["wilson_95"][1] - a for a, p in zip(y, points)]]
                style = {"dense": dict(color="black", ls="--"), "star": dict(color="dimgray", lw=2.5)}.get(name, {})
                ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=name, **style)
            ax.set_xscale("log", base=2)
            ax.set_xticks(result["lengths"], [str(length) for length in result["lengths"]])
            ax.set(title=f"{kind}, {n} blocks", ylim=(-0.03, 1.03))
            if c == 0:
                ax.set_ylabel("accuracy")
            if r == len(kinds) - 1:
                ax.set_xlabel("context tokens L")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def write_report(path: Path, result: dict) -> None:
    """The JSON at ``path``, the tables at ``.md`` and the plot at ``.png`` beside it."""
    harness.write_json(path, result)
    path.with_suffix(".md").write_text(markdown(result))
    if result.get("cells"):
        plot(result, path.with_suffix(".png"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--render", type=Path, required=True, help="a pulsar_accuracy.py results JSON")
    args = parser.parse_args()
    write_report(args.render, json.loads(args.render.read_text()))


if __name__ == "__main__":
    main()

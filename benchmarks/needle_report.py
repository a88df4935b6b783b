"""Summary, markdown table and capture-against-budget plot of a needle-capture run.

``write_report(result, folder)`` adds ``result["summary"]`` and writes ``needle_capture_cpu.json``,
``needle_capture_cpu.md`` and ``needle_capture_cpu.png`` into ``folder`` (``NAME``: the benchmark
runs on the CPU). ``python -m benchmarks.needle_report FOLDER`` rebuilds the markdown and the plot
from the JSON in FOLDER.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks import harness

NAME = "needle_capture_cpu"
"""The result files' name, before .json, .md and .png."""
CHALLENGER, BASELINE = "novelty", "max_idf"
QUADRANTS = (("dev", "dev"), ("dev", "held_out"), ("held_out", "dev"), ("held_out", "held_out"))


def _rate(rows: list[dict], ratio: str) -> float | None:
    return sum(r["captured_at"][ratio] for r in rows) / len(rows) if rows else None


def _labels(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["heuristic"] for r in rows))


def _split(rows: list[dict], name: str) -> list[dict]:
    if name == "all":
        return rows
    if name == "dev":
        return [r for r in rows if r["source_split"] == "dev" and r["template_split"] == "dev"]
    return [r for r in rows if r["source_split"] == "held_out" or r["template_split"] == "held_out"]


def summarise(result: dict) -> dict:
    """Capture rates per heuristic (by split, ratio, source, tokenizer, template, length and block
    size), the best heuristic, and the cells where novelty does not beat Max-IDF."""
    rows, ratios = result["rows"], [str(r) for r in result["settings"]["ratios"]]
    main = str(result["settings"]["main_ratio"])
    by_label = {h: [r for r in rows if r["heuristic"] == h] for h in _labels(rows)}
    summary: dict = {"contexts": len(by_label[BASELINE]), "capture": {}, "by": {}}
    for h, mine in by_label.items():
        summary["capture"][h] = {s: {q: _rate(_split(mine, s), q) for q in ratios} for s in ("all", "dev", "held_out")}
        summary["capture"][h]["quadrants"] = {
            f"{s}_source/{t}_template": _rate([r for r in mine if (r["source_split"], r["template_split"]) == (s, t)],
                                              main) for s, t in QUADRANTS}
        summary["by"][h] = {key: {str(v): _rate([r for r in mine if r[key] == v], main)
                                  for v in dict.fromkeys(r[key] for r in mine)}
                            for key in ("source", "tokenizer", "template", "length", "block_size")}
    best = max(by_label, key=lambda h: summary["capture"][h]["all"][main])
    summary["best"] = dict(heuristic=best, capture=summary["capture"][best]["all"][main], ratio=float(main),
                           target=0.5, target_met=summary["capture"][best]["all"][main] >= 0.5)
    if CHALLENGER in by_label:
        summary["against_baseline"] = _compare(by_label[CHALLENGER], by_label[BASELINE], ratios)
    return summary


def _compare(challenger: list[dict], baseline: list[dict], ratios: list[str]) -> dict:
    """The challenger against the baseline: cells (source x tokenizer x template, and length x
    block size) at each ratio where it captures fewer needles (``worse``) or as many (``equal``),
    and whether it captures more in every split and every per-key aggregate at every ratio."""
    worse, equal = [], []
    for keys in (("source", "tokenizer", "template"), ("length", "block_size")):
        for cell in dict.fromkeys(tuple(r[k] for k in keys) for r in baseline):
            mine = [r for r in challenger if tuple(r[k] for k in keys) == cell]
            theirs = [r for r in baseline if tuple(r[k] for k in keys) == cell]
            for q in ratios:
                a, b = _rate(mine, q), _rate(theirs, q)
                entry = dict(zip(keys, cell), ratio=float(q), challenger=a, baseline=b, contexts=len(mine))
                if a < b:
                    worse.append(entry)
                elif a == b:
                    equal.append(entry)
    aggregates = [(s, None, None) for s in ("all", "dev", "held_out")] + [
        ("all", k, v) for k in ("source", "tokenizer", "template", "length", "block_size")
        for v in dict.fromkeys(r[k] for r in baseline)]
    better_everywhere_aggregated = all(
        _rate([r for r in _split(challenger, s) if k is None or r[k] == v], q)
        > _rate([r for r in _split(baseline, s) if k is None or r[k] == v], q)
        for s, k, v in aggregates for q in ratios)
    return dict(challenger=CHALLENGER, baseline=BASELINE, worse=worse, equal=equal,
                better_in_every_aggregate=better_everywhere_aggregated,
                beats_everywhere=better_everywhere_aggregated and not worse)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def markdown(result: dict) -> str:
    s, settings = result["summary"], result["settings"]
    ratios, main = [str(r) for r in settings["ratios"]], str(settings["main_ratio"])
    labels = list(s["capture"])
    lines = [
        "# Needle capture by Pulsar summaries",
        "",
        f"{s['contexts']} contexts (one needle each) per heuristic: sources {', '.join(f'{k} ({v})' for k, v in result['sources'].items())}; "
        f"tokenizers {', '.join(f'{k} ({v})' for k, v in result['tokenizers'].items())}; "
        f"templates {', '.join(f'{k} ({v})' for k, v in result['templates'].items())}; lengths "
        f"{', '.join(str(n // 1024) + 'K' for n in settings['lengths'])}; block sizes {settings['block_sizes']}; "
        f"{settings['trials']} trials per cell; chunk {settings['chunk']}, sink {settings['sink']}. "
        "Needles at uniformly random sentence (prose) or line (code) boundaries, never in the last block.",
        f"Captured = {settings['captured']}. Dev = dev source and dev template (what `novelty` was designed on); "
        "held out = a held-out source or template. Packages: "
        + ", ".join(f"{k} {v}" for k, v in {**harness.versions_of(result), **result["packages"]}.items()) + ".",
        "",
        "## Capture against the summary budget",
        "",
        "| heuristic | " + " | ".join(f"all @{q}" for q in ratios) + " | " + " | ".join(f"dev @{q}" for q in ratios)
        + " | " + " | ".join(f"held out @{q}" for q in ratios) + " |",
        "|---|" + "---:|" * (3 * len(ratios)),
    ]
    for h in labels:
        c = s["capture"][h]
        lines.append(f"| {h} | " + " | ".join(_pct(c[sp][q]) for sp in ("all", "dev", "held_out") for q in ratios) + " |")
    best = s["best"]
    lines += ["", f"Best at ratio {best['ratio']}: **{best['heuristic']}**, {_pct(best['capture'])} of all needles "
              f"(target {_pct(best['target'])}: {'met' if best['target_met'] else 'not met'}).", ""]
    lines += _by_table(s, labels, "quadrants", main, lambda h: s["capture"][h]["quadrants"],
                       "Split quadrants at ratio " + main)
    for key, title in (("source", "By source"), ("tokenizer", "By tokenizer"), ("template", "By template"),
                       ("length", "By context length"), ("block_size", "By block size")):
        lines += _by_table(s, labels, key, main, lambda h, k=key: s["by"][h][k], f"{title} at ratio {main}",
                           splits=result["templates"] if key == "template" else
                           result["sources"] if key == "source" else None)
    if "against_baseline" in s:
        c = s["against_baseline"]
        ties = sorted({f"{_pct(e['challenger'])} at {e['ratio']}" for e in c["equal"]})
        lines += [f"## {c['challenger']} against {c['baseline']}", "",
                  f"Cells are source x tokenizer x template and length x block size, at each ratio. `{c['challenger']}` "
                  f"captures more in every split and every per-source, tokenizer, template, length and block-size "
                  f"aggregate at every ratio: {'yes' if c['better_in_every_aggregate'] else 'no'}. Cells where it "
                  f"captures fewer: {len(c['worse'])}; as many: {len(c['equal'])} "
                  f"({', '.join(ties) or 'none'}). "
                  f"Beats {c['baseline']} everywhere: **{'yes' if c['beats_everywhere'] else 'no'}**.", ""]
        if c["worse"]:
            keys = [k for k in c["worse"][0] if k not in ("ratio", "challenger", "baseline", "contexts")]
            lines += ["| " + " | ".join(keys) + f" | ratio | {c['challenger']} | {c['baseline']} | contexts |",
                      "|" + "---|" * (len(keys) + 4)]
            for w in c["worse"]:
                lines.append("| " + " | ".join(str(w[k]) for k in keys)
                             + f" | {w['ratio']} | {_pct(w['challenger'])} | {_pct(w['baseline'])} | {w['contexts']} |")
            lines.append("")
    if "selection_ms_cpu" in result:
        ref = result["phase1_reference"]
        budget = ref["phase1_ms"] / 100
        lines += ["## Selection time", "",
                  f"`select_summaries` at L = 131072 (essays, Tekken): median process CPU time, one thread, on the "
                  f"benchmark's CPU. Reference: Pulsar phase 1 at 128K on the {ref['device']} "
                  f"({ref['file']}, {ref['layers']}-layer model): {ref['phase1_ms']} ms per device, so 1% is "
                  f"{budget:.2f} ms.", "", "| heuristic / block | CPU ms | % of phase 1 |", "|---|---:|---:|"]
        for k, v in result["selection_ms_cpu"].items():
            lines.append(f"| {k} | {v} | {100 * v / ref['phase1_ms']:.1f}% |")
        lines.append("")
    lines += [f"CPU wall time of the run: {result['wall_seconds_cpu']} s.", ""]
    return "\n".join(lines)


def _by_table(s: dict, labels: list[str], key: str, main: str, get, title: str, splits: dict | None = None) -> list[str]:
    columns = list(get(labels[0]))
    head = [f"{c} ({splits[c]})" if splits else c for c in columns]
    lines = [f"## {title}", "", "| heuristic | " + " | ".join(head) + " |", "|---|" + "---:|" * len(columns)]
    for h in labels:
        values = get(h)
        lines.append(f"| {h} | " + " | ".join(_pct(values[c]) for c in columns) + " |")
    return lines + [""]


def plot(result: dict, path: Path) -> None:
    """Capture against ratio per heuristic: all needles, dev, held out (three panels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, ratios = result["summary"], result["settings"]["ratios"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.6), sharey=True)
    styles = {"novelty": dict(color="tab:red", linewidth=2.8, marker="o"),
              "uniform": dict(color="black", linestyle="--", marker="s"),
              "max_idf": dict(color="tab:blue", linewidth=2, marker="^"),
              "max_idf+tfidf_ties": dict(color="tab:purple", linewidth=1.2, marker=".", alpha=0.8)}
    for ax, split, title in zip(axes, ("all", "dev", "held_out"),
                                ("All needles", "Dev (designed on)", "Held out (source or template)")):
        for h, capture in s["capture"].items():
            style = styles.get(h, dict(linewidth=1.2, marker=".", alpha=0.8))
            ax.plot(ratios, [100 * capture[split][str(q)] for q in ratios], label=h, **style)
        ax.plot(ratios, [100 * q for q in ratios], color="grey", linestyle=":", label="budget share (chance)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ratios, [f"{q:g}" for q in ratios])
        ax.minorticks_off()
        ax.set_xlabel("summary ratio (share of each block's tokens)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(0, 100)
    axes[0].set_ylabel("needles captured (%)")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=9, frameon=False)
    fig.suptitle(f"Pulsar summaries: needle capture against budget ({s['contexts']} contexts per heuristic; "
                 "uniform spreads its tokens and never holds a whole value)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def dumps(result: dict) -> str:
    """JSON of the result with one line per row (the rest indented)."""
    head = json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1)
    rows = ",\n".join(json.dumps(r) for r in result["rows"])
    return head[:-2] + ',\n "rows": [\n' + rows + "\n ]\n}\n"


def write_report(result: dict, folder: Path) -> None:
    result["summary"] = summarise(result)
    (folder / f"{NAME}.json").write_text(dumps(result))
    (folder / f"{NAME}.md").write_text(markdown(result))
    plot(result, folder / f"{NAME}.png")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: python -m benchmarks.needle_report FOLDER (holding {NAME}.json)")
    folder = Path(sys.argv[1])
    write_report(json.loads((folder / f"{NAME}.json").read_text()), folder)

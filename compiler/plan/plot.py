"""A PNG of a plan: measured m(r) per layer, and the predicted indexer speedup against length.

Needs matplotlib (optional dependency, imported only here; the Agg backend, no display).
"""
from __future__ import annotations

from pathlib import Path

from compiler.cost_model import IndexerShape, predicted_ratio
from compiler.plan.schema import LayerPlan, Plan


def speedup_curve(entry: LayerPlan, shape: IndexerShape, plan: Plan, lengths: list[int]) -> list[float]:
    """Predicted speedup of a layer's plan at each length: 1 where it runs dense, else the cost model's
    prediction for its r, survival and redo fraction, scaled as at the design length."""
    if entry.settings.path == "dense":
        return [1.0 for _ in lengths]
    r, min_keys = entry.settings.r, entry.settings.min_keys
    chosen = next(c for c in entry.candidates if c.r == r)
    raw = predicted_ratio(plan.design_length, r, chosen.survival, shape, plan.constants, redo=chosen.redo_frac)
    scale = 1.0 / (entry.predicted_speedup * raw)
    return [1.0 if n < min_keys else
            1.0 / predicted_ratio(n, r, chosen.survival, shape, plan.constants, redo=chosen.redo_frac, scale=scale)
            for n in lengths]


def plot_plan(plan: Plan, out: str | Path, lengths: list[int] | None = None) -> Path:
    """Write the two-panel figure to ``out``; ``lengths`` default to powers of two up to 4x the design
    length. Returns the path written."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("--plot needs matplotlib: pip install matplotlib") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if lengths is None:
        lengths = [1 << p for p in range(8, (4 * plan.design_length).bit_length())]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for entry in plan.layers:
        if entry.candidates:
            rs = [c.r for c in entry.candidates]
            left.plot(rs, [c.survival for c in entry.candidates], marker="o", label=entry.layer)
        shape = IndexerShape(heads=entry.heads, head_dim=entry.head_dim, topk=entry.topk, queries=plan.queries)
        label = f"{entry.layer} ({entry.settings.path}, r={entry.settings.r})"
        right.plot(lengths, speedup_curve(entry, shape, plan, lengths), label=label)
    left.set(xlabel="retained heads r", ylabel="survival m(r) = survivors / screened keys",
             title="measured m(r) per layer", ylim=(0.0, 1.05))
    right.set(xlabel="key length T", ylabel="predicted indexer speedup vs dense", xscale="log",
              title="predicted speedup (plan constants)")
    right.axhline(1.0, color="grey", linewidth=0.8)
    for ax in (left, right):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=6)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

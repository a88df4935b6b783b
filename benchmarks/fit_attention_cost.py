"""Fit the cost model's sparse-attention constants (``cost_model.AttentionConstants``) to a
``sparse_attention_forms.py`` run, offline, and replay the per-call choice on its rows.

    python3 benchmarks/fit_attention_cost.py --results benchmarks/results/sparse_attention_auto_h200.json \
        --out benchmarks/results/fit_attention_cost_h200.json

Union rows: time = selected·(ratio·(H·union_s + union_key_s) + union_fixed_s) with selected = B·S·K
and ratio the row's measured ``union_ratio``, fitted by relative least squares (a negative term is
dropped and the rest refitted). Absorbed: the median seconds per (query, key, 64-head block) of the
warp-specialised rows (``absorbed_s``) and of the Triton chain's default configuration where the op
runs the chain, below ``WARP_SPECIALISED_MIN_HEADS`` heads (``absorbed_chain_s``). Expansion: the
median ``copy_bytes_per_s`` that makes ``union:latent`` minus ``union`` the cost model's expansion
time (the matmul rate kept from ``H200_ATTENTION``).
The markdown beside the JSON lists, per (case, kind), the measured absorbed and union times, the
form ``compiler.ops.sparse_form`` picks with the fitted and with the current constants on the row's
sampled ratio, and the regret of each pick (its time over the faster form's).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks import harness
from compiler import cost_model
from compiler.cost_model import H200_ATTENTION, AttentionConstants
from compiler.lowering.attention.absorbed_attention import DEFAULT_CONFIG, WARP_SPECIALISED, WARP_SPECIALISED_MIN_HEADS
from compiler.lowering.defaults import ABSORBED_BLOCK_HEADS

DIMS = (512, 128, 64, 128)
"""(Dc, Dn, Dr, Dv) of ``sparse_attention_forms.py``'s MLA shape."""
_FLOOR = 1e-15
"""A fitted term dropped as negative keeps this value (the constants must be positive)."""


def _selected(row) -> int:
    return row["B"] * row["S"] * row["topk"]


def _blocks(row) -> int:
    return -(-row["heads"] // ABSORBED_BLOCK_HEADS)


def fit(rows: list[dict]) -> tuple[AttentionConstants, dict]:
    """(constants, report) from the timed prefill rows of one run (module docstring)."""
    prefill = [r for r in rows if "ms" in r and r["S"] > 1 and r.get("union_ratio") is not None]
    union = [r for r in prefill if r["method"] == "union"]
    if len(union) < 2:
        raise ValueError(f"results: expected at least 2 timed union rows with a union_ratio, got {len(union)}")
    a = np.array([[_selected(r) * r["union_ratio"] * r["heads"], _selected(r) * r["union_ratio"], _selected(r)]
                  for r in union])
    y = np.array([r["ms"] * 1e-3 for r in union])
    keep = [0, 1, 2]
    while True:
        coef, *_ = np.linalg.lstsq(a[:, keep] / y[:, None], np.ones_like(y), rcond=None)
        if (coef > 0).all() or len(keep) == 1:
            break
        keep = [k for k, c in zip(keep, coef) if c > 0] or keep[:1]
    terms = np.full(3, _FLOOR)
    terms[keep] = np.maximum(coef, _FLOOR)
    errors = np.abs(a @ terms / y - 1)

    def per_unit(method, rows):
        times = [r["ms"] * 1e-3 / (_selected(r) * _blocks(r)) for r in rows if r["method"] == method]
        return statistics.median(times) if times else None

    ws = per_unit(f"absorbed:{WARP_SPECIALISED}", prefill)
    chain = per_unit(f"absorbed:{DEFAULT_CONFIG}", [r for r in prefill if r["heads"] < WARP_SPECIALISED_MIN_HEADS])
    constants = dataclasses.replace(
        H200_ATTENTION, union_s=float(terms[0]), union_key_s=float(terms[1]), union_fixed_s=float(terms[2]),
        absorbed_s=ws or H200_ATTENTION.absorbed_s, absorbed_chain_s=chain or H200_ATTENTION.absorbed_chain_s,
        copy_bytes_per_s=_copy_rate(prefill) or H200_ATTENTION.copy_bytes_per_s,
        source=f"benchmarks/fit_attention_cost.py ({len(union)} union calls, max relative error {errors.max():.2f})")
    return constants, {"union_points": len(union), "max_rel_error": float(errors.max()),
                       "rms_rel_error": float(np.sqrt((errors ** 2).mean()))}


def _copy_rate(rows: list[dict]) -> float | None:
    """Median effective copy rate of the expansion: (union:latent - union) time less its matmul time."""
    pairs = defaultdict(dict)
    for r in rows:
        pairs[(r["B"], r["S"], r["T"], r["heads"], r["kind"])][r["method"]] = r
    dc, dn, dr, dv = DIMS
    rates = []
    for (b, _, t, heads, _), methods in pairs.items():
        if "union:latent" in methods and "union" in methods:
            extra = (methods["union:latent"]["ms"] - methods["union"]["ms"]) * 1e-3
            copy = extra - b * t * heads * 2 * dc * (dn + dv) / H200_ATTENTION.matmul_flops_per_s
            if copy > 0:
                rates.append(b * t * heads * (3 * dn + dr + dv) * 2 / copy)
    return statistics.median(rates) if rates else None


def replay(rows: list[dict], constants: AttentionConstants) -> list[dict]:
    """Per prefill (case, kind): the measured forms and the pick of ``call_sparse_form``'s rule under
    ``constants`` on the sampled ratio (union fits; the absorbed form warp-specialised when it ran)."""
    cells = defaultdict(dict)
    for r in rows:
        if "ms" in r and r["S"] > 1 and r.get("union_ratio_sampled") is not None:
            cells[(r["B"], r["S"], r["T"], r["heads"], r["kind"])][r["method"]] = r
    out = []
    for (b, s, t, heads, kind), methods in cells.items():
        absorbed = [m for name, m in methods.items() if name.startswith("absorbed:")]
        if not absorbed or "union" not in methods:
            continue
        best_absorbed = min(absorbed, key=lambda m: m["ms"])
        any_row = methods["union"]
        ws = heads >= WARP_SPECIALISED_MIN_HEADS
        crossover = cost_model.union_ratio_crossover(b, s, any_row["topk"], heads, ws, constants,
                                                     expand=(t, *DIMS))
        pick = "union" if any_row["union_ratio_sampled"] < crossover else "absorbed"
        union = methods.get("union:latent", methods["union"])
        times = {"absorbed": best_absorbed["ms"], "union": union["ms"]}
        out.append({"B": b, "S": s, "T": t, "heads": heads, "kind": kind, "union_ratio": any_row["union_ratio"],
                    "crossover": crossover, **{f"{k}_ms": v for k, v in times.items()}, "pick": pick,
                    "regret": times[pick] / min(times.values()),
                    "auto_ms": methods["auto"]["ms"] if "auto" in methods else None})
    return out


def summary(report: dict, fitted: AttentionConstants, picks: dict[str, list[dict]]) -> str:
    lines = [f"Union fit: {report['union_points']} calls, max relative error {report['max_rel_error']:.3f}, "
             f"rms {report['rms_rel_error']:.3f}. Fitted: absorbed_s {fitted.absorbed_s:.3g}, absorbed_chain_s "
             f"{fitted.absorbed_chain_s:.3g}, union_s {fitted.union_s:.3g}, union_key_s {fitted.union_key_s:.3g}, "
             f"union_fixed_s {fitted.union_fixed_s:.3g}, copy_bytes_per_s {fitted.copy_bytes_per_s:.3g}. Union ms: "
             "the union form from the latent (union:latent) where the run has it.",
             "", "| B | S | T | heads | kind | union / K | absorbed ms | union ms | auto ms | pick (fitted) | regret | "
             "pick (current) | regret |", "|" + "---|" * 13]
    for new, old in zip(picks["fitted"], picks["current"]):
        auto = "-" if new["auto_ms"] is None else f"{new['auto_ms']:.2f}"
        lines.append(f"| {new['B']} | {new['S']} | {new['T']} | {new['heads']} | {new['kind']} | "
                     f"{new['union_ratio']:.2f} | {new['absorbed_ms']:.2f} | {new['union_ms']:.2f} | {auto} | "
                     f"{new['pick']} | {new['regret']:.2f} | {old['pick']} | {old['regret']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", required=True, help="a sparse_attention_forms.py results JSON")
    p.add_argument("--out", required=True, help="constants JSON to write (a .md summary is written beside it)")
    args = p.parse_args(argv)
    rows = json.loads(Path(args.results).read_text())["rows"]
    constants, report = fit(rows)
    picks = {"fitted": replay(rows, constants), "current": replay(rows, H200_ATTENTION)}
    doc = {"constants": dataclasses.asdict(constants), "report": report, "picks": picks["fitted"]}
    harness.write_results(args.out, doc, summary(report, constants, picks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Refit the cost model's H200 constants to the committed H200 measurements, offline (no GPU).

    python3 benchmarks/fit_cost_model.py --out benchmarks/results/fit_cost_model_h200.json

Inputs: ``results/dense_roofline_h200.json`` (the dense op's scorer and selection times) and
``results/indexer_zoo_h200.json`` (certified calls with their survival). The model is affine in its
parameters, so each call gives one linear equation: the dense scorer rate from the scorer's MACs
and time, the selection rate from the rest of the dense op, then the certified parameters by
relative least squares with non-negative values. Writes the constants as JSON
(``KernelConstants.from_json``, ``python -m compiler.plan --constants FILE``) and beside it a
markdown summary: the fit's errors and each zoo family's plan under ``H200_FITTED`` and under the
refit (``compiler.plan.choice.choose_layer`` on the zoo's calibration measurements), with the
measured ratio to dense of what each plan runs in each cell the zoo timed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import numpy as np

from benchmarks import harness
from compiler.cost_model import H200_FITTED, T, IndexerShape, KernelConstants, certified_call_time, dense_call_time
from compiler.plan.choice import choose_layer
from compiler.plan.schema import CandidateMeasurement
from compiler.topk_settings import TopkSettings

RESULTS = Path(__file__).resolve().parent / "results"
CERTIFIED_FIELDS = ("dense_macs_per_s", "screen_macs_per_s", "refine_macs_per_s", "select_keys_per_s",
                    "plan_s_per_query", "certified_fixed_s")
"""The parameters a certified call's time depends on, in the order of the fit's columns."""
_OFF = 1e300
"""A rate that makes its stage free (the model takes positive finite rates only)."""


def _unit(field: str) -> KernelConstants:
    """Constants with only ``field`` switched on (rate 1 or 1 second), every other stage free."""
    values = dict(dense_macs_per_s=_OFF, screen_macs_per_s=_OFF, refine_macs_per_s=_OFF,
                  select_keys_per_s=_OFF, plan_s_per_query=0.0, dense_fixed_s=0.0, certified_fixed_s=0.0)
    values[field] = 1.0
    return dataclasses.replace(H200_FITTED, **values)


def certified_coefficients(S: int, T_keys: int, r: int, m: float, redo: float, heads: int, head_dim: int,
                           topk: int) -> np.ndarray:
    """Seconds per unit of each CERTIFIED_FIELDS parameter (seconds per 1/rate for rates) of one
    certified call of S queries at the end of T_keys keys."""
    shape = IndexerShape(heads=heads, head_dim=head_dim, topk=topk, queries=S)
    return np.array([float(certified_call_time(r, m, shape, _unit(f), redo=redo).subs(T, T_keys))
                     for f in CERTIFIED_FIELDS])


def dense_rates(roofline: dict) -> tuple[float, float]:
    """(dense MACs/s, selection keys/s): medians over the roofline's dense rows of the scorer's MACs
    per scorer second, and of the keys per second of the rest of the op (the op's time minus the
    scorer's)."""
    macs, keys = [], []
    for row in roofline["rows"]:
        if row["method"] != "dense":
            continue
        shape = IndexerShape(heads=row["H"], head_dim=row["D"], topk=row["topk"], queries=row["S"])
        work = float(dense_call_time(shape, _unit("dense_macs_per_s")).subs(T, row["T"]))
        visited = float(dense_call_time(shape, _unit("select_keys_per_s")).subs(T, row["T"]))
        macs.append(work / (row["score_ms"] / 1e3))
        keys.append(visited / ((row["ms"] - row["score_ms"]) / 1e3))
    return statistics.median(macs), statistics.median(keys)


def certified_points(zoo: dict) -> list[dict]:
    """Certified calls of the zoo: each plan's calibration candidates and each cell's best fixed r."""
    sizes = zoo["sizes"]
    points = [dict(family=family, S=sizes["cal_S"], T=sizes["cal_T"], r=c["r"], m=c["survival"],
                   redo=c["redo_frac"], ms=c["ms"]) for family, plan in zoo["plans"].items()
              for c in plan["candidates"]]
    points += [dict(family=row["family"], S=row["S"], T=row["T"], r=row["r"], m=1.0 - row["pruned"], redo=0.0,
                    ms=row["ms"]) for row in zoo["rows"] if row["method"] == "best_fixed" and row["pruned"] > 0]
    return points


def fit(roofline: dict, zoo: dict) -> tuple[KernelConstants, dict]:
    """(refitted constants, fit report: relative errors of the certified points)."""
    dense_rate, select_rate = dense_rates(roofline)
    sizes = zoo["sizes"]
    points = certified_points(zoo)
    A = np.array([certified_coefficients(p["S"], p["T"], p["r"], p["m"], p["redo"], sizes["H"], sizes["D"],
                                         sizes["topk"]) for p in points])
    seconds = np.array([p["ms"] / 1e3 for p in points])
    known = A[:, 0] / dense_rate + A[:, 3] / select_rate
    free = [1, 2, 4, 5]  # screen, refine (inverse rates), plan per query, fixed
    W = A[:, free] / seconds[:, None]
    target = (seconds - known) / seconds
    scale = np.abs(W).max(0)
    scale[scale == 0] = 1.0
    active = list(range(len(free)))
    while True:  # non-negative least squares by dropping the most negative column
        theta = np.zeros(len(free))
        sol, *_ = np.linalg.lstsq(W[:, active] / scale[active], target, rcond=None)
        theta[active] = sol / scale[active]
        negative = [i for i in active if theta[i] < 0]
        if not negative:
            break
        active.remove(min(negative, key=lambda i: theta[i]))
    predicted = known + A[:, free] @ theta
    rel = predicted / seconds - 1.0
    inverse = lambda x: _OFF if x == 0 else 1.0 / x  # noqa: E731
    constants = dataclasses.replace(
        H200_FITTED, dense_macs_per_s=dense_rate, select_keys_per_s=select_rate,
        screen_macs_per_s=inverse(theta[0]), refine_macs_per_s=inverse(theta[1]), plan_s_per_query=theta[2],
        dense_fixed_s=0.0, certified_fixed_s=theta[3],
        source=(f"benchmarks/fit_cost_model.py: dense and selection rates from dense_roofline_h200.json, the "
                f"rest a relative least-squares fit to {len(points)} certified calls of indexer_zoo_h200.json "
                f"(max relative error {np.abs(rel).max():.2f}, rms {np.sqrt((rel ** 2).mean()):.2f})"))
    report = {"points": len(points), "max_rel_error": float(np.abs(rel).max()),
              "rms_rel_error": float(np.sqrt((rel ** 2).mean())),
              "worst": [dict(points[i], rel_error=round(float(rel[i]), 3)) for i in np.argsort(-np.abs(rel))[:5]]}
    return constants, report


def zoo_plans(zoo: dict, constants: KernelConstants) -> dict:
    """Each zoo family's plan decided offline from its calibration measurements with ``constants``."""
    sizes = zoo["sizes"]
    plans = {}
    for family, plan in zoo["plans"].items():
        candidates = [CandidateMeasurement(r=c["r"], survival=c["survival"], redo_frac=c["redo_frac"], ms=c["ms"],
                                           queries=sizes["cal_S"], certified_queries=sizes["cal_S"],
                                           keys_screened=sizes["cal_S"] * sizes["cal_T"],
                                           survivors=int(c["survival"] * sizes["cal_S"] * sizes["cal_T"]), fallbacks={})
                      for c in plan["candidates"]]
        choice = choose_layer(candidates, plan["dense_ms"], [(1, sizes["cal_S"], sizes["cal_T"])], heads=sizes["H"],
                              head_dim=sizes["D"], topk=sizes["topk"], constants=constants,
                              design_length=sizes["design_length"], queries=sizes["plan_queries"])
        plans[family] = {**choice.settings.op_arguments(), "cells": _measured(zoo, family, choice.settings)}
    return plans


def recorded_settings(plan: dict) -> TopkSettings:
    """The settings of a plan that a zoo run recorded (results files from before the settings
    object spell path "auto" as "certified" and min_keys as "crossover")."""
    path = "auto" if plan["path"] == "certified" else plan["path"]
    return TopkSettings(path, plan["r"], plan.get("min_keys", plan.get("crossover")))


def _measured(zoo: dict, family: str, settings: TopkSettings) -> dict:
    """Per zoo cell "SxT": the measured time / dense of what the plan would run there (1.0 when
    dense), or None when the zoo did not time that budget in that cell (it keeps the plan's own r
    and the best fixed r)."""
    rows = {}
    for row in zoo["rows"]:
        if row["family"] == family:
            rows.setdefault((row["S"], row["T"]), {})[row["method"]] = row
    cells = {}
    for (S, T_keys), m in sorted(rows.items()):
        if settings.path == "dense" or T_keys < settings.min_keys:
            ratio = 1.0
        else:
            timed = [m[k] for k in ("plan_op", "best_fixed") if k in m and m[k].get("r") == settings.r]
            ratio = round(timed[0]["ms"] / m["dense"]["ms"], 3) if timed else None
        cells[f"{S}x{T_keys}"] = ratio
    return cells


def summary(report: dict, plans: dict) -> str:
    """The fit's errors and the zoo's plans under both constants, as markdown."""
    lines = ["# Cost model refit (offline, `benchmarks/fit_cost_model.py`)", "",
             f"{report['points']} certified calls; relative error max {report['max_rel_error']:.2f}, "
             f"rms {report['rms_rel_error']:.2f}. Plans decided offline from each zoo family's calibration "
             "measurements; per cell (S x T) the measured time / dense of what the plan would run there "
             "(1.0: dense; ?: the zoo did not time that budget there), cells in the order "
             f"{', '.join(next(iter(plans['current'].values()))['cells'])}.", "",
             harness.markdown_table(["family", "current plan (r, from keys)", "its cells", "refit plan (r, from keys)",
                                     "its cells"],
                                    [[family, plan_cell(now), ratio_cells(now), plan_cell(plans["refit"][family]),
                                      ratio_cells(plans["refit"][family])] for family, now in plans["current"].items()])]
    return "\n".join(lines) + "\n"


def plan_cell(plan: dict) -> str:
    """A plan's settings as a table cell."""
    return "dense" if plan["path"] == "dense" else f"r={plan['r']}, {plan['min_keys']}"


def ratio_cells(plan: dict) -> str:
    """A plan's measured ratios per zoo cell as a table cell ("?": the zoo did not time its budget there)."""
    return ", ".join("?" if v is None else f"{v:.2f}" for v in plan["cells"].values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="constants JSON to write (a .md summary is written beside it)")
    p.add_argument("--roofline", default=str(RESULTS / "dense_roofline_h200.json"))
    p.add_argument("--zoo", default=str(RESULTS / "indexer_zoo_h200.json"))
    args = p.parse_args(argv)
    roofline, zoo = (json.loads(Path(x).read_text()) for x in (args.roofline, args.zoo))
    constants, report = fit(roofline, zoo)
    plans = {"current": zoo_plans(zoo, H200_FITTED), "refit": zoo_plans(zoo, constants)}
    harness.write_results(args.out, constants.to_dict(), summary(report, plans))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

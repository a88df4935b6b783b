"""Confidence intervals of a proportion (successes out of trials)."""
from __future__ import annotations

import math

Z_95 = 1.959963984540054
"""The standard normal quantile of 0.975: two-sided 95%."""


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval (lower, upper) of ``successes / trials``, within [0, 1]; (0, 1)
    for no trials. ValueError unless 0 <= successes <= trials."""
    if not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    if trials == 0:
        return 0.0, 1.0
    p, z2 = successes / trials, z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    return max(0.0, centre - half), min(1.0, centre + half)

"""benchmarks/models/proportions.py: the Wilson score interval."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "models"))
from proportions import wilson_interval  # noqa: E402


@pytest.mark.parametrize("successes, trials, low, high", [
    (0, 10, 0.0, 0.27753), (5, 10, 0.23659, 0.76341), (10, 10, 0.72247, 1.0), (81, 100, 0.72221, 0.87485)])
def test_known_intervals(successes, trials, low, high):
    got = wilson_interval(successes, trials)
    assert got == pytest.approx((low, high), abs=1e-5)


def test_no_trials_and_bad_counts():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)

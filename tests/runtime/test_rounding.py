"""runtime.rounding's step through the FP8 scorer's key scale (SPEC A.10, CPU margin):
``scaled_bound_up`` is a float32 value at least the scaled score on adversarial values."""
import torch

from runtime.rounding import next_up, scaled_bound_up


def test_scaled_bound_up_is_a_float32_above_the_scaled_score_on_adversarial_values():
    g = torch.Generator().manual_seed(0)
    n = 200_000
    s = (torch.randn(n, generator=g) * 2.0 ** torch.randint(-140, 120, (n,), generator=g)).float()
    s[:1000] = 0.0
    a = (torch.rand(n, generator=g) + 0.5) * 2.0 ** torch.randint(-149, 127, (n,), generator=g).float()
    a = a.float().clamp_min(2.0**-149)
    s64 = s.double()
    for bound in (s64, next_up(s64), s64 + s64.abs() * 2.0**-40):
        y = scaled_bound_up(bound, a)
        assert y.dtype == torch.float64 and torch.equal(y.float().double(), y)
        assert bool(((s * a).double() <= y).all())  # fl32(s a) <= Y, overflow to +inf included

"""Constants of the reference stages measured on the CPU."""
from compiler.cost_model import KernelConstants
from compiler.plan.constants import measure_reference_constants


def test_reference_constants_are_measured_as_valid_positive_rates():
    c = measure_reference_constants("cpu", S=4, T=256, H=4, D=8, kk=8, r=2, repeats=1)
    assert KernelConstants.from_dict(c.to_dict()) == c
    assert c.screen_tile == 1 and "measured on cpu" in c.source
    assert c.certified_fixed_s > 0 and c.dense_fixed_s > 0

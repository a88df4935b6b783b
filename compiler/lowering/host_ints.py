"""Integer helpers of the launch code on the host: ``cdiv`` and ``next_power_of_2``, the values of
``triton.cdiv`` and ``triton.next_power_of_2`` in plain Python. Triton's are constexpr functions,
and every host call of one goes through that dispatch (microseconds each), where a certified call
sizes its launches with dozens of them. Kernels keep ``tl.cdiv``."""
from __future__ import annotations

__all__ = ["cdiv", "next_power_of_2"]


def cdiv(a: int, b: int) -> int:
    """The ceiling of a / b for b > 0 (``triton.cdiv``)."""
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n for n >= 1, 0 for n <= 0 (``triton.next_power_of_2``)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0

"""The host integer helpers equal triton's, whose constexpr-function calls they replace."""
import triton

from compiler.lowering.host_ints import cdiv, next_power_of_2


def test_equal_to_triton_on_small_and_large_values():
    values = [*range(-70, 300), 2**31 - 1, 2**31, 2**31 + 1, 2**40 + 3, 2**62 - 5]
    for n in values:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for d in (1, 2, 3, 7, 16, 128, 1000, 2**20 + 1):
            assert cdiv(n, d) == triton.cdiv(n, d), (n, d)

"""Outward rounding inside Triton kernels: the GPU forms of ``runtime.rounding``'s ``next_up`` (float64)
and ``round_up_to_float32``. Each returns a value >= its argument whatever rounding the hardware's
float64-to-float32 conversion uses (nearest, towards zero, or flushing subnormals)."""
import triton
import triton.language as tl

_TINY = tl.constexpr(2.0**-126)


@triton.jit
def next_up_f64(x):
    """The next float64 above a float64 x >= 0 (+0 gives the smallest subnormal; +inf stays)."""
    bits = x.to(tl.int64, bitcast=True)
    return tl.where(x < float("inf"), (bits + 1).to(tl.float64, bitcast=True), x)


@triton.jit
def round_up_f32(x):
    """A float32 >= float64 x: the smallest one wherever the conversion is within one unit in the last
    place; a positive x below the smallest normal float32 gives 2^-126, so that a flushing conversion
    cannot round it down; +-inf and NaN pass through."""
    y = x.to(tl.float32)
    bits = y.to(tl.int32, bitcast=True)
    up = tl.where(y > 0.0, bits + 1, bits - 1)  # y <= 0 below x only where x > 0 is tiny: clamped
    y = tl.where(y.to(tl.float64) < x, up.to(tl.float32, bitcast=True), y)
    return tl.where((x > 0.0) & (x < _TINY), _TINY, y)

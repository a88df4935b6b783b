"""The proven rounding margin of the certified top-K (SPEC A.4; the derivation item by item: SPEC C.8).

``range_is_safe(mass, max_head_norm, max_key_norm)``: a query's preconditions (no step of THE
SCORER or of the float64 bound can overflow). ``margin_coefficients(...)`` gives per query the
slope and offset of ``margin = slope * ||k||_up + offset``, with slope = gamma_{D+H+3}(u32) M_s +
2 gamma_{D+r+4}(u64) M_U + 4 gamma_{n_plan}(u64) M_plan + 2^-300 and offset = 2 (D + H + 4)
2^-149 (1 + W), so that U_num = next_up(fl(U + margin)) >= the float32 score for every key.
``key_norm_up`` never under-estimates ||k||; ``round_up_to_float32`` and ``next_up`` round up. The
margin scales with the absolute masses, never with |U|. ``scaled_bound_up`` carries a bound through
the FP8 scorer's key-scale step (SPEC A.10, CPU margin)."""
from __future__ import annotations

import torch

__all__ = [
    "U32",
    "U64",
    "SAFE_RANGE",
    "gamma",
    "next_up",
    "round_up_to_float32",
    "key_norm_up",
    "scaled_bound_up",
    "margin_constants",
    "margin_coefficients",
    "range_is_safe",
]

U32 = 2.0**-24
U64 = 2.0**-53
SAFE_RANGE = 2.0**126  # bound on every |score| and |partial| the scorer may form
_SUBNORMAL32 = 2.0**-149
_UNDERFLOW64 = 2.0**-300


def gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u); raises ValueError when n u >= 1/2 (bound unusable)."""
    if n < 0:
        raise ValueError(f"n: expected a non-negative count, got {n}")
    if n * u >= 0.5:
        raise ValueError(f"n: n*u = {n * u} is too large for a forward-error bound")
    return n * u / (1.0 - n * u)


def next_up(x: torch.Tensor) -> torch.Tensor:
    """The next representable value above x (same dtype); +inf stays +inf."""
    return torch.nextafter(x, torch.full_like(x, float("inf")))


def round_up_to_float32(x: torch.Tensor) -> torch.Tensor:
    """The smallest float32 >= x for a float64 tensor x (values beyond float32 become +inf)."""
    y = x.to(torch.float32)
    return torch.where(y.to(torch.float64) < x, next_up(y), y)


def key_norm_up(k: torch.Tensor) -> torch.Tensor:
    """An upper bound of the Euclidean norm of float32 keys [..., D] -> float64 [...]."""
    D = k.shape[-1]
    k64 = k.to(torch.float64)
    norm = torch.sqrt((k64 * k64).sum(-1))
    return next_up(norm * (1.0 + 2.0 * gamma(D + 2, U64)))


def scaled_bound_up(bound: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Y = round_up_to_float32(next_up(bound * scale)) as float64 (SPEC A.10): a float32 value at least
    fl32(s^ * scale) for every float32 s^ <= ``bound`` (float64) when ``scale`` (float32, broadcast)
    is finite and positive."""
    return round_up_to_float32(next_up(bound * scale.to(torch.float64))).to(torch.float64)


def margin_coefficients(
    mass_scores: torch.Tensor,
    weight_sum: torch.Tensor,
    mass_bound: torch.Tensor,
    mass_plan: torch.Tensor,
    *,
    D: int,
    H: int,
    r: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(slope, offset) float64 per query: margin = slope * ||k||_up + offset (module docstring).

    mass_scores = M_s, weight_sum = W, mass_bound = M_U, mass_plan = M_s + B_P + E (float64).
    """
    c_s, c_u, c_plan, floor, c_w = margin_constants(D, H, r)
    slope = c_s * mass_scores + c_u * mass_bound + c_plan * mass_plan + floor
    offset = c_w * (1.0 + weight_sum)
    return slope, offset


def margin_constants(D: int, H: int, r: int) -> tuple[float, float, float, float, float]:
    """The float64 constants (c_s, c_u, c_plan, floor, c_w) of ``margin_coefficients``: slope =
    ((c_s M_s + c_u M_U) + c_plan M_plan) + floor and offset = c_w (1 + W), in that order of
    operations (a kernel that evaluates them so gets the same values bitwise)."""
    n_plan = H * D + H * H + D + 8
    return (gamma(D + H + 3, U32), 2.0 * gamma(D + r + 4, U64), 4.0 * gamma(n_plan, U64), _UNDERFLOW64,
            2.0 * (D + H + 4) * _SUBNORMAL32)


def range_is_safe(
    mass_scores: torch.Tensor,
    max_head_norm: torch.Tensor,
    max_key_norm: torch.Tensor,
) -> torch.Tensor:
    """True where no float32 scorer step before the bias can overflow (float64, bool result)."""
    reach = torch.maximum(mass_scores, max_head_norm) * max_key_norm
    return reach * (1.0 + 2.0**-10) < SAFE_RANGE

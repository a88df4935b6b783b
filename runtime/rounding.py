"""The proven rounding margin of the certified top-K (SPEC A.4).

Notation: u32 = 2^-24 and u64 = 2^-53 are the unit roundoffs of float32 and float64;
gamma_n(u) = n u / (1 - n u) (Higham, "Accuracy and Stability of Numerical Algorithms", 3.1).
Model of every rounded operation: fl(a op b) = (a op b)(1 + delta) + eta with |delta| <= u and
|eta| <= 2^-150 (float32) or 2^-1075 (float64), eta covering subnormal results. A sum of n terms
computed in ANY order (sequential, pairwise, BLAS blocking, with or without FMA) satisfies
|fl(sum) - sum| <= gamma_{n-1} sum |terms| + (absolute underflow terms).
Masses, for one query: M_s = sum_h |w_h| ||q_h||, W = sum_h |w_h|, all computed in float64.

Preconditions (checked per query before the certificate is used, see ``range_is_safe``): inputs
finite and max(M_s, max_h ||q_h||) ||k|| (1 + 2^-10) < 2^126 for every visible key, so that no
step of THE SCORER before the bias and no float64 step overflows. The additive bias is not part
of this check: it enters only through the last float32 add fl32(s^ + b), and rounding to nearest
is monotone even when it overflows to +-inf, so the argument of item 1 below holds for any finite
bias (transformers' eager masks use float32 min, about -3.4e38, for hidden keys).

1. THE SCORER versus the exact score s(k) = sum_h w_h relu(q_h . k) (real arithmetic on the
   float32 inputs). x^_h accumulates D products: |x^_h - x_h| <= gamma_D ||q_h|| ||k|| + alpha,
   alpha <= D 2^-149 (1 + gamma_D) (Cauchy-Schwarz: sum_d |q_hd k_d| <= ||q_h|| ||k||). relu is
   exact and 1-Lipschitz. t^_h = fl(w_h relu(x^_h)) adds one rounding: |t^_h - w_h relu(x_h)| <=
   gamma_{D+1} |w_h| ||q_h|| ||k|| + |w_h| alpha + 2^-150. The H-term sum adds gamma_{H-1} sum|t^_h|.
   With (1 + gamma_a)(1 + gamma_b) <= 1 + gamma_{a+b}:
       |s^ - s| <= gamma_{D+H}(u32) M_s ||k|| + 2 (D + H + 4) 2^-149 (1 + W).
   The additive bias is added in float32 after s^; rounding to nearest is monotone, so
   s^ <= X implies fl32(s^ + b) <= fl32(X + b) <= X_up, where X_up is X + b rounded UP to a
   float32 (``round_up_to_float32``). Pruning X_up < tau therefore proves fl32(s^ + b) < tau.
2. Evaluation of the bound U (float64, ``certificate.evaluate_bound``): r row dots of length D,
   one aux dot, r products, an (r + 2)-term sum: |U^ - U| <= gamma_{D+r+4}(u64) M_U ||k||, with
   M_U = sum_{j in R} |w~_j| ||q_j|| + E + ||aux||.
3. Planning (float64, ``certificate.plan_certificate``): the inequality U >= s is exact algebra
   for the COMPUTED beta^ (any beta^ >= 0 works) with d_h = q_h - beta^ q_j exact; the computed
   d^, u^ = w d^, w~^, a^ / V^ and E^ differ from the exact functions of beta^ by at most
   gamma_3 sum_P w_h (||q_h|| + beta^_h ||q_j*||) (d^, u^), gamma_{H+1} (M_s + B_P) (w~^),
   gamma_{H+2} M_s (a^, V^) and gamma_{HD+H^2+D+4} E^ (E^: its Gram sum is dominated by its
   diagonal, which bounds the cross-term errors), each times ||k||. With B_P = sum_P w_h beta^_h
   ||q_j*h||, all of it is at most 4 gamma_{n_plan}(u64) (M_s + B_P + E) ||k||,
   n_plan = H D + H^2 + D + 8 (the factor 4 also covers the float64 error of the masses).
   Float64 underflow: each rounded operation adds at most 2^-1075 absolutely; propagated
   through at most three later factors below 2^130 each (float32 range) and fewer than 2^60
   operations, the Gram sum of E is off by less than 2^-629 and its square root by less than
   2^-314; every other planning quantity by far less. 2^-300 ||k|| covers all of it.
4. Key norms: ||k||^ = sqrt(sum k_d^2) in float64 is at most gamma_{D+1}(u64) below ||k||;
   ``key_norm_up`` multiplies by 1 + 2 gamma_{D+2}(u64) and steps one float64 up, so it never
   under-estimates.

Total, per query and key:   margin = slope * ||k||_up + offset,
    slope  = gamma_{D+H+3}(u32) M_s + 2 gamma_{D+r+4}(u64) M_U + 4 gamma_{n_plan}(u64) M_plan + 2^-300
    offset = 2 (D + H + 4) 2^-149 (1 + W),          M_plan = M_s + B_P + E.
The float64 evaluation of ``slope`` and of ``margin`` is relatively at most 2^-50 low; the extra
+1 in gamma_{D+H+3} (>= u32 M_s ||k|| more than the D+H needed) absorbs it. Finally
U_num = next_up(fl(U^ + margin)) >= U^ + margin (next_up of a nearest-rounded value is never
below the exact value), hence s^ <= U_num, and the fp32 comparison value is
round_up_to_float32(next_up(fl(U_num + b))).

5. The FP8 scorer (SPEC A.10): E4M3 inputs embed exactly in float32, so items 1-4 hold verbatim
   for s^ = THE SCORER on (q8, w', k8); its score is fl32(s^ a) with the key's scale a > 0
   (finite). Rounding to nearest is monotone and a > 0, so s^ <= U_num gives
   fl32(s^ a) <= Y = round_up_to_float32(next_up(fl64(U_num a))) (Y >= U_num a >= s^ a, and the
   nearest float32 to s^ a is at most the smallest float32 above it): ``scaled_bound_up``. No
   margin term is added for the scale, and Y takes the place of U_num before the bias.

The margin is relative to the absolute masses, never to |U| (exact-slack keys have U = s). At
D = 128, H = 64 its leading term is gamma_195(u32) = 1.2e-5 times M_s ||k||; SPEC A.8 measured
the float32 scorer error at up to 1.6e-7 M_s ||k|| and found that a margin of ~200x that
(3.2e-5) costs at most 0.03 points of pruning.
"""
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
    """Y = round_up_to_float32(next_up(bound * scale)) as float64 (item 5): a float32 value at least
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
    n_plan = H * D + H * H + D + 8
    slope = (
        gamma(D + H + 3, U32) * mass_scores
        + 2.0 * gamma(D + r + 4, U64) * mass_bound
        + 4.0 * gamma(n_plan, U64) * mass_plan
        + _UNDERFLOW64
    )
    offset = 2.0 * (D + H + 4) * _SUBNORMAL32 * (1.0 + weight_sum)
    return slope, offset


def range_is_safe(
    mass_scores: torch.Tensor,
    max_head_norm: torch.Tensor,
    max_key_norm: torch.Tensor,
) -> torch.Tensor:
    """True where no float32 scorer step before the bias can overflow (float64, bool result)."""
    reach = torch.maximum(mass_scores, max_head_norm) * max_key_norm
    return reach * (1.0 + 2.0**-10) < SAFE_RANGE

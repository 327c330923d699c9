"""Scalar math for the elementwise kernels, written with tl.exp and tl.log only.

libdevice calls (erf, tanh, expm1) do not run in Triton's interpreter, and one code path must
serve the CPU tests and the GPU. Each function here is accurate to a few float32 ulps; the
polynomial coefficients were fitted in float64 and checked against scipy on a dense grid
(max abs error 1.6e-7 for erf, relative 2e-7 for tanh and expm1).
"""

import triton
import triton.language as tl


@triton.jit
def sigmoid(x):
    # 1 / (1 + e^-x): for x -> -inf, e^-x overflows to inf and the result is exactly 0.
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def expm1(x):
    """e^x - 1 without the cancellation of tl.exp(x) - 1 near 0 (Taylor to x^9 below 0.5)."""
    t = tl.minimum(tl.maximum(x, -0.5), 0.5)
    p = 2.7557319223985893e-06
    p = p * t + 2.48015873015873e-05
    p = p * t + 0.0001984126984126984
    p = p * t + 0.001388888888888889
    p = p * t + 0.008333333333333333
    p = p * t + 0.041666666666666664
    p = p * t + 0.16666666666666666
    p = p * t + 0.5
    p = p * t + 1.0
    small = t * p
    return tl.where(tl.abs(x) < 0.5, small, tl.exp(x) - 1.0)


@triton.jit
def tanh(x):
    """Odd polynomial below 0.55 (no cancellation), (1 - e^-2|x|) / (1 + e^-2|x|) above."""
    a = tl.abs(x)
    s = tl.minimum(a, 0.55)
    s = s * s
    p = -0.006332100369036198
    p = p * s + 0.02110716514289379
    p = p * s + -0.053859058767557144
    p = p * s + 0.1333262026309967
    p = p * s + -0.33333316445350647
    p = p * s + 1.0
    e = tl.exp(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)
    r = tl.where(a < 0.55, tl.minimum(a, 0.55) * p, big)
    return tl.where(x < 0, -r, r)


@triton.jit
def _erf_small(z):
    """erf(z) for 0 <= z <= 1: z * P(z^2)."""
    s = z * z
    p = 8.00684210844338e-05
    p = p * s + -0.0008053741184994578
    p = p * s + 0.005192956887185574
    p = p * s + -0.026856068521738052
    p = p * s + 0.11283634603023529
    p = p * s + -0.3761262893676758
    p = p * s + 1.128379225730896
    return z * p


@triton.jit
def _erfc_large(z):
    """erfc(z) for 1 <= z <= 4: exp(Q(z - 2.5)), Q fitted to log(erfc)."""
    u = tl.minimum(tl.maximum(z, 1.0), 4.0) - 2.5
    q = 1.6263990119114169e-06
    q = q * u + -1.329059432464419e-05
    q = q * u + 7.734444079687819e-05
    q = q * u + -0.00042021024273708463
    q = q * u + 0.00216522254049778
    q = q * u + -0.010858452878892422
    q = q * u + -0.9438936710357666
    q = q * u + -5.352680683135986
    q = q * u + -7.806815147399902
    return tl.exp(q)


@triton.jit
def erf(x):
    z = tl.abs(x)
    small = _erf_small(tl.minimum(z, 1.0))
    # Above 4, 1 - erf(z) < 1.6e-8 rounds to 1 in float32.
    large = tl.where(z < 4.0, 1.0 - _erfc_large(z), 1.0)
    r = tl.where(z < 1.0, small, large)
    return tl.where(x < 0, -r, r)


@triton.jit
def normal_cdf(x):
    """Phi(x) = (1 + erf(x / sqrt 2)) / 2, computed from erfc in the lower tail so that
    Phi(-5) keeps its relative accuracy instead of being 1 - 0.99999..."""
    z = tl.abs(x) * 0.7071067811865476
    small = 0.5 * _erf_small(tl.minimum(z, 1.0))  # Phi(|x|) - 1/2 for z < 1
    tail = tl.where(z < 4.0, 0.5 * _erfc_large(z), 0.0)  # Phi(-|x|) for z >= 1
    upper = tl.where(z < 1.0, 0.5 + small, 1.0 - tail)  # Phi(|x|)
    lower = tl.where(z < 1.0, 0.5 - small, tail)  # Phi(-|x|)
    return tl.where(x < 0, lower, upper)


@triton.jit
def normal_pdf(x):
    return 0.3989422804014327 * tl.exp(-0.5 * x * x)

#!/usr/bin/python3
"""Fits the 2^f polynomial of Exp2NonPositive (src/simd/flash_attention-inl.h).

p(f) = 1 + f·(c1 + c2·f + ... + c6·f^5) on f in [-1/2, 1/2], minimising the
maximum relative error against 2^f (Lawson's iteratively reweighted least
squares, which converges to the minimax fit). The constant term is pinned to
1 so that 2^0 is exactly 1. Prints the coefficients as float literals, the
relative error in exact arithmetic, and the error of a float32 Horner
evaluation (in ulps of 2^-24) -- numpy evaluates without FMA, so the kernel,
which uses FMA, is at least as accurate.

Run: /usr/bin/python3 bench/fit_exp2.py
"""
import numpy as np

DEGREE = 6
x = np.cos(np.linspace(0, np.pi, 4001)) * 0.5  # Chebyshev nodes on [-1/2, 1/2]
y = 2.0 ** x
A = np.stack([x ** k for k in range(1, DEGREE + 1)], 1) / y[:, None]
b = (y - 1) / y
w = np.ones_like(x)
for _ in range(200):
    c, *_ = np.linalg.lstsq(A * w[:, None], b * w, rcond=None)
    err = np.abs(A @ c - b)
    w = w * (err + 1e-30) ** 0.5
    w /= w.max()
print("relative error (exact arithmetic): %.3g" % np.abs(A @ c - b).max())

cf = c.astype(np.float32)
xs = np.linspace(-0.5, 0.5, 200001).astype(np.float32)
p = cf[DEGREE - 1]
for k in range(DEGREE - 2, -1, -1):
    p = np.float32(p * xs + cf[k])
p = np.float32(p * xs + np.float32(1))
rel = np.abs(p.astype(np.float64) / 2.0 ** xs.astype(np.float64) - 1)
print("float32 Horner: max relative error %.3g = %.2f ulp(2^-24)" % (rel.max(), rel.max() / 2 ** -24))
for k, v in enumerate(cf, start=1):
    print("c%d = %.9ef" % (k, v))

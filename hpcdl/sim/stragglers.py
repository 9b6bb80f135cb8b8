"""stragglers.py - a synchronous step waits for the slowest of N ranks.

Each rank's compute time per step is taken as normal, T ~ N(mu, sigma^2),
independent across ranks (sigma / mu = cv, the spread `hpcdl sim profile`
measures). The step waits for max(T_1 .. T_N), whose expectation is

    E[max] = mu + sigma * e_N,   e_N = E[max of N standard normals]
           = integral of x * N phi(x) Phi(x)^(N-1) dx        (order statistics)

e_1 = 0, e_2 = 1/sqrt(pi), e_3 = 3/(2 sqrt(pi)); e_N grows like sqrt(2 ln N)
(e_8 = 1.42, e_256 = 2.83, e_1024 = 3.25). No fudge factor: the only input is
the measured spread cv.
"""
import math

import numpy as np

_GRID = np.linspace(-12.0, 12.0, 24001)   # x; phi is < 1e-31 beyond +-12
_PHI = np.exp(-_GRID ** 2 / 2) / math.sqrt(2 * math.pi)
_CDF = 0.5 * (1.0 + np.vectorize(math.erf)(_GRID / math.sqrt(2.0)))


def expected_max_std_normal(n):
    """e_N: the expected maximum of n independent standard normals (0 for n = 1)."""
    if int(n) != n or n < 1:
        raise ValueError("the number of ranks must be a positive integer (got %r)" % (n,))
    if n == 1:
        return 0.0
    density = n * _PHI * _CDF ** (n - 1)          # density of the maximum
    return float(np.trapezoid(_GRID * density, _GRID))


def slowdown(n, cv):
    """E[max of n rank times] / mu = 1 + cv * e_N: how much longer the step's
    compute is than one rank's mean. cv = sigma / mu >= 0."""
    if cv < 0:
        raise ValueError("the compute-time spread (sigma / mean) must be >= 0 (got %r)" % cv)
    return 1.0 + cv * expected_max_std_normal(n)

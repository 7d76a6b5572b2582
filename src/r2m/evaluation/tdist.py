"""Student's t, chi-square and beta distributions for real parameters (pure ``math``).

The statistics of the tables need Student's t at the fractional degrees of freedom of a
Satterthwaite approximation (:mod:`r2m.evaluation.noise`) and chi-square quantiles for the
confidence bounds of a variance. Both reduce to two special functions, written here from their
textbook definitions:

* the regularised incomplete beta function ``I_x(a, b)``, by its continued fraction (evaluated with
  the modified Lentz method; for ``x`` beyond ``(a + 1) / (a + b + 2)`` through
  ``I_x(a, b) = 1 − I_{1−x}(b, a)``, where the fraction converges fast);
* the regularised lower incomplete gamma function ``P(a, x)``, by its power series below
  ``x = a + 1`` and by the continued fraction of ``Q = 1 − P`` above.

Then ``P(|T| > t) = I_{ν/(ν+t²)}(ν/2, 1/2)`` for Student's t with ``ν`` degrees of freedom and
``P(χ²_ν ≤ x) = P(ν/2, x/2)``; quantiles are found by bisection (the functions are monotone).
"""

from __future__ import annotations

import math

_EPS = 1e-15
_TINY = 1e-300
_MAX_TERMS = 10_000


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of ``I_x(a, b)`` (without its prefactor), modified Lentz."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            step = c * d
            h *= step
        if abs(step - 1.0) < _EPS:
            return h
    return h


def betainc(a: float, b: float, x: float, y: float | None = None) -> float:
    """The regularised incomplete beta function ``I_x(a, b)`` for ``a, b > 0`` and ``0 ≤ x ≤ 1``; ``y``:
    ``1 − x`` when the caller has it more precisely than the subtraction would give it."""
    if not (a > 0 and b > 0):
        raise ValueError(f"need a, b > 0, got {a}, {b}")
    y = 1.0 - x if y is None else y
    if x <= 0:
        return 0.0
    if y <= 0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, y) / b


def t_sf2(t: float, df: float) -> float:
    """``P(|T| ≥ |t|)`` for Student's t with ``df > 0`` degrees of freedom (the two-sided p of ``t``);
    ``df`` infinite: the normal's."""
    if not df > 0:
        raise ValueError(f"need df > 0, got {df}")
    if math.isinf(t):
        return 0.0
    if math.isinf(df):
        return math.erfc(abs(t) / math.sqrt(2.0))
    return betainc(df / 2.0, 0.5, df / (df + t * t), t * t / (df + t * t))


def t_cdf(t: float, df: float) -> float:
    """``P(T ≤ t)`` for Student's t with ``df`` degrees of freedom."""
    tail = t_sf2(t, df) / 2.0
    return 1.0 - tail if t > 0 else tail


def t_ppf(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (``0 < q < 1``)."""
    if not 0 < q < 1:
        raise ValueError(f"need 0 < q < 1, got {q}")
    if q == 0.5:
        return 0.0
    upper = q > 0.5
    tail = 2.0 * ((1.0 - q) if upper else q)  # the two-sided tail the quantile leaves beyond |t|
    lo, hi = 0.0, 1.0
    while t_sf2(hi, df) > tail:
        hi *= 2.0
        if hi > 1e12:
            break
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_sf2(mid, df) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    x = (lo + hi) / 2.0
    return x if upper else -x


def t_two_sided(level: float, df: float) -> float:
    """The ``t`` with ``P(|T| ≤ t) = level``: the half-width factor of a central ``level`` interval."""
    if not 0 < level < 1:
        raise ValueError(f"need a level in (0, 1), got {level}")
    return t_ppf(0.5 + level / 2.0, df)


def gammainc(a: float, x: float) -> float:
    """The regularised lower incomplete gamma function ``P(a, x)`` for ``a > 0``, ``x ≥ 0``."""
    if not a > 0:
        raise ValueError(f"need a > 0, got {a}")
    if x <= 0:
        return 0.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:  # series: sum x^n / (a (a+1) … (a+n))
        term = total = 1.0 / a
        ap = a
        for _ in range(_MAX_TERMS):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * _EPS:
                break
        return min(1.0, math.exp(log_front) * total)
    # continued fraction of Q(a, x), modified Lentz
    b = x + 1.0 - a
    c, d = 1.0 / _TINY, 1.0 / b
    h = d
    for i in range(1, _MAX_TERMS):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = b + an / c
        c = c if abs(c) > _TINY else _TINY
        step = c * d
        h *= step
        if abs(step - 1.0) < _EPS:
            break
    return max(0.0, 1.0 - math.exp(log_front) * h)


def chi2_cdf(x: float, df: float) -> float:
    """``P(χ²_df ≤ x)``."""
    return gammainc(df / 2.0, x / 2.0)


def chi2_ppf(q: float, df: float) -> float:
    """The ``q`` quantile of the chi-square distribution with ``df > 0`` degrees of freedom."""
    if not 0 < q < 1 or not df > 0:
        raise ValueError(f"need 0 < q < 1 and df > 0, got {q}, {df}")
    lo, hi = 0.0, max(1.0, df)
    while chi2_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if chi2_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return (lo + hi) / 2.0


def z_two_sided(level: float) -> float:
    """The ``z`` with ``P(|Z| ≤ z) = level`` for a standard normal."""
    return t_two_sided(level, math.inf)


def beta_ppf(q: float, a: float, b: float) -> float:
    """The ``q`` quantile of the Beta(``a``, ``b``) distribution (bisection on :func:`betainc`)."""
    if not 0 < q < 1:
        raise ValueError(f"need 0 < q < 1, got {q}")
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if betainc(a, b, mid) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15:
            break
    return (lo + hi) / 2.0


def binomial_interval(hits: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """The Clopper–Pearson (exact) interval of a proportion ``hits / trials`` at ``level``."""
    if trials < 1 or not 0 <= hits <= trials:
        raise ValueError(f"need 0 ≤ hits ≤ trials and trials ≥ 1, got {hits} of {trials}")
    tail = (1.0 - level) / 2.0
    low = 0.0 if hits == 0 else beta_ppf(tail, hits, trials - hits + 1)
    high = 1.0 if hits == trials else beta_ppf(1.0 - tail, hits + 1, trials - hits)
    return low, high

"""The one model of the noise behind every interval, mark and plan: training seeds and test images.

**The model.** A score is a corpus metric of one trained model (a *run*: one training seed of a
system) on a set of test images. Two things are random: which seed trained the model, and which
images were drawn for the test. For a mean metric (CIDEr-D, ROUGE-L) write system X's run s on image i
as ``y = μ_X + a_i + g_{X,i} + u_{X,s} + e_{X,s,i}``: the image's difficulty ``a_i`` (shared by every
system), the system × image interaction ``g`` (where a system is good), the seed effect ``u``
(variance ``σ²_u``, the same on every image) and the seed × image residual ``e`` (``σ²_e``). A
difference B − A estimated by the means over ``k_A`` and ``k_B`` runs on the same ``n`` images has

    Var = Var(Ā | images) + Var(B̄ | images) + Var(E[B̄ − Ā | images])
        =  S²_A / k_A      +  S²_B / k_B     +  C

with ``S²_X = σ²_u,X + σ²_e,X / n`` the variance of one run's corpus metric over seeds on these images
(estimated by the sample variance of the runs' corpus metrics, ``k_X − 1`` degrees of freedom) and
``C = σ²_g / n`` the variance that comes from the choice of images alone (the image component). This
is the crossed seed × image design of Bouthillier et al. (MLSys 2021, "Accounting for variance in
machine learning benchmarks") and of the subjects × items designs of psycholinguistics (Clark 1973).

**The image component by the bootstrap.** Every run is scored on the same bootstrap draws of the
images (Koehn 2004's paired resampling, extended to all runs of both systems; each draw recomputes
every metric's corpus form from the per-image sufficient statistics, so BLEU and METEOR stay corpus
metrics). Over the draws, two *different* runs covary only through what they share — the images'
difficulty and interaction — while one run's variance holds its own seed × image residual too. So
``C`` is estimated from covariances between distinct runs:

    C = c̄_BB + c̄_AA − 2 c̄_AB

with ``c̄_XX`` the mean covariance between two different runs of X and ``c̄_AB`` the mean covariance
between a run of A and a run of B (times ``n / (n − 1)``, the bootstrap's plug-in bias of a variance),
and truncated at 0. A system with a single run is taken as one fixed model (the most-frequent caption
has no seed; one seed alone shows no seed spread): its ``c̄`` is the run's own variance and it adds no
seed term. With one run on each side the model is the paired bootstrap variance of B − A over images
— the comparison says "these two models on these images", not "these methods". Adding the seed term
and the bootstrap variance of the seed-averaged difference instead would count the residual twice.

**Interval and test.** ``(B̄ − Ā) ± t_ν · √Var``, ``ν`` the Welch–Satterthwaite degrees of freedom of the
three terms (``k_A − 1``, ``k_B − 1`` and ``n − 1``); the two-sided p of the same t, so a difference is
marked exactly when its (Holm-adjusted) interval excludes 0. Seeds are treated as independent draws
of each system (a seed number shared by two variants is not a pair: same-numbered seeds need not be
related, and a pairing would halve the degrees of freedom).

**Planning** (:func:`power`, :func:`mde`, :func:`images_needed`, :func:`seeds_needed`): the terms scale
with the design — ``S²_X = σ²_u,X + σ²_e,X / n`` splits through the bootstrap (a run's variance minus
its covariance with another run of X is ``σ²_e,X / n``), ``C ∝ 1 / n`` — and the power of the t test at
level ``α`` (after a correction: ``α / family``, Holm's first and strictest step) for a true difference Δ
is the share of a parametric simulation (:func:`power_of_terms`) that the test marks: each variance term
estimated as ``v · χ²_df / df``, the Satterthwaite df estimated from those, the difference normal — at
three seeds per system the estimated df is often near 2, and a power computed at the true df would promise
too much.
:meth:`Fit.upper` puts each variance at its one-sided upper confidence bound (chi-square with its
degrees of freedom), so a plan can say what holds if the spreads are as large as the data allow.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from r2m.evaluation import bootstrap as B
from r2m.evaluation import tdist

DEFAULT_POWER = 0.8
MAX_IMAGES = 10**7
MAX_SEEDS = 10_000

SEEDS_AND_IMAGES = ("t over seeds and images (variance components: each system's seed spread plus the "
                    "image component from the bootstrap; Welch-Satterthwaite df)")
IMAGES_ONLY = "one run per system: t over the test images (paired bootstrap variance)"
ONE_SYSTEM = "t over seeds and images (variance components)"


@dataclass(frozen=True)
class Side:
    """One system's part of a fit: its runs' mean, their spread over seeds and the residual inside it."""

    mean: float
    runs: int
    fixed: bool  # one run: a fixed model (no seed term)
    seed_var: float  # S²: the sample variance of the runs' corpus values (0 when fixed)
    resid_var: float  # σ²_e / n: the seed × image residual's share of S² (bootstrap; 0 when fixed)

    def seed_effect(self) -> float:
        """``σ²_u``: the seed effect alone (``S² − σ²_e / n``, at least 0)."""
        return max(0.0, self.seed_var - self.resid_var)


@dataclass(frozen=True)
class Fit:
    """The variance components of one metric's B − A (or of one system's mean, ``a`` None) at ``n``
    images: :mod:`module docs <r2m.evaluation.noise>`."""

    b: Side
    a: Side | None
    image: float  # C: the image component of the difference (or of the mean), at n images
    n: int

    @property
    def delta(self) -> float:
        return self.b.mean - (self.a.mean if self.a is not None else 0.0)

    @property
    def sides(self) -> tuple[Side, ...]:
        return (self.b,) if self.a is None else (self.b, self.a)

    def terms(self, n: int | None = None, runs: int | None = None) -> list[tuple[float, float]]:
        """``(variance, degrees of freedom)`` of each term at ``n`` images and ``runs`` runs per unfixed
        system (default: this fit's own). At its own size the seed term is ``S² / k`` as measured; at
        another it is ``(σ²_u + σ²_e / n') / k'``."""
        own = n is None and runs is None
        n2 = self.n if n is None else n
        out = []
        for s in self.sides:
            if s.fixed:
                continue
            k = s.runs if runs is None else runs
            var = s.seed_var if own else s.seed_effect() + s.resid_var * self.n / n2
            out.append((var / k, k - 1))
        out.append((self.image * self.n / n2, n2 - 1))
        return out

    def variance(self, n: int | None = None, runs: int | None = None) -> float:
        return sum(v for v, _ in self.terms(n, runs))

    def df(self, n: int | None = None, runs: int | None = None) -> float:
        """Welch–Satterthwaite: ``(Σ v)² / Σ (v² / df)`` (all terms 0: ``n − 1``)."""
        terms = self.terms(n, runs)
        total = sum(v for v, _ in terms)
        denom = sum(v * v / d for v, d in terms if v > 0 and d > 0)
        if total <= 0 or denom <= 0:
            return float((self.n if n is None else n) - 1 or 1)
        return max(1.0, total * total / denom)

    def upper(self, confidence: float = 0.8) -> Fit:
        """Each variance at its one-sided ``confidence`` upper bound: ``v · df / χ²_{1−confidence, df}``
        (seed variances with ``k − 1``, the image component with ``n − 1`` degrees of freedom)."""
        def up(v: float, df: int) -> float:
            return v * df / tdist.chi2_ppf(1 - confidence, df) if v > 0 and df > 0 else v

        sides = [replace(s, seed_var=up(s.seed_var, s.runs - 1)) if not s.fixed else s for s in self.sides]
        return replace(self, b=sides[0], a=sides[1] if self.a is not None else None,
                       image=up(self.image, self.n - 1))

    @property
    def method(self) -> str:
        if self.a is None:
            return ONE_SYSTEM
        return IMAGES_ONLY if self.a.fixed and self.b.fixed else SEEDS_AND_IMAGES


@dataclass(frozen=True)
class Estimate:
    """B − A (or one system's mean) with its interval and two-sided p from :class:`Fit`."""

    value: float
    low: float
    high: float
    se: float
    df: float
    p: float
    level: float
    fit: Fit

    @property
    def excludes_zero(self) -> bool:
        return bool(self.low > 0 or self.high < 0)

    @property
    def runs(self) -> tuple[int, ...]:
        return tuple(s.runs for s in self.fit.sides)


# --------------------------------------------------------------------------- fitting
def _cov(draws: np.ndarray, n: int) -> np.ndarray:
    """Covariance over bootstrap draws ``[resamples, runs]`` (rows with a non-finite value left out),
    times ``n / (n − 1)``."""
    ok = np.isfinite(draws).all(axis=1)
    x = draws[ok]
    if len(x) < 2:
        return np.full((draws.shape[1], draws.shape[1]), math.nan)
    c = np.atleast_2d(np.cov(x, rowvar=False, ddof=1))
    return c * (n / (n - 1) if n > 1 else 1.0)


def _within(c: np.ndarray) -> tuple[float, float]:
    """Mean covariance between two different runs (one run: its variance) and the mean residual
    (variance minus that covariance; 0 for one run) of a block of the covariance matrix."""
    k = c.shape[0]
    if k == 1:
        return float(c[0, 0]), 0.0
    off = float((c.sum() - np.trace(c)) / (k * (k - 1)))
    return off, max(0.0, float(np.trace(c)) / k - off)


def fit(runs_b: Sequence[B.PerImage], runs_a: Sequence[B.PerImage] = (), metrics: Sequence[str] | None = None,
        resamples: int = B.DEFAULT_RESAMPLES, seed: int = 0) -> dict[str, Fit]:
    """Per metric the :class:`Fit` of ``mean(B) − mean(A)`` (``runs_a`` empty: of B's mean), every run on
    the same images (aligned to the first run of B by image id). ``metrics`` defaults to those every run
    has. The bootstrap draws (``resamples``, ``seed``) are shared by all runs."""
    runs_b, runs_a = list(runs_b), list(runs_a)
    if not runs_b:
        raise ValueError("need at least one run of system B")
    ids = runs_b[0].ids
    runs = [r.aligned_to(ids) for r in (*runs_b, *runs_a)]
    n = len(ids)
    if n < 2:
        raise ValueError(f"need at least two test images, got {n}")
    if metrics is None:
        have = [set(r.metrics()) for r in runs]
        metrics = [m for m in B.METRICS if all(m in h for h in have)]
    metrics = list(metrics)
    if not metrics:
        return {}
    point = B._corpus_many(runs, np.arange(n)[None, :], metrics)
    draws = B._corpus_chunks(runs, B.resample_chunks(n, resamples, seed), metrics)
    kb, ka = len(runs_b), len(runs_a)
    out = {}
    for m in metrics:
        values = np.array([float(p[m][0]) for p in point])
        cov = _cov(np.stack([d[m] for d in draws], axis=1), n)
        cb, rb = _within(cov[:kb, :kb])
        side_b = Side(float(values[:kb].mean()), kb, kb == 1, float(values[:kb].var(ddof=1)) if kb > 1 else 0.0,
                      rb)
        if not ka:
            out[m] = Fit(side_b, None, max(0.0, cb), n)
            continue
        ca, ra = _within(cov[kb:, kb:])
        cab = float(cov[:kb, kb:].mean())
        side_a = Side(float(values[kb:].mean()), ka, ka == 1, float(values[kb:].var(ddof=1)) if ka > 1 else 0.0,
                      ra)
        out[m] = Fit(side_b, side_a, max(0.0, cb + ca - 2 * cab), n)
    return out


def estimate(f: Fit, level: float = B.DEFAULT_LEVEL) -> Estimate:
    """The interval ``delta ± t_{level, ν} · SE`` and the two-sided p of ``delta / SE`` (``ν``: :meth:`Fit.df`).
    A non-finite component (a metric undefined on these images) gives NaN bounds and p = 1; zero variance
    gives a zero-width interval and p 0 (1 for a zero difference)."""
    var, df, d = f.variance(), f.df(), f.delta
    if not (math.isfinite(var) and math.isfinite(d)):
        return Estimate(d, math.nan, math.nan, math.nan, df, 1.0, level, f)
    # float rounding (the same statistics summed in another order) is no difference and no spread
    tiny = 1e-12 * max([1.0, *(abs(s.mean) for s in f.sides)])
    se = math.sqrt(max(var, 0.0))
    se = 0.0 if se <= tiny else se
    half = tdist.t_two_sided(level, df) * se
    if abs(d) <= tiny:
        p = 1.0
    elif se == 0:
        p = 0.0
    else:
        p = min(1.0, tdist.t_sf2(d / se, df))
    return Estimate(d, d - half, d + half, se, df, p, level, f)


def compare(runs_b: Sequence[B.PerImage], runs_a: Sequence[B.PerImage] = (), metrics: Sequence[str] | None = None,
            resamples: int = B.DEFAULT_RESAMPLES, seed: int = 0, level: float = B.DEFAULT_LEVEL) -> dict[str, Estimate]:
    """:func:`fit` then :func:`estimate`, per metric."""
    return {m: estimate(f, level) for m, f in fit(runs_b, runs_a, metrics, resamples, seed).items()}


# --------------------------------------------------------------------------- power and planning
POWER_DRAWS = 10_000  # draws of the parametric simulation behind every power figure (fixed seeds)
_DF_GRID = np.geomspace(1.0, 1e5, 121)


@functools.lru_cache(maxsize=64)
def _crit_table(alpha: float) -> np.ndarray:
    """The two-sided critical t at level ``alpha`` on :data:`_DF_GRID` (interpolated in log df)."""
    return np.array([tdist.t_ppf(1 - alpha / 2, d) for d in _DF_GRID])


def _crit(alpha: float, df: np.ndarray) -> np.ndarray:
    return np.interp(np.log(np.clip(df, 1.0, _DF_GRID[-1])), np.log(_DF_GRID), _crit_table(alpha))


@functools.lru_cache(maxsize=256)
def _chi2_draws(term: int, df: int) -> np.ndarray:
    """``χ²_df / df`` draws for the ``term``-th variance term (its own fixed stream)."""
    return np.random.default_rng([7, term, df]).chisquare(df, POWER_DRAWS) / df


@functools.lru_cache(maxsize=1)
def _normal_draws() -> np.ndarray:
    return np.random.default_rng([7, 0]).standard_normal(POWER_DRAWS)


def power_of_terms(terms: Sequence[tuple[float, float]], delta: float, alpha: float) -> float:
    """The power of the test these tables run — ``|D| / SE > t_{1−α/2, ν̂}`` with the variance and its
    Welch–Satterthwaite df ``ν̂`` *estimated* — when the true difference is ``delta`` and the variance terms
    ``(variance, df)`` are the truth: a parametric simulation with fixed draws (each term's estimate
    ``v · χ²_df / df``, the difference normal and independent of them). At three seeds the estimated df
    is often near 2, where the critical t is large; a power from the true df alone would promise too much."""
    terms = [(float(v), int(round(d))) for v, d in terms if v > 0]
    total = sum(v for v, _ in terms)
    if total <= 0:
        return 1.0 if delta != 0 else alpha
    est = [v * _chi2_draws(j, d) for j, (v, d) in enumerate(terms)]
    var = np.sum(est, axis=0)
    df = var * var / np.sum([e * e / d for e, (_, d) in zip(est, terms, strict=True)], axis=0)
    diff = abs(delta) + math.sqrt(total) * _normal_draws()
    return float(np.mean(np.abs(diff) > _crit(alpha, df) * np.sqrt(var)))


def fit_power(f: Fit, delta: float, alpha: float, n: int | None = None, runs: int | None = None) -> float:
    """Power for a true difference ``delta`` at ``n`` images and ``runs`` runs per unfixed system, the fit's
    components taken as the truth (:func:`power_of_terms`)."""
    return power_of_terms(f.terms(n, runs), delta, alpha)


def mde(f: Fit, alpha: float, target: float = DEFAULT_POWER, n: int | None = None, runs: int | None = None) -> float:
    """The minimum detectable effect: the smallest ``|Δ|`` detected with probability ``target`` by the test at
    level ``alpha`` (after a correction, e.g. ``0.05 / family``) at these sizes (default: the fit's own)."""
    terms = f.terms(n, runs)
    total = sum(v for v, _ in terms)
    if not math.isfinite(total):
        return math.nan
    if total <= 0:
        return 0.0
    se = math.sqrt(total)
    lo, hi = 0.0, 4 * se
    while power_of_terms(terms, hi, alpha) < target:
        hi *= 2
        if hi > 1e6 * se:
            return math.inf
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if power_of_terms(terms, mid, alpha) < target else (lo, mid)
    return hi


def images_needed(f: Fit, delta: float, alpha: float, target: float = DEFAULT_POWER,
                  runs: int | None = None) -> int | None:
    """The fewest test images (at least 2) with power ≥ ``target`` at ``runs`` runs per system (default:
    the fit's own); None when even :data:`MAX_IMAGES` are not enough (the seed effect's variance alone
    keeps the power below ``target`` at that many runs)."""
    if fit_power(f, delta, alpha, MAX_IMAGES, runs) < target:
        return None
    return _first(lambda n: fit_power(f, delta, alpha, n, runs) >= target, 2, MAX_IMAGES)


def seeds_needed(f: Fit, delta: float, alpha: float, target: float = DEFAULT_POWER,
                 n: int | None = None) -> int | None:
    """The fewest runs (seeds) per system (at least 2) with power ≥ ``target`` on ``n`` images (default: the
    fit's own); None when no system has a seed spread (one run each) or :data:`MAX_SEEDS` are not enough
    (the image component alone keeps the power below ``target``)."""
    if all(s.fixed for s in f.sides):
        return None
    if fit_power(f, delta, alpha, n, MAX_SEEDS) < target:
        return None
    return _first(lambda k: fit_power(f, delta, alpha, n, k) >= target, 2, MAX_SEEDS)


def _first(ok, lo: int, hi: int) -> int:
    """The smallest integer in ``[lo, hi]`` where ``ok`` holds (``ok(hi)`` holds; ``ok`` monotone)."""
    step = lo
    while step < hi and not ok(step):  # doubling first: the answer is usually small
        lo = step + 1
        step = min(hi, step * 2)
    hi = step
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo

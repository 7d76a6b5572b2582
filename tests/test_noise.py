"""The model of the noise (src/r2m/evaluation/noise.py) and its distributions (tdist.py).

The distributions against scipy (a reference implementation, not the code under test). The components
on hand-made runs against their definitions (sample variances and covariances computed here). The
interval's coverage and the planning figures checked by simulation from data with known components
(fixed seeds; every tolerance is three binomial standard errors of the simulated share)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from r2m.evaluation import bootstrap as B
from r2m.evaluation import noise as N
from r2m.evaluation import tdist


# --------------------------------------------------------------------------- distributions
@pytest.mark.parametrize("df", [1, 2, 2.6, 4, 15.3, 200, 1e5])
def test_t_and_chi_square_match_scipy(df) -> None:
    for t in (0.0, 0.3, 1.0, 2.0, 4.3, 12.0):
        assert tdist.t_sf2(t, df) == pytest.approx(2 * stats.t.sf(t, df), rel=1e-8, abs=1e-300)
    for q in (0.01, 0.2, 0.8, 0.975, 0.99375):
        assert tdist.t_ppf(q, df) == pytest.approx(stats.t.ppf(q, df), rel=1e-8)
    for q in (0.05, 0.2, 0.5, 0.95):
        assert tdist.chi2_ppf(q, df) == pytest.approx(stats.chi2.ppf(q, df), rel=1e-8)
    assert tdist.z_two_sided(0.95) == pytest.approx(1.959964, abs=1e-6)


def test_t_closed_form_for_two_degrees_of_freedom() -> None:
    """For df = 2 the two-sided p of t is 1 − t / √(t² + 2) (closed form)."""
    for t in (0.5, 2 * math.sqrt(3), 9.0):
        assert tdist.t_sf2(t, 2) == pytest.approx(1 - t / math.sqrt(t * t + 2), abs=1e-12)


def test_clopper_pearson_matches_scipy() -> None:
    for hits, trials in ((0, 20), (3, 20), (380, 400), (400, 400)):
        lo, hi = tdist.binomial_interval(hits, trials)
        assert lo == pytest.approx(stats.beta.ppf(0.025, hits, trials - hits + 1) if hits else 0.0, abs=1e-9)
        assert hi == pytest.approx(stats.beta.ppf(0.975, hits + 1, trials - hits) if hits < trials else 1.0, abs=1e-9)


# --------------------------------------------------------------------------- the components by hand
def runs(values: np.ndarray) -> list[B.PerImage]:
    """One run per row of ``values`` ``[runs, images]`` (a mean metric: the corpus value is the mean)."""
    ids = tuple(str(i) for i in range(values.shape[1]))
    return [B.PerImage(ids, {"CIDEr": np.asarray(v, dtype=np.float64)}) for v in values]


def test_components_are_sample_variances_and_covariances_of_the_runs() -> None:
    """Two runs each on 30 images. Seed terms: the sample variance of each system's run means. Image component:
    for a mean metric the bootstrap covariance of two runs' means tends to (sample covariance over images) / n,
    so C = mean cov(B_s, B_t) + mean cov(A_s, A_t) − 2 mean cov(A_s, B_t), over n — here with the covariances
    computed directly (40,000 draws: Monte-Carlo error well under the 3 % allowed)."""
    rng = np.random.default_rng(3)
    n = 30
    base, inter = rng.normal(0, 1, n), rng.normal(0, 0.8, n)
    a = np.stack([base + rng.normal(0, 0.3) + rng.normal(0, 0.4, n) for _ in range(2)])
    b = np.stack([base + inter + 0.2 + rng.normal(0, 0.3) + rng.normal(0, 0.4, n) for _ in range(2)])
    got = N.fit(runs(b), runs(a), ["CIDEr"], resamples=40_000)["CIDEr"]
    cov = np.cov(np.vstack([b, a]), ddof=1)  # over images
    expected = (cov[0, 1] + cov[2, 3] - (cov[0, 2] + cov[0, 3] + cov[1, 2] + cov[1, 3]) / 2) / n
    assert expected > 0 and got.image == pytest.approx(expected, rel=0.03)
    assert got.b.seed_var == pytest.approx(np.var(b.mean(axis=1), ddof=1), rel=1e-12)
    assert got.a.seed_var == pytest.approx(np.var(a.mean(axis=1), ddof=1), rel=1e-12)
    assert got.delta == pytest.approx(b.mean() - a.mean(), abs=1e-12)
    # the residual inside a system's seed term: (run variance − covariance of its two runs) / n
    assert got.b.resid_var == pytest.approx(((cov[0, 0] + cov[1, 1]) / 2 - cov[0, 1]) / n, rel=0.03)
    e = N.estimate(got)
    terms = [got.b.seed_var / 2, got.a.seed_var / 2, got.image]
    df = sum(terms) ** 2 / (terms[0] ** 2 / 1 + terms[1] ** 2 / 1 + terms[2] ** 2 / (n - 1))
    assert e.df == pytest.approx(df, rel=1e-9)
    half = stats.t.ppf(0.975, df) * math.sqrt(sum(terms))
    assert (e.low, e.high) == pytest.approx((e.value - half, e.value + half), rel=1e-9)
    assert e.p == pytest.approx(2 * stats.t.sf(abs(e.value) / math.sqrt(sum(terms)), df), rel=1e-6)


def test_one_run_each_is_the_paired_t_over_images() -> None:
    """One run per system: a fixed model each, no seed term; the variance is the paired bootstrap's, which for
    a mean metric tends to sd(differences)² / n: the interval is the paired t interval over the images."""
    rng = np.random.default_rng(4)
    a, b = rng.normal(0.5, 0.3, 20), rng.normal(0.6, 0.3, 20)
    e = N.compare(runs(b[None]), runs(a[None]), ["CIDEr"], resamples=40_000)["CIDEr"]
    d = b - a
    half = stats.t.ppf(0.975, 19) * d.std(ddof=1) / math.sqrt(20)
    assert e.fit.method == N.IMAGES_ONLY and e.df == 19
    assert e.high - e.low == pytest.approx(2 * half, rel=0.03)
    assert e.value == pytest.approx(d.mean(), abs=1e-12)


def test_identical_runs_keep_the_image_interval() -> None:
    """Three identical runs per system: no seed spread (seed terms 0), and since every run covaries with every
    other as with itself, the image component is the paired variance over images, not 0."""
    rng = np.random.default_rng(0)
    a, b = rng.random(30), rng.random(30)
    three = N.compare(runs(np.stack([b] * 3)), runs(np.stack([a] * 3)), ["CIDEr"], resamples=2000)["CIDEr"]
    one = N.compare(runs(b[None]), runs(a[None]), ["CIDEr"], resamples=2000)["CIDEr"]
    assert three.fit.b.seed_var == pytest.approx(0, abs=1e-20) and three.fit.a.seed_var == pytest.approx(0, abs=1e-20)
    assert three.se == pytest.approx(one.se, rel=1e-9) and three.high - three.low > 0.05


def test_the_interval_excludes_zero_exactly_when_p_is_below_the_level() -> None:
    rng = np.random.default_rng(5)
    for k in range(40):
        a = rng.normal(0.5, 0.3, (3, 16)) + rng.normal(0, 0.1, (3, 1))
        b = rng.normal(0.5 + 0.15 * rng.random(), 0.3, (3, 16)) + rng.normal(0, 0.1, (3, 1))
        e = N.compare(runs(b), runs(a), ["CIDEr"], resamples=200, seed=k)["CIDEr"]
        assert e.excludes_zero == (e.p < 0.05), (k, e.low, e.high, e.p)


# --------------------------------------------------------------------------- coverage by simulation
def simulate(n: int, k: int, sd_image: float, sd_inter: float, sd_seed: float, sd_resid: float, delta: float,
             rng: np.random.Generator) -> tuple[list[B.PerImage], list[B.PerImage]]:
    """System X's run s on image i: ``image_i + [X = B] (delta + inter_i) + seed_X,s + resid_X,s,i`` on ``n`` new
    images (a new draw of the test set), ``k`` runs per system."""
    image, inter = rng.normal(0, sd_image, n), rng.normal(0, sd_inter, n)
    a = np.stack([1 + image + rng.normal(0, sd_seed) + rng.normal(0, sd_resid, n) for _ in range(k)])
    b = np.stack([1 + delta + image + inter + rng.normal(0, sd_seed) + rng.normal(0, sd_resid, n) for _ in range(k)])
    return runs(b), runs(a)


@pytest.mark.parametrize(("name", "n", "k", "sd_inter", "sd_seed", "sd_resid", "seed"), [
    ("residual only (a real seed null of the demo)", 16, 3, 0.0, 0.0, 0.45, 1),
    ("seed effect and residual", 16, 3, 0.0, 0.12, 0.45, 2),
    ("interaction and residual, no seed effect", 16, 3, 0.3, 0.0, 0.1, 3),
    ("one run each", 16, 1, 0.1, 0.0, 0.45, 4),
])
def test_the_interval_covers_at_95_percent(name, n, k, sd_inter, sd_seed, sd_resid, seed) -> None:
    """300 draws of new images and new seeds with known components: the 95 % interval covers the true difference
    in 95 % ± 3 binomial SE (91.2–98.8 %) of them — where the seed × image residual is counted once (the old
    quadrature of a t half-width over seeds and a bootstrap half-width over images covered about 99.7 %)."""
    rng = np.random.default_rng(seed)
    draws, covered = 300, 0
    for j in range(draws):
        b, a = simulate(n, k, 0.5, sd_inter, sd_seed, sd_resid, 0.1, rng)
        e = N.compare(b, a, ["CIDEr"], resamples=200, seed=j)["CIDEr"]
        covered += e.low <= 0.1 <= e.high
    se = math.sqrt(0.95 * 0.05 / draws)
    print(f"{name}: covered {covered} of {draws}")
    assert abs(covered / draws - 0.95) <= 3 * se, (name, covered / draws)


# --------------------------------------------------------------------------- planning by simulation
def test_the_planned_size_reaches_80_percent_power_after_the_correction() -> None:
    """Known components (seed sd 0.02, residual 0.45, interaction 0.1; a difference of 0.15; a family of 4, so
    level 0.05 / 4, Holm's first step — Holm rejects at least as often), fitted from a pilot run of 3 seeds on
    16 images with the true components put in: the planned number of images at 3 seeds, simulated 300 times,
    detects the difference in 80 % of them within 3 binomial SE (the integer rounding can only add), and
    clearly fewer images detect it less often."""
    truth = N.Fit(N.Side(0.0, 3, False, 0.02**2 + 0.45**2 / 16, 0.45**2 / 16),
                  N.Side(0.0, 3, False, 0.02**2 + 0.45**2 / 16, 0.45**2 / 16), 0.1**2 / 16, 16)
    alpha, delta = 0.05 / 4, 0.15
    n = N.images_needed(truth, delta, alpha)
    assert n is not None and 20 < n < 5000
    rng = np.random.default_rng(8)

    def rate(size: int, draws: int = 300) -> float:
        hits = 0
        for j in range(draws):
            b, a = simulate(size, 3, 0.5, 0.1, 0.02, 0.45, delta, rng)
            hits += N.compare(b, a, ["CIDEr"], resamples=200, seed=j)["CIDEr"].p <= alpha
        return hits / draws

    at, below = rate(n), rate(max(2, n // 3))
    se = math.sqrt(0.8 * 0.2 / 300)
    print(f"planned {n} images: power {at:.3f}; at {max(2, n // 3)}: {below:.3f}")
    assert 0.8 - 3 * se <= at <= 0.8 + 3 * se + 0.05
    assert below < 0.8 - 3 * se


def test_no_number_of_images_beats_a_seed_effect_the_model_fits() -> None:
    """Seed effect sd 0.2 at 3 seeds per system and a difference of 0.1: Var ≥ 2 · 0.04 / 3 whatever the images, so
    the power stays below 80 % (by scipy's t at the Welch df, 4): images_needed says none, seeds_needed a number,
    and with no seed effect fitted (residual only) the images do it."""
    side = N.Side(0.0, 3, False, 0.2**2 + 0.45**2 / 16, 0.45**2 / 16)
    fit = N.Fit(side, side, 0.0, 16)
    se = math.sqrt(2 * 0.04 / 3)
    crit = stats.t.ppf(1 - 0.025, 4)
    assert stats.t.sf(crit - 0.1 / se, 4) < 0.8  # even with no image noise at all
    assert N.images_needed(fit, 0.1, 0.05) is None
    assert N.seeds_needed(fit, 0.1, 0.05) is not None
    resid_only = N.Fit(N.Side(0.0, 3, False, 0.45**2 / 16, 0.45**2 / 16),
                       N.Side(0.0, 3, False, 0.45**2 / 16, 0.45**2 / 16), 0.0, 16)
    assert N.images_needed(resid_only, 0.1, 0.05) is not None


def test_the_upper_bounds_are_chi_square_bounds() -> None:
    side = N.Side(0.0, 3, False, 0.01, 0.002)
    up = N.Fit(side, side, 0.004, 16).upper(0.8)
    assert up.b.seed_var == pytest.approx(0.01 * 2 / stats.chi2.ppf(0.2, 2), rel=1e-8)
    assert up.image == pytest.approx(0.004 * 15 / stats.chi2.ppf(0.2, 15), rel=1e-8)


def test_power_with_known_variance_is_the_normal_test() -> None:
    """With a variance of many degrees of freedom the test is the z test: power = Φ(Δ/se − z) + Φ(−Δ/se − z)
    (scipy's normal), to the Monte-Carlo error of the simulation's 10,000 draws; and the mde is where it is 0.8."""
    side = N.Side(0.0, 2000, False, 0.0004 * 2000, 0.0)
    fit = N.Fit(side, side, 0.0, 10**5)
    se = math.sqrt(fit.variance())
    z = stats.norm.ppf(1 - 0.0125 / 2)
    for d in (0.5 * se, 2 * se, 3.5 * se):
        expected = stats.norm.cdf(d / se - z) + stats.norm.cdf(-d / se - z)
        assert N.fit_power(fit, d, 0.0125) == pytest.approx(expected, abs=4 * math.sqrt(0.25 / 10_000))
    assert N.mde(fit, 0.0125) == pytest.approx((z + stats.norm.ppf(0.8)) * se, rel=0.02)


# --------------------------------------------------------------------------- the bench's real-seed nulls
def test_the_bench_counts_coverage_marks_and_power_on_a_pool_of_runs() -> None:
    """``r2m bench significance --runs``'s loop on a pool of 12 runs of one configuration (no seed effect): the
    null draws are covered and rarely marked; with B's rows on every image taken from a checkpoint 0.3 better
    (``--plant``, share 1), every draw is marked in the truth's direction and the truth is covered."""
    from r2m.bench import randomization as RB

    rng = np.random.default_rng(12)
    base = rng.normal(0.5, 0.3, 30)
    pool = runs(np.stack([base + rng.normal(0, 0.2, 30) for _ in range(12)]))
    better = [B.PerImage(r.ids, {"CIDEr": r.columns["CIDEr"] + 0.3}) for r in pool]
    seeds, single = RB.seed_null(pool, None, 3, 60, 200, seed=1)
    assert seeds.draws == single.draws == 60
    assert seeds.covered["CIDEr"] >= 54 and seeds.marked["CIDEr"] <= 6  # 95 % / 5 % with room for 60 draws
    planted, _ = RB.seed_null(pool, None, 3, 30, 200, seed=2, plant=better, share=1.0, truth={"CIDEr": 0.3})
    assert planted.marked["CIDEr"] == 30 and planted.covered["CIDEr"] >= 26


def test_the_jackknife_over_runs_widens_the_share_of_draws_that_share_runs() -> None:
    """The real seed nulls' draws share runs: the delete-one-run jackknife of the covered share, checked against a
    hand computation. Pool of 6 runs, each of the 15 pairs drawn once, only the pair (0, 1) not covered: the share
    is 14/15; without run 0 or 1 it is 10/10, without any other run 9/10; their mean 0.9333, the jackknife variance
    5/6 · (2 · (1/15)² + 4 · (1/30)²) = 0.011111, SE 0.10541, the interval 14/15 ± 1.96 · SE, clipped at 1."""
    from itertools import combinations

    from r2m.bench import randomization as RB

    est = {True: N.Estimate(0.0, -1.0, 1.0, 0.5, 10.0, 1.0, 0.95, None),
           False: N.Estimate(2.0, 1.0, 3.0, 0.5, 10.0, 0.001, 0.95, None)}
    tally = RB.Tally(["CIDEr"], pool=6)
    for pair in combinations(range(6), 2):
        tally.add({"CIDEr": est[pair != (0, 1)]}, runs=pair)
    assert tally.covered["CIDEr"] == 14 and tally.marked["CIDEr"] == 1
    lo, hi = tally.jackknife("CIDEr")
    assert lo == pytest.approx(14 / 15 - 1.96 * 0.105409, abs=1e-4) and hi == 1.0
    lo_m, hi_m = tally.jackknife("CIDEr", "marked")
    assert lo_m == 0.0 and hi_m == pytest.approx(1 / 15 + 1.96 * 0.105409, abs=1e-4)
    # independent draws (no pool), or a run in every draw: no jackknife
    assert RB.Tally(["CIDEr"]).jackknife("CIDEr") is None
    every = RB.Tally(["CIDEr"], pool=3)
    for pair in ((0, 1), (0, 2)):
        every.add({"CIDEr": est[True]}, runs=pair)
    assert every.jackknife("CIDEr") is None

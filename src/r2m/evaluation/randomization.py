"""Paired approximate randomization on each metric's corpus form, Holm's correction.

**The test** (Noreen 1989; Yeh, COLING 2000). Under the null hypothesis that systems A and B are
equally good, A's and B's outputs for one image are exchangeable. Each trial swaps the two systems'
per-image statistics on a random half of the images (a fair coin per image), recomputes the
**corpus** form of every metric of both (:func:`r2m.evaluation.bootstrap.corpus_metrics`: BLEU and
METEOR from summed counts, the means of ROUGE-L / CIDEr-D / SPICE), and counts the trials whose
absolute difference exceeds the observed one (``greater``) and those that equal it (``ties``). The p
is the **mid-p** (Lancaster 1961): ties count one half,
``p = (greater + (ties + 1) / 2) / (trials + 1)`` — the observed assignment is one of the trials and
a tie with itself, so p is never 0 and its floor is ``1 / (2 (trials + 1))``; the test is two-sided
by construction (no doubling). When every assignment fits in ``trials`` (``2**images ≤ trials``) all
of them are enumerated and ``p = (greater + ties / 2) / 2**images`` exactly. An observed difference of
exactly 0 gets p = 1 (every assignment reaches it: no evidence at all).

Why the mid-p: on discrete statistics (whether a caption names a concept is 0 or 1 per image, and at
16 images only a few images differ between two systems) the conventional p, ``(count + 1) / (trials
+ 1)`` with ties counted whole, can rarely reach 0.05 and marks far fewer than 5 % of planted nulls;
the mid-p is the mean of the p-values a randomised test would give over its tie-breaking coin, so its
rate of marks is near the nominal one on discrete data, while on continuous metrics (no ties but the
observed assignment's own) it differs from the conventional p by half a trial. :attr:`Test.p_conventional`
keeps the conventional p (``r2m bench significance`` prints both rates). Where only a handful of
images differ (CR≥1 on 16 images) the mid-p's rate stays below 5 % too (docs/guide/statistics.md).

A trial is vectorised: the swapped sums are ``sum_A + S @ (B − A)`` and ``sum_B − S @ (B − A)`` for
a ``[trials, images]`` 0/1 matrix ``S``, in chunks.

**Where it is used.** The tables, the claims and ``r2m compare`` decide their marks with the model of
seeds and images (:mod:`r2m.evaluation.noise`); this test is its independent cross-check on nulls
exchangeable by construction (``r2m bench significance`` prints its rate of marks beside the model's),
and ``r2m bench randomization`` times it. :func:`stratified_randomization` swaps within strata (e.g.
one stratum per seed pair) when several pairs are tested at once.

**Multiplicity** (:func:`holm`): Holm's step-down adjusted p-values, a difference marked when its
adjusted p ≤ ``alpha`` (the families: :mod:`r2m.reports.intervals`).

**Limits**: fewer than :data:`MIN_TRIALS` trials or :func:`min_resamples` resamples give no mark or
interval (:func:`check_count` says why); more than :data:`MAX_TRIALS` trials or
:data:`r2m.evaluation.bootstrap.MAX_RESAMPLES` resamples are refused (work is chunked, so memory is never the
limit; time is).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from r2m.evaluation import bootstrap as B

DEFAULT_TRIALS = 10_000  # sacreBLEU's default for approximate randomization
DEFAULT_ALPHA = 0.05
# below 199 trials the Monte-Carlo standard error of a p near alpha = 0.05, sqrt(alpha (1 - alpha) / trials),
# exceeds a third of alpha (and the smallest p, 1 / (2 (trials + 1)), exceeds alpha / 20)
MIN_TRIALS = 199
MAX_TRIALS = 1_000_000
_CHUNK_CELLS = 1 << 21  # trials × images held at once (16 MiB of float64 swaps)
_EXACT_MAX_BITS = 20


def min_resamples(level: float = B.DEFAULT_LEVEL) -> int:
    """The fewest bootstrap resamples that put at least 5 draws beyond each end of a central
    ``level`` percentile interval (200 at 95 %): fewer, and an end is an order statistic of one or two
    draws (at 1 resample the interval is one point that need not contain the estimate)."""
    return math.ceil(10 / (1 - level) - 1e-9)


def check_count(what: str, value: int, lowest: int, highest: int) -> str | None:
    """Why ``value`` resamples (no interval) or trials (no mark) are too few (None: enough). Raises
    ValueError above ``highest`` (one line)."""
    if value > highest:
        raise ValueError(f"{what} {value:,} is above the limit of {highest:,} (the time grows with it; "
                         f"10,000 trials or 1,000 resamples are the usual counts)")
    if value < lowest:
        return f"{what} {value:,} below the floor of {lowest:,}: no {'mark' if what == 'trials' else 'interval'} printed"
    return None


@dataclass(frozen=True)
class Test:
    """One metric's randomization test of B − A: the observed statistic, its mid-p and what it rests on."""

    delta: float  # observed statistic (mean over strata of corpus B − corpus A)
    p: float  # mid-p: (greater + (ties + 1) / 2) / (trials + 1); exact: (greater + ties / 2) / trials
    count: int  # trials whose |difference| reached |delta| (greater + ties)
    trials: int  # trials run (exact: every assignment, 2**images)
    exact: bool = False
    ties: int = 0  # of ``count``, the trials whose |difference| equals |delta| (to rounding)

    @property
    def greater(self) -> int:
        return self.count - self.ties

    @property
    def p_conventional(self) -> float:
        """The p with ties counted whole: ``(count + 1) / (trials + 1)``; exact: ``count / trials``."""
        if not math.isfinite(self.delta) or abs(self.delta) <= 1e-13:
            return 1.0
        return self.count / self.trials if self.exact else (self.count + 1) / (self.trials + 1)

    @property
    def floor(self) -> float:
        """The smallest p this test can give (the observed assignment and its mirror image tie)."""
        return 1.0 / self.trials if self.exact else 0.5 / (self.trials + 1)


def mid_p(greater: int, ties: int, trials: int, exact: bool, delta: float) -> float:
    """The mid-p of a randomization test: ties with the observed statistic count one half; sampled
    trials add the observed assignment (a tie) to ``trials``. ``delta == 0``: 1."""
    if delta == 0:
        return 1.0
    if exact:
        return (greater + ties / 2) / trials
    return (greater + (ties + 1) / 2) / (trials + 1)


def _masks(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    """``[rows, n]`` fair coins as float64 (unpacked from random bytes)."""
    per = (n + 7) // 8
    raw = np.frombuffer(rng.bytes(rows * per), dtype=np.uint8).reshape(rows, per)
    return np.unpackbits(raw, axis=1, count=n).astype(np.float64)


def _swapped(masks: np.ndarray, diff: np.ndarray) -> np.ndarray:
    """``masks @ diff`` on one BLAS thread (:func:`r2m.evaluation.bootstrap.one_blas_thread`)."""
    with B.one_blas_thread(len(masks)):
        return masks @ diff


def _all_masks(n: int) -> np.ndarray:
    codes = np.arange(2**n, dtype=np.int64)
    return ((codes[:, None] >> np.arange(n)) & 1).astype(np.float64)


def _check_pairs(pairs: Sequence[tuple[B.PerImage, B.PerImage]]) -> list[tuple[B.PerImage, B.PerImage]]:
    if not pairs:
        raise ValueError("need at least one pair of systems")
    out = []
    for a, b in pairs:
        if a.n == 0:
            raise ValueError("a system with no scored image cannot be compared")
        out.append((a, b.aligned_to(a.ids)))
    return out


def common_metrics(pairs: Sequence[tuple[B.PerImage, B.PerImage]]) -> list[str]:
    """The metrics every system of every pair has, in table order."""
    have = [set(s.metrics()) for pair in pairs for s in pair]
    return [m for m in B.METRICS if all(m in h for h in have)]


def stratified_randomization(pairs: Sequence[tuple[B.PerImage, B.PerImage]], trials: int = DEFAULT_TRIALS,
                             seed: int = 0, metrics: Sequence[str] | None = None) -> dict[str, Test]:
    """Approximate randomization of the mean over strata (seed pairs) of ``corpus(B_s) − corpus(A_s)``,
    swapping each stratum's two systems per image independently. One pair: the plain paired test."""
    if trials < 1:
        raise ValueError(f"need at least one trial, got {trials}")
    if trials > MAX_TRIALS:
        raise ValueError(f"{trials:,} trials is above the limit of {MAX_TRIALS:,}")
    pairs = _check_pairs(pairs)
    metrics = list(common_metrics(pairs) if metrics is None else metrics)
    strata = []  # per stratum: [(part of A, part of B, D = B − A columns, sum A, sum B)]
    for a, b in pairs:
        pa, pb = B._parts(a, metrics), B._parts(b, metrics)
        strata.append([(x, y.columns - x.columns, x.columns.sum(0), y.columns.sum(0))
                       for x, y in zip(pa, pb, strict=True)])
    sizes = [a.n for a, _ in pairs]
    total = sum(sizes)
    offsets = np.cumsum([0, *sizes])

    def stat(masks: np.ndarray | None) -> dict[str, np.ndarray]:
        acc: dict[str, np.ndarray] = {}
        for s, parts in enumerate(strata):
            for part, diff, sa, sb in parts:
                if masks is None:
                    moved = np.zeros((1, diff.shape[1]))
                else:
                    moved = _swapped(masks[:, offsets[s]:offsets[s + 1]], diff)
                got_a, got_b = part.finish(sa + moved), part.finish(sb - moved)
                for m in got_a:
                    acc[m] = acc.get(m, 0.0) + (got_b[m] - got_a[m])
        return {m: v / len(strata) for m, v in acc.items()}

    observed = {m: float(v[0]) for m, v in stat(None).items()}
    exact = total <= _EXACT_MAX_BITS and 2**total <= trials
    counts = dict.fromkeys(metrics, 0)
    ties = dict.fromkeys(metrics, 0)

    def tally(masks: np.ndarray) -> None:
        for m, v in stat(masks).items():
            obs = abs(observed[m])
            tol = 1e-9 * obs + 1e-13  # a swap that gives the observed |difference| up to float rounding ties
            with np.errstate(invalid="ignore"):
                av = np.abs(v)
                counts[m] += int(np.count_nonzero(av >= obs - tol))
                ties[m] += int(np.count_nonzero((av >= obs - tol) & (av <= obs + tol)))

    if exact:
        tally(_all_masks(total))
        runs = 2**total
    else:
        rng = np.random.default_rng(seed)
        step = max(1, _CHUNK_CELLS // total)
        for start in range(0, trials, step):
            tally(_masks(rng, min(step, trials - start), total))
        runs = trials
    out = {}
    for m in metrics:
        obs = observed[m]
        # no difference, or none defined (a metric with no image to average over): no evidence, p = 1
        zero = not math.isfinite(obs) or abs(obs) <= 1e-13
        out[m] = Test(obs, mid_p(counts[m] - ties[m], ties[m], runs, exact, 0.0 if zero else obs),
                      counts[m], runs, exact, ties[m])
    return out


def randomization_test(a: B.PerImage, b: B.PerImage, trials: int = DEFAULT_TRIALS, seed: int = 0,
                       metrics: Sequence[str] | None = None) -> dict[str, Test]:
    """Paired approximate randomization of ``corpus(B) − corpus(A)`` per metric (``b`` aligned to
    ``a``'s images; the two must cover the same images)."""
    return stratified_randomization([(a, b)], trials, seed, metrics)


# --------------------------------------------------------------------------- multiplicity
def holm(pvalues: Mapping[object, float] | Sequence[float]) -> dict[object, float] | list[float]:
    """Holm's step-down adjusted p-values (Holm 1979): sort the ``k`` p-values, the ``i``-th smallest
    (``i`` from 1) becomes ``max_{j ≤ i} min(1, (k − j + 1) · p_(j))``. A hypothesis is rejected at
    family-wise level ``alpha`` when its adjusted p ≤ alpha — the same decisions as comparing the
    ``i``-th smallest with ``alpha / (k − i + 1)`` and stopping at the first that fails. Ties keep
    their input order. A mapping gives a mapping (same keys), a sequence a list."""
    keys = list(pvalues) if isinstance(pvalues, Mapping) else list(range(len(pvalues)))
    vals = [float(pvalues[k]) for k in keys]
    if any(not (0 <= v <= 1) for v in vals):
        raise ValueError(f"p-values must lie in [0, 1], got {vals}")
    order = sorted(range(len(vals)), key=lambda i: vals[i])
    adjusted = [0.0] * len(vals)
    running, k = 0.0, len(vals)
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (k - rank) * vals[i]))
        adjusted[i] = running
    if isinstance(pvalues, Mapping):
        return dict(zip(keys, adjusted, strict=True))
    return adjusted


def p_text(p: float, floor: float) -> str:
    """``p=0.034``, or ``p≤0.0001`` when p is at the floor its trials allow (never a bound below the
    floor). ``floor``: the smallest p the test could give, times the Holm factor where adjusted."""
    if p != p:
        return "p=n/a"
    if p <= floor * (1 + 1e-9):
        return f"p≤{_g(floor)}"
    return f"p={_g(p)}"


def _g(x: float) -> str:
    return f"{x:.2g}" if x < 0.01 else f"{x:.3f}".rstrip("0").rstrip(".") if x < 1 else "1"

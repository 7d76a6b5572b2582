"""Bootstrap intervals over test images, the paired bootstrap of a difference, the t interval over seeds.

Pure functions on numpy arrays. The input is a :class:`PerImage`: one row per test image of the
sufficient statistics :func:`r2m.evaluation.coco.evaluate_stats` returns (and the ``evaluate`` stage
keeps in ``per_image.parquet``), from which :func:`corpus_metrics` recomputes the **corpus** form of
every metric for any multiset of images, as coco-caption computes it on the whole set:

* **BLEU-1..4**: clipped n-gram matches, candidate n-grams, candidate length and the closest
  reference length (coco-caption's brevity rule) summed over the images, then the geometric mean of
  the precisions and the brevity penalty, with pycocoevalcap's ``tiny``/``small`` constants;
* **METEOR** (1.5, ``-l en -norm``): the 23 segment statistics summed as the jar's ``EVAL`` sums them
  (a segment matching its reference in one chunk with every word matched adds no chunks), then the
  jar's own scoring (module weights, delta, F-mean, fragmentation penalty): not a mean of segment
  scores;
* **ROUGE-L, CIDEr-D, SPICE**: the mean of the per-image scores, as coco-caption reports them.
  CIDEr-D's per-image scores use the document frequencies of the **full** test reference set: the
  df is held fixed under resampling (recomputing it per resample would change what each image
  scores);
* **concept recall** (``concept_recall``, ``concept_any``): the share of an image's input concepts
  its caption names, and whether it names ≥ 1, averaged over the images with ≥ 1 concept.

The identity resample (every image once) gives back what ``r2m evaluate`` reports (integer sums are
exact; float means differ only in summation order, < 1e-12).

Intervals are **percentile** bootstrap intervals (not BCa): images are drawn with replacement,
``resamples`` times (default 1,000) from a seeded generator; the interval is the central ``level``
share of the resampled corpus metrics. It describes the variation over test images for one fixed
trained model; training seeds are the other half (:mod:`r2m.evaluation.noise` puts the two together). The paired bootstrap (Koehn,
EMNLP 2004) draws the image ids once per resample and recomputes both systems' corpus metrics on
the same draw; B − A is significant when its interval excludes 0 (``p``: twice the smaller share of
resampled differences at or beyond 0 on either side, the sign count Koehn reads).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from r2m.evaluation import tdist
from r2m.evaluation.stats import BLEU_STATS, METEOR_STATS

DEFAULT_RESAMPLES = 1000
DEFAULT_LEVEL = 0.95
_CHUNK_CELLS = 1 << 22  # resamples × images held at once (32 MiB of float64 counts)

BLEU_COLUMNS = BLEU_STATS  # the scorers' names for their per-image statistics
METEOR_COLUMNS = METEOR_STATS
MEAN_METRICS = ("ROUGE_L", "CIDEr", "SPICE")
CONCEPT_COLUMNS = ("concept_given", "concept_named")
METRICS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE",
           "concept_recall", "concept_any")

# METEOR 1.5's parameters for ``-l en`` (task "default"): alpha, beta, gamma, delta and the weights
# of its four modules (exact, stem, synonym, paraphrase)
METEOR_PARAMS = (0.85, 0.2, 0.6, 0.75)
METEOR_WEIGHTS = (1.0, 0.6, 0.8, 0.6)
_BLEU_SMALL, _BLEU_TINY = 1e-9, 1e-15  # pycocoevalcap's guards against 0/0


@dataclass(frozen=True)
class PerImage:
    """Per-image sufficient statistics of one system: ``ids`` (image ids, in row order) and
    ``columns`` (name → float array, one value per image; names: :data:`BLEU_COLUMNS`,
    :data:`METEOR_COLUMNS`, :data:`MEAN_METRICS`, :data:`CONCEPT_COLUMNS`; absent = not scored)."""

    ids: tuple[str, ...]
    columns: Mapping[str, np.ndarray]

    def __post_init__(self) -> None:
        n = len(self.ids)
        for name, col in self.columns.items():
            if np.shape(col) != (n,):
                raise ValueError(f"column {name!r} has shape {np.shape(col)}; expected ({n},)")

    @property
    def n(self) -> int:
        return len(self.ids)

    def metrics(self) -> list[str]:
        """The metrics these columns give, in table order (a mean metric whose values are all
        missing, e.g. SPICE without its jars, is not one)."""
        have = set(self.columns)
        out = []
        for m in METRICS:
            if m.startswith("Bleu_"):
                ok = have.issuperset(BLEU_COLUMNS)
            elif m == "METEOR":
                ok = have.issuperset(METEOR_COLUMNS)
            elif m in MEAN_METRICS:
                ok = m in have and not np.isnan(self.columns[m]).all()
            else:
                ok = have.issuperset(CONCEPT_COLUMNS) and bool((self.columns["concept_given"] > 0).any())
            if ok:
                out.append(m)
        return out

    def take(self, rows: Sequence[int] | np.ndarray) -> PerImage:
        rows = np.asarray(rows, dtype=np.int64)
        return PerImage(tuple(self.ids[r] for r in rows), {k: np.asarray(v)[rows] for k, v in self.columns.items()})

    def aligned_to(self, ids: Sequence[str]) -> PerImage:
        """These rows in the order of ``ids`` (which must be the same set of images)."""
        if tuple(ids) == self.ids:
            return self
        where = {i: r for r, i in enumerate(self.ids)}
        if len(where) != len(ids) or set(where) != set(ids):
            raise ValueError("the two systems were scored on different images")
        return self.take([where[i] for i in ids])


@dataclass(frozen=True)
class Interval:
    """A value and its interval ``[low, high]`` at ``level``."""

    value: float
    low: float
    high: float
    level: float = DEFAULT_LEVEL


@dataclass(frozen=True)
class Difference:
    """B − A on the same images: the two values, the difference and its paired interval."""

    a: float
    b: float
    delta: float
    low: float
    high: float
    level: float = DEFAULT_LEVEL
    p: float = 1.0  # two-sided: twice the smaller share of resampled differences on either side of 0 (≤ 1)

    @property
    def significant(self) -> bool:
        """The interval excludes 0."""
        return bool(self.low > 0 or self.high < 0)


# --------------------------------------------------------------------------- corpus forms
def bleu_from_sums(s: np.ndarray) -> np.ndarray:
    """BLEU-1..4 ``[..., 4]`` from summed :data:`BLEU_COLUMNS` ``[..., 10]`` (pycocoevalcap's
    ``BleuScorer.compute_score``: running product of the precisions, brevity penalty when the
    candidates are shorter than the closest references)."""
    testlen, reflen, guess, correct = s[..., 0], s[..., 1], s[..., 2:6], s[..., 6:10]
    out = np.empty(s.shape[:-1] + (4,), dtype=np.float64)
    prod = np.ones(s.shape[:-1], dtype=np.float64)
    for k in range(4):
        prod = prod * ((correct[..., k] + _BLEU_TINY) / (guess[..., k] + _BLEU_SMALL))
        out[..., k] = prod ** (1.0 / (k + 1))
    ratio = (testlen + _BLEU_TINY) / (reflen + _BLEU_SMALL)
    short = ratio < 1
    with np.errstate(divide="ignore", over="ignore"):
        penalty = np.where(short, np.exp(1 - 1 / np.where(short, ratio, 1.0)), 1.0)
    return out * penalty[..., None]


def meteor_perfect(stats: np.ndarray) -> np.ndarray:
    """Segments that match their reference word for word in one chunk (METEOR's ``addStats`` adds
    no chunks for these)."""
    m = stats[..., 4:20].reshape(stats.shape[:-1] + (4, 4))  # module × (test content, ref content, test fn, ref fn)
    test_total = m[..., 0].sum(-1) + m[..., 2].sum(-1)
    ref_total = m[..., 1].sum(-1) + m[..., 3].sum(-1)
    return (test_total == stats[..., 0]) & (ref_total == stats[..., 1]) & (stats[..., 20] == 1)


def meteor_from_sums(s: np.ndarray) -> np.ndarray:
    """METEOR from summed :data:`METEOR_COLUMNS` ``[..., 23]`` (chunks of perfect segments already
    left out, :func:`meteor_perfect`), computed as METEOR 1.5's ``MeteorScorer.computeMetrics``."""
    alpha, beta, gamma, delta = METEOR_PARAMS
    tl, rl, tf, rf = s[..., 0], s[..., 1], s[..., 2], s[..., 3]
    m = s[..., 4:20].reshape(s.shape[:-1] + (4, 4))
    chunks, tw, rw = s[..., 20], s[..., 21], s[..., 22]
    t_len = delta * (tl - tf) + (1.0 - delta) * tf
    r_len = delta * (rl - rf) + (1.0 - delta) * rf
    t_match = np.zeros(s.shape[:-1])
    r_match = np.zeros(s.shape[:-1])
    for i, w in enumerate(METEOR_WEIGHTS):  # the jar's order: content over modules, then function
        t_match = t_match + m[..., i, 0] * w * delta
    for i, w in enumerate(METEOR_WEIGHTS):
        r_match = r_match + m[..., i, 1] * w * delta
    for i, w in enumerate(METEOR_WEIGHTS):
        t_match = t_match + m[..., i, 2] * w * (1.0 - delta)
    for i, w in enumerate(METEOR_WEIGHTS):
        r_match = r_match + m[..., i, 3] * w * (1.0 - delta)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = t_match / t_len
        recall = r_match / r_len
        f_mean = 1.0 / (((1.0 - alpha) / precision) + (alpha / recall))
        frag = np.where(meteor_perfect(s), 0.0, chunks / ((tw + rw) / 2))
        score = f_mean * (1.0 - gamma * frag**beta)
    return np.where(np.isnan(score), 0.0, np.maximum(score, 0.0))


@dataclass(frozen=True)
class _Part:
    """Columns to sum over a resample and how a metric follows from the sums."""

    columns: np.ndarray  # [n, k]
    finish: Callable[[np.ndarray], dict[str, np.ndarray]]


def _parts(stats: PerImage, metrics: Sequence[str]) -> list[_Part]:
    col = {k: np.asarray(v, dtype=np.float64) for k, v in stats.columns.items()}
    n = stats.n
    parts: list[_Part] = []
    wanted = set(metrics)
    bleu = [m for m in metrics if m.startswith("Bleu_")]
    if bleu:
        def finish_bleu(s: np.ndarray, b: tuple[str, ...] = tuple(bleu)) -> dict[str, np.ndarray]:
            scores = bleu_from_sums(s)
            return {m: scores[..., int(m[-1]) - 1] for m in b}

        parts.append(_Part(np.stack([col[c] for c in BLEU_COLUMNS], axis=1), finish_bleu))
    if "METEOR" in wanted:
        mat = np.stack([col[c] for c in METEOR_COLUMNS], axis=1)
        mat[meteor_perfect(mat), 20] = 0.0  # the EVAL sum leaves their single chunk out
        parts.append(_Part(mat, lambda s: {"METEOR": meteor_from_sums(s)}))
    means = [m for m in metrics if m in MEAN_METRICS]
    if means:
        mat = np.stack([col[m] for m in means] + [np.ones(n)], axis=1)
        parts.append(_Part(mat, lambda s, ms=tuple(means): {m: s[..., k] / s[..., -1] for k, m in enumerate(ms)}))
    concepts = [m for m in metrics if m.startswith("concept_")]
    if concepts:
        given, named = col["concept_given"], col["concept_named"]
        has = given > 0
        share = np.where(has, named / np.where(has, given, 1.0), 0.0)
        mat = np.stack([share, (has & (named > 0)).astype(np.float64), has.astype(np.float64)], axis=1)

        def finish(s: np.ndarray, cs: tuple[str, ...] = tuple(concepts)) -> dict[str, np.ndarray]:
            with np.errstate(divide="ignore", invalid="ignore"):
                got = {"concept_recall": s[..., 0] / s[..., 2], "concept_any": s[..., 1] / s[..., 2]}
            return {m: got[m] for m in cs}

        parts.append(_Part(mat, finish))
    unknown = wanted - set(METRICS)
    if unknown:
        raise ValueError(f"unknown metric(s) {sorted(unknown)}; known: {', '.join(METRICS)}")
    return parts


def one_blas_thread(rows: int = 2) -> contextlib.AbstractContextManager:
    """BLAS on one thread for a product of ``rows`` rows and few columns over many images: on a busy
    2-core machine OpenBLAS's second thread stalls such products 10-100x (each thread waits for the
    other one's share; measured at 123,287 images). For two rows or more one thread gives the same
    sums (checked against the threaded product); a single row (the identity, whose sums the tables
    report) keeps the threaded matrix-vector product, which splits the images and so rounds otherwise.
    Needs ``threadpoolctl`` (it comes with scikit-learn); without it, nothing changes."""
    if rows < 2:
        return contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def draw_counts(idx: np.ndarray, n: int) -> np.ndarray:
    """``[R, n]`` float counts: how often each image is drawn in each row of ``idx`` ``[R, m]``."""
    r = idx.shape[0]
    flat = (np.arange(r, dtype=np.int64)[:, None] * n + idx).ravel()
    return np.bincount(flat, minlength=r * n).reshape(r, n).astype(np.float64)


def _check_idx(idx: np.ndarray | Sequence[int], n: int) -> tuple[np.ndarray, bool]:
    idx = np.asarray(idx, dtype=np.int64)
    single = idx.ndim == 1
    idx = idx[None, :] if single else idx
    if idx.ndim != 2 or idx.shape[1] == 0:
        raise ValueError(f"resample indices must be [resamples, draws] with draws > 0, got shape {idx.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"resample indices must lie in [0, {n})")
    return idx, single


def _corpus_many(systems: Sequence[PerImage], idx: np.ndarray, metrics: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """:func:`corpus_metrics` of several systems on the same draws (one count matrix per chunk)."""
    return _corpus_chunks(systems, [idx], metrics)


def _corpus_chunks(systems: Sequence[PerImage], chunks: Iterable[np.ndarray],
                   metrics: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """:func:`_corpus_many` over the draws of every chunk in turn; the columns are built once."""
    n = systems[0].n
    parts = [_parts(s, metrics) for s in systems]
    flat = [p for sys_parts in parts for p in sys_parts]
    # every column of every system in one matrix: one matrix product per chunk of resamples
    columns = np.concatenate([p.columns for p in flat], axis=1) if flat else np.zeros((n, 0))
    bounds = np.cumsum([0] + [p.columns.shape[1] for p in flat])
    outs: list[dict[str, list[np.ndarray]]] = [{m: [] for m in metrics} for _ in systems]
    step = max(1, _CHUNK_CELLS // max(n, 1))
    for idx in chunks:
        for start in range(0, idx.shape[0], step):
            counts = draw_counts(idx[start:start + step], n)
            with one_blas_thread(len(counts)):
                sums = counts @ columns
            k = 0
            for sys_parts, out in zip(parts, outs, strict=True):
                for part in sys_parts:
                    for m, v in part.finish(sums[:, bounds[k]:bounds[k + 1]]).items():
                        out[m].append(v)
                    k += 1
    return [{m: np.concatenate(v) if v else np.zeros(0) for m, v in out.items()} for out in outs]


def corpus_metrics(stats: PerImage, idx: np.ndarray | Sequence[int] | None = None,
                   metrics: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """The corpus form of each metric on resampled images.

    ``idx``: image rows ``[draws]`` (one multiset; ``None``: every image once, the identity) or
    ``[resamples, draws]`` (a batch). Returns ``{metric: values}``, a 0-d array for one multiset,
    ``[resamples]`` for a batch. ``metrics`` defaults to :meth:`PerImage.metrics`."""
    metrics = list(stats.metrics() if metrics is None else metrics)
    idx_arr, single = _check_idx(np.arange(stats.n) if idx is None else idx, stats.n)
    out = _corpus_many([stats], idx_arr, metrics)[0]
    return {m: (v[0] if single else v) for m, v in out.items()}


MAX_RESAMPLES = 1_000_000  # beyond this the time, not the memory, is the limit (draws are chunked)


def _check_resamples(n: int, resamples: int) -> None:
    if n < 1 or resamples < 1:
        raise ValueError(f"need at least one image and one resample, got {n} and {resamples}")
    if resamples > MAX_RESAMPLES:
        raise ValueError(f"{resamples:,} resamples is above the limit of {MAX_RESAMPLES:,}")


def resample_indices(n: int, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """``[resamples, n]`` image rows drawn with replacement (numpy's PCG64, seeded)."""
    _check_resamples(n, resamples)
    if resamples * n > 8 * _CHUNK_CELLS:
        raise ValueError(f"{resamples:,} resamples of {n:,} images at once is too large; use resample_chunks")
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n), dtype=np.int64)


def resample_chunks(n: int, resamples: int = DEFAULT_RESAMPLES, seed: int = 0):
    """The rows of :func:`resample_indices` (the same draws, in order) in chunks of at most
    ``_CHUNK_CELLS`` cells: memory stays bounded for any number of resamples."""
    _check_resamples(n, resamples)
    rng = np.random.default_rng(seed)
    step = max(1, _CHUNK_CELLS // n)
    for start in range(0, resamples, step):
        yield rng.integers(0, n, size=(min(step, resamples - start), n), dtype=np.int64)


def _draws_many(systems: Sequence[PerImage], resamples: int, seed: int,
                metrics: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """:func:`_corpus_many` over :func:`resample_chunks`."""
    return _corpus_chunks(systems, resample_chunks(systems[0].n, resamples, seed), metrics)


def percentile_interval(values: np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` percentile interval of bootstrap draws (NaN when none is finite)."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    lo, hi = np.nanpercentile(values, [50 * (1 - level), 50 * (1 + level)]) if np.isfinite(values).any() \
        else (math.nan, math.nan)
    return float(lo), float(hi)


def bootstrap_ci(stats: PerImage, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                 level: float = DEFAULT_LEVEL, metrics: Sequence[str] | None = None) -> dict[str, Interval]:
    """Percentile bootstrap interval of each metric over the test images."""
    metrics = list(stats.metrics() if metrics is None else metrics)
    point = corpus_metrics(stats, None, metrics)
    draws = _draws_many([stats], resamples, seed, metrics)[0]
    return {m: Interval(float(point[m]), *percentile_interval(draws[m], level), level) for m in metrics}


def paired_bootstrap(a: PerImage, b: PerImage, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                     level: float = DEFAULT_LEVEL, metrics: Sequence[str] | None = None) -> dict[str, Difference]:
    """B − A with its paired percentile interval: each resample draws the image rows once and
    recomputes both corpus metrics on them. ``b`` is aligned to ``a``'s image order; the two must
    cover the same images. ``metrics`` defaults to those both systems have."""
    b = b.aligned_to(a.ids)
    if metrics is None:
        metrics = [m for m in a.metrics() if m in set(b.metrics())]
    metrics = list(metrics)
    ident = np.arange(a.n)[None, :]
    pa, pb = _corpus_many([a, b], ident, metrics)
    da, db = _draws_many([a, b], resamples, seed, metrics)
    return {m: difference(float(pa[m][0]), float(pb[m][0]), db[m] - da[m], level) for m in metrics}


def difference(a: float, b: float, draws: np.ndarray, level: float = DEFAULT_LEVEL) -> Difference:
    """B − A with the percentile interval of its bootstrap ``draws`` and the two-sided sign-count p
    (twice the smaller share of draws on either side of 0)."""
    lo, hi = percentile_interval(draws, level)
    p = min(1.0, 2 * min(float(np.mean(draws <= 0)), float(np.mean(draws >= 0))))
    return Difference(a, b, b - a, lo, hi, level, p)


# --------------------------------------------------------------------------- seeds: Student's t
def t_interval(values: Sequence[float] | np.ndarray, level: float = DEFAULT_LEVEL) -> Interval:
    """Student-t interval of the mean of ``values`` (e.g. one metric over training seeds when no per-image
    statistics exist): mean ± t_{df=n-1} · s / √n, ``s`` the sample standard deviation."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or len(x) < 2 or not np.isfinite(x).all():
        raise ValueError(f"a t interval needs at least two finite values, got {x.tolist()}")
    mean = float(x.mean())
    half = tdist.t_two_sided(level, len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return Interval(mean, mean - half, mean + half, level)

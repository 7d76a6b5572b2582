"""``r2m bench randomization`` (time of the randomization test) and ``r2m bench significance``
(rates of marks on planted nulls).

Both score seeded synthetic captions with the coco-caption scorers (:func:`r2m.evaluation.bench.synthetic`
references; tokeniser ``none``; SPICE left out) and add synthetic concept counts, so every metric the
tables mark has real per-image statistics.

* ``randomization``: 10,000 trials of :func:`r2m.evaluation.randomization.randomization_test` of two
  systems on 5,000 images × every metric (default sizes), wall and CPU seconds.
* ``significance``: two captioning runs of the same recipe on the same images; a planted null takes
  ``n`` images at random and gives each image's two captions to A and B in a random order, so A and
  B differ by chance alone. Over ``--pairs`` such pairs per ``n`` it prints, per metric, the share
  marked at 5 % by the randomization test and by the paired percentile bootstrap, with the
  Monte-Carlo standard error ``sqrt(0.05 · 0.95 / pairs)``; the randomization test's rate with its
  mid-p (what decides a mark) and with the conventional p (ties counted whole).
* ``significance``, seed level: a pool of ``--pool`` runs of one recipe whose quality differs from run
  to run (each run keeps a reference word with probability ``0.5 + spread · z``, ``z`` standard normal,
  fixed per run): a seed-level planted null draws ``2k`` distinct runs, gives ``k`` to A and ``k`` to B
  at random and pairs them seed by seed on ``n`` images, so A and B differ by seed-to-seed spread and
  image noise alone. Per ``spread`` and ``n`` it prints the share marked by the seed-aware test
  (:func:`r2m.evaluation.randomization.seed_test`) and by its randomization within seeds alone (a test
  that ignores the seed spread).
"""

from __future__ import annotations

import math
import random
import time

import numpy as np

from r2m.evaluation import bootstrap as B
from r2m.evaluation import coco
from r2m.evaluation import randomization as RZ
from r2m.evaluation.bench import (
    MAX_IMAGES,
    WORDS,
    peak_rss_mib,
    reset_peak_rss,
    scoring_options,
    synthetic,
    tiled,
)
from r2m.utils.cliargs import OneLineParser, float_in, int_in, list_of, names_in


def _runs(images: int, refs: int, scorers: list[str], runs: int, seed: int,
          keep: list[float] | None = None) -> list[B.PerImage]:
    """``runs`` caption files of one recipe on the same images, scored image by image, with synthetic
    concept counts. Run ``r`` keeps each word of a reference with probability ``keep[r]`` (default 0.5;
    the rest random words) and names ``floor(given · min(1, 2 · keep[r] · U))`` of an image's ``given``
    concepts (U uniform): a run's ``keep`` is its quality, the same on every image."""
    from r2m.evaluation import coco
    from r2m.evaluation.per_image import from_evaluation

    keep = [0.5] * runs if keep is None else list(keep)
    _, references = synthetic(images, refs, seed=seed)
    rng = random.Random(seed + 1)
    nrng = np.random.default_rng(seed + 2)
    given = nrng.integers(0, 6, size=images).astype(np.float64)
    out = []
    for q in keep:
        results = {}
        for i, rs in references.items():
            words = rng.choice(rs).split()
            results[i] = " ".join(w if rng.random() < q else rng.choice(WORDS) for w in words)
        _, per, stats = coco.evaluate_stats(results, references, scorers, tokenizer="none")
        rows = from_evaluation(list(results), per, stats)
        named = np.floor(given * np.minimum(1.0, 2 * q * nrng.random(images)))
        out.append(B.PerImage(rows.ids, dict(rows.columns, concept_given=given, concept_named=named)))
    return out


def planted_null(r1: B.PerImage, r2: B.PerImage, n: int, pairs: int, trials: int, resamples: int = 0,
                 seed: int = 0, alpha: float = RZ.DEFAULT_ALPHA) -> dict[str, dict[str, float]]:
    """Per test (``randomization``; ``bootstrap`` when ``resamples``) and metric, the share of
    ``pairs`` planted nulls of ``n`` images marked at ``alpha``: each pair takes ``n`` of the images
    without replacement and gives each image's two rows (``r1``, ``r2``) to A and B in random order."""
    rng = np.random.default_rng(seed)
    metrics = [m for m in r1.metrics() if m in set(r2.metrics())]
    tests = ["randomization", "conventional p", *(["bootstrap"] if resamples else [])]
    hits = {test: dict.fromkeys(metrics, 0) for test in tests}
    for k in range(pairs):
        rows = rng.choice(r1.n, size=n, replace=False)
        a1, a2 = r1.take(rows), r2.take(rows)
        flip = rng.random(n) < 0.5
        a = B.PerImage(a1.ids, {c: np.where(flip, a2.columns[c], a1.columns[c]) for c in a1.columns})
        b = B.PerImage(a1.ids, {c: np.where(flip, a1.columns[c], a2.columns[c]) for c in a1.columns})
        for m, t in RZ.randomization_test(a, b, trials, seed=k, metrics=metrics).items():
            hits["randomization"][m] += t.p <= alpha
            hits["conventional p"][m] += t.p_conventional <= alpha
        if resamples:
            for m, d in B.paired_bootstrap(a, b, resamples, seed=k, level=1 - alpha, metrics=metrics).items():
                hits["bootstrap"][m] += d.significant
    return {test: {m: h / pairs for m, h in hs.items()} for test, hs in hits.items()}


def seed_null(pool: list[B.PerImage], n: int, k: int, pairs: int, trials: int, seed: int = 0,
              alpha: float = RZ.DEFAULT_ALPHA) -> dict[str, dict[str, float]]:
    """Per test (``seed-aware``: :func:`r2m.evaluation.randomization.seed_test`'s p; ``images only``: its
    randomization within seeds) and metric, the share of ``pairs`` seed-level planted nulls marked at
    ``alpha``: each takes ``n`` images and ``2k`` distinct runs of ``pool``, the first ``k`` for A and the
    rest for B, paired in draw order."""
    if 2 * k > len(pool):
        raise ValueError(f"{k} seeds per system need a pool of at least {2 * k} runs, got {len(pool)}")
    rng = np.random.default_rng(seed)
    metrics = RZ.common_metrics([(pool[0], pool[1])])
    hits = {test: dict.fromkeys(metrics, 0) for test in ("seed-aware", "images only")}
    for j in range(pairs):
        rows = rng.choice(pool[0].n, size=n, replace=False)
        runs = rng.choice(len(pool), size=2 * k, replace=False)
        seeds = [(pool[runs[i]].take(rows), pool[runs[k + i]].take(rows)) for i in range(k)]
        for m, t in RZ.seed_test(seeds, metrics, trials, seed=j).items():
            hits["seed-aware"][m] += t.p <= alpha
            hits["images only"][m] += t.p_images <= alpha
    return {test: {m: h / pairs for m, h in hs.items()} for test, hs in hits.items()}


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="r2m bench randomization", description=__doc__.split("\n\n")[0])
    scoring_options(p, "test")
    p.add_argument("--trials", type=int_in(1, 10**7), default=RZ.DEFAULT_TRIALS)
    args = p.parse_args(argv)
    scored = args.scored if 0 < args.scored < args.images else args.images
    t0 = time.perf_counter()
    a, b = _runs(scored, args.refs, args.scorers, 2, args.seed)
    a, b = tiled(a, args.images), tiled(b, args.images)
    t_score = time.perf_counter() - t0
    RZ.randomization_test(a.take(range(10)), b.take(range(10)), 50)  # warm-up (BLAS threads)
    rss0, reset = peak_rss_mib(), reset_peak_rss()
    t1, c1 = time.perf_counter(), time.process_time()
    tests = RZ.randomization_test(a, b, args.trials, args.seed)
    wall, cpu = time.perf_counter() - t1, time.process_time() - c1
    rss = peak_rss_mib()
    print(f"randomization: {args.images} images x {args.refs} refs, {args.trials} trials, metrics {', '.join(tests)}")
    print(f"  scoring both systems (not part of the test): {t_score:.1f} s"
          + (f" ({scored} images scored, their statistics repeated to {args.images})" if scored < args.images else ""))
    print(f"  randomization_test, two systems, all metrics: {wall:.2f} s ({cpu:.2f} CPU-s)")
    print(f"  peak RSS during the test: {rss:.0f} MiB" + (f" (before it: {rss0:.0f} MiB)" if reset else
                                                           " (of the whole process: no peak reset here)"))
    for m, t in tests.items():
        print(f"  {m:<15} B - A {t.delta:+.4f}  {RZ.p_text(t.p, t.floor)}")
    return 0


def significance(argv: list[str] | None = None) -> int:
    sc = names_in(coco.SCORERS.names())
    p = OneLineParser(prog="r2m bench significance", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=list_of(int_in(1, MAX_IMAGES)), default=[16, 50, 100, 300],
                   help="test-set sizes n (default 16,50,100,300)")
    p.add_argument("--pairs", type=int_in(1, 10**6), default=1000, help="planted nulls per size (default 1000)")
    p.add_argument("--trials", type=int_in(1, 10**6), default=999, help="randomization trials per test (default 999)")
    p.add_argument("--resamples", type=int_in(0, 10**6), default=1000,
                   help="bootstrap resamples per test (0: no bootstrap)")
    p.add_argument("--images", type=int_in(1, MAX_IMAGES), default=600,
                   help="images scored, drawn from for each pair (default 600)")
    p.add_argument("--scorers", type=sc, default=["bleu", "meteor", "rouge", "cider"])
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0)
    p.add_argument("--seed-sizes", type=list_of(int_in(1, MAX_IMAGES), empty=True), default=[16, 50, 100],
                   help="test-set sizes of the seed-level nulls ('' skips them)")
    p.add_argument("--seeds", type=int_in(2, 1000), default=3, help="seeds per system in a seed-level null (default 3)")
    p.add_argument("--pool", type=int_in(4, 10**4), default=16, help="runs in the seed-level pool (default 16)")
    p.add_argument("--seed-spreads", type=list_of(float_in(0, 1)), default=[0, 0.05, 0.15],
                   help="spreads of the runs' quality (probability of keeping a reference word; default 0,0.05,0.15)")
    p.add_argument("--seed-scorers", type=sc, default=["bleu", "rouge", "cider"],
                   help="scorers of the pool (default without METEOR: about 15 s a run of 300 images)")
    args = p.parse_args(argv)
    sizes = args.sizes
    if max(sizes) > args.images:
        p.error(f"--sizes must be between 1 and --images ({args.images})")
    seed_sizes = args.seed_sizes
    spreads = args.seed_spreads
    pool_images = max(200, *seed_sizes) if seed_sizes else 0
    if seed_sizes and (min(seed_sizes) < 1 or args.seeds < 2 or args.pool < 2 * args.seeds):
        p.error(f"--seed-sizes must be ≥ 1, --seeds ≥ 2 and --pool ≥ 2 × --seeds, got {args.seed_sizes!r}, "
                f"{args.seeds}, {args.pool}")
    r1, r2 = _runs(args.images, 5, args.scorers, 2, args.seed)
    se = math.sqrt(0.05 * 0.95 / args.pairs)
    print(f"planted nulls: {args.pairs} pairs per size, {args.trials} randomization trials, "
          f"{args.resamples} bootstrap resamples; nominal 5 %, Monte-Carlo SE {100 * se:.2f} % "
          f"(5 % ± 3 SE: {100 * (0.05 - 3 * se):.1f}–{100 * (0.05 + 3 * se):.1f} %)")
    t0 = time.perf_counter()
    for n in sizes:
        _print_rates(n, n == sizes[0], planted_null(r1, r2, n, args.pairs, args.trials, args.resamples, args.seed + n))
    print(f"({time.perf_counter() - t0:.0f} s)")
    if not seed_sizes:
        return 0
    print(f"\nseed-level planted nulls: {args.seeds} seeds per system drawn from a pool of {args.pool} runs on "
          f"{pool_images} images ({args.seed_scorers}, concepts), {args.pairs} pairs per size, {args.trials} trials")
    t0 = time.perf_counter()
    z = np.random.default_rng(args.seed + 99).standard_normal(args.pool)
    for spread in spreads:
        keep = [float(x) for x in np.clip(0.5 + spread * z, 0.05, 0.95)]
        pool = _runs(pool_images, 5, args.seed_scorers, args.pool, args.seed + 1, keep)
        cider = [100 * float(B.corpus_metrics(r, metrics=["CIDEr"])["CIDEr"]) for r in pool] if "CIDEr" in pool[0].metrics() else []
        sd = f", seed-to-seed sd of CIDEr on the {pool_images} images {np.std(cider, ddof=1):.1f}" if cider else ""
        print(f"spread {spread:g}{sd}")
        for n in seed_sizes:
            _print_rates(n, n == seed_sizes[0], seed_null(pool, n, args.seeds, args.pairs, args.trials, args.seed + n))
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


def _print_rates(n: int, header: bool, rates: dict[str, dict[str, float]]) -> None:
    """One row per test of the shares of nulls marked at ``n`` images (the metrics' header first)."""
    metrics = list(next(iter(rates.values())))
    if header:
        print(f"{'n':>5}  {'test':<14}" + "".join(f"{m:>15}" for m in metrics))
    for test, r in rates.items():
        print(f"{n:>5}  {test:<14}" + "".join(f"{100 * r[m]:>14.1f}%" for m in metrics))

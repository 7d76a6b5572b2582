"""``r2m bench randomization`` (time of the randomization test) and ``r2m bench significance`` (does the
noise model's 95 % interval cover, and how often does it mark, where the truth is known).

* ``randomization``: 10,000 trials of :func:`r2m.evaluation.randomization.randomization_test` of two
  systems on 5,000 images × every metric (default sizes), wall and CPU seconds. Seeded synthetic
  captions scored with the coco-caption scorers (:func:`r2m.bench.evaluate.synthetic` references;
  tokeniser ``none``; SPICE left out) plus synthetic concept counts.
* ``significance``, per metric, the share of draws whose interval (:func:`r2m.evaluation.noise.compare`)
  covers the truth and the share marked at p ≤ 0.05, each with its Clopper–Pearson interval, on

  - *image-swap nulls* of synthetic captions: two runs of one recipe, ``n`` images drawn, each image's
    two rows given to A and B in random order (one run per system: images only), beside the
    randomization test's rate of marks (its cross-check, exact on such nulls);
  - *synthetic seed nulls*: a pool of runs of one recipe whose quality differs by run (a reference
    word kept with probability ``0.5 + spread · z``, ``z`` standard normal per run); ``k`` distinct
    runs for A and ``k`` for B, and one run each (what a comparison that ignores the seeds marks);
  - *real seed nulls* (``--runs GLOB``): result folders of one configuration at many seeds (e.g. the
    demo's R2M at 12 seeds, made with a catalog ``seeds`` override): disjoint seed sets of ``k`` runs,
    one seed each, and image-swap nulls of two real runs; with ``--plant GLOB`` (the same seeds at
    another checkpoint) a *planted difference* — B's rows of a random share of the images taken from
    that checkpoint — whose coverage of the truth and power (marks in its direction) are printed.
"""

from __future__ import annotations

import glob
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from r2m.bench.evaluate import (
    MAX_IMAGES,
    WORDS,
    peak_rss_mib,
    reset_peak_rss,
    scoring_options,
    synthetic,
    tiled,
)
from r2m.evaluation import bootstrap as B
from r2m.evaluation import coco, tdist
from r2m.evaluation import noise as N
from r2m.evaluation import randomization as RZ
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


def _swapped(r1: B.PerImage, r2: B.PerImage, rng: np.random.Generator) -> tuple[B.PerImage, B.PerImage]:
    """Each image's two rows given to A and B in a random order (exchangeable by construction)."""
    flip = rng.random(r1.n) < 0.5
    a = B.PerImage(r1.ids, {c: np.where(flip, r2.columns[c], r1.columns[c]) for c in r1.columns})
    b = B.PerImage(r1.ids, {c: np.where(flip, r1.columns[c], r2.columns[c]) for c in r1.columns})
    return a, b


@dataclass
class Tally:
    """Per metric: draws whose interval covered the truth, and whose mark (p ≤ alpha) was set."""

    metrics: list[str]
    draws: int = 0
    covered: dict[str, int] = field(default_factory=dict)
    marked: dict[str, int] = field(default_factory=dict)
    pool: int = 0  # runs in the pool the draws take their runs from (0: draws independent, no jackknife)
    used: list[tuple[int, ...]] = field(default_factory=list)  # per draw: the pool's runs it used
    flags: dict[str, list[tuple[bool, bool]]] = field(default_factory=dict)  # per metric, per draw: (covered, marked)

    def add(self, got: dict[str, N.Estimate], truth: dict[str, float] | None = None,
            alpha: float = RZ.DEFAULT_ALPHA, runs: tuple[int, ...] = ()) -> None:
        self.draws += 1
        self.used.append(tuple(int(r) for r in runs))
        for m in self.metrics:
            e = got.get(m)
            t = 0.0 if truth is None else truth[m]
            ok = e is not None and math.isfinite(e.low) and e.low <= t <= e.high
            cov = bool(ok or e is None or not math.isfinite(e.low))
            mark = bool(e is not None and e.p <= alpha and (truth is None or np.sign(e.value) == np.sign(t)))
            self.covered[m] = self.covered.get(m, 0) + int(cov)
            self.marked[m] = self.marked.get(m, 0) + int(mark)
            self.flags.setdefault(m, []).append((cov, mark))

    def jackknife(self, metric: str, what: str = "covered") -> tuple[float, float] | None:
        """A 95 % interval for the share of draws ``covered`` (or ``marked``) that counts the draws' shared
        runs: the delete-one-run jackknife (Quenouille 1956; Efron & Stein 1981) over the pool — the share
        recomputed from the draws that did not use run r, for each r, with variance
        ``(R − 1) / R · Σ (θ₋ᵣ − θ̄)²``, and ``θ ± 1.96 · SE`` clipped to [0, 1]. None when the draws are
        independent (no pool) or a run is in every draw."""
        if not self.pool or not self.used:
            return None
        col = 0 if what == "covered" else 1
        hits = np.array([f[col] for f in self.flags[metric]], dtype=float)
        theta = float(hits.mean())
        parts = []
        for r in range(self.pool):
            keep = np.array([r not in u for u in self.used])
            if not keep.any():
                return None
            parts.append(float(hits[keep].mean()))
        parts_a = np.array(parts)
        se = math.sqrt((self.pool - 1) / self.pool * float(((parts_a - parts_a.mean()) ** 2).sum()))
        return max(0.0, theta - 1.96 * se), min(1.0, theta + 1.96 * se)


def planted_null(r1: B.PerImage, r2: B.PerImage, n: int, pairs: int, trials: int, resamples: int,
                 seed: int = 0) -> tuple[Tally, dict[str, int]]:
    """Image-swap nulls: each takes ``n`` images without replacement and gives each image's two rows (``r1``,
    ``r2``) to A and B in random order. The noise model's coverage of 0 and marks (one run per system:
    images only), and the randomization test's marks (mid-p) as its cross-check."""
    rng = np.random.default_rng(seed)
    metrics = [m for m in r1.metrics() if m in set(r2.metrics())]
    tally, randomization = Tally(metrics), dict.fromkeys(metrics, 0)
    for k in range(pairs):
        rows = rng.choice(r1.n, size=n, replace=False)
        a, b = _swapped(r1.take(rows), r2.take(rows), rng)
        tally.add(N.compare([b], [a], metrics, resamples, seed=k))
        if trials:
            for m, t in RZ.randomization_test(a, b, trials, seed=k, metrics=metrics).items():
                randomization[m] += t.p <= RZ.DEFAULT_ALPHA
    return tally, randomization


def seed_null(pool: list[B.PerImage], n: int | None, k: int, pairs: int, resamples: int, seed: int = 0,
              plant: list[B.PerImage] | None = None, share: float = 1.0,
              truth: dict[str, float] | None = None) -> tuple[Tally, Tally]:
    """Seed nulls: each draws ``2k`` distinct runs of ``pool`` (one configuration), ``k`` for A and ``k`` for
    B, on ``n`` of the images (None: all). The model's coverage of 0 and marks with ``k`` seeds per system,
    and those of one seed each (images only: what a comparison that ignores the seeds says). With ``plant``
    (the same runs at another checkpoint, in pool order), B's rows of a random ``share`` of the images come
    from ``plant``: a planted difference, whose ``truth`` the coverage is checked against and whose marks
    (in the truth's direction) are the power."""
    if 2 * k > len(pool):
        raise ValueError(f"{k} seeds per system need a pool of at least {2 * k} runs, got {len(pool)}")
    rng = np.random.default_rng(seed)
    metrics = RZ.common_metrics([(pool[0], pool[1])])
    if plant is not None:
        metrics = [m for m in metrics if m in set(plant[0].metrics())]
    seeds, single = Tally(metrics, pool=len(pool)), Tally(metrics, pool=len(pool))
    size = pool[0].n if n is None else n
    for j in range(pairs):
        rows = rng.choice(pool[0].n, size=size, replace=False)
        runs = rng.choice(len(pool), size=2 * k, replace=False)
        a = [pool[r].take(rows) for r in runs[:k]]
        b = [pool[r].take(rows) for r in runs[k:]]
        if plant is not None:
            mask = rng.random(size) < share
            b = [B.PerImage(x.ids, {c: np.where(mask, plant[r].take(rows).columns[c], x.columns[c]) for c in x.columns})
                 for x, r in zip(b, runs[k:], strict=True)]
        seeds.add(N.compare(b, a, metrics, resamples, seed=j), truth, runs=tuple(runs))
        single.add(N.compare(b[:1], a[:1], metrics, resamples, seed=j), truth, runs=(runs[0], runs[k]))
    return seeds, single


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


def _pct(hits: int, draws: int) -> str:
    lo, hi = tdist.binomial_interval(hits, draws)
    return f"{100 * hits / draws:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def _print_tally(label: str, tally: Tally, header: bool, what: str = "covered") -> None:
    """One line per tally: per metric the share of draws covered (or marked) with its Clopper–Pearson interval;
    for draws from a pool of runs a second line with the jackknife interval over the runs (:meth:`Tally.jackknife`)."""
    if header:
        print(f"{'':<34}" + "".join(f"{m:>22}" for m in tally.metrics))
    counts = tally.covered if what == "covered" else tally.marked
    print(f"{label:<34}" + "".join(f"{_pct(counts[m], tally.draws):>22}" for m in tally.metrics))
    if tally.pool:
        cells = []
        for m in tally.metrics:
            jk = tally.jackknife(m, what)
            cells.append("—" if jk is None else f"[{100 * jk[0]:.1f}, {100 * jk[1]:.1f}]")
        print(f"{'  jackknife over the ' + str(tally.pool) + ' runs':<34}" + "".join(f"{c:>22}" for c in cells))


def _real_pool(pattern: str, what: str) -> list[B.PerImage]:
    """The per-image statistics of every result folder matching ``pattern`` (a glob), on the images all share."""
    from r2m.evaluation import per_image

    folders = sorted(Path(p) for p in glob.glob(pattern))
    runs = [per_image.read(f / "per_image.parquet")[0] for f in folders if (f / "per_image.parquet").is_file()]
    if len(runs) < 2:
        raise SystemExit(f"r2m bench significance: {what} {pattern!r} matches {len(runs)} result folder(s) with "
                         "per_image.parquet; give a glob of at least 4 seeds' folders, e.g. 'results/demo/r2m/s*/train_i'")
    common = set.intersection(*(set(r.ids) for r in runs))
    ids = [i for i in runs[0].ids if i in common]
    where = [{i: k for k, i in enumerate(r.ids)} for r in runs]
    return [r.take([w[i] for i in ids]) for r, w in zip(runs, where, strict=True)]


def significance(argv: list[str] | None = None) -> int:
    sc = names_in(coco.SCORERS.names())
    p = OneLineParser(prog="r2m bench significance", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=list_of(int_in(2, MAX_IMAGES), empty=True), default=[16, 50, 100],
                   help="image-swap nulls: test-set sizes n (default 16,50,100; '' skips them)")
    p.add_argument("--pairs", type=int_in(1, 10**6), default=400, help="nulls per size (default 400)")
    p.add_argument("--trials", type=int_in(0, 10**6), default=999, help="randomization trials of the cross-check (0: none)")
    p.add_argument("--resamples", type=int_in(1, 10**6), default=1000, help="bootstrap draws per comparison (default 1000)")
    p.add_argument("--images", type=int_in(2, MAX_IMAGES), default=300,
                   help="images scored, drawn from for each null (default 300)")
    p.add_argument("--scorers", type=sc, default=["bleu", "meteor", "rouge", "cider"])
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0)
    p.add_argument("--seed-sizes", type=list_of(int_in(2, MAX_IMAGES), empty=True), default=[16, 50],
                   help="synthetic seed nulls: sizes ('' skips them)")
    p.add_argument("--seeds", type=int_in(2, 1000), default=3, help="seeds per system (default 3)")
    p.add_argument("--pool", type=int_in(4, 10**4), default=16, help="runs in the synthetic seed pool (default 16)")
    p.add_argument("--seed-spreads", type=list_of(float_in(0, 1)), default=[0, 0.05],
                   help="spreads of the synthetic runs' quality (default 0,0.05)")
    p.add_argument("--seed-scorers", type=sc, default=["bleu", "rouge", "cider"], help="scorers of the synthetic pool")
    p.add_argument("--runs", action="append", default=[], metavar="GLOB",
                   help="real seed nulls: a glob of result folders of one configuration at many seeds, e.g. "
                        "'results/demo/r2m/s*/train_i' (repeat for another dataset)")
    p.add_argument("--real-pairs", type=int_in(1, 10**6), default=400, help="real seed nulls per glob (default 400)")
    p.add_argument("--plant", action="append", default=[], metavar="GLOB",
                   help="the same seeds at another checkpoint (e.g. 'results/demo/r2m/s*/train_xe'), one per --runs: "
                        "power on a planted difference")
    p.add_argument("--plant-share", type=float_in(0, 1, open_lo=True), default=0.5,
                   help="share of images whose B rows come from --plant (default 0.5)")
    args = p.parse_args(argv)
    sizes = args.sizes
    if sizes and max(sizes) > args.images:
        p.error(f"--sizes must be between 2 and --images ({args.images})")
    seed_sizes = args.seed_sizes
    spreads = args.seed_spreads
    if seed_sizes and args.pool < 2 * args.seeds:
        p.error(f"--pool must be ≥ 2 × --seeds, got {args.pool} and {args.seeds}")
    if args.plant and len(args.plant) != len(args.runs):
        p.error("give one --plant per --runs (the same seeds at another checkpoint)")
    print(f"95 % intervals of the noise model (docs/guide/statistics.md): share of draws whose interval covers the "
          f"truth and share marked at p ≤ 0.05 (before any correction), each with its Clopper–Pearson 95 % interval; "
          f"{args.resamples} bootstrap draws per comparison")
    if sizes:
        r1, r2 = _runs(args.images, 5, args.scorers, 2, args.seed)
        print(f"\nimage-swap nulls, synthetic captions (two runs of one recipe on {args.images} images, {args.pairs} "
              f"nulls per size): coverage; then marks of the model and of the randomization test ({args.trials} "
              "trials, mid-p)")
        t0 = time.perf_counter()
        for n in sizes:
            tally, rz = planted_null(r1, r2, n, args.pairs, args.trials, args.resamples, args.seed + n)
            _print_tally(f"n={n} covered", tally, n == sizes[0])
            _print_tally(f"n={n} marked", tally, False, "marked")
            if args.trials:
                print(f"{f'n={n} marked, randomization':<34}" + "".join(f"{_pct(rz[m], args.pairs):>22}"
                                                                      for m in tally.metrics))
        print(f"({time.perf_counter() - t0:.0f} s)")
    if seed_sizes:
        pool_images = max(200, *seed_sizes)
        print(f"\nseed nulls, synthetic: {args.seeds} seeds per system drawn from {args.pool} runs of one recipe on "
              f"{pool_images} images whose quality differs by run (keeps a reference word with probability "
              f"0.5 + spread · z), {args.pairs} nulls per size")
        t0 = time.perf_counter()
        z = np.random.default_rng(args.seed + 99).standard_normal(args.pool)
        for spread in spreads:
            keep = [float(x) for x in np.clip(0.5 + spread * z, 0.05, 0.95)]
            pool = _runs(pool_images, 5, args.seed_scorers, args.pool, args.seed + 1, keep)
            cider = [100 * float(B.corpus_metrics(r, metrics=["CIDEr"])["CIDEr"]) for r in pool]
            print(f"spread {spread:g} (seed sd of CIDEr on the {pool_images} images {np.std(cider, ddof=1):.1f})")
            for n in seed_sizes:
                seeds, single = seed_null(pool, n, args.seeds, args.pairs, args.resamples, args.seed + n)
                _print_tally(f"n={n} covered", seeds, n == seed_sizes[0])
                _print_tally(f"n={n} marked", seeds, False, "marked")
                _print_tally(f"n={n} marked, one seed each", single, False, "marked")
        print(f"({time.perf_counter() - t0:.0f} s)")
    for i, pattern in enumerate(args.runs):
        pool = _real_pool(pattern, "--runs")
        if len(pool) < 2 * args.seeds:
            raise SystemExit(f"r2m bench significance: --runs {pattern!r}: {len(pool)} runs, need at least "
                             f"{2 * args.seeds} for {args.seeds} seeds per system")
        combos = math.comb(len(pool), args.seeds) * math.comb(len(pool) - args.seeds, args.seeds) // 2
        print(f"\nreal seed nulls: {pattern} ({len(pool)} runs on {pool[0].n} images); {args.real_pairs} "
              f"draws of {args.seeds} vs {args.seeds} distinct runs (of {combos:,} disjoint splits); the draws share "
              "runs, so beside each Clopper–Pearson interval, which treats them as independent and is too narrow, "
              f"a line gives the jackknife interval over the {len(pool)} runs")
        t0 = time.perf_counter()
        seeds, single = seed_null(pool, None, args.seeds, args.real_pairs, args.resamples, args.seed + 7 * i)
        _print_tally("covered", seeds, True)
        _print_tally("marked", seeds, False, "marked")
        _print_tally("marked, one seed each (images only)", single, False, "marked")
        swap = Tally(seeds.metrics, pool=len(pool))
        rng = np.random.default_rng(args.seed + 11 * i)
        for j in range(args.real_pairs):
            r1, r2 = rng.choice(len(pool), size=2, replace=False)
            a, b = _swapped(pool[r1], pool[r2], rng)
            swap.add(N.compare([b], [a], swap.metrics, args.resamples, seed=j), runs=(r1, r2))
        _print_tally("image-swap nulls, covered", swap, False)
        _print_tally("image-swap nulls, marked", swap, False, "marked")
        if args.plant:
            plant = _real_pool(args.plant[i], "--plant")
            if len(plant) != len(pool) or plant[0].ids != pool[0].ids:
                raise SystemExit(f"r2m bench significance: --plant {args.plant[i]!r} must hold the same seeds and "
                                 f"images as --runs {pattern!r}")
            truth = {m: args.plant_share * float(np.mean([
                B.corpus_metrics(x, metrics=[m])[m] - B.corpus_metrics(r, metrics=[m])[m]
                for x, r in zip(plant, pool, strict=True)])) for m in seeds.metrics}
            print(f"planted difference: B's rows on {100 * args.plant_share:g} % of the images from {args.plant[i]} "
                  "(truth: that share of the pool's mean difference, × 100: "
                  + ", ".join(f"{m} {100 * v:+.1f}" for m, v in truth.items()) + ")")
            pw, pw1 = seed_null(pool, None, args.seeds, args.real_pairs, args.resamples, args.seed + 13 * i, plant,
                                args.plant_share, truth)
            _print_tally("covered (the truth)", pw, True)
            _print_tally("power (marked, right direction)", pw, False, "marked")
            _print_tally("power, one seed each", pw1, False, "marked")
        print(f"({time.perf_counter() - t0:.0f} s)")
    return 0

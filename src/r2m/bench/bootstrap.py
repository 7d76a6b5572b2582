"""``r2m bench bootstrap``: time of the bootstrap over images (the target: 1,000 resamples of
every metric on 5,000 images in seconds).

Scores seeded synthetic captions (5,000 images × 5 references by default, :func:`r2m.bench.evaluate.synthetic`)
with the coco-caption scorers to get real per-image statistics (SPICE left out; tokeniser ``none``
unless ``--ptb``), adds synthetic concept counts, then times :func:`bootstrap_ci` of one system and
:func:`paired_bootstrap` of two (the second: every other caption replaced by a reference) and
prints the figures with the identity check (largest |corpus metric − reported metric|).
"""

from __future__ import annotations

import time

import numpy as np

from r2m.bench.evaluate import peak_rss_mib, reset_peak_rss, synthetic, tiled
from r2m.evaluation import bootstrap as B
from r2m.evaluation import coco


def system(results: dict[str, str], references: dict[str, list[str]], scorers: list[str], tokenizer: str,
           seed: int) -> tuple[B.PerImage, dict[str, float | None]]:
    from r2m.evaluation.per_image import from_evaluation

    metrics, per, stats = coco.evaluate_stats(results, references, scorers, tokenizer=tokenizer)
    ids = list(results)
    rows = from_evaluation(ids, per, stats)
    rng = np.random.default_rng(seed)
    given = rng.integers(0, 6, size=len(ids)).astype(np.float64)
    cols = dict(rows.columns, concept_given=given, concept_named=np.floor(given * rng.random(len(ids))))
    return B.PerImage(rows.ids, cols), metrics


def main(argv: list[str] | None = None) -> int:
    from r2m.bench.evaluate import scoring_options
    from r2m.utils.cliargs import OneLineParser, int_in

    p = OneLineParser(prog="r2m bench bootstrap", description=__doc__.split("\n\n")[0])
    scoring_options(p, "resample")
    p.add_argument("--resamples", type=int_in(1, 10**6), default=B.DEFAULT_RESAMPLES)
    p.add_argument("--ptb", action="store_true", help="PTB-tokenise first, as r2m evaluate does (Java)")
    args = p.parse_args(argv)
    scored = args.scored if 0 < args.scored < args.images else args.images
    scorers = args.scorers
    tokenizer = "ptb" if args.ptb else "none"
    results, references = synthetic(scored, args.refs, seed=args.seed)
    t0 = time.perf_counter()
    a, reported = system(results, references, scorers, tokenizer, args.seed)
    better = {i: (references[i][0] if k % 2 else c) for k, (i, c) in enumerate(results.items())}
    b, _ = system(better, references, scorers, tokenizer, args.seed)
    t_score = time.perf_counter() - t0
    ident = B.corpus_metrics(a)
    worst = max(abs(float(ident[m]) - float(v)) for m, v in reported.items() if v is not None)
    a, b = tiled(a, args.images), tiled(b, args.images)
    B.bootstrap_ci(a, 2, args.seed)  # warm-up: numpy's BLAS threads start on the first product
    rss0, reset = peak_rss_mib(), reset_peak_rss()
    t1, c1 = time.perf_counter(), time.process_time()
    ci = B.bootstrap_ci(a, args.resamples, args.seed)
    t_ci, c_ci = time.perf_counter() - t1, time.process_time() - c1
    t2, c2 = time.perf_counter(), time.process_time()
    diff = B.paired_bootstrap(a, b, args.resamples, args.seed)
    t_paired, c_paired = time.perf_counter() - t2, time.process_time() - c2
    rss = peak_rss_mib()
    print(f"bootstrap: {args.images} images x {args.refs} refs, {args.resamples} resamples, "
          f"metrics {', '.join(ci)}")
    print(f"  scoring both systems (not part of the bootstrap): {t_score:.1f} s"
          + (f" ({scored} images scored, their statistics repeated to {args.images})" if scored < args.images else ""))
    print(f"  identity resample vs reported metrics: max |diff| = {worst:.2e}")
    print(f"  bootstrap_ci, one system, all metrics: {t_ci:.2f} s ({c_ci:.2f} CPU-s)")
    print(f"  paired_bootstrap, two systems, all metrics: {t_paired:.2f} s ({c_paired:.2f} CPU-s)")
    print(f"  peak RSS during the two: {rss:.0f} MiB" + (f" (before them: {rss0:.0f} MiB)" if reset else
                                                          " (of the whole process: no peak reset here)"))
    for m in ci:
        d = diff[m]
        print(f"  {m:<15} A {ci[m].value:.4f} [{ci[m].low:.4f}, {ci[m].high:.4f}]   "
              f"B - A {d.delta:+.4f} [{d.low:+.4f}, {d.high:+.4f}] {'*' if d.significant else 'n.s.'}")
    return 0

"""``r2m bench evaluate``: coco-caption evaluation time on synthetic captions.

Target: 5,000 images × 5 references, all scorers but SPICE, at least 2× faster than
pycocoevalcap's tokeniser and scorers called one after another on the same data, in the same run.
Prints both end-to-end times (the baseline's per step) with the CPU seconds each used (this process
and its Java / worker children: on a shared machine the wall time depends on the other load), the
speed-up and whether the two sets of metrics are identical. ``--repeat N`` alternates the two N
times and prints medians with their spread.
"""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import time

from r2m.evaluation import coco

WORDS = (
    "a an the man woman child dog cat horse bird car bus train bicycle boat plane person people group "
    "table chair bed couch street road field beach water snow grass tree building kitchen room window "
    "red blue green white black small large young old two three sitting standing walking riding eating "
    "holding playing looking next to on in with of near under top front behind at while and"
).split()

MAX_IMAGES = 10**6  # synthetic images a benchmark scores at most (the paper's test split: 5,000)


def scoring_options(p, what: str) -> None:
    """The options of the benchmarks that score synthetic captions first (``r2m bench bootstrap``,
    ``randomization``): ``--images``, ``--refs``, ``--scorers`` (whose statistics ``what``), ``--scored``, ``--seed``."""
    from r2m.utils.cliargs import int_in, names_in

    p.add_argument("--images", type=int_in(1, MAX_IMAGES), default=5000)
    p.add_argument("--refs", type=int_in(1, 100), default=5)
    p.add_argument("--scorers", type=names_in(coco.SCORERS.names()), default=["bleu", "meteor", "rouge", "cider"],
                   help=f"scorers whose statistics to {what}")
    p.add_argument("--scored", type=int_in(0, MAX_IMAGES), default=0,
                   help="score this many images and repeat their statistics up to --images (0: score all)")
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0)


def synthetic(n_images: int, n_refs: int, seed: int = 0) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Seeded random captions (5–15 words, some capitals and punctuation so PTB has work to do)."""
    rng = random.Random(seed)

    def sentence() -> str:
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 15))]
        words[0] = words[0].capitalize()
        if rng.random() < 0.3:
            words.insert(rng.randint(1, len(words) - 1), ",")
        return " ".join(words) + rng.choice([".", "", " .", "!"])

    results = {str(i): sentence() for i in range(n_images)}
    references = {str(i): [sentence() for _ in range(n_refs)] for i in range(n_images)}
    return results, references


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux ``/proc/self/clear_refs``); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_mib() -> float:
    """This process's peak RSS in MiB since the last :func:`reset_peak_rss` (else since it started)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def tiled(stats, n: int):
    """``stats`` (a :class:`r2m.evaluation.bootstrap.PerImage`) repeated row by row to ``n`` images
    (ids made unique): benchmark-sized statistics from a smaller scored set, for the resampling tests,
    whose time and memory depend on the number of images and columns, not on the values."""
    import numpy as np

    from r2m.evaluation.bootstrap import PerImage

    if n <= stats.n:
        return stats.take(range(n))
    rows = np.arange(n) % stats.n
    ids = tuple(f"{stats.ids[r]}~{k // stats.n}" for k, r in enumerate(rows.tolist()))
    return PerImage(ids, {c: np.asarray(v)[rows] for c, v in stats.columns.items()})


def pycocoevalcap_sequence(results: dict[str, str], references: dict[str, list[str]],
                           scorers: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """The baseline: pycocoevalcap's PTBTokenizer and scorers called one after another, as
    ``COCOEvalCap.evaluate`` does (minus SPICE). Returns (metrics, seconds per step)."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    steps: dict[str, float] = {}
    t = time.perf_counter()
    tok = PTBTokenizer()
    gts = tok.tokenize({i: [{"caption": c} for c in references[i]] for i in results})
    res = tok.tokenize({i: [{"caption": c}] for i, c in results.items()})
    steps["ptb_tokenize"] = time.perf_counter() - t
    make = {"bleu": lambda: Bleu(4), "meteor": Meteor, "rouge": Rouge, "cider": Cider}
    metrics: dict[str, float] = {}
    for name in scorers:
        if name not in make:
            continue
        t = time.perf_counter()
        scorer = make[name]()  # METEOR: includes its JVM start-up, as in COCOEvalCap
        score, _ = scorer.compute_score(gts, res, **({"verbose": 0} if name == "bleu" else {}))
        steps[name] = time.perf_counter() - t
        if name == "bleu":
            metrics.update({f"Bleu_{n + 1}": float(score[n]) for n in range(4)})
        else:
            metrics[coco.SCORERS.get(name).metrics[0]] = float(score)
        del scorer
    return metrics, steps


def _cpu() -> float:
    """CPU seconds of this process and its finished children (JVMs, worker processes)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run(n_images: int, n_refs: int, scorers: list[str], parallel: str, workers: int | None,
        seed: int = 0, baseline: bool = True, repeat: int = 1) -> dict:
    """``repeat`` rounds of (the baseline, then r2m) on the same data; the figures are the medians,
    each with its spread (min, max) and the per-round values."""
    results, references = synthetic(n_images, n_refs, seed)
    out: dict = {"images": n_images, "refs_per_image": n_refs, "scorers": scorers, "parallel": parallel,
                 "workers": workers or coco.default_workers(), "cpus": os.cpu_count(), "repeat": repeat}
    rounds: dict[str, list] = {k: [] for k in ("baseline_seconds", "baseline_cpu_seconds", "baseline_step_seconds",
                                                "seconds", "cpu_seconds", "speedup", "max_abs_diff", "identical")}
    for _ in range(repeat):
        if baseline:
            t0, c0 = time.perf_counter(), _cpu()
            base, steps = pycocoevalcap_sequence(results, references, scorers)
            rounds["baseline_seconds"].append(time.perf_counter() - t0)
            rounds["baseline_cpu_seconds"].append(_cpu() - c0)
            rounds["baseline_step_seconds"].append(steps)
        t0, c0 = time.perf_counter(), _cpu()
        metrics, _ = coco.evaluate(results, references, scorers, parallel=parallel, workers=workers)
        rounds["seconds"].append(time.perf_counter() - t0)
        rounds["cpu_seconds"].append(_cpu() - c0)
        out["metrics"] = metrics
        if baseline:
            rounds["speedup"].append(rounds["baseline_seconds"][-1] / rounds["seconds"][-1])
            rounds["max_abs_diff"].append(max(abs(metrics[k] - v) for k, v in base.items()))
            rounds["identical"].append(all(metrics[k] == v for k, v in base.items()))
    for key in ("seconds", "cpu_seconds", *(("baseline_seconds", "baseline_cpu_seconds") if baseline else ())):
        out[key] = statistics.median(rounds[key])
        out[f"{key}_range"] = [min(rounds[key]), max(rounds[key])]
        out[f"{key}_each"] = rounds[key]
    if baseline:
        out["baseline_step_seconds"] = {k: statistics.median(r[k] for r in rounds["baseline_step_seconds"])
                                        for k in rounds["baseline_step_seconds"][0]}
        out["speedup"] = out["baseline_seconds"] / out["seconds"]  # of the medians
        out["speedup_each"] = rounds["speedup"]
        out["max_abs_diff"] = max(rounds["max_abs_diff"])
        out["identical"] = all(rounds["identical"])
    return out


def main(argv: list[str] | None = None) -> int:
    from r2m.utils.cliargs import OneLineParser, int_in, names_in

    p = OneLineParser(prog="r2m bench evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int_in(1, MAX_IMAGES), default=5000)
    p.add_argument("--refs", type=int_in(1, 100), default=5)
    p.add_argument("--scorers", type=names_in(coco.SCORERS.names()), default=["bleu", "meteor", "rouge", "cider"],
                   help="comma-separated (default: all but spice)")
    p.add_argument("--parallel", choices=coco.PARALLEL_MODES, default="hybrid")
    p.add_argument("--workers", type=int_in(1, 1024), default=None,
                   help="cores to use (default: min(4, cpus), at least 2)")
    p.add_argument("--no-baseline", action="store_true", help="skip the pycocoevalcap sequence")
    p.add_argument("--repeat", type=int_in(1, 1000), default=1, help="rounds of (baseline, r2m); medians and spreads printed")
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    out = run(args.images, args.refs, args.scorers, args.parallel,
              args.workers, args.seed, baseline=not args.no_baseline, repeat=args.repeat)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    head = (f"evaluate: {out['images']} images x {out['refs_per_image']} refs, scorers {','.join(out['scorers'])}, "
            f"{out['cpus']} cpus, {out['repeat']} round(s): median [min-max]")
    print(head)

    def spread(key: str) -> str:
        lo, hi = out[f"{key}_range"]
        return f"{out[key]:6.1f} s [{lo:.1f}-{hi:.1f}]"

    if "baseline_seconds" in out:
        print(f"  pycocoevalcap one after another: {spread('baseline_seconds')}, "
              f"{out['baseline_cpu_seconds']:.1f} CPU-s  ("
              + ", ".join(f"{k} {v:.1f}" for k, v in out["baseline_step_seconds"].items()) + ")")
    print(f"  r2m evaluate (parallel={out['parallel']}, workers={out['workers']}, "
          f"meteor JVMs x threads={'x'.join(map(str, coco.meteor_procs(out['workers'])))}): {spread('seconds')}, "
          f"{out['cpu_seconds']:.1f} CPU-s")
    if "speedup" in out:
        each = ", ".join(f"{x:.2f}" for x in out["speedup_each"])
        print(f"  speed-up {out['speedup']:.2f}x of the medians (each round: {each}; target >= 2x); metrics "
              f"{'identical' if out['identical'] else 'DIFFERENT'} (largest difference {out['max_abs_diff']:.1e})")
    return 0

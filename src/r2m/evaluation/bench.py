"""``r2m bench evaluate``: coco-caption evaluation time on synthetic captions.

Target (DESIGN.md §6): 5,000 images × 5 references, all scorers but SPICE, ≤ 30 s.
Prints the end-to-end time of :func:`r2m.evaluation.coco.evaluate` (tokenisation + scorers) and the
time of each step alone.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from r2m.evaluation import coco

WORDS = (
    "a an the man woman child dog cat horse bird car bus train bicycle boat plane person people group "
    "table chair bed couch street road field beach water snow grass tree building kitchen room window "
    "red blue green white black small large young old two three sitting standing walking riding eating "
    "holding playing looking next to on in with of near under top front behind at while and"
).split()


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


def run(n_images: int, n_refs: int, scorers: list[str], parallel: str, workers: int | None,
        seed: int = 0) -> dict:
    results, references = synthetic(n_images, n_refs, seed)
    t0 = time.perf_counter()
    metrics, _ = coco.evaluate(results, references, scorers, parallel=parallel, workers=workers)
    total = time.perf_counter() - t0

    gts = {i: references[i] for i in results}
    res = {i: [results[i]] for i in results}
    t = time.perf_counter()
    gts_t, res_t = coco.tokenize(gts, res, "ptb")
    steps = {"ptb_tokenize": time.perf_counter() - t}
    for name in scorers:
        if coco.SCORERS.get(name).unavailable():
            continue
        t = time.perf_counter()
        coco.run_scorer(name, gts_t, res_t)  # METEOR: includes its JVM start-up
        steps[name] = time.perf_counter() - t
    return {"images": n_images, "refs_per_image": n_refs, "scorers": scorers, "parallel": parallel,
            "seconds": total, "step_seconds": steps, "metrics": metrics}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="r2m bench evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--refs", type=int, default=5)
    p.add_argument("--scorers", default="bleu,meteor,rouge,cider", help="comma-separated (default: all but spice)")
    p.add_argument("--parallel", choices=coco.PARALLEL_MODES, default="hybrid")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    out = run(args.images, args.refs, [s for s in args.scorers.split(",") if s], args.parallel,
              args.workers, args.seed)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"evaluate: {out['images']} images x {out['refs_per_image']} refs, scorers "
          f"{','.join(out['scorers'])}, parallel={out['parallel']}: {out['seconds']:.1f} s (target <= 30 s)")
    for k, v in out["step_seconds"].items():
        print(f"  {k:<14} {v:6.1f} s (alone)")
    return 0

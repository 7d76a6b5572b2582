"""``r2m bench <name> [options]``: micro-benchmarks that print their figures.

Each benchmark is a ``main(argv) -> int`` function named by a ``"module:function"`` string in
:data:`BENCHMARKS` (imported only when run, so ``r2m bench --help`` stays fast). To add one, add a
line here and write the function in a module of this package, e.g. ``"features": "r2m.bench.features:main"``.
"""

from __future__ import annotations

import sys

# name -> ("module:function", help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "train": ("r2m.bench.train:main", "R2M training throughput (sentences/s, forward+backward)"),
    "schedule": ("r2m.bench.schedule:main", "the paper's whole training schedule at paper sizes (per-stage s, sentences/s)"),
    "evaluate": ("r2m.bench.evaluate:main", "coco-caption evaluation time (5,000 images x 5 refs, no SPICE)"),
    "bootstrap": ("r2m.bench.bootstrap:main",
                  "bootstrap intervals: 1,000 resamples of every metric on 5,000 images x 5 refs (s)"),
    "randomization": ("r2m.bench.randomization:main",
                      "approximate randomization: 10,000 trials of every metric on 5,000 images x 5 refs (s)"),
    "significance": ("r2m.bench.randomization:significance",
                     "coverage and marks of the 95 % interval on image-swap and seed nulls (synthetic; real with --runs), power on a planted difference (--plant)"),
    "features": ("r2m.bench.features:main", "feature extraction throughput per backend (images/s)"),
    "concepts": ("r2m.bench.concepts:main", "concept precision/recall of detector settings on the demo photos"),
    "scale": ("r2m.bench.scale:main",
              "every stage on a benchmark-shaped rehearsal dataset at 1 %, 10 %, ...: time, RSS, bytes, growth exponent"),
    "plan": ("r2m.bench.plan:main",
             "what a dry run costs here (snakemake -n, dvc status), beside each engine's floor for as many jobs"),
    "sup": ("r2m.bench.sup:main", "supervised baseline training throughput (sentences/s; --model mrnn)"),
}


def _usage() -> str:
    lines = ["usage: r2m bench <name> [options]", "", "benchmarks:"]
    width = max(map(len, BENCHMARKS)) + 1
    lines += [f"  {name:<{width}} {h}" for name, (_, h) in sorted(BENCHMARKS.items())]
    lines += ["", "Run `r2m bench <name> --help` for a benchmark's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"r2m bench: unknown benchmark {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    from r2m.cli import call

    return call(BENCHMARKS[name][0], rest)

"""Real seed nulls in one command: R2M at many seeds on one dataset, then `r2m bench significance` on them.

    .venv/bin/python scripts/seed_nulls.py --dataset demo --seeds 12      # about 100 CPU s a seed on the demo

It copies the project's files (git's tracked and new, never a run's outputs) into a scratch workspace
(default ``bench/seed-nulls/<dataset>``, kept: a second call with more seeds trains only the new ones),
writes a params.yaml that runs R2M alone on ``--dataset`` at seeds ``0 … N−1`` (the catalog entry's
``seeds`` override), has Snakemake evaluate every seed's final checkpoint and its L_XE checkpoint, and
prints the wall and CPU seconds of that (children's user + sys). Then ``r2m bench significance --runs
…/s*/train_i --plant …/s*/train_xe`` on the workspace's results: coverage and marks of the 95 % interval
on disjoint seed sets and on image-swap nulls (1,000 draws each), and power on a planted difference (B's rows
on every image from the L_XE checkpoint: on the demo about 2 CIDEr, the size of a Table 2 claim); the bench's text is also
saved as ``<workspace>/significance.txt`` (``scripts/doc_numbers.py`` quotes it). Extra arguments after
``--`` go to the bench (e.g. ``-- --real-pairs 1000 --seeds 4``).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

import yaml
from scratch_run import BIN, ROOT, copy_project, run_env, snakemake  # scripts/ is on the path


def workspace(wd: Path, dataset: str, seeds: int) -> None:
    """The scratch copy and its params: R2M alone on ``dataset`` at seeds 0 … seeds − 1, no baselines."""
    raw = copy_project(wd)
    if dataset not in raw["catalog"]:
        raise SystemExit(f"seed_nulls: {dataset!r} is not a catalog entry of params.yaml "
                         f"({', '.join(raw['catalog'])})")
    raw["datasets"] = [dataset]
    raw["variants"] = ["r2m"]
    raw["baselines"]["datasets"] = []
    raw["catalog"][dataset]["seeds"] = list(range(seeds))
    (wd / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))


def stamp_targets(wd: Path, dataset: str, seeds: int, ckpts: tuple[str, ...]) -> None:
    """Write the stamps of the requested evaluations before Snakemake plans: on a fresh workspace it reports
    a requested job's own stamp missing instead of writing it (``snakemake all`` does not meet this)."""
    sys.path.insert(0, str(ROOT / "src"))
    from r2m import params as P
    from r2m.stage import registry as S
    from r2m.stage.record import Planner

    planner = Planner(P.validate(yaml.safe_load((wd / "params.yaml").read_text())), wd)
    for k in range(seeds):
        for ckpt in ckpts:
            planner.plan(S.get("evaluate"), {"dataset": dataset, "variant": "r2m", "seed": str(k), "ckpt": ckpt})


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="demo", help="catalog entry (default demo)")
    ap.add_argument("--seeds", type=int, default=12, help="seeds of R2M to run (default 12)")
    ap.add_argument("--workdir", type=Path, help="scratch workspace (default bench/seed-nulls/<dataset>)")
    ap.add_argument("--cores", type=int, default=2, help="Snakemake cores (default 2)")
    ap.add_argument("--plant", default="train_xe", help="checkpoint of the planted difference (default train_xe)")
    ap.add_argument("--bench-only", action="store_true",
                    help="no copy and no training: the bench on the runs the workspace already holds (after a code "
                         "change that leaves the trained runs as they are, e.g. the bench's own)")
    a = ap.parse_args(argv)
    if a.seeds < 4:
        ap.error("--seeds must be at least 4 (two disjoint sets of two)")
    wd = (a.workdir or ROOT / "bench" / "seed-nulls" / a.dataset).resolve()
    wd.mkdir(parents=True, exist_ok=True)
    env = run_env(wd)
    if a.bench_only:
        trained = "the runs the workspace held, trained by an earlier call"
    else:
        workspace(wd, a.dataset, a.seeds)
        targets = [f"results/{a.dataset}/r2m/s{k}/{ckpt}/per_image.parquet" for k in range(a.seeds)
                   for ckpt in ("train_i", a.plant)]
        stamp_targets(wd, a.dataset, a.seeds, ("train_i", a.plant))
        rc, wall, cpu = snakemake(wd, a.cores, targets, f"seed_nulls: {a.seeds} seeds of R2M on {a.dataset} in {wd}")
        if rc:
            return rc
        trained = f"training and scoring {a.seeds} seeds: {wall:.0f} s wall, {cpu:.0f} CPU s if run now"
    runs = str(wd / f"results/{a.dataset}/r2m/s*/train_i")
    plant = str(wd / f"results/{a.dataset}/r2m/s*/{a.plant}")
    t0, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([str(BIN / "r2m"), "bench", "significance", "--sizes", "", "--seed-sizes", "",
                        "--runs", runs, "--plant", plant,
                        "--real-pairs", "1000", "--plant-share", "1", *extra], env={**env, "PYTHONPATH": str(ROOT / "src")},
                       capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_bench = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    text = (r.stdout.replace(str(wd) + "/", "") + f"({trained}; the bench: {time.perf_counter() - t0:.0f} s wall, {cpu_bench:.0f} CPU s)\n")
    print(text, end="")
    print(r.stderr, end="", file=sys.stderr)
    if r.returncode == 0:
        (wd / "significance.txt").write_text(text)  # what scripts/doc_numbers.py quotes
    return r.returncode


if __name__ == "__main__":
    raise SystemExit(main())

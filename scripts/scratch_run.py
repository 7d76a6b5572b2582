"""The whole DAG in a scratch copy of the project with some params changed, then its tables printed.

    .venv/bin/python scripts/scratch_run.py official --set catalog.demo.fidelity=official --set 'baselines.datasets=[]'

It copies the project's files (git's tracked and new, never a run's outputs) into ``bench/scratch/<name>``
(kept: a second call reruns only what its records say changed), sets each ``--set KEY=VALUE`` in that copy's
``params.yaml`` (dotted keys; the value is read as YAML, so ``[]``, ``0.3`` and ``null`` are typed), runs
``snakemake --cores N all`` there (or the targets given after ``--``), prints the wall and CPU seconds
(children's user + sys) and then ``reports/table1.csv``, ``table2.csv``, ``table3.csv`` and ``claims.csv``.
Used for the ``official`` profile's before/after tables in docs/guide/reproduce.md; ``seed_nulls.py``
copies the project with the same function.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COPIED = ("Snakefile", "workflow", "src", "data", "pyproject.toml")
TABLES = ("table1.csv", "table2.csv", "table3.csv", "claims.csv")


def project_files(names: tuple[str, ...]) -> list[Path]:
    """git's tracked files and new files it does not ignore under ``names``."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                          "--", *names], capture_output=True, check=True).stdout.decode()
    return sorted({Path(p) for p in out.split("\0") if p and (ROOT / p).is_file()})


def copy_project(wd: Path) -> dict[str, Any]:
    """Copy the project's code and data into ``wd`` (files already equal are left alone, so their times
    stay); returns the project's params.yaml as a mapping, for the caller to change and write."""
    for rel in project_files(COPIED):
        dst = wd / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists() or dst.read_bytes() != (ROOT / rel).read_bytes():
            shutil.copy2(ROOT / rel, dst)
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def set_key(raw: dict[str, Any], assignment: str) -> None:
    """``KEY=VALUE`` into ``raw``: KEY dotted (sections created as needed), VALUE parsed as YAML."""
    key, sep, value = assignment.partition("=")
    if not sep or not key:
        raise SystemExit(f"scratch_run: --set {assignment!r}: expected KEY=VALUE")
    *path, last = key.split(".")
    node = raw
    for part in path:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SystemExit(f"scratch_run: --set {key}: {part!r} is not a section")
    node[last] = yaml.safe_load(value)


def run_env(wd: Path) -> dict[str, str]:
    """The environment of a scratch run: this venv's commands first, one thread per job, the copy's code."""
    return {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{BIN}:{os.environ['PATH']}", "R2M_NO_PROGRESS": "1",
            "R2M_THREADS": "1", "R2M_DEVICE": os.environ.get("R2M_DEVICE", "cpu"), "PYTHONPATH": str(wd / "src")}


def timed(cmd: list[str], wd: Path) -> tuple[int, float, float]:
    """Run ``cmd`` in ``wd``: its exit status, wall seconds and children's CPU seconds."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    r = subprocess.run(cmd, cwd=wd, env=run_env(wd))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return r.returncode, time.perf_counter() - t0, cpu


def snakemake(wd: Path, cores: int, targets: list[str], what: str) -> tuple[int, float, float]:
    """Snakemake on ``targets`` in ``wd``, its time printed as ``what: … s wall, … CPU s``: :func:`timed`'s triple."""
    rc, wall, cpu = timed([str(BIN / "snakemake"), "--cores", str(cores), *targets], wd)
    print(f"{what}: {wall:.0f} s wall, {cpu:.0f} CPU s (user + sys of every job; jobs already done cost nothing)",
          flush=True)
    if rc:
        print(f"{what.split(':')[0]}: snakemake failed (exit {rc}); see {wd}/logs", file=sys.stderr)
    return rc, wall, cpu


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    targets = argv[argv.index("--") + 1:] if "--" in argv else ["all"]
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", help="the scratch workspace's name (bench/scratch/<name>)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a params.yaml key (repeatable)")
    ap.add_argument("--cores", type=int, default=2, help="Snakemake cores (default 2)")
    a = ap.parse_args(argv)
    wd = (ROOT / "bench" / "scratch" / a.name).resolve()
    wd.mkdir(parents=True, exist_ok=True)
    raw = copy_project(wd)
    for item in a.set:
        set_key(raw, item)
    (wd / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    rc = snakemake(wd, a.cores, targets, f"scratch_run: {a.name} ({' '.join(a.set) or 'params unchanged'})")[0]
    if rc:
        return rc
    for name in TABLES:
        path = wd / "reports" / name
        if path.exists():
            print(f"\n== {name}\n{path.read_text()}", end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``r2m bench plan``: what planning costs in this workspace, beside each engine's own floor.

It times, as child processes (user + system CPU from ``RUSAGE_CHILDREN``, and wall time), the
commands a user runs to ask "is anything to do?": ``snakemake -n all``, ``r2m stamps`` and
``dvc status`` (when ``dvc.lock`` exists), and ``snakemake --version`` (the engine's start alone). Then
it builds two throw-away workflows of the same number of jobs in a temporary folder, each job one
input and one output, everything up to date, and times the same dry runs there: the engines' floor
for a DAG of that size, which no project code adds to. A pure-Python loop of 10⁷ additions says how
fast the machine is.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

KIND = "bench:plan"  # the ownership kind of the --out file (r2m.utils.owner)


def _tool(name: str) -> str:
    """The command beside the running Python (the project's .venv), else the one on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def timed(cmd: list[str], cwd: Path) -> dict[str, Any]:
    """Run ``cmd`` in ``cwd``; its CPU seconds (user + system, children included), wall seconds, rc, output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, "R2M_NO_PROGRESS": "1"})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu": cpu, "wall": wall, "rc": proc.returncode, "out": proc.stdout + proc.stderr}


def loop_seconds() -> float:
    """CPU seconds of a pure-Python loop of 10⁷ additions at module level (the machine's speed, beside the
    figures; ``python -c 's = 0\nfor i in range(10**7): s += i'`` takes as long)."""
    code = compile("s = 0\nfor i in range(10**7):\n    s += i\n", "<loop>", "exec")
    t0 = time.process_time()
    exec(code, {})  # module-level names, as in `python -c`
    return time.process_time() - t0


def snakemake_floor(root: Path, jobs: int) -> None:
    """A Snakemake workflow of ``jobs`` jobs (one input function, one shared input, one output each), its
    outputs written directly, newer than their inputs. Snakemake has no metadata for them (running the jobs
    costs seconds each), so this floor leaves out the metadata checks a real workspace's dry run makes."""
    root.mkdir(parents=True)
    (root / "Snakefile").write_text(
        f"N = {jobs}\n\n"
        "rule all:\n    input: expand('out/{i}.txt', i=range(N))\n\n"
        "def stamp(wc):\n    return f'st/{wc.i}.json'\n\n"
        "rule make:\n    input: stamp, 'shared.txt'\n    output: 'out/{i}.txt'\n"
        "    run:\n        open(output[0], 'w').write('x')\n")
    for d in ("st", "out"):
        (root / d).mkdir()
    old = time.time() - 60
    for path in [root / "shared.txt"] + [root / "st" / f"{i}.json" for i in range(jobs)]:
        path.write_text("{}")
        os.utime(path, (old, old))
    for i in range(jobs):
        (root / "out" / f"{i}.txt").write_text("x")


def dvc_floor(root: Path, jobs: int) -> None:
    """A DVC project of ``jobs`` stages (``foreach``, one dep and one output each), committed to its lock."""
    root.mkdir(parents=True)
    lines = ["vars:", "- items:"] + [f"    k{i}: {{i: '{i}'}}" for i in range(jobs)]
    lines += ["stages:", "  make:", "    foreach: ${items}", "    do:",
              "      cmd: cp st/${item.i}.json out/${item.i}.txt",
              '      deps: ["st/${item.i}.json"]', '      outs: ["out/${item.i}.txt"]']
    (root / "dvc.yaml").write_text("\n".join(lines) + "\n")
    (root / "st").mkdir()
    (root / "out").mkdir()
    for i in range(jobs):
        (root / "st" / f"{i}.json").write_text("{}")
        (root / "out" / f"{i}.txt").write_text("{}")
    for cmd in (["init", "--no-scm", "-q"], ["commit", "-f", "-q"]):
        done = timed([_tool("dvc"), *cmd], root)
        if done["rc"]:
            raise RuntimeError(f"the DVC floor project failed at `dvc {' '.join(cmd)}`: {done['out'][-400:]}")


def measure(cmd: list[str], cwd: Path, runs: int) -> dict[str, Any]:
    rows = [timed(cmd, cwd) for _ in range(runs)]
    cpus, walls = [r["cpu"] for r in rows], [r["wall"] for r in rows]
    return {"cpu": median(cpus), "cpu_min": min(cpus), "cpu_max": max(cpus), "wall": median(walls),
            "rc": max(r["rc"] for r in rows), "tail": rows[-1]["out"].strip().splitlines()[-1:]}


def main(argv: list[str] | None = None) -> int:
    from r2m.utils.cliargs import OneLineParser, int_in
    from r2m.utils.owner import claim, mark_file

    p = OneLineParser(prog="r2m bench plan", description=__doc__.split("\n")[0])
    p.add_argument("--root", default=".", help="the workspace (default: here)")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--runs", type=int_in(1, 1000), default=3, help="runs of each command (the median is shown)")
    p.add_argument("--jobs", type=int_in(0, 10**6), default=0,
                   help="jobs in the floor workflows (default: this DAG's instances)")
    p.add_argument("--out", default=None, help="also write the figures as JSON here (a new file, or one it wrote)")
    a = p.parse_args(argv)
    root = Path(a.root).resolve()
    if not (root / a.params).is_file():
        p.error(f"--root {a.root}: no params file {a.params} there; give a workspace")
    if a.out is not None:  # the writer check, before anything is timed
        claim(a.out, KIND, "--out", folder=False)
    jobs = a.jobs
    if not jobs:
        from r2m import params as P
        from r2m.pipeline.resolved import dag_instances

        jobs = sum(1 for _ in dag_instances(P.load(root / a.params)))
    sm, dvc, r2m = _tool("snakemake"), _tool("dvc"), _tool("r2m")
    figures: dict[str, Any] = {"loop_1e7_s": loop_seconds(), "jobs": jobs}
    rows: list[tuple[str, str, dict[str, Any]]] = []
    print(f"r2m bench plan: {root}, {jobs} instances, {a.runs} runs each (median CPU s; min–max)", flush=True)
    rows.append(("this workspace", "snakemake --version", measure([sm, "--version"], root, a.runs)))
    rows.append(("this workspace", "snakemake -n all", measure([sm, "-n", "all"], root, a.runs)))
    rows.append(("this workspace", "r2m stamps", measure([r2m, "stamps"], root, a.runs)))
    if (root / "dvc.lock").exists():
        rows.append(("this workspace", "dvc status", measure([dvc, "status"], root, a.runs)))
    else:
        print("  (no dvc.lock here: `dvc status` skipped; `r2m stamps && dvc commit -f` writes one)")
    with tempfile.TemporaryDirectory(prefix="r2m-plan-floor-") as tmp:
        snakemake_floor(Path(tmp) / "snakemake", jobs)
        rows.append((f"floor: {jobs} one-rule jobs", "snakemake -n all", measure([sm, "-n", "all"], Path(tmp) / "snakemake", a.runs)))
        dvc_floor(Path(tmp) / "dvc", jobs)
        rows.append((f"floor: {jobs} one-dep stages", "dvc status", measure([dvc, "status"], Path(tmp) / "dvc", a.runs)))
    print("\n| workflow | command | CPU s | wall s | last line |\n|---|---|---|---|---|")
    for where, cmd, r in rows:
        last = (r["tail"] or [""])[0][:60] + ("" if r["rc"] == 0 else f" (rc {r['rc']})")
        print(f"| {where} | `{cmd}` | {r['cpu']:.2f} ({r['cpu_min']:.2f}–{r['cpu_max']:.2f}) | {r['wall']:.2f} | {last} |")
    print(f"\na pure-Python loop of 10⁷ additions: {figures['loop_1e7_s']:.2f} CPU s")
    figures["rows"] = [{"workflow": w, "command": c, **{k: v for k, v in r.items() if k != "tail"}} for w, c, r in rows]
    if a.out is not None:
        from r2m.utils.io import write_text

        write_text(a.out, json.dumps(figures, indent=1) + "\n")
        mark_file(a.out, KIND)
    return 0

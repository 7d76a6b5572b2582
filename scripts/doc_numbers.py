"""The figures the guides quote from a run, regenerated from that run's outputs.

    .venv/bin/python scripts/doc_numbers.py --check     # after `make run`: which quoted figures differ
    .venv/bin/python scripts/doc_numbers.py --write     # rewrite them from reports/, results/ (and bench/)

A guide marks each generated passage ``<!-- numbers:NAME -->`` … ``<!-- /numbers -->``; NAME is one of
:data:`REGIONS`, a function of the workspace's outputs (``reports/*.csv``, ``results/<dataset>/…``, and
for the calibration the text ``scripts/seed_nulls.py`` saves under ``bench/seed-nulls/<dataset>/``). A
passage whose inputs are absent is left as it is and listed (``--check`` fails on it only with
``--strict``). Nothing else in the guides is touched.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import platform
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
GUIDES = ("docs/guide/statistics.md", "docs/guide/baselines.md", "docs/guide/reproduce.md", "README.md")
REGION = re.compile(r"(<!-- numbers:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /numbers -->)", re.S)


class Missing(Exception):
    """An input of a passage is not in this workspace."""


def _csv(root: Path, rel: str) -> list[dict[str, str]]:
    path = root / rel
    if not path.is_file():
        raise Missing(rel)
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _stamp(root: Path, rel: str) -> str:
    when = dt.date.fromtimestamp((root / rel).stat().st_mtime).isoformat()
    return f"{rel} of a run on {when} ({platform.machine()}, {_cores()} cores)"


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)


def _cell(r: dict[str, str], c: str) -> str:
    v, lo, hi = r.get(c, ""), r.get(f"{c}_lo", ""), r.get(f"{c}_hi", "")
    return f"{v} [{lo}, {hi}]" if v and lo and hi else v


# --------------------------------------------------------------------------- passages
def baselines_rows(root: Path) -> str:
    rows = [r for r in _csv(root, "reports/baselines.csv") if r["dataset"] == "tiny_paired"
            and r["source"] in ("this run", "reference point")]
    if not rows:
        raise Missing("reports/baselines.csv (tiny_paired rows)")
    images = next((r["images"] for r in rows if r.get("images")), "?")
    parts = [f"{r['method']} {_cell(r, 'C')} / {_cell(r, 'B-4')}" for r in rows]
    return (f"On `tiny_paired`'s {images} test images the default run's `reports/baselines.csv` reads (CIDEr / "
            f"BLEU-4 with 95 % intervals, one seed each: over the images): {'; '.join(parts)} "
            f"({_stamp(root, 'reports/baselines.csv')}).\n")


def _seed_values(root: Path, dataset: str) -> dict[str, list[float]]:
    """Per row (variant/ckpt) the CIDEr (× 100) of each seed's eval.json."""
    out: dict[str, list[float]] = {}
    base = root / "results" / dataset
    for ev in sorted(base.glob("*/s*/*/eval.json")):
        variant, seed, ckpt = ev.parts[-4:-1]
        data = json.loads(ev.read_text())
        if isinstance(data.get("CIDEr"), (int, float)):
            out.setdefault(f"{variant}/{ckpt}", []).append(100 * data["CIDEr"])
    if not out:
        raise Missing(f"results/{dataset}/*/s*/*/eval.json")
    return out


def seed_spread_demo(root: Path) -> str:
    rows = {k: v for k, v in _seed_values(root, "demo").items() if len(v) >= 2}
    if not rows:
        raise Missing("results/demo: no row with two seeds")
    sds = sorted(statistics.stdev(v) for v in rows.values())
    seeds = sorted({len(v) for v in rows.values()})
    return (f"Between seeds of one row the demo's CIDEr moves with a standard deviation of {sds[0]:.1f}–{sds[-1]:.1f} "
            f"points (median {statistics.median(sds):.1f}; {len(rows)} rows of {'/'.join(map(str, seeds))} seeds, "
            f"{_stamp(root, 'results/demo')}).\n")


def power_demo(root: Path) -> str:
    from r2m.evaluation import power

    rows = power.scan(root / "results" / "demo", "CIDEr")
    if not rows:
        raise Missing("results/demo/**/per_image.parquet")
    s = power.summarise(rows, [5, 10, 20], "CIDEr", family=4)
    out = [f"`r2m power results/demo --deltas 5,10,20` ({_stamp(root, 'results/demo')}): fitted on {s['pairs']} pairs "
           f"of rows, {s['images']} test images, {'/'.join(map(str, s['runs']))} seeds per row — seed effect sd "
           f"{_f(s['sd_seed'])}, seed × image residual sd {_f(s['sd_residual'])} per image, system × image "
           f"interaction sd {_f(s.get('sd_interaction'))} per image (CIDEr × 100, medians over the pairs). For 80 % "
           "power at level 0.05 / 4 (Table 2's family):", "",
           f"| CIDEr difference | test images at {s['fit']['runs']} seeds per system | seeds per system on "
           f"{s['fit']['images']} images |", "|---|---|---|"]
    for d in s["deltas"]:
        out.append(f"| {d['delta']:g} | {_n(d['images'])} (upper bounds: {_n(d['images_hi'])}) | "
                   f"{_n(d['seeds'])} (upper bounds: {_n(d['seeds_hi'])}) |")
    out += ["", f"At the run's own size a difference of {s['deltas'][0]['mde_here']:.1f} points is detected with 80 % "
            "power (the mde)."]
    return "\n".join(out) + "\n"


def _f(v: float | None) -> str:
    return "—" if v is None or not math.isfinite(v) else f"{v:.1f}"


def _n(v: int | None) -> str:
    return "none" if v is None else f"{v:,}"


def claims_demo(root: Path) -> str:
    rows = [r for r in _csv(root, "reports/claims.csv") if r["dataset"] == "demo"]
    if not rows:
        raise Missing("reports/claims.csv (demo rows)")
    out = [f"`reports/claims.csv` on the demo ({_stamp(root, 'reports/claims.csv')}; CIDEr × 100):", "",
           "| claim | comparison | seeds | images | difference [95 %] | this run / published | adjusted p | mde | "
           "verdict | images / seeds for the published effect |",
           "|---|---|---:|---:|---|---|---:|---:|---|---|"]
    for r in rows:
        plan = (f"{r['images_to_resolve'] or 'none'} / {r['seeds_to_resolve'] or 'none'}"
                if r.get("planned_effect") else "")
        out.append(f"| {r['claim']} | {r['comparison']} | {r['seeds']} | {r['images']} | "
                   f"{r['difference']} [{r['low']}, {r['high']}] | {r['relative']} % / {r['published_relative']} % | "
                   f"{r['p_adjusted']} | {r['mde']} | {r['verdict']} | {plan} |")
    return "\n".join(out) + "\n"


def readme_demo(root: Path) -> str:
    """The README's table: the demo's R2M row of the run's table1.csv beside the published R2M rows."""
    rows = _csv(root, "reports/table1.csv")
    demo = next((r for r in rows if r["dataset"] == "demo" and r["method"] == "R2M" and r["source"] == "this run"),
                None)
    if demo is None:
        raise Missing("reports/table1.csv (the demo's R2M row)")
    published = [r for r in rows if r["method"] == "R2M" and r["source"] == "published"]
    when = dt.date.fromtimestamp((root / "reports/table1.csv").stat().st_mtime).isoformat()
    cols = ("B-4", "M", "R", "C")
    out = [f"What `make run` gives on the embedded demo, beside the paper's benchmark figures (the demo's row: "
           f"{demo['images']} test images, mean of {demo['seeds']} training seeds with a 95 % t interval over seeds "
           f"and images; `make run` on a {_cores()}-core {platform.machine()} CPU machine, {when} — another CPU gives "
           "other floats, see below):", "",
           "| dataset | method | B-4 | METEOR | ROUGE-L | CIDEr |", "|---|---|---|---|---|---|",
           f"| demo ({demo['images']} photos) | R²M, this pipeline | {' | '.join(_cell(demo, c) for c in cols)} |"]
    out += [f"| {r['dataset']} | R²M, published | {' | '.join(r[c] for c in cols)} |" for r in published]
    return "\n".join(out) + "\n"


def _calibration(rel: str, how: str) -> Callable[[Path], str]:
    def make(root: Path) -> str:
        path = root / rel
        if not path.is_file():
            raise Missing(rel)
        text = path.read_text().rstrip()
        seeds = re.search(r"training and scoring (\d+) seeds", text)
        command = f"{how} --seeds {seeds.group(1)}`" if seeds else f"{how}`"
        return f"```\n{text}\n```\n({command}; {_stamp(root, rel)})\n"

    return make


REGIONS: dict[str, Callable[[Path], str]] = {
    "baselines-rows": baselines_rows,
    "seed-spread-demo": seed_spread_demo,
    "power-demo": power_demo,
    "claims-demo": claims_demo,
    "readme-demo": readme_demo,
    "calibration-demo": _calibration("bench/seed-nulls/demo/significance.txt", "`scripts/seed_nulls.py --dataset demo"),
    "calibration-tiny": _calibration("bench/seed-nulls/tiny/significance.txt", "`scripts/seed_nulls.py --dataset tiny"),
    "calibration-synthetic": _calibration("bench/significance-synthetic.txt", "`r2m bench significance"),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="list the passages that differ from the run (exit 1)")
    mode.add_argument("--write", action="store_true", help="rewrite the passages from the run")
    ap.add_argument("--root", type=Path, default=ROOT, help="the workspace holding the run (default: this checkout)")
    ap.add_argument("--strict", action="store_true", help="--check also fails on a passage whose inputs are absent")
    a = ap.parse_args(argv)
    differ, absent = [], []
    for rel in GUIDES:
        path = ROOT / rel
        if not path.is_file():
            continue
        text = path.read_text()

        def fill(m: re.Match, rel: str = rel) -> str:
            name = m.group("name")
            if name not in REGIONS:
                raise SystemExit(f"doc_numbers: {rel}: unknown passage {name!r} (known: {', '.join(REGIONS)})")
            try:
                body = REGIONS[name](a.root)
            except Missing as e:
                absent.append(f"{rel}: {name} (no {e})")
                return m.group(0)
            if body != m.group("body"):
                differ.append(f"{rel}: {name}")
            return m.group(1) + body + m.group(4)

        new = REGION.sub(fill, text)
        if a.write and new != text:
            path.write_text(new)
    for line in absent:
        print(f"doc_numbers: left as it is: {line}")
    for line in differ:
        print(f"doc_numbers: {'rewrote' if a.write else 'differs from the run'}: {line}")
    if a.check and (differ or (a.strict and absent)):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``r2m compare --references REFS.json A B [C …]`` or ``--system A1 A2 A3 --system B1 B2 B3``: each system's
metrics with 95 % intervals, and B − A (C − A, …) with its interval, p and mark.

A system is one run (a positional argument) or several runs of one method at different training seeds
(``--system PATH [PATH …]``, repeated once per system). A run is a COCO results file
(``[{"image_id", "caption"}]``) or a result folder (``results/<dataset>/<variant>/s<seed>/<ckpt>/``: its
``captions.json``, with ``caption_info.json`` for concept recall). A folder's ``per_image.parquet`` is
used as it is when it records the same ``captions.json`` and references file (their SHA-256);
otherwise the captions are scored here as ``r2m evaluate`` scores them (PTB tokenisation, the
coco-caption scorers). Every run must caption the same images.

Everything comes from one model of the noise (:mod:`r2m.evaluation.noise`, the tables' and the
claims'): a system's value is the mean over its runs, and a difference's variance holds each system's
spread over its seeds plus the image component (the covariance of different runs over shared bootstrap
draws of the images, every corpus metric recomputed on each draw); the interval is t with
Welch–Satterthwaite degrees of freedom and the p the same t's. One run per system: the comparison is
over the test images only ("these two models on these images"). With more than two systems the family
of each metric is its differences against A (systems − 1), Holm-corrected; a difference is ``*`` when
its (adjusted) p ≤ 0.05, else ``n.s.``, and ``mde`` is the difference detected with 80 % power at level
0.05 / family. Below :func:`~r2m.evaluation.randomization.min_resamples` resamples no interval or mark
is printed.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r2m.evaluation import bootstrap as B
from r2m.evaluation import coco
from r2m.evaluation import noise as N
from r2m.evaluation import randomization as RZ
from r2m.evaluation.inputs import EvalInputError, drop_empty_references, load_references, load_results, match
from r2m.evaluation.per_image import PerImageError


class CompareError(ValueError):
    """A one-line reason ``r2m compare`` cannot compare its inputs."""


@dataclass(frozen=True)
class System:
    name: str  # A, B, C, …
    path: Path
    captions: Path
    info: Path | None  # caption_info.json of a result folder
    saved: Path | None  # per_image.parquet of a result folder


def locate(name: str, path: str | Path) -> System:
    p = Path(path)
    if p.is_dir():
        caps = p / "captions.json"
        if not caps.is_file():
            raise CompareError(f"{p}: a result folder needs captions.json (none there)")
        info = p / "caption_info.json"
        saved = p / "per_image.parquet"
        return System(name, p, caps, info if info.is_file() else None, saved if saved.is_file() else None)
    if not p.exists():
        raise CompareError(f"{p}: no such results file or folder")
    return System(name, p, p, None, None)


def check_same_images(systems: list[System]) -> None:
    """Every system captions the same image ids (read and validated here: one line on a bad file)."""
    first = systems[0]
    ids0 = set(load_results(first.captions))
    for s in systems[1:]:
        ids = set(load_results(s.captions))
        if ids != ids0:
            only_s, only_0 = sorted(ids - ids0), sorted(ids0 - ids)
            shown = ", ".join(repr(i) for i in (only_s or only_0)[:3])
            raise CompareError(
                f"{s.captions}: image ids differ from {first.captions}: {len(only_s)} only in {s.name}, "
                f"{len(only_0)} only in {first.name} (e.g. {shown}); compare systems on the same images")


def _saved_stats(s: System, references: Path) -> B.PerImage | None:
    from r2m.evaluation import per_image
    from r2m.utils.io import file_digest

    if s.saved is None:
        return None
    stats, meta = per_image.read(s.saved)
    same = (meta.get("captions_sha256") == file_digest(s.captions)
            and meta.get("references_sha256") == file_digest(references))
    return stats if same and stats.n else None


def score(s: System, references: Path, scorers: list[str], logger: logging.Logger) -> B.PerImage:
    """The system's per-image statistics: its saved file when still valid, else scored now."""
    from r2m.evaluation import per_image
    from r2m.evaluation.stage import concept_metrics, evaluate_files

    saved = _saved_stats(s, references)
    if saved is not None:
        logger.info("%s: statistics from %s", s.name, s.saved)
        return saved
    logger.info("%s: scoring %s", s.name, s.captions)
    out = evaluate_files(s.captions, references, scorers, logger=logger, allow_partial=True)
    concepts = concept_metrics(s.captions, s.info).get("per_image", {}) if s.info else None
    return per_image.from_evaluation(list(out["images"]), out["images"], out["stats"], concepts)


def compare(systems: list[list[str]], references: str | Path, *, resamples: int = B.DEFAULT_RESAMPLES,
            seed: int = 0, level: float = B.DEFAULT_LEVEL, scorers: list[str] | None = None,
            logger: logging.Logger | None = None, alpha: float = RZ.DEFAULT_ALPHA) -> dict[str, Any]:
    """The comparison as a JSON-ready dict (what ``--json`` prints); ``systems``: each system's runs."""
    logger = logger or logging.getLogger("r2m.compare")
    # limits first: nothing is scored for a count that would be refused or print nothing
    no_interval = RZ.check_count("resamples", resamples, RZ.min_resamples(level), B.MAX_RESAMPLES)
    refs = Path(references)
    if not refs.is_file():
        raise CompareError(f"{refs}: references file not found")
    names = [chr(ord("A") + k) if k < 26 else f"S{k}" for k in range(len(systems))]
    runs = [[locate(n if len(paths) == 1 else f"{n}{j + 1}", p) for j, p in enumerate(paths)]
            for n, paths in zip(names, systems, strict=True)]
    flat = [r for rs in runs for r in rs]
    check_same_images(flat)
    # every captioned image has references (checked before anything is announced or started)
    references_of = drop_empty_references(load_references(refs))[0]
    match(load_results(flat[0].captions), references_of, str(flat[0].captions), str(refs))
    if len(load_results(flat[0].captions)) < 2:
        raise CompareError(f"{flat[0].captions}: at least two captioned images are needed to compare")
    wanted = list(scorers or coco.DEFAULT_SCORERS)
    for name in list(wanted):
        reason = coco.SCORERS.get(name).unavailable()
        if reason:  # said once here, not once per system
            logger.warning("%s", reason)
            wanted.remove(name)
    if not wanted:
        raise CompareError("none of the requested scorers can run here")
    cache: dict[Path, B.PerImage] = {}
    stats: list[list[B.PerImage]] = []
    for rs in runs:
        got = []
        for r in rs:
            key = r.path.resolve()
            if key not in cache:
                cache[key] = score(r, refs, wanted, logger)
            got.append(cache[key])
        stats.append(got)
    ids = stats[0][0].ids
    stats = [[st.aligned_to(ids) for st in rs] for rs in stats]
    own = [N.compare(rs, (), None, resamples, seed, level) for rs in stats]
    diffs = [N.compare(rs, stats[0], None, resamples, seed, level) for rs in stats[1:]]
    family: dict[str, int] = {}
    for ds in diffs:
        for m in ds:
            family[m] = family.get(m, 0) + 1
    adjusted = {m: RZ.holm({k: ds[m].p for k, ds in enumerate(diffs) if m in ds}) for m in family}

    def one(k: int, m: str, e: N.Estimate) -> dict[str, Any]:
        p_holm = adjusted[m][k]
        cell: dict[str, Any] = {
            "a": e.fit.a.mean, "b": e.fit.b.mean, "delta": e.value, "low": e.low, "high": e.high, "se": e.se,
            "df": e.df, "p": e.p, "p_holm": p_holm, "family": family[m],
            "mde": N.mde(e.fit, alpha / family[m]), "runs": list(e.runs), "method": e.fit.method,
            "components": {"seed_b": e.fit.b.seed_var, "seed_a": e.fit.a.seed_var, "image": e.fit.image}}
        if no_interval:
            cell.update(low=None, high=None, mark="", mde=None)
        else:
            cell["mark"] = "*" if p_holm <= alpha else "n.s."
        cell["significant"] = cell["mark"] == "*"
        return cell

    def value(e: N.Estimate) -> dict[str, Any]:
        return {"value": e.value, "low": None if no_interval else e.low, "high": None if no_interval else e.high,
                "runs": e.runs[0]}

    several = any(len(rs) > 1 for rs in stats)
    return {
        "references": str(refs), "images": len(ids), "resamples": resamples, "seed": seed, "level": level,
        "alpha": alpha,
        "interval": ("t over seeds and test images (variance components, Welch-Satterthwaite df)" if several
                     else "t over the test images (one run per system: these models on these images)"),
        "test": "the interval's t (two-sided p)",
        "correction": (f"Holm per metric over its {len(diffs)} differences against A" if len(diffs) > 1
                       else "none (one pair)"),
        "family": len(diffs), "limits": [x for x in (no_interval,) if x],
        "systems": [{"name": n, "paths": [str(r.path) for r in rs], "metrics": {m: value(e) for m, e in iv.items()}}
                    for n, rs, iv in zip(names, runs, own, strict=True)],
        "differences": [{"a": names[0], "b": n, "metrics": {m: one(k, m, e) for m, e in ds.items()}}
                        for k, (n, ds) in enumerate(zip(names[1:], diffs, strict=True))],
    }


def _no_nan(obj: Any) -> Any:
    """NaN (a metric undefined on these images) as JSON null."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _no_nan(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_no_nan(v) for v in obj]
    return obj


def _fmt(x: float | None, sign: bool = False) -> str:
    return "n/a" if x is None or x != x else (f"{x:+.4f}" if sign else f"{x:.4f}")


def _iv(v: dict[str, Any], sign: bool = False) -> str:
    if v.get("low") is None:
        return "[no interval]"
    return f"[{_fmt(v['low'], sign)}, {_fmt(v['high'], sign)}]"


def _p(p: float) -> str:
    return "p=n/a" if p != p else (f"p={p:.2g}" if p < 0.01 else f"p={p:.3f}")


def render(result: dict[str, Any]) -> str:
    pct = f"{result['level'] * 100:g} %"
    lines = [f"{len(result['systems'])} systems on {result['images']} images of {result['references']}; "
             f"{pct} interval: {result['interval']} ({result['resamples']} bootstrap draws, seed {result['seed']}); "
             f"marks: {result['test']}, correction: {result['correction']}, * = p ≤ {result['alpha']:g}; "
             "mde = the difference detected with 80 % power"]
    lines += [f"  ({x})" for x in result.get("limits", [])]
    for s in result["systems"]:
        lines.append(f"  {s['name']}: {', '.join(s['paths'])}")
    metrics = list(result["systems"][0]["metrics"])
    width = max(len(m) for m in metrics) if metrics else 6
    for m in metrics:
        lines.append("")
        for k, s in enumerate(result["systems"]):
            v = s["metrics"].get(m)
            cell = "n/a" if v is None else f"{_fmt(v['value'])} {_iv(v)}"
            row = f"{m if k == 0 else '':<{width}}  {s['name']}  {cell:<26}"
            if k:
                d = result["differences"][k - 1]["metrics"].get(m)
                if d is not None:
                    p = _p(d["p"]) + (f", Holm {_p(d['p_holm'])}" if result["family"] > 1 else "")
                    mde = "" if d.get("mde") is None else f", mde {_fmt(d['mde'])}"
                    row += (f"  {s['name']} − {result['systems'][0]['name']} {_fmt(d['delta'], True)} "
                            f"{_iv(d, True)} {d['mark'] or '—':<4} {p}{mde}")
            lines.append(row.rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from r2m.utils.cliargs import OneLineParser, float_in, int_in

    p = OneLineParser(prog="r2m compare", description=__doc__.split("\n\n")[0])
    p.add_argument("systems", nargs="*", metavar="RESULTS",
                   help="COCO results files or result folders, one run per system (A B [C …])")
    p.add_argument("--system", action="append", nargs="+", metavar="RUN", dest="groups", default=[],
                   help="the runs (seeds) of one system; repeat once per system (instead of RESULTS)")
    p.add_argument("--references", required=True, help="COCO caption annotations JSON the systems are scored against")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--resamples", type=int_in(1, B.MAX_RESAMPLES), default=B.DEFAULT_RESAMPLES,
                   help=f"bootstrap draws of the image component (default 1000; no interval or mark below "
                        f"{RZ.min_resamples()}, at most {B.MAX_RESAMPLES:,})")
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0, help="seed of the image draws (default 0)")
    p.add_argument("--level", type=float_in(0, 1, open_lo=True, open_hi=True), default=B.DEFAULT_LEVEL,
                   help="interval level (default 0.95)")
    p.add_argument("--scorers", default=",".join(coco.DEFAULT_SCORERS),
                   help=f"comma-separated subset of {','.join(coco.DEFAULT_SCORERS)} (default: all available)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what is scored")
    args = p.parse_args(argv)
    if args.systems and args.groups:
        p.error("give the systems either as RESULTS (one run each) or with --system, not both")
    systems = [list(g) for g in args.groups] or [[x] for x in args.systems]
    if len(systems) < 2:
        p.error("give at least two systems to compare (A B [C …], or --system … twice)")
    logger = logging.getLogger("r2m.compare")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("r2m compare: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if args.verbose else logging.WARNING)
    logger.propagate = False
    scorers = [s.strip() for s in args.scorers.split(",") if s.strip()]
    try:
        for s in scorers:
            coco.SCORERS.get(s)
        result = compare(systems, args.references, resamples=args.resamples, seed=args.seed,
                         level=args.level, scorers=scorers, logger=logger)
    except (CompareError, EvalInputError, PerImageError, FileNotFoundError, KeyError, ValueError) as err:
        text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(f"r2m compare: {' '.join(str(text).split())}", file=sys.stderr)
        return 2
    print(json.dumps(_no_nan(result), indent=2) if args.json else render(result))
    return 0

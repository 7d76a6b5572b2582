"""``r2m compare --references REFS.json A B [C …]``: each system's metrics with 95 % bootstrap intervals
over the test images, and B − A (C − A, …) with its paired interval.

A, B, … are COCO results files (``[{"image_id", "caption"}]``) or result folders
(``results/<dataset>/<variant>/s<seed>/<ckpt>/``: their ``captions.json``, with ``caption_info.json`` for
concept recall). A folder's ``per_image.parquet`` is used as it is when it records the same
``captions.json`` and references file (their SHA-256); otherwise the captions are scored here as
``r2m evaluate`` scores them (PTB tokenisation, the coco-caption scorers). Every system must
caption the same images. Intervals: percentile bootstrap (:mod:`r2m.evaluation.bootstrap`), the
same seeded draws for every system. Marks: the paired approximate-randomization test of each corpus
metric (:mod:`r2m.evaluation.randomization`); with more than two systems the family is every
difference against A (systems − 1 × metrics), Holm-corrected. A difference is ``*`` when its
(adjusted) p ≤ 0.05, else ``n.s.``; below :func:`~r2m.evaluation.randomization.min_resamples`
resamples no interval is printed, below :data:`~r2m.evaluation.randomization.MIN_TRIALS` trials no
mark.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from r2m.evaluation import bootstrap as B
from r2m.evaluation import coco
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


def compare(paths: list[str], references: str | Path, *, resamples: int = B.DEFAULT_RESAMPLES, seed: int = 0,
            level: float = B.DEFAULT_LEVEL, scorers: list[str] | None = None,
            logger: logging.Logger | None = None, trials: int = RZ.DEFAULT_TRIALS,
            alpha: float = RZ.DEFAULT_ALPHA) -> dict[str, Any]:
    """The comparison as a JSON-ready dict (what ``--json`` prints)."""
    logger = logger or logging.getLogger("r2m.compare")
    # limits first: nothing is scored for a count that would be refused or print nothing
    no_interval = RZ.check_count("resamples", resamples, RZ.min_resamples(level), RZ.MAX_RESAMPLES)
    no_mark = RZ.check_count("trials", trials, RZ.MIN_TRIALS, RZ.MAX_TRIALS)
    refs = Path(references)
    if not refs.is_file():
        raise CompareError(f"{refs}: references file not found")
    names = [chr(ord("A") + k) if k < 26 else f"S{k}" for k in range(len(paths))]
    systems = [locate(n, p) for n, p in zip(names, paths, strict=True)]
    check_same_images(systems)
    # every captioned image has references (checked before anything is announced or started)
    references_of = drop_empty_references(load_references(refs))[0]
    match(load_results(systems[0].captions), references_of, str(systems[0].captions), str(refs))
    wanted = list(scorers or coco.DEFAULT_SCORERS)
    for name in list(wanted):
        reason = coco.SCORERS.get(name).unavailable()
        if reason:  # said once here, not once per system
            logger.warning("%s", reason)
            wanted.remove(name)
    if not wanted:
        raise CompareError("none of the requested scorers can run here")
    cache: dict[Path, B.PerImage] = {}
    stats = []
    for s in systems:
        key = s.path.resolve()
        if key not in cache:
            cache[key] = score(s, refs, wanted, logger)
        stats.append(cache[key])
    base = stats[0]
    rows = [st.aligned_to(base.ids) for st in stats]
    intervals = [B.bootstrap_ci(st, resamples, seed, level) for st in rows]
    diffs = [B.paired_bootstrap(base, st, resamples, seed, level) for st in rows[1:]]
    tests = [RZ.randomization_test(base, st, trials, seed, list(ds)) for st, ds in zip(rows[1:], diffs, strict=True)]
    family = {(k, m): t.p for k, ts in enumerate(tests) for m, t in ts.items()}
    adjusted = RZ.holm(family) if len(tests) > 1 else family
    k_family = len(family) if len(tests) > 1 else 1

    def one(k: int, m: str, d: B.Difference) -> dict[str, Any]:
        t = tests[k][m]
        cell: dict[str, Any] = {**asdict(d), "bootstrap_p": d.p, "p": t.p, "p_holm": adjusted[(k, m)],
                                "p_floor": t.floor, "trials": t.trials, "exact": t.exact}
        if no_interval:
            cell.update(low=None, high=None)
        cell["mark"] = "" if no_mark else ("*" if adjusted[(k, m)] <= alpha else "n.s.")
        cell["significant"] = cell["mark"] == "*"
        return cell

    return {
        "references": str(refs), "images": base.n, "resamples": resamples, "seed": seed, "level": level,
        "trials": trials, "alpha": alpha,
        "interval": "percentile bootstrap over test images",
        "test": "paired approximate randomization over images, mid-p = (greater + (ties + 1) / 2) / (trials + 1)",
        "correction": (f"Holm over {k_family} differences (systems - 1 x metrics)" if len(tests) > 1 else "none (one pair)"),
        "family": k_family, "limits": [x for x in (no_interval, no_mark) if x],
        "systems": [{"name": s.name, "path": str(s.path),
                     "metrics": {m: {**asdict(v), **({"low": None, "high": None} if no_interval else {})}
                                 for m, v in iv.items()}}
                    for s, iv in zip(systems, intervals, strict=True)],
        "differences": [{"a": systems[0].name, "b": s.name,
                         "metrics": {m: one(k, m, d) for m, d in ds.items()}}
                        for k, (s, ds) in enumerate(zip(systems[1:], diffs, strict=True))],
    }


def _no_nan(obj: Any) -> Any:
    """NaN (a metric undefined on a resample) as JSON null."""
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


def render(result: dict[str, Any]) -> str:
    pct = f"{result['level'] * 100:g} %"
    lines = [f"{len(result['systems'])} systems on {result['images']} images of {result['references']}; "
             f"{pct} {result['interval']} ({result['resamples']} resamples, seed {result['seed']}); "
             f"marks: {result['test']} ({result['trials']} trials), correction: {result['correction']}, "
             f"* = p ≤ {result['alpha']:g}"]
    lines += [f"  ({x})" for x in result.get("limits", [])]
    for s in result["systems"]:
        lines.append(f"  {s['name']}: {s['path']}")
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
                    p = RZ.p_text(d["p"], d["p_floor"])
                    if result["family"] > 1:
                        p += f", Holm {RZ.p_text(d['p_holm'], min(1.0, d['p_floor'] * result['family']))}"
                    row += (f"  {s['name']} − {result['systems'][0]['name']} {_fmt(d['delta'], True)} "
                            f"{_iv(d, True)} {d['mark'] or '—':<4} {p}")
            lines.append(row.rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from r2m.utils.cliargs import OneLineParser, float_in, int_in

    p = OneLineParser(prog="r2m compare", description=__doc__.split("\n\n")[0])
    p.add_argument("systems", nargs="+", metavar="RESULTS", help="COCO results files or result folders (A B [C …])")
    p.add_argument("--references", required=True, help="COCO caption annotations JSON the systems are scored against")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--resamples", type=int_in(1, RZ.MAX_RESAMPLES), default=B.DEFAULT_RESAMPLES,
                   help=f"bootstrap resamples of the intervals (default 1000; none printed below "
                        f"{RZ.min_resamples()}, at most {RZ.MAX_RESAMPLES:,})")
    p.add_argument("--trials", type=int_in(1, RZ.MAX_TRIALS), default=RZ.DEFAULT_TRIALS,
                   help=f"randomization trials of the marks (default {RZ.DEFAULT_TRIALS:,}; no mark below "
                        f"{RZ.MIN_TRIALS}, at most {RZ.MAX_TRIALS:,})")
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0, help="seed of the image draws (default 0)")
    p.add_argument("--level", type=float_in(0, 1, open_lo=True, open_hi=True), default=B.DEFAULT_LEVEL,
                   help="interval level (default 0.95)")
    p.add_argument("--scorers", default=",".join(coco.DEFAULT_SCORERS),
                   help=f"comma-separated subset of {','.join(coco.DEFAULT_SCORERS)} (default: all available)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what is scored")
    args = p.parse_args(argv)
    if len(args.systems) < 2:
        p.error("give at least two systems to compare (A B [C …])")
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
        result = compare(args.systems, args.references, resamples=args.resamples, seed=args.seed,
                         level=args.level, scorers=scorers, logger=logger, trials=args.trials)
    except (CompareError, EvalInputError, PerImageError, FileNotFoundError, KeyError, ValueError) as err:
        text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(f"r2m compare: {' '.join(str(text).split())}", file=sys.stderr)
        return 2
    print(json.dumps(_no_nan(result), indent=2) if args.json else render(result))
    return 0

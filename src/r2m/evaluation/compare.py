"""``r2m compare --references REFS.json A B [C …]``: each system's metrics with 95 % bootstrap intervals
over the test images, and B − A (C − A, …) with its paired interval.

A, B, … are COCO results files (``[{"image_id", "caption"}]``) or result folders
(``results/<dataset>/<variant>/s<seed>/<ckpt>/``: their ``captions.json``, with ``caption_info.json`` for
concept recall). A folder's ``per_image.parquet`` is used as it is when it records the same
``captions.json`` and references file (their SHA-256); otherwise the captions are scored here as
``r2m evaluate`` scores them (PTB tokenisation, the coco-caption scorers). Every system must
caption the same images. Intervals: percentile bootstrap (:mod:`r2m.evaluation.bootstrap`), the
same seeded draws for every system; a difference is ``*`` when its interval excludes 0, else
``n.s.``.
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
            logger: logging.Logger | None = None) -> dict[str, Any]:
    """The comparison as a JSON-ready dict (what ``--json`` prints)."""
    logger = logger or logging.getLogger("r2m.compare")
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
    return {
        "references": str(refs), "images": base.n, "resamples": resamples, "seed": seed, "level": level,
        "interval": "percentile bootstrap over test images",
        "systems": [{"name": s.name, "path": str(s.path), "metrics": {m: asdict(v) for m, v in iv.items()}}
                    for s, iv in zip(systems, intervals, strict=True)],
        "differences": [{"a": systems[0].name, "b": s.name,
                         "metrics": {m: {**asdict(d), "significant": d.significant} for m, d in ds.items()}}
                        for s, ds in zip(systems[1:], diffs, strict=True)],
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


def _fmt(x: float, sign: bool = False) -> str:
    return "n/a" if x != x else (f"{x:+.4f}" if sign else f"{x:.4f}")


def _p(p: float, resamples: int) -> str:
    """Koehn's sign share; 0 means no resample reached 0: below 1/resamples, not 0."""
    return f"p<{1 / resamples:.2g}" if p == 0 else f"p={p:.3f}"


def render(result: dict[str, Any]) -> str:
    pct = f"{result['level'] * 100:g} %"
    lines = [f"{len(result['systems'])} systems on {result['images']} images of {result['references']}; "
             f"{pct} {result['interval']} ({result['resamples']} resamples, seed {result['seed']})"]
    for s in result["systems"]:
        lines.append(f"  {s['name']}: {s['path']}")
    metrics = list(result["systems"][0]["metrics"])
    width = max(len(m) for m in metrics) if metrics else 6
    for m in metrics:
        lines.append("")
        for k, s in enumerate(result["systems"]):
            v = s["metrics"].get(m)
            cell = "n/a" if v is None else f"{_fmt(v['value'])} [{_fmt(v['low'])}, {_fmt(v['high'])}]"
            row = f"{m if k == 0 else '':<{width}}  {s['name']}  {cell:<26}"
            if k:
                d = result["differences"][k - 1]["metrics"].get(m)
                if d is not None:
                    mark = "*" if d["significant"] else "n.s."
                    row += (f"  {s['name']} − {result['systems'][0]['name']} {_fmt(d['delta'], True)} "
                            f"[{_fmt(d['low'], True)}, {_fmt(d['high'], True)}] {mark:<4} {_p(d['p'], result['resamples'])}")
            lines.append(row.rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from r2m.cli import OneLineParser

    p = OneLineParser(prog="r2m compare", description=__doc__.split("\n\n")[0])
    p.add_argument("systems", nargs="+", metavar="RESULTS", help="COCO results files or result folders (A B [C …])")
    p.add_argument("--references", required=True, help="COCO caption annotations JSON the systems are scored against")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--resamples", type=int, default=B.DEFAULT_RESAMPLES, help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the image draws (default 0)")
    p.add_argument("--level", type=float, default=B.DEFAULT_LEVEL, help="interval level (default 0.95)")
    p.add_argument("--scorers", default=",".join(coco.DEFAULT_SCORERS),
                   help=f"comma-separated subset of {','.join(coco.DEFAULT_SCORERS)} (default: all available)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what is scored")
    args = p.parse_args(argv)
    if len(args.systems) < 2:
        p.error("give at least two systems to compare (A B [C …])")
    if args.resamples < 1 or not 0 < args.level < 1:
        p.error("--resamples must be >= 1 and --level in (0, 1)")
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
                         level=args.level, scorers=scorers, logger=logger)
    except (CompareError, EvalInputError, PerImageError, FileNotFoundError, KeyError, ValueError) as err:
        text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(f"r2m compare: {' '.join(str(text).split())}", file=sys.stderr)
        return 2
    print(json.dumps(_no_nan(result), indent=2) if args.json else render(result))
    return 0

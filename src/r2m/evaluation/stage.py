"""The ``evaluate`` stage and the standalone ``r2m evaluate --results … --references …`` command.

DAG stage: ``results/<D>/<variant>/s<seed>/<ckpt>/captions.json`` against ``data/<D>/references/references.json``
(restricted to the captioned images) → ``eval.json`` (aggregate metrics for ``dvc metrics``, plus
``n_images``, ``unreadable_images`` and ``unreadable_image_ids``: the scored images that
``detect_concepts`` could not read, listed in ``data/<D>/bad_images.csv``, captioned from no
concepts) and ``eval_per_image.json`` (per-image scores).

**Complete or refused.** The captions must cover every reference image of the split(s) they
caption (every reference image when the file names no splits); otherwise evaluation stops with one
line naming the file and the number of missing ids, unless ``--allow-partial``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from r2m.evaluation import coco
from r2m.evaluation.inputs import (
    EvalInputError,
    ReferenceProblems,
    check_coverage,
    drop_empty_references,
    duplicate_file_names,
    match,
    parse_references,
    parse_results,
    partial_error,
    reference_splits,
)
from r2m.stage.context import StageContext
from r2m.utils.io import read_json, write_json

log = logging.getLogger("r2m")


def evaluate_files(
    results_path: str | Path,
    references_path: str | Path,
    scorers: list[str] | tuple[str, ...] = coco.DEFAULT_SCORERS,
    *,
    tokenizer: str = "ptb",
    parallel: str = "hybrid",
    workers: int | None = None,
    logger: logging.Logger = log,
    allow_partial: bool = False,
    extra_duplicates: Sequence[Sequence[str]] = (),
) -> dict[str, Any]:
    """Validate and score two files; returns ``{"metrics", "unavailable", "images", "missing",
    "reference_problems", "stats"}`` (``stats``: the scorers' per-image sufficient statistics,
    :func:`r2m.evaluation.coco.evaluate_stats`).

    Results that do not cover every reference image of their split(s) are an error unless
    ``allow_partial`` (then the missing ids are logged and returned). Empty reference captions are
    not scored, and file names named by several image ids (of the references file, or
    ``extra_duplicates`` ``[file_name, id, …]`` that the dataset recipe found) are reported: a
    line each in the log and counts in ``reference_problems``."""
    results = parse_results(read_json(results_path), str(results_path))
    ref_data = read_json(references_path)
    references, empty = drop_empty_references(parse_references(ref_data, str(references_path)))
    empty_ids = [i for i in results if i in empty]
    problems = ReferenceProblems(sum(empty[i] for i in empty_ids), empty_ids,
                                 duplicate_file_names(ref_data) + [list(d) for d in extra_duplicates])
    for line in problems.lines(str(references_path)):
        logger.warning("%s", line)
    results, refs_all = match(results, references, str(results_path), str(references_path))
    splits = reference_splits(ref_data)
    missing = check_coverage(results, references, splits)
    if missing:
        err = partial_error(missing, len(results), str(results_path), str(references_path))
        if not allow_partial:
            raise err
        logger.warning("--allow-partial: %s", err)
    references = refs_all
    logger.info("evaluating %d captions (%d references) with %s", len(results),
                sum(len(v) for v in references.values()), ", ".join(scorers))
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", coco.MetricUnavailableWarning)
        metrics, per_image, stats = coco.evaluate_stats(results, references, scorers, tokenizer=tokenizer,
                                                        parallel=parallel, workers=workers)
    for w in caught:
        if issubclass(w.category, coco.MetricUnavailableWarning):
            logger.warning("%s", w.message)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    logger.info("scored in %.1f s: %s", time.perf_counter() - t0,
                " ".join(f"{k}={'n/a' if v is None else f'{v:.4f}'}" for k, v in metrics.items()))
    unavailable = [m for m, v in metrics.items() if v is None]
    return {"metrics": metrics, "unavailable": unavailable, "images": per_image, "missing": missing,
            "split": scored_split(results, splits), "reference_problems": problems.counts(), "stats": stats}


def scored_split(results: Any, splits: dict[str, str | None]) -> str | None:
    """The split(s) of the scored images as the references name them (``test``, ``val``, ``test+val``);
    ``None`` when the references name no split."""
    names = sorted({s for i in results if (s := splits.get(i))})
    return "+".join(names) or None


def recipe_duplicates(manifest: Path) -> list[list[str]]:
    """``[file_name, id, …]`` the dataset recipe found named by several reference ids (the ``folder``
    recipe keeps the first id; ``manifest.json`` ``duplicate_reference_ids``), none if absent."""
    if not manifest.exists():
        return []
    data = read_json(manifest)
    return [list(map(str, d)) for d in data.get("duplicate_reference_ids", [])] if isinstance(data, dict) else []


def unreadable_images(path: Path, ids: Any) -> list[str]:
    """Ids among ``ids`` listed in a ``bad_images.csv`` (``image_id,path,reason``); none if absent."""
    import csv

    if not path.exists():
        return []
    wanted = set(ids)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if path.stat().st_size and "image_id" not in (reader.fieldnames or []):
                raise ValueError(f"{path}: not a bad-images list (its header has no 'image_id'); rerun "
                                 "detect_concepts")
            return sorted({r["image_id"] for r in reader if r.get("image_id") in wanted})
    except (UnicodeDecodeError, csv.Error) as err:
        raise ValueError(f"{path}: unreadable bad-images list ({type(err).__name__}); rerun detect_concepts") from None


def concept_metrics(captions_path: str | Path, info_path: str | Path | None) -> dict[str, Any]:
    """Concept recall of the captions against the concepts they were made from (``caption_info.json``)."""
    from r2m.evaluation.concepts import concept_recall

    captions = {str(r["image_id"]): str(r["caption"]) for r in json.loads(Path(captions_path).read_text())}
    if info_path is None or not Path(info_path).exists():  # no caption_info (e.g. supervised captions)
        if info_path is not None:
            log.warning("evaluate: %s is missing: no concept recall", info_path)
        return {"concept_recall": None, "concept_any": None, "concept_images": 0}
    info = json.loads(Path(info_path).read_text())
    concepts = {str(r["image_id"]): list(r["concepts"]) for r in info.get("images", [])}
    out = concept_recall(captions, concepts)
    out["sources"] = info.get("counts", {})
    out["selected_on_test"] = bool(info.get("selected_on_test", False))
    return out


def run(ctx: StageContext) -> None:
    """DAG stage: score one variant/checkpoint's captions."""
    refs = ctx.deps["references"] / "references.json"
    workers = ctx.runtime.workers or None
    out = evaluate_files(ctx.deps["captions"], refs, list(ctx.params.evaluate.scorers), workers=workers,
                         logger=ctx.log, allow_partial=bool(getattr(ctx.args, "allow_partial", False)),
                         extra_duplicates=recipe_duplicates(ctx.deps["prepared"] / "manifest.json"))
    bad = unreadable_images(ctx.deps["bad_images"], out["images"]) if "bad_images" in ctx.deps else []
    if bad:
        ctx.log.warning("evaluate: %d of %d scored image(s) were unreadable (captioned from no concepts): %s",
                        len(bad), len(out["images"]), ", ".join(bad[:10]))
    if "info" in ctx.deps:
        cr = concept_metrics(ctx.deps["captions"], ctx.deps["info"])
    else:  # stages without caption_info.json (the supervised baselines' evaluate_sup)
        cr = {"concept_recall": None, "concept_any": None, "concept_images": 0}
    ctx.log.info("concept recall %s, captions naming >= 1 concept %s (%d images with concepts)",
                 "n/a" if cr["concept_recall"] is None else f"{cr['concept_recall']:.3f}",
                 "n/a" if cr["concept_any"] is None else f"{cr['concept_any']:.3f}", cr["concept_images"])
    extra = {"split": out["split"], "n_images": len(out["images"]), "missing_images": len(out["missing"]),
             "unreadable_images": len(bad),
             "unreadable_image_ids": bad, **out["reference_problems"]}
    concepts = {"concept_recall": cr["concept_recall"], "concept_any": cr["concept_any"]}
    if cr.get("selected_on_test"):  # the checkpoint was chosen on these very images (fidelity.select_on_test)
        extra["selected_on_test"] = True
    stats = out.pop("stats")
    write_json(ctx.outs["metrics"], {**out["metrics"], **concepts, **extra})
    write_json(ctx.outs["per_image"], {**out, **concepts, **extra, "concepts": cr})
    if "stats" in ctx.outs:
        write_per_image(ctx.outs["stats"], out, stats, cr if "info" in ctx.deps else None,
                        {**out["metrics"], **concepts}, ctx.deps["captions"], refs)
    ctx.save_params(ctx.outs["metrics"].parent, "eval.params.yaml")


# --------------------------------------------------------------------------- standalone command
def write_per_image(path: Path, out: dict[str, Any], stats: dict[str, list[float]], cr: dict[str, Any] | None,
                    metrics: dict[str, Any], captions: Path, references: Path) -> None:
    """``per_image.parquet`` (:mod:`r2m.evaluation.per_image`) of one evaluation."""
    from r2m.evaluation import per_image
    from r2m.utils.io import file_digest

    rows = per_image.from_evaluation(list(out["images"]), out["images"], stats,
                                     None if cr is None else cr.get("per_image", {}))
    per_image.write(path, rows, {"metrics": metrics, "captions_sha256": file_digest(captions),
                                 "references_sha256": file_digest(references)})


def _scorer_list(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no scorer named; choose from {coco.SCORERS.names()}")
    unknown = [n for n in names if n not in coco.SCORERS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown scorer(s) {unknown}; choose from {coco.SCORERS.names()}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("standalone use (without --dataset/--variant/--ckpt)")
    parser.add_argument("--allow-partial", action="store_true",
                        help="score captions that do not cover every reference image of their split")
    g.add_argument("--results", help="COCO results JSON: [{image_id, caption}, ...]")
    g.add_argument("--references", help="COCO caption annotations JSON ({images, annotations})")
    g.add_argument("--out", help="write metrics + per-image scores here (JSON); default: stdout only")
    g.add_argument("--scorers", type=_scorer_list, default=list(coco.DEFAULT_SCORERS),
                   help=f"comma-separated subset of {','.join(coco.DEFAULT_SCORERS)} (default: all)")
    g.add_argument("--tokenizer", choices=coco.TOKENIZERS.names(), default="ptb",
                   help="ptb = coco-caption's PTBTokenizer (default); none = as given")
    g.add_argument("--parallel", choices=coco.PARALLEL_MODES, default="hybrid",
                   help="how independent scorers run side by side (default: hybrid = Java scorers in threads, Python scorers in a worker process from 50,000 images on, in a thread below)")


KIND = "evaluate"  # the ownership kind of the file ``r2m evaluate --out`` writes (r2m.utils.owner)


def _refused_out(out: str | None, *inputs: str) -> str | None:
    """Why ``--out`` may not be written, or None: the writer check (:func:`r2m.utils.owner.write_problem`:
    empty, below a file, a folder, inside another r2m output, a workspace's own file, an existing file this
    command did not write), or one of the input files."""
    from r2m.utils.owner import write_problem

    if out is None:
        return None
    path = Path(out)
    if str(out).strip() and path.is_file() and any(Path(i).exists() and path.samefile(i) for i in inputs):
        return "is one of the input files; name another file"
    return write_problem(out, KIND, folder=False)


def standalone(args: argparse.Namespace) -> int:
    if not args.results or not args.references:
        print("r2m evaluate: give --dataset/--variant/--ckpt (pipeline stage) or "
              "--results RES.json --references REFS.json [--out METRICS.json]", file=sys.stderr)
        return 2
    from r2m.stage.context import setup_logging

    refused = _refused_out(args.out, args.results, args.references)
    if refused:
        print(f"r2m evaluate: --out {args.out}: {refused}", file=sys.stderr)
        return 2
    logger = setup_logging(None)
    try:
        out = evaluate_files(args.results, args.references, args.scorers, tokenizer=args.tokenizer,
                             parallel=args.parallel, workers=args.workers or None, logger=logger,
                             allow_partial=args.allow_partial)
    except (EvalInputError, FileNotFoundError, ValueError) as err:
        print(f"r2m evaluate: {err}", file=sys.stderr)
        return 2
    out.pop("stats")
    if args.out:
        from r2m.utils.owner import mark_file

        write_json(args.out, out)
        mark_file(args.out, KIND)  # the next run may replace it while it is unchanged
        logger.info("wrote %s", args.out)
    print(json.dumps(out["metrics"], indent=2))
    return 0

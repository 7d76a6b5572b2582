"""``r2m caption``: the DAG's ``caption`` stage (:func:`r2m.decoding.stage.run`, with
``--dataset/--variant/--ckpt``) and, without them, ``r2m caption IMAGES… [--model FOLDER]``:
captions for image files that belong to no dataset.

IMAGES are files, folders (their image files, not recursive) or glob patterns. The checkpoint folder
(default ``models/demo/r2m/train_i``, the demo's model after ``make run``) carries
``inference.json``: the vocabulary and the concept/detector/feature/caption settings it was trained
with (:mod:`r2m.decoding.settings`); the captioning is
:class:`r2m.decoding.captioner.Captioner`. Detection, (when ``no_concepts`` is ``image``) features and
beam search run batched. Prints ``path<TAB>caption`` per image (``--json``: a JSON list with the
concepts and scores); ``--html OUT`` writes a static gallery (``OUT/index.html`` with each image,
its concepts and scores, its caption and the FM/RM attention plot). Unreadable images are reported
on stderr (and in the JSON/HTML) and skipped; the exit status is 1 only when no image could be
captioned.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import sys
from pathlib import Path

from r2m.decoding.stage import run  # noqa: F401  (the DAG stage: pipeline/stages.py's impl)

DEFAULT_MODEL = "models/demo/r2m/train_i"
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("captioning your own images (without --dataset/--variant/--ckpt)")
    g.add_argument("images", nargs="*", help="image files, folders or glob patterns")
    g.add_argument("--model", default=None, help=f"checkpoint folder (default: {DEFAULT_MODEL})")
    g.add_argument("--json", action="store_true", help="print a JSON list instead of path<TAB>caption")
    g.add_argument("--html", default=None, metavar="OUT", help="write a gallery page OUT/index.html")
    g.add_argument("--batch-size", type=int, default=None, help="images per batch (default: the recorded one)")
    g.add_argument("--beam", type=int, default=None)
    g.add_argument("--max-len", type=int, default=None)
    g.add_argument("--no-concepts", choices=("empty", "image", "top1"), default=None,
                   help="images without concepts (default: the checkpoint's recorded caption.no_concepts)")


def expand(items: list[str]) -> tuple[list[Path], list[tuple[str, str]]]:
    """Image paths from files/folders/globs (deduplicated, in order) and (item, reason) misses."""
    paths: list[Path] = []
    missing: list[tuple[str, str]] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                missing.append((item, "folder holds no image files"))
            paths += found
        elif p.is_file():
            paths.append(p)
        elif any(c in item for c in "*?["):
            found = sorted(Path(f) for f in glob.glob(item, recursive=True) if Path(f).is_file())
            if not found:
                missing.append((item, "pattern matches no file"))
            paths += found
        else:
            missing.append((item, "no such file or folder"))
    seen, out = set(), []
    for p in paths:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            out.append(p)
    return out, missing


def standalone(args: argparse.Namespace) -> int:
    """``r2m caption IMAGES…`` (called by :mod:`r2m.cli` when the stage's axes are not given)."""
    from r2m.decoding.captioner import Captioner
    from r2m.pipeline.context import setup_logging
    from r2m.runtime import Runtime

    setup_logging(None, logging.WARNING)
    given = [a for a in ("dataset", "variant", "ckpt") if getattr(args, a, None) is not None]
    if given and not args.images:
        print(f"r2m caption: the pipeline stage needs --dataset, --variant and --ckpt (got only "
              f"{', '.join('--' + a for a in given)})", file=sys.stderr)
        return 2
    if not args.images:
        print("r2m caption: give IMAGES (files, folders, globs) to caption your own images, or "
              "--dataset D --variant V --ckpt C to run the pipeline stage", file=sys.stderr)
        return 2
    runtime = Runtime.from_env(args.device, args.threads, args.workers)
    runtime.apply()
    paths, missing = expand(args.images)
    for item, reason in missing:
        print(f"r2m caption: skipped {item}: {reason}", file=sys.stderr)
    if not paths:
        print("r2m caption: no image to caption", file=sys.stderr)
        return 1
    model_dir = Path(args.model or DEFAULT_MODEL)
    try:
        hint = " (run `make run` first, or pass --model FOLDER)" if str(model_dir) == DEFAULT_MODEL else ""
        cap = Captioner(model_dir, runtime.torch_device(), hint=hint)
    except (FileNotFoundError, ValueError) as err:
        print(f"r2m caption: {err}", file=sys.stderr)
        return 1
    results, bad = cap.caption(paths, args.batch_size, args.beam, args.max_len, args.no_concepts,
                               attention=bool(args.html))
    bad += [{"path": item, "reason": reason} for item, reason in missing]
    for b in bad:
        print(f"r2m caption: bad image {b['path']}: {b['reason']}", file=sys.stderr)
    if args.json:
        print(json.dumps({"model": str(model_dir), "captions": [{k: v for k, v in r.items() if k != "attention"}
                                                                for r in results], "bad_images": bad}, indent=1))
    else:
        for r in results:
            print(f"{r['path']}\t{r['caption']}")
    if args.html:
        from r2m.reports.gallery import write_gallery

        page = write_gallery(Path(args.html), results, bad, model_dir, cap.model.cfg)
        print(f"r2m caption: gallery -> {page}", file=sys.stderr)
    return 0 if results else 1

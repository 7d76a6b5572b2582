"""``r2m caption IMAGES… [--model FOLDER]``: captions for image files that belong to no dataset
(``r2m caption`` without ``--dataset/--variant/--ckpt``: :data:`r2m.cli.STANDALONE`; with them it is the
DAG's ``caption`` stage, :func:`r2m.captioning.stage.run`, which imports nothing of this module: the detector
and feature backends new photos need are not loaded by the stage, so its record does not name them).

IMAGES are files, folders (their image files, not recursive) or glob patterns. The checkpoint folder
(default ``models/demo/r2m/s0/train_i``, the demo's model after ``make run``) carries
``inference.json``: the vocabulary and the concept/detector/feature/caption settings it was trained
with (:mod:`r2m.captioning.settings`); the captioning is
:class:`r2m.captioning.photos.Captioner`. Detection, (when ``no_concepts`` is ``image``) features and
beam search run batched, a batch at a time: each batch's ``path<TAB>caption`` lines are printed (and
flushed) as soon as it is done, with a progress bar on stderr (:func:`_stream`). The path is a JSON string (in
double quotes, escaped) when it holds a control character, a line or other separator, or starts with
``"`` (:func:`path_field`), so every line splits at its first TAB outside quotes (``--json``: a JSON
list with the concepts and scores); ``--html OUT`` writes a static gallery (``OUT/index.html`` with
each image, its concepts and scores, its caption and the FM/RM attention plot), whole or not at all,
and refuses, before anything is captioned, an OUT that exists and is not a gallery r2m wrote
(unchanged: :func:`r2m.utils.io.ownership_problem`) or that holds one of the images. Unreadable images
are reported on stderr (and in the JSON/HTML) and skipped; the exit status is 1 only when no image
could be captioned.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import sys
from contextlib import nullcontext
from pathlib import Path

from r2m.utils.cliargs import int_in
from r2m.utils.guard import IMAGE_SUFFIXES, not_a_file

DEFAULT_MODEL = "models/demo/r2m/s0/train_i"


USAGE = """r2m caption IMAGES... [--model FOLDER] [--html OUT] [--json] [--batch-size N] [--beam N]
                   [--max-len N] [--no-concepts {empty,image,top1}] [--device D]
       r2m caption --dataset D --variant V --ckpt C [--params FILE]"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = USAGE
    p.description = (f"Caption your own image files (IMAGES: files, folders, glob patterns) with a trained model "
                     f"(--model, default {DEFAULT_MODEL}), printing path<TAB>caption, or --json, or a gallery page "
                     "(--html OUT); or, with --dataset/--variant/--ckpt, run the DAG's caption stage: "
                     "beam-search captions for a dataset's evaluation images.")
    g = p.add_argument_group("captioning your own images (without --dataset/--variant/--ckpt)")
    g.add_argument("images", nargs="*", metavar="IMAGES", help="image files, folders or glob patterns")
    g.add_argument("--model", default=None, help=f"checkpoint folder (default: {DEFAULT_MODEL})")
    g.add_argument("--json", action="store_true", help="print a JSON list instead of path<TAB>caption (a path "
                   "with a control or separator character, or starting with '\"', is printed as a JSON string)")
    g.add_argument("--html", default=None, metavar="OUT", help="write a gallery page OUT/index.html (OUT: a new "
                   "or empty folder, or a gallery r2m wrote there, unchanged; never a folder holding the IMAGES)")
    g.add_argument("--batch-size", type=int_in(1, 65536), default=None,
                   help="images per batch (default: the recorded one)")
    g.add_argument("--beam", type=int_in(1, 100), default=None)
    g.add_argument("--max-len", type=int_in(1, 1000), default=None)
    g.add_argument("--no-concepts", choices=("empty", "image", "top1"), default=None,
                   help="images without concepts (default: the checkpoint's recorded caption.no_concepts)")


def expand(items: list[str]) -> tuple[list[Path], list[tuple[str, str]]]:
    """Image paths from files/folders/globs (deduplicated, in order) and (item, reason) misses."""
    paths: list[Path] = []
    missing: list[tuple[str, str]] = []
    for item in items:
        p = Path(item)
        why = not_a_file(p)
        if why is not None and why != "no such file or folder":  # a FIFO, a link loop: never opened
            missing.append((item, why))
        elif p.is_dir():
            found = sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES and not_a_file(f) is None
                           and f.is_file())
            if not found:
                missing.append((item, "folder holds no image files"))
            paths += found
        elif p.is_file():
            paths.append(p)
        elif any(c in item for c in "*?["):
            found = sorted(Path(f) for f in glob.glob(item, recursive=True)
                           if not_a_file(Path(f)) is None and Path(f).is_file())
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


def path_field(path: str) -> str:
    """``path`` as the first field of a ``path<TAB>caption`` line: as it is, or a JSON string when it
    could be misread (a control, line or other separator character, or a leading ``"``)."""
    if path.isprintable() and not path.startswith('"'):
        return path
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes of a file name (surrogate escapes): \u escapes
        return json.dumps(path, ensure_ascii=True)
    return json.dumps(path, ensure_ascii=False)


def _stream(cap, paths: list[Path], args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """Caption ``paths`` a batch at a time: each ``path<TAB>caption`` line (and each bad image, on stderr)
    printed and flushed as soon as its batch is done, a progress bar on stderr (a line every 30 s when
    stderr is no terminal: :func:`r2m.utils.progress.progress`); all captions and bad images."""
    from r2m.utils.progress import progress

    results: list[dict] = []
    bad: list[dict] = []
    batches = cap.chunks(paths, args.batch_size, args.beam, args.max_len, args.no_concepts,
                         attention=bool(args.html))  # checks the settings before any image is read
    with progress(total=len(paths), desc="caption", unit="img") as bar:
        for good, skipped in batches:
            with bar.external_write_mode(file=sys.stdout) if sys.stderr.isatty() else nullcontext():
                # on a terminal the bar is cleared, then redrawn below the new lines
                for b in skipped:
                    print(f"r2m caption: bad image {path_field(b['path'])}: {' '.join(b['reason'].split())}",
                          file=sys.stderr, flush=True)
                if not args.json:
                    for r in good:
                        print(f"{path_field(r['path'])}\t{r['caption']}", flush=True)
            results += good
            bad += skipped
            bar.update(len(good) + len(skipped))
    return results, bad


def standalone(args: argparse.Namespace) -> int:
    """``r2m caption IMAGES…`` (called by :mod:`r2m.cli` when the stage's axes are not given), under the
    network guard: nothing it does may reach the network (:mod:`r2m.utils.netguard`); an attempt is
    refused and the command fails in one line naming what tried."""
    from r2m.utils.netguard import NetworkGuard, NetworkRefused

    guard = NetworkGuard()
    try:
        with guard:
            rc = _standalone(args)
            guard.check()  # a refusal swallowed by a library or a thread
            return rc
    except NetworkRefused as err:
        print(f"r2m caption: {err}", file=sys.stderr)
        return 1


def _standalone(args: argparse.Namespace) -> int:
    from r2m.captioning.photos import Captioner
    from r2m.runtime import Runtime
    from r2m.stage.context import setup_logging

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
    if args.html is not None:  # before any model is loaded or image captioned ("": refused, not ignored)
        from r2m.reports.gallery import gallery_target_problem

        problem = gallery_target_problem(args.html, paths)
        if problem:
            print(f"r2m caption: --html {args.html}: {problem}", file=sys.stderr)
            return 2
    skipped = [f"{path_field(item)}: {reason}" for item, reason in missing]
    if not paths:  # one line, naming what was skipped
        print(f"r2m caption: no image to caption{' (skipped ' + '; '.join(skipped) + ')' if skipped else ''}",
              file=sys.stderr)
        return 1
    for line in skipped:
        print(f"r2m caption: skipped {line}", file=sys.stderr)
    model_dir = Path(args.model or DEFAULT_MODEL)
    try:
        hint = " (run `make run` first, or pass --model FOLDER)" if str(model_dir) == DEFAULT_MODEL else ""
        cap = Captioner(model_dir, runtime.torch_device(), hint=hint)
    except (FileNotFoundError, ValueError) as err:
        print(f"r2m caption: {' '.join(str(err).split())}", file=sys.stderr)
        return 1
    detect = cap.settings.get("detect_concepts") or {}
    det_path = (detect.get("options") or {}).get("path")
    if detect.get("backend") == "precomputed" and not (isinstance(det_path, str) and Path(det_path).is_file()):
        # precomputed detections serve new images only from a file that names them (by path)
        print(f"r2m caption: --model {model_dir}: trained on a dataset whose concepts were precomputed "
              "(detect_concepts.backend: precomputed) and its inference.json names no detections file for "
              "new images, so there is no detector for them; use a model trained with a detector backend",
              file=sys.stderr)
        return 2
    try:
        results, bad = _stream(cap, paths, args)
    except (FileNotFoundError, ValueError, RuntimeError, ImportError) as err:  # a detector or feature
        # backend that cannot be built here (weights missing, an extra not installed): one line
        print(f"r2m caption: --model {model_dir}: {' '.join(str(err).split())}", file=sys.stderr)
        return 1
    bad += [{"path": item, "reason": reason} for item, reason in missing]
    for item, reason in missing:
        print(f"r2m caption: bad image {path_field(item)}: {' '.join(reason.split())}", file=sys.stderr)
    if args.json:
        print(json.dumps({"model": str(model_dir), "captions": [{k: v for k, v in r.items() if k != "attention"}
                                                                for r in results], "bad_images": bad}, indent=1))
    if args.html:
        from r2m.reports.gallery import write_gallery

        page = write_gallery(Path(args.html), results, bad, model_dir, cap.model.cfg)
        print(f"r2m caption: gallery -> {page}", file=sys.stderr)
    return 0 if results else 1

"""``r2m caption IMAGES… [--model FOLDER]``: captions for image files that belong to no dataset.

IMAGES are files, folders (their image files, not recursive) or glob patterns. The checkpoint folder
(default ``models/demo/r2m/train_i``, the demo's model after ``make run``) carries
``inference.json``: the vocabulary and the concept/detector/feature/caption settings it was trained
with (:mod:`r2m.decoding.settings`). Detection, (when ``no_concepts`` is ``image``) features and
beam search run batched. Prints ``path<TAB>caption`` per image (``--json``: a JSON list with the
concepts and scores); ``--html OUT`` writes a static gallery (``OUT/index.html`` with each image,
its concepts and scores, its caption and the FM/RM attention plot). Unreadable images are reported
on stderr (and in the JSON/HTML) and skipped; the exit status is 1 only when no image could be
captioned.
"""

from __future__ import annotations

import argparse
import glob
import html
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "models/demo/r2m/train_i"
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
log = logging.getLogger("r2m")


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


class Captioner:
    """A checkpoint with its recorded settings, ready to caption image files."""

    def __init__(self, model_dir: str | Path, device: Any = "cpu", root: Path = Path(".")):
        from r2m.decoding import settings
        from r2m.models import load_model

        self.model_dir = Path(model_dir)
        if not (self.model_dir / "model.pt").exists():
            hint = " (run `make run` first, or pass --model FOLDER)" if str(model_dir) == DEFAULT_MODEL else ""
            raise FileNotFoundError(f"no checkpoint: {self.model_dir / 'model.pt'} is missing{hint}")
        self.model, self.ckpt = load_model(self.model_dir)
        self.device = device
        self.model.to(device).eval()
        self.settings = settings.load(self.model_dir, self.ckpt, root)
        self.itos: list[str] = self.settings["itos"]
        if len(self.itos) != self.model.cfg.vocab_size:
            raise ValueError(f"{self.model_dir}: recorded vocabulary has {len(self.itos)} words, "
                             f"the model {self.model.cfg.vocab_size}")
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def caption(self, paths: list[Path], batch_size: int | None = None, beam: int | None = None,
                max_len: int | None = None, no_concepts: str | None = None,
                attention: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
        """Captions (in input order) of the readable images, and the bad ones ``{path, reason}``."""
        import pandas as pd

        from r2m.decoding.stage import (
            END,
            attention_record,
            caption_vectors,
            concept_inputs,
            encode_all,
            image_vectors,
        )
        from r2m.text.dictionary import concept_order
        from r2m.vision.detectors import detect_images

        s = self.settings
        det_p, cap, conc = s["detect_concepts"], s["caption"], s["concepts"]
        batch_size = batch_size or int(det_p.get("batch_size", 8))
        beam, max_len = beam or int(cap["beam"]), max_len or int(cap["max_len"])
        mode = no_concepts or cap.get("no_concepts", "empty")
        ids = [str(p) for p in paths]
        det = detect_images(paths, det_p["backend"], det_p.get("options") or {}, image_ids=ids,
                            dictionary=conc["dictionary"], batch_size=batch_size,
                            min_side=int(det_p.get("min_side", 1)), device=self.device)
        bad = {i: reason for i, _, reason in det.attrs["bad_images"]}
        good = [i for i in ids if i not in bad]
        fid = s.get("fidelity") or {}
        order = concept_order(fid.get("image_concepts") or "by_score", "test")
        words, source = concept_inputs(good, det, float(conc["score_threshold"]), int(conc["max_per_image"]),
                                       self.stoi, mode, order, conc["dictionary"])
        rows = {n: i for n, i in enumerate(good) if source[n] == "image"}
        feats = self._features(list(rows.values()), batch_size) if rows and self.model.cfg.image_dim else {}
        vecs = image_vectors(self.model, self.ckpt, rows, None, log, feats)
        source = [("image" if n in vecs else "empty") if src == "image" else src for n, src in enumerate(source)]
        chunks = [[self.stoi[w] for w in ws] for ws in words]
        v = encode_all(self.model, chunks, batch_size, self.device, vecs)
        best = caption_vectors(self.model, v, beam, max_len, batch_size, decoding=fid.get("decoding") or "paper")
        scores = det.groupby(["image_id", "concept"])["score"].max() if len(det) else pd.Series(dtype=float)
        out = []
        for n, (i, toks) in enumerate(zip(good, best, strict=True)):
            rec: dict[str, Any] = {
                "path": i, "caption": " ".join(self.itos[t] for t in toks), "source": source[n],
                "concepts": [{"concept": w, "score": round(float(scores[(i, w)]), 4) if (i, w) in scores else None}
                             for w in words[n]],
            }
            if attention:
                rec["attention"] = attention_record(self.model, self.itos, chunks[n], [*toks, END][:max_len],
                                                    self.device, v[n])["steps"]
            out.append(rec)
        return out, [{"path": i, "reason": bad[i]} for i in ids if i in bad]

    def _features(self, files: list[str], batch_size: int) -> dict[str, Any]:
        from r2m.vision.features import build_extractor, extract_arrays

        fp = self.settings["extract_features"]
        ex = build_extractor(fp["backend"], fp.get("options") or {})
        arrays, good, _ = extract_arrays(ex, files, batch_size, self.device, show=False)
        return {files[g]: arrays["pooled"][n] for n, g in enumerate(good)}


# ---------------------------------------------------------------------------- gallery
def _attention_png(rec: dict[str, Any], cfg: Any, path: Path) -> bool:
    from r2m.reports.figures import _save, attention_figure

    steps = rec.get("attention") or []
    if not steps or not (all(s.get("fm") for s in steps) or all(s.get("rm") for s in steps)):
        return False
    keys = [f"M{k}" for k in range(cfg.memory_slots)] + ["f"]
    _save(attention_figure({"image_id": Path(rec["path"]).name, "caption": rec["caption"], "steps": steps},
                           ["v", "w_prev"], keys), path)
    return True


def write_gallery(out: Path, results: list[dict[str, Any]], bad: list[dict[str, str]], model_dir: Path,
                  cfg: Any) -> Path:
    """``out/index.html`` + ``out/images/`` (copies) + ``out/attention/`` (FM/RM plots)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "images").mkdir(exist_ok=True)
    (out / "attention").mkdir(exist_ok=True)
    cards = []
    for n, r in enumerate(results):
        src = Path(r["path"])
        img_name = f"{n:04d}{src.suffix.lower()}"
        shutil.copyfile(src, out / "images" / img_name)
        att = f"attention/{n:04d}.png"
        has_att = _attention_png(r, cfg, out / att)
        concepts = "".join(f"<li>{html.escape(c['concept'])} <span class=s>"
                           f"{'' if c['score'] is None else format(c['score'], '.2f')}</span></li>"
                           for c in r["concepts"]) or f"<li class=none>no concept ({html.escape(r['source'])})</li>"
        note = {"top1": " (best concept below the threshold)", "image": " (from the image feature)",
                "empty": " (from no concept)"}.get(r["source"], "")
        cards.append(
            f'<figure class=card><img src="images/{img_name}" alt="{html.escape(src.name)}">'
            f'<figcaption><p class=cap>{html.escape(r["caption"]) or "<em>(empty)</em>"}</p>'
            f'<p class=path>{html.escape(str(src))}{html.escape(note)}</p><ul class=concepts>{concepts}</ul>'
            + (f'<details><summary>FM/RM attention</summary><img class=att src="{att}" alt="attention"></details>'
               if has_att else "") + "</figcaption></figure>")
    bad_html = ("<h2>Skipped images</h2><ul>" + "".join(
        f"<li>{html.escape(b['path'])}: {html.escape(b['reason'])}</li>" for b in bad) + "</ul>") if bad else ""
    page = f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><title>r2m captions</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; background: #fafafa; color: #222; }}
.grid {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(320px, 1fr)); gap: 1em; }}
.card {{ margin: 0; background: white; border: 1px solid #ddd; border-radius: 6px; padding: .6em; }}
.card > img {{ width: 100%; max-height: 260px; object-fit: contain; background: #eee; }}
.cap {{ font-size: 1.1em; font-weight: 600; margin: .4em 0; }}
.path {{ color: #777; font-size: .8em; word-break: break-all; margin: 0; }}
.concepts {{ list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: .3em; }}
.concepts li {{ background: #e8f0fe; border-radius: 3px; padding: .1em .4em; font-size: .85em; }}
.concepts li.none {{ background: #fde8e8; }}
.s {{ color: #557; }}
.att {{ width: 100%; }}
</style></head><body>
<h1>r2m captions</h1>
<p>{len(results)} image(s) captioned with <code>{html.escape(str(model_dir))}</code>.</p>
<div class=grid>
{chr(10).join(cards)}
</div>
{bad_html}
</body></html>
"""
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- command
def main(args: argparse.Namespace) -> int:
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
        cap = Captioner(model_dir, runtime.torch_device())
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
        page = write_gallery(Path(args.html), results, bad, model_dir, cap.model.cfg)
        print(f"r2m caption: gallery -> {page}", file=sys.stderr)
    return 0 if results else 1

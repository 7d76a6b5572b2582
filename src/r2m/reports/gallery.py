"""The static HTML gallery of ``r2m caption IMAGES --html OUT``: each image with its concepts and
scores, its caption and the FM/RM attention plot (:func:`r2m.reports.plots.attention_figure`).

The page comes from the template file ``templates/gallery.html`` (:mod:`r2m.reports.pages`, shared
with the report; auto-escaping: file names, captions and concepts are data, never markup). The
gallery is built in a temporary folder beside ``OUT`` and renamed into place only when complete, so a failure (a full disk) leaves the previous gallery as it was. An
``OUT`` that exists is replaced only when it is a gallery r2m made (the ownership marker of
:mod:`r2m.utils.owner` names the kind ``gallery``: a folder that merely holds ``index.html`` or
``images/`` is not one, nor is any other r2m output such as a model folder) and it holds nothing else
and nothing changed, and never when it holds (or is) one of the images to caption; all of it, an
empty OUT and an OUT below a file included, is refused before anything is captioned
(:func:`gallery_target_problem`).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from r2m.utils.guard import is_disk_full
from r2m.utils.io import atomic_path
from r2m.utils.owner import write_problem

KIND = "gallery"  # the ownership kind of a gallery folder

NOTES = {"top1": " (best concept below the threshold)", "image": " (from the image feature)",
         "empty": " (from no concept)"}

def attention_png(rec: dict[str, Any], cfg: Any, path: Path) -> bool:
    from r2m.reports.plots import attention_figure, save_figure

    steps = rec.get("attention") or []
    if not steps or not (all(s.get("fm") for s in steps) or all(s.get("rm") for s in steps)):
        return False
    keys = [f"M{k}" for k in range(cfg.memory_slots)] + ["f"]
    save_figure(attention_figure({"image_id": Path(rec["path"]).name, "caption": rec["caption"], "steps": steps},
                           ["v", "w_prev"], keys), path)
    return True


def render_page(cards: list[dict[str, Any]], bad: list[dict[str, str]], model_dir: Path) -> str:
    """The gallery's ``index.html`` (``templates/gallery.html``; every value auto-escaped)."""
    from r2m.reports.pages import render

    return render("gallery.html", cards=cards, bad=bad, model_dir=str(model_dir))


def gallery_target_problem(out: str | Path, inputs: Sequence[Path] = ()) -> str | None:
    """Why ``--html OUT`` cannot be (re)written, or None: OUT must be a non-empty path below folders, new,
    an empty folder or a gallery r2m wrote (unchanged, nothing added), not inside another r2m output or a
    workspace's own files (:func:`r2m.utils.owner.write_problem`), and hold none of the ``inputs``."""
    if not str(out).strip():
        return write_problem(out, KIND, folder=True)
    out = Path(out)
    if out.exists() or out.is_symlink():
        target = out.resolve()
        inside = [p for p in inputs if p.resolve() == target or target in p.resolve().parents]
        if inside:
            return (f"holds the image {inside[0]} to caption; r2m never replaces a folder holding its inputs: "
                    "give a new folder for the gallery")
    return write_problem(out, KIND, folder=True)


def _card(n: int, r: dict[str, Any], cfg: Any, folder: Path) -> dict[str, Any]:
    src = Path(r["path"])
    suffix = src.suffix.lower() if re.fullmatch(r"\.[a-z0-9]{1,8}", src.suffix.lower()) else ""
    img = f"images/{n:04d}{suffix}"  # our own name: nothing of the file name reaches the src attribute
    shutil.copyfile(src, folder / img)
    att = f"attention/{n:04d}.png"
    return {"img": img, "name": src.name, "caption": r["caption"], "path": str(src),
            "note": NOTES.get(r["source"], ""), "source": r["source"],
            "concepts": [{"concept": c["concept"], "score": "" if c["score"] is None else format(c["score"], ".2f")}
                         for c in r["concepts"]],
            "attention": att if attention_png(r, cfg, folder / att) else None}


def write_gallery(out: Path, results: list[dict[str, Any]], bad: list[dict[str, str]], model_dir: Path,
                  cfg: Any) -> Path:
    """``out/index.html`` + ``out/images/`` (copies) + ``out/attention/`` (FM/RM plots), written whole:
    built in a temporary folder, then renamed over ``out``."""
    problem = gallery_target_problem(out, [Path(r["path"]) for r in results])
    if problem:
        raise ValueError(f"{out}: {problem}")
    try:
        with atomic_path(out, kind=KIND) as tmp:
            (tmp / "images").mkdir(parents=True)
            (tmp / "attention").mkdir()
            cards = [_card(n, r, cfg, tmp) for n, r in enumerate(results)]
            (tmp / "index.html").write_text(render_page(cards, bad, model_dir), encoding="utf-8")
    except OSError as err:
        if is_disk_full(err):  # name the gallery, not the temporary folder (already removed)
            raise OSError(err.errno, err.strerror, str(out)) from None
        raise
    return out / "index.html"

"""The static HTML gallery of ``r2m caption IMAGES --html OUT``: each image with its concepts and
scores, its caption and the FM/RM attention plot (:func:`r2m.reports.plots.attention_figure`)."""

from __future__ import annotations

import html
import shutil
from pathlib import Path
from typing import Any


def attention_png(rec: dict[str, Any], cfg: Any, path: Path) -> bool:
    from r2m.reports.plots import attention_figure, save_figure

    steps = rec.get("attention") or []
    if not steps or not (all(s.get("fm") for s in steps) or all(s.get("rm") for s in steps)):
        return False
    keys = [f"M{k}" for k in range(cfg.memory_slots)] + ["f"]
    save_figure(attention_figure({"image_id": Path(rec["path"]).name, "caption": rec["caption"], "steps": steps},
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
        has_att = attention_png(r, cfg, out / att)
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

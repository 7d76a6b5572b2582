"""``reports/index.html``: one static, self-contained page (inline CSS, no scripts) with Tables 1–3
and each dataset's figures and qualitative examples. Images are referenced by relative paths
(``figures/<dataset>/*.png``) so the page works when the ``reports/`` folder is opened or copied.
"""

from __future__ import annotations

import csv
import datetime as _dt
import html
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from r2m.reports.published import COLUMNS
from r2m.reports.tables import CONCEPT_COLUMNS, CONCEPT_NOTE, PUBLISHED, SCOPE_COLUMNS, TABLES
from r2m.utils.io import read_json, write_text

esc = html.escape

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#22313f;color:#fff;padding:18px 32px}
header h1{margin:0;font-size:22px} header p{margin:4px 0 0;color:#c9d3dc;font-size:13px}
nav{padding:8px 32px;background:#eef1f4;font-size:14px} nav a{margin-right:16px;color:#22313f}
main{padding:8px 32px 40px;max-width:1200px}
h2{border-bottom:2px solid #22313f;padding-bottom:4px;margin-top:32px}
h3{margin-top:24px}
table.metrics{border-collapse:collapse;font-size:13px;margin:8px 0;background:#fff}
table.metrics th,table.metrics td{border:1px solid #d5dbe1;padding:3px 8px}
table.metrics th{background:#eef1f4}
table.metrics td.num{text-align:right;font-variant-numeric:tabular-nums}
table.metrics tr.published td{color:#5f6b76;font-style:italic}
table.metrics tr.run td{font-weight:600}
table.metrics tr.first td{border-top:2px solid #8a98a6}
.note{color:#8a5a00;background:#fff6e0;border-left:3px solid #e0a800;padding:4px 10px;font-size:13px;margin:4px 0}
.caption{font-size:13px;color:#444;margin:2px 0 14px}
figure{margin:12px 0} figure img{max-width:100%;border:1px solid #d5dbe1;background:#fff}
.examples{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:14px}
.example{display:flex;gap:12px;background:#fff;border:1px solid #d5dbe1;padding:10px;font-size:13px}
.example img{width:180px;height:auto;object-fit:contain;align-self:flex-start}
.example .noimg{width:180px;height:120px;display:flex;align-items:center;justify-content:center;background:#eee;color:#888}
.example ul{margin:2px 0 6px;padding-left:18px} .example dt{font-weight:600;margin-top:4px}
.example dd{margin:0 0 0 10px} .tag{display:inline-block;background:#e6eef6;border-radius:3px;padding:0 5px;margin:1px}
footer{font-size:12px;color:#777;padding:0 32px 24px}
"""


# --------------------------------------------------------------------------- tables
def read_table_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table_html(rows: Sequence[Mapping[str, str]]) -> str:
    cols = [*COLUMNS, *(c for c in CONCEPT_COLUMNS if rows and c in rows[0])]
    scope = [c for c in SCOPE_COLUMNS if rows and c in rows[0]]  # split, images, note (what each row scored)
    head = "".join(f"<th>{esc(h)}</th>" for h in ("Dataset", "Method", "Source", *cols, *scope))
    body, prev = [], None
    for r in rows:
        cls = ["published" if r.get("source") == PUBLISHED else "run"]
        if r.get("dataset") != prev:
            cls.append("first")
        shown = r.get("dataset", "") if r.get("dataset") != prev else ""
        prev = r.get("dataset")
        cells = [f"<td>{esc(shown)}</td>", f"<td>{esc(r.get('method', ''))}</td>",
                 f"<td>{esc(r.get('source', ''))}</td>"]
        cells += [f'<td class="num">{esc(r.get(c, "") or "")}</td>' for c in cols]
        cells += [f'<td{" class=num" if c == "images" else ""}>{esc(r.get(c, "") or "")}</td>' for c in scope]
        body.append(f'<tr class="{" ".join(cls)}">{"".join(cells)}</tr>')
    return f'<table class="metrics"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def tables_section(paths: Mapping[str, Path]) -> str:
    parts = ['<section id="tables"><h2>Tables</h2>',
             '<p class="caption">Scores &times; 100 (B = BLEU, M = METEOR, R = ROUGE-L, C = CIDEr, '
             'S = SPICE). <i>Italic grey</i> rows are the paper\'s published numbers, <b>bold</b> rows '
             'this run. Empty cells: not reported in the paper, or not computed here (SPICE needs '
             'Stanford CoreNLP jars that are not available offline). ' + esc(CONCEPT_NOTE) + '</p>']
    for name, path in paths.items():
        spec = TABLES[name]
        parts.append(f'<h3 id="{name}">Table {spec.number}: {esc(spec.title)}</h3>')
        if not Path(path).exists():
            parts.append(f'<p class="note">{esc(str(path))} is missing: run <code>r2m {name}</code>.</p>')
            continue
        parts.append(table_html(read_table_csv(Path(path))))
        parts.append(f'<p class="caption">{esc(spec.note)} Source: <code>{esc(Path(path).name)}</code>.</p>')
    parts.append("</section>")
    return "\n".join(parts)


def csv_table_html(rows: Sequence[Mapping[str, str]], header: Sequence[str]) -> str:
    """A generic CSV table (the baselines and retrieval tables): text columns left, numbers right;
    published rows grey, skipped rows as notes."""
    text = {"dataset", "method", "source", "note"}
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body, prev = [], None
    for r in rows:
        cls = ["published" if r.get("source") == PUBLISHED else "run"]
        if r.get("dataset") != prev:
            cls.append("first")
        cells = []
        for h in header:
            v = r.get(h, "") or ""
            if h == "dataset":
                v = v if r.get("dataset") != prev else ""
            cells.append(f'<td>{esc(v)}</td>' if h in text else f'<td class="num">{esc(v)}</td>')
        prev = r.get("dataset")
        body.append(f'<tr class="{" ".join(cls)}">{"".join(cells)}</tr>')
    return f'<table class="metrics"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


EXTRA_TABLES = {  # name -> (title, caption)
    "baselines": ("Supervised baselines (captioning)",
                  "Scores &times; 100 on each dataset's test split; PPL = per-word perplexity of the test references. "
                  "The seeds' published rows name the paper's dataset. A dataset without paired training captions "
                  "is one <i>skipped</i> line."),
    "baselines_multilabel": ("S-CNN-RNN: the concept head as a multi-label classifier",
                             "Per-class (C-) and per-image (O-) precision / recall / F1 &times; 100 of the top-3 "
                             "concepts on the test images, against the concept words of their references, beside "
                             "a frequency baseline; the published rows are COCO's 80 object classes."),
    "retrieval": ("Image&ndash;sentence retrieval",
                  "Sent = sentence retrieval (image query), Img = image retrieval (sentence query); R@K in percent, "
                  "Med r = median rank of the first ground truth. m-RNN ranks by P(sentence | image) (sentence "
                  "retrieval normalised by P(sentence)); R2M by its joint space."),
}


def extra_tables_section(paths: Mapping[str, Path]) -> str:
    parts = []
    for name, path in paths.items():
        title, caption = EXTRA_TABLES[name]
        parts.append(f'<section id="{name}"><h2>{title}</h2>')
        if not Path(path).exists():
            parts.append(f'<p class="note">{esc(str(path))} is missing: run <code>r2m {name}</code>.</p></section>')
            continue
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = reader.fieldnames or []
        parts.append(csv_table_html(rows, header))
        parts.append(f'<p class="caption">{caption} Source: <code>{esc(Path(path).name)}</code>.</p></section>')
    return "\n".join(parts)


# --------------------------------------------------------------------------- figures
def _rel(target: Path, page_dir: Path) -> str:
    return Path(os.path.relpath(target, page_dir)).as_posix()


def example_html(ex: Mapping[str, Any], fig_dir: Path, page_dir: Path) -> str:
    thumb = ex.get("thumbnail")
    img = (f'<img src="{esc(_rel(fig_dir / thumb, page_dir))}" alt="image {esc(str(ex["image_id"]))}">'
           if thumb else '<div class="noimg">image unavailable</div>')
    concepts = "".join(f'<span class="tag">{esc(c["concept"])} {float(c["score"]):.2f}</span>'
                       for c in ex.get("concepts", [])) or "<i>none</i>"
    caps = "".join(f"<dt>{esc(c['label'])}</dt><dd>{esc(c['caption']) if c.get('caption') is not None else '<i>missing</i>'}</dd>"
                   for c in ex.get("captions", []))
    refs = "".join(f"<li>{esc(r)}</li>" for r in ex.get("references", [])) or "<li><i>none</i></li>"
    return (f'<div class="example">{img}<div><b>image {esc(str(ex["image_id"]))}</b><br>'
            f"Concepts: {concepts}<dl>{caps}</dl>References:<ul>{refs}</ul></div></div>")


def dataset_section(dataset: str, fig_dir: Path, page_dir: Path) -> str:
    index_path = fig_dir / "index.json"
    if not index_path.exists():
        return (f'<section id="ds-{esc(dataset)}"><h2>{esc(dataset)}</h2><p class="note">'
                f"{esc(str(index_path))} is missing: run <code>r2m figures --dataset {esc(dataset)}</code>.</p></section>")
    idx = read_json(index_path)
    parts = [f'<section id="ds-{esc(dataset)}"><h2>{esc(idx.get("label") or dataset)} '
             f'<small>({esc(dataset)})</small></h2>']
    parts += [f'<p class="note">{esc(n)}</p>' for n in idx.get("notes", [])]
    for fig in idx.get("figures", []):
        if fig.get("kind") == "examples":
            continue  # shown below as cards (the PNG is linked)
        src = fig_dir / fig["file"]
        if not src.exists():
            parts.append(f'<p class="note">figure file missing: {esc(str(src))}</p>')
            continue
        parts.append(f'<h3>{esc(fig.get("title", fig["file"]))}</h3><figure><img src="{esc(_rel(src, page_dir))}" '
                     f'alt="{esc(fig.get("title", ""))}"></figure><p class="caption">{esc(fig.get("caption", ""))}</p>')
    if idx.get("examples"):
        ex_fig = next((f for f in idx.get("figures", []) if f.get("kind") == "examples"), None)
        link = (f' (also as one figure: <a href="{esc(_rel(fig_dir / ex_fig["file"], page_dir))}">'
                f'{esc(ex_fig["file"])}</a>)') if ex_fig else ""
        parts.append(f"<h3>Qualitative examples</h3><p class=\"caption\">Detected concepts with scores, the "
                     f"caption after each training stage (R2M), and the references{link}.</p>")
        parts.append('<div class="examples">' + "".join(example_html(e, fig_dir, page_dir) for e in idx["examples"])
                     + "</div>")
    parts.append("</section>")
    return "\n".join(parts)


# --------------------------------------------------------------------------- page
def render_page(tables: Mapping[str, Path], figure_dirs: Sequence[tuple[str, Path]], page_path: Path,
                extra: Mapping[str, Path] | None = None) -> str:
    page_dir = page_path.parent
    extra = extra or {}
    nav = (['<a href="#tables">Tables</a>'] + [f'<a href="#{n}">{n.capitalize()}</a>' for n in extra]
           + [f'<a href="#ds-{esc(d)}">{esc(d)}</a>' for d, _ in figure_dirs])
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = ([tables_section(tables)] + ([extra_tables_section(extra)] if extra else [])
            + [dataset_section(d, Path(p), page_dir) for d, p in figure_dirs])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>R2M reproduction report</title><style>{CSS}</style></head>
<body><header><h1>R&sup2;M: Recurrent Relational Memory for unsupervised image captioning &mdash; reproduction</h1>
<p>Guo et al., IJCAI 2020. Tables 1&ndash;3 beside the published numbers; losses, attention and examples per dataset.</p></header>
<nav>{' '.join(nav)}</nav>
<main>
{chr(10).join(body)}
</main>
<footer>Generated by <code>r2m report</code> on {stamp}.</footer>
</body></html>
"""


def attention_section(fig_dir: Path, page_dir: Path) -> str:
    """Show, Attend and Tell's per-word attention maps and its attention hit rate (from the baselines stage)."""
    index = Path(fig_dir) / "index.json"
    if not index.exists():
        return ""
    import json

    idx = json.loads(index.read_text())
    if not idx.get("figures") and not idx.get("notes"):
        return ""
    parts = ['<section id="sat-attention"><h2>Show, Attend and Tell: where it looks</h2>']
    parts += [f'<p>{esc(n)}</p>' for n in idx.get("notes", [])]
    for fig in idx.get("figures", []):
        src = _rel(Path(fig_dir) / fig["file"], page_dir)
        parts.append(f'<figure><img src="{esc(src)}" alt="attention maps" style="max-width:100%">'
                     f'<figcaption>{esc(fig["dataset"])}, image {esc(str(fig["image_id"]))}: '
                     f'&ldquo;{esc(fig["caption"])}&rdquo; (&alpha; per word, upsampled and smoothed)</figcaption></figure>')
    parts.append("</section>")
    return "\n".join(parts)


def run(ctx) -> None:
    tables = {name: ctx.deps[name] for name in ("table1", "table2", "table3")}
    figs = [(keys["dataset"], Path(path)) for keys, path in ctx.gather("figures")]
    out = ctx.outs["html"]
    extra = {name: ctx.deps[name] for name in EXTRA_TABLES if name in ctx.deps}
    page = render_page(tables, figs, Path(out), extra)
    if "baselines_attention" in ctx.deps:
        att = attention_section(Path(ctx.deps["baselines_attention"]), Path(out).parent)
        page = page.replace("\n</main>", "\n" + att + "\n</main>") if att else page
    write_text(out, page)
    ctx.log.info("report: wrote %s", out)

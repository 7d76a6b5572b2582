"""``reports/index.html``: one static, self-contained page (inline CSS, no scripts) with Tables 1–3
and each dataset's figures and qualitative examples, and a red "random weights" line for every
dataset whose features or detector ran with random weights (:func:`random_weight_rows`). Images are referenced by relative paths
(``figures/<dataset>/*.png``) so the page works when the ``reports/`` folder is opened or copied.

The page comes from a Jinja2 template with auto-escaping, like the caption gallery
(:mod:`r2m.reports.gallery`): the functions here turn the tables' CSV files and the figures'
``index.json`` into plain data (dataset names, captions, notes, file names, paths: all text, never
markup), and :data:`PAGE` (with its parts from :data:`MACROS`) lays them out. The only markup marked safe is written in this module:
the titles and captions of :data:`EXTRA_TABLES` (constants with entities and ``<i>``), and the
template's own macros (whose values are escaped inside them).
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from markupsafe import Markup

from r2m.reports import intervals as I
from r2m.reports.published import COLUMNS
from r2m.reports.tables import CONCEPT_COLUMNS, CONCEPT_NOTE, PUBLISHED, SCOPE_COLUMNS, TABLES
from r2m.stage.context import StageContext
from r2m.utils.io import read_json, write_text
from r2m.vision.weights import RANDOM_BY_DEFINITION, uses_random_weights

# A trailing backslash joins a line to the next (one HTML line, short template lines).
MACROS = """\
{% macro metrics_table(t) %}
<table class="metrics"><thead><tr>{% for h in t.header %}<th>{{ h }}</th>{% endfor %}</tr></thead><tbody>\
{% for r in t.rows %}<tr class="{{ r.cls }}">\
{% for c in r.cells %}<td{% if c.num %} class="num"{% endif %}>{{ c.value }}\
{% if c.ci %}<br><small class="ci">{{ c.ci }}</small>{% endif %}</td>{% endfor %}</tr>{% endfor %}\
</tbody></table>
{%- endmacro %}
{% macro interval_parts(t) %}
{% if t.diffs %}
<p class="caption"><b>Differences</b> (row &minus; reference, &times; 100: the means over the seeds both rows ran, \
named in &ldquo;vs&rdquo; when one row has seeds the other lacks, on the images both scored; * = Holm-adjusted p \
&le; 0.05 within the family of the table&rsquo;s comparisons on that dataset and metric, n.s. = not, with the minimum \
detectable effect (mde) beside it):</p>
{{ metrics_table(t.diffs) }}
{% endif %}
{% if t.sentence %}<p class="caption">{{ t.sentence }}</p>{% endif %}
{%- endmacro %}
{% macro missing(path, command) %}
<p class="note">{{ path }} is missing: run <code>r2m {{ command }}</code>.</p>
{%- endmacro %}
{% macro tables_section(tables, concept_note) %}
<section id="tables"><h2>Tables</h2>
<p class="caption">Scores &times; 100 (B = BLEU, M = METEOR, R = ROUGE-L, C = CIDEr, S = SPICE). \
<i>Italic grey</i> rows are the paper's published numbers, <b>bold</b> rows this run. \
Empty cells: not reported in the paper, or not computed here \
(SPICE needs Stanford CoreNLP jars that are not available offline). Below each value of this run: its \
95&nbsp;% interval [low, high] &mdash; t over the seeds and the test images (variance components: the seeds&rsquo; \
spread and the image component from 1,000 bootstrap draws, fixed seed; one seed: over the images). {{ concept_note }}</p>
{% for t in tables %}
<h3 id="{{ t.name }}">Table {{ t.number }}: {{ t.title }}</h3>
{% if t.table is none %}
{{ missing(t.path, t.name) }}
{% else %}
{{ metrics_table(t.table) }}
{{ interval_parts(t.table) }}
<p class="caption">{{ t.note }} Source: <code>{{ t.source }}</code>.</p>
{% endif %}
{% endfor %}
</section>
{%- endmacro %}
{% macro claims_section(c) %}
<section id="claims"><h2>The paper&rsquo;s claims</h2>
{% if c.rows is none %}
{{ missing(c.path, "claims") }}</section>
{%- else %}
<p class="caption">Each claim the paper makes with Tables 1&ndash;3, tested on this run&rsquo;s datasets: \
<b>supported</b> = the difference (higher &minus; lower, &times; 100) has its {{ c.level }} interval wholly \
above 0 and its adjusted p &lt; {{ c.alpha }}; <b>contradicted</b> = wholly below 0 with adjusted p \
&lt; {{ c.alpha }}; <b>unresolved</b> = neither (the note gives the relative difference beside the published one, and how \
many test images or seeds would detect the published effect with 80&nbsp;% power after the correction); <b>not testable here</b> = this run has no pair of rows \
to compare. A verdict is about this run&rsquo;s data, not a reproduction of the paper&rsquo;s benchmark numbers. \
{{ c.counts }}.</p>
<table class="metrics"><thead><tr>{% for h in c.header %}<th>{{ h }}</th>{% endfor %}</tr></thead><tbody>\
{% for r in c.rows %}<tr class="run"><td>{{ r.statement }}<br><small class="ci">{{ r.claim }}; published: \
{{ r.published }}</small></td><td>{{ r.dataset }}</td><td>{{ r.comparison }} ({{ r.metric }})</td>\
<td class="num">{{ r.difference }}{% if r.interval %}<br><small class="ci">{{ r.interval }}</small>{% endif %}</td>\
<td class="num">{{ r.p }}</td><td class="num">{{ r.p_adjusted }}</td><td class="num">{{ r.seeds }}</td>\
<td class="num">{{ r.images }}</td><td><span class="verdict {{ r.cls }}">{{ r.verdict }}</span></td>\
<td>{{ r.note }}</td></tr>{% endfor %}</tbody></table>
<p class="caption">{% for t in c.tests %}Test: {{ t }}. {% endfor %}{% for t in c.corrections %}Correction: {{ t }}. \
{% endfor %}Source: <code>{{ c.source }}</code>.</p></section>
{%- endif %}
{%- endmacro %}
{% macro extra_section(t) %}
<section id="{{ t.name }}"><h2>{{ t.title }}</h2>
{% if t.table is none %}
{{ missing(t.path, t.name) }}</section>
{%- else %}
{{ metrics_table(t.table) }}
{{ interval_parts(t.table) }}
<p class="caption">{{ t.caption }} Source: <code>{{ t.source }}</code>.</p></section>
{%- endif %}
{% endmacro %}
{% macro example(e) %}
<div class="example">\
{% if e.thumb %}<img src="{{ e.thumb }}" alt="image {{ e.image_id }}">\
{% else %}<div class="noimg">image unavailable</div>{% endif %}\
<div><b>image {{ e.image_id }}</b><br>Concepts: \
{% for c in e.concepts %}<span class="tag">{{ c.concept }} {{ c.score }}</span>{% else %}<i>none</i>{% endfor %}\
<dl>{% for c in e.captions %}<dt>{{ c.label }}</dt>\
<dd>{% if c.caption is none %}<i>missing</i>{% else %}{{ c.caption }}{% endif %}</dd>{% endfor %}</dl>\
References:<ul>{% for r in e.references %}<li>{{ r }}</li>{% else %}<li><i>none</i></li>{% endfor %}</ul>\
</div></div>
{%- endmacro %}
{% macro weights_section(rows) %}
<section id="weights"><h2>Random weights</h2>
{% for r in rows %}
<p class="random"><span class="badge">random weights</span> <b>{{ r.dataset }}</b>: {{ r.what }} (<code>{{ r.section }}</code>, backend <code>{{ r.backend }}</code>: {{ r.why }}) &mdash; its numbers do not measure pretrained weights.</p>
{% endfor %}
</section>
{%- endmacro %}
{% macro dataset_section(d) %}
{% if d.index_missing %}
<section id="ds-{{ d.dataset }}"><h2>{{ d.dataset }}</h2><p class="note">{{ d.index_missing }} is missing: \
run <code>r2m figures --dataset {{ d.dataset }}</code>.</p></section>
{%- else %}
<section id="ds-{{ d.dataset }}"><h2>{{ d.label }} <small>({{ d.dataset }})</small></h2>
{% for r in d.random_weights %}
<p class="random"><span class="badge">random weights</span> {{ r.what }} (<code>{{ r.section }}</code>, backend <code>{{ r.backend }}</code>: {{ r.why }})</p>
{% endfor %}
{% for n in d.notes %}
<p class="note">{{ n }}</p>
{% endfor %}
{% for f in d.figures %}
{% if f.missing %}
<p class="note">figure file missing: {{ f.missing }}</p>
{% else %}
<h3>{{ f.title }}</h3><figure><img src="{{ f.src }}" alt="{{ f.alt }}"></figure>\
<p class="caption">{{ f.caption }}</p>
{% endif %}
{% endfor %}
{% if d.examples %}
<h3>Qualitative examples</h3><p class="caption">Detected concepts with scores, the caption after each training \
stage (R2M), and the references\
{% if d.examples_link %} (also as one figure: <a href="{{ d.examples_link.href }}">{{ d.examples_link.file }}</a>)\
{% endif %}.</p>
<div class="examples">{% for e in d.examples %}{{ example(e) }}{% endfor %}</div>
{% endif %}
</section>
{%- endif %}
{% endmacro %}
{% macro attention_section(a) %}
<section id="sat-attention"><h2>Show, Attend and Tell: where it looks</h2>
{% for n in a.notes %}
<p>{{ n }}</p>
{% endfor %}
{% for f in a.figures %}
<figure><img src="{{ f.src }}" alt="attention maps" style="max-width:100%"><figcaption>{{ f.dataset }}, \
{% if f.model %}{{ f.model }}, {% endif %}image {{ f.image_id }}: &ldquo;{{ f.caption }}&rdquo; (&alpha; per word, upsampled and smoothed)</figcaption></figure>
{% endfor %}
</section>
{%- endmacro %}
"""

PAGE = """\
{% from "macros" import tables_section, claims_section, extra_section, dataset_section, attention_section, \
weights_section %}
<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>R2M reproduction report</title><style>
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
table.metrics small.ci{color:#6b7680;font-weight:400;white-space:nowrap}
.note{color:#8a5a00;background:#fff6e0;border-left:3px solid #e0a800;padding:4px 10px;font-size:13px;margin:4px 0}
.caption{font-size:13px;color:#444;margin:2px 0 14px}
figure{margin:12px 0} figure img{max-width:100%;border:1px solid #d5dbe1;background:#fff}
.examples{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:14px}
.example{display:flex;gap:12px;background:#fff;border:1px solid #d5dbe1;padding:10px;font-size:13px}
.example img{width:180px;height:auto;object-fit:contain;align-self:flex-start}
.example .noimg{width:180px;height:120px;display:flex;align-items:center;justify-content:center;background:#eee;\
color:#888}
.example ul{margin:2px 0 6px;padding-left:18px} .example dt{font-weight:600;margin-top:4px}
.example dd{margin:0 0 0 10px} .tag{display:inline-block;background:#e6eef6;border-radius:3px;padding:0 5px;margin:1px}
footer{font-size:12px;color:#777;padding:0 32px 24px}
.random{color:#7a1010;background:#fde8e8;border-left:3px solid #c62828;padding:4px 10px;font-size:13px;margin:4px 0}
.verdict{display:inline-block;border-radius:3px;padding:0 6px;font-weight:600}
.verdict.supported{background:#dff3e3;color:#1b5e20} .verdict.contradicted{background:#fde8e8;color:#7a1010}
.verdict.unresolved{background:#fff6e0;color:#8a5a00} .verdict.untestable{background:#eef1f4;color:#5f6b76}
.badge{display:inline-block;background:#c62828;color:#fff;border-radius:3px;padding:0 6px;font-weight:600}
</style></head>
<body><header><h1>R&sup2;M: Recurrent Relational Memory for unsupervised image captioning &mdash; reproduction</h1>
<p>Guo et al., IJCAI 2020. Tables 1&ndash;3 beside the published numbers; losses, attention and examples per \
dataset.</p></header>
<nav>{% for link in nav %}{% if not loop.first %} {% endif %}<a href="#{{ link.id }}">{{ link.text }}</a>\
{% endfor %}</nav>
<main>
{% if random_weights %}
{{ weights_section(random_weights) }}
{% endif %}
{{ tables_section(tables, concept_note) }}
{% if claims %}
{{ claims_section(claims) }}
{% endif %}
{% for t in extra %}
{{ extra_section(t) }}
{% endfor %}
{% for d in datasets %}
{{ dataset_section(d) }}
{% endfor %}
{% if attention %}
{{ attention_section(attention) }}
{% endif %}
</main>
<footer>Generated by <code>r2m report</code> on {{ stamp }}.</footer>
</body></html>
"""


@cache
def _env() -> Any:
    """The templates (``page`` imports its parts from ``macros``), auto-escaping every value."""
    import jinja2

    return jinja2.Environment(loader=jinja2.DictLoader({"macros": MACROS, "page": PAGE}), autoescape=True,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
                              lstrip_blocks=True)


# --------------------------------------------------------------------------- tables
def read_table_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _row_class(r: Mapping[str, str], prev: str | None) -> str:
    cls = ["published" if r.get("source") == PUBLISHED else "run"]
    return " ".join(cls + (["first"] if r.get("dataset") != prev else []))


def _cell(r: Mapping[str, str], column: str, num: bool) -> dict[str, Any]:
    """A cell: its value and, when the CSV gives one, its interval ``[low, high]``."""
    lo, hi = r.get(f"{column}_lo", "") or "", r.get(f"{column}_hi", "") or ""
    return {"value": r.get(column, "") or "", "num": num, "ci": f"[{lo}, {hi}]" if lo and hi else ""}


def _diff_cell(r: Mapping[str, str], column: str) -> dict[str, Any]:
    """A paired difference: ``+1.2 n.s.`` with its interval below it."""
    d = r.get(f"d_{column}", "") or ""
    if not d:
        return {"value": "", "num": True, "ci": ""}
    return {"value": f"{'' if d.startswith('-') else '+'}{d} {r.get(f'd_{column}_mark', '')}", "num": True,
            "ci": f"[{r.get(f'd_{column}_lo', '')}, {r.get(f'd_{column}_hi', '')}]"}


def interval_parts(rows: Sequence[Mapping[str, str]], header: Sequence[str]) -> dict[str, Any]:
    """The paired differences of the rows compared with a reference (``vs``) as a table, and the
    sentence saying how many seeds and images stand behind the table (none without ``seeds``)."""
    if "seeds" not in header:
        return {"diffs": None, "sentence": ""}
    cols = I.diff_columns(header)
    compared = [r for r in rows if r.get("vs")]
    diffs = {"header": ["Dataset", "Method", "vs", *cols],
             "rows": [{"cls": "run", "cells": [{"value": r.get(k, "") or "", "num": False, "ci": ""}
                                               for k in ("dataset", "method", "vs")]
                       + [_diff_cell(r, c) for c in cols]} for r in compared]}
    return {"diffs": diffs if compared and cols else None, "sentence": I.table_sentence(rows, cols)}


def table_view(rows: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """Tables 1–3 as data: the paper's columns, the concept columns (each value with its interval
    below it), seeds and interval, and the scope columns (split, images, note: what each row scored)
    present in the CSV; a dataset's name on its first row only; the paired differences and the
    table's sentence (:func:`interval_parts`)."""
    header = list(rows[0]) if rows else []
    cols = [*COLUMNS, *(c for c in CONCEPT_COLUMNS if c in header)]
    counts = [c for c in ("seeds", "interval") if c in header]
    scope = [c for c in SCOPE_COLUMNS if c in header]
    body, prev = [], None
    for r in rows:
        cells = [{"value": r.get("dataset", "") if r.get("dataset") != prev else "", "num": False, "ci": ""},
                 {"value": r.get("method", ""), "num": False, "ci": ""},
                 {"value": r.get("source", ""), "num": False, "ci": ""}]
        cells += [_cell(r, c, True) for c in cols]
        cells += [_cell(r, c, c in ("seeds", "images")) for c in (*counts, *scope)]
        body.append({"cls": _row_class(r, prev), "cells": cells})
        prev = r.get("dataset")
    return {"header": ["Dataset", "Method", "Source", *cols, *counts, *scope], "rows": body,
            **interval_parts(rows, header)}


def table_html(rows: Sequence[Mapping[str, str]]) -> str:
    """One of Tables 1–3 as an HTML ``<table>`` (every cell escaped)."""
    return str(_env().get_template("macros").module.metrics_table(table_view(rows)))


def csv_table_view(rows: Sequence[Mapping[str, str]], header: Sequence[str]) -> dict[str, Any]:
    """A generic CSV table (the baselines and retrieval tables) as data: text columns left, numbers
    right, each value with its interval below it; published rows grey, skipped rows as notes; the
    paired differences and the table's sentence (:func:`interval_parts`)."""
    text = {"dataset", "method", "source", "note", "interval", "split"}
    cols = I.display_columns(header)
    body, prev = [], None
    for r in rows:
        cells = [_cell(r, h, h not in text) for h in cols]
        if r.get("dataset") == prev:
            cells[cols.index("dataset")] = {"value": "", "num": False, "ci": ""}
        body.append({"cls": _row_class(r, prev), "cells": cells})
        prev = r.get("dataset")
    return {"header": cols, "rows": body, **interval_parts(rows, header)}


def tables_view(paths: Mapping[str, Path]) -> list[dict[str, Any]]:
    """Tables 1–3: title, note and rows of each (``table`` None: its CSV is missing)."""
    out = []
    for name, path in paths.items():
        spec, path = TABLES[name], Path(path)
        out.append({"name": name, "number": spec.number, "title": spec.title, "note": spec.note,
                    "path": str(path), "source": path.name,
                    "table": table_view(read_table_csv(path)) if path.exists() else None})
    return out


EXTRA_TABLES = {  # name -> (title, caption): markup written here (entities, <i>), marked safe
    "baselines": (Markup("Supervised baselines (captioning)"),
                  Markup("Scores &times; 100 on each dataset's test split; PPL = per-word perplexity of the test "
                         "references. The seeds' published rows name the paper's dataset. A dataset without paired "
                         "training captions is one <i>skipped</i> line.")),
    "baselines_multilabel": (Markup("S-CNN-RNN: the concept head as a multi-label classifier"),
                             Markup("Per-class (C-) and per-image (O-) precision / recall / F1 &times; 100 of the "
                                    "top-3 concepts on the test images, against the concept words of their "
                                    "references, beside a frequency baseline; the published rows are COCO's 80 "
                                    "object classes.")),
    "retrieval": (Markup("Image&ndash;sentence retrieval"),
                  Markup("Sent = sentence retrieval (image query), Img = image retrieval (sentence query); R@K in "
                         "percent, Med r = median rank of the first ground truth. m-RNN ranks by P(sentence | image) "
                         "(sentence retrieval normalised by P(sentence)); R2M by its joint space.")),
}


def extra_tables_view(paths: Mapping[str, Path]) -> list[dict[str, Any]]:
    """The baselines' and retrieval tables (``table`` None: its CSV is missing)."""
    out = []
    for name, path in paths.items():
        title, caption = EXTRA_TABLES[name]
        path, table = Path(path), None
        if path.exists():
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                rows = list(reader)
                table = csv_table_view(rows, reader.fieldnames or [])
        out.append({"name": name, "title": title, "caption": caption, "path": str(path), "source": path.name,
                    "table": table})
    return out


def claims_view(path: Path | None) -> dict[str, Any] | None:
    """``reports/claims.csv`` as data for the "Claims" section (``rows`` None: the file is missing; None:
    no claims file is part of this page)."""
    if path is None:
        return None
    from r2m.reports import claims as CL

    path = Path(path)
    view: dict[str, Any] = {"path": str(path), "source": path.name, "rows": None, "alpha": f"{CL.ALPHA:g}",
                            "level": "95 %", "header": ["Claim", "Dataset", "Comparison", "Difference", "p",
                                                       "adjusted p", "Seeds", "Images", "Verdict", "Note"]}
    if not path.exists():
        return view
    rows = read_table_csv(path)
    cls = {CL.SUPPORTED: "supported", CL.CONTRADICTED: "contradicted", CL.UNRESOLVED: "unresolved"}
    view.update(
        counts=CL.counts_sentence(rows).capitalize(),
        tests=sorted({r["test"] for r in rows if r.get("test")}),
        corrections=sorted({r["correction"] for r in rows if r.get("correction")}),
        rows=[{**{k: r.get(k, "") for k in ("claim", "statement", "published", "dataset", "comparison", "metric",
                                            "p", "p_adjusted", "seeds", "images", "verdict", "note")},
               "difference": (("+" if not r["difference"].startswith("-") else "") + r["difference"])
               if r.get("difference") else "",
               "interval": f"[{r['low']}, {r['high']}]" if r.get("low") and r.get("high") else "",
               "cls": cls.get(r.get("verdict", ""), "untestable")} for r in rows])
    return view


# --------------------------------------------------------------------------- figures
def _rel(target: Path, page_dir: Path) -> str:
    return Path(os.path.relpath(target, page_dir)).as_posix()


def example_view(ex: Mapping[str, Any], fig_dir: Path, page_dir: Path) -> dict[str, Any]:
    """One qualitative example: thumbnail, concepts with scores, each stage's caption, references."""
    thumb = ex.get("thumbnail")
    return {"thumb": _rel(fig_dir / thumb, page_dir) if thumb else None, "image_id": str(ex["image_id"]),
            "concepts": [{"concept": c["concept"], "score": f"{float(c['score']):.2f}"}
                         for c in ex.get("concepts", [])],
            "captions": [{"label": c["label"], "caption": c.get("caption")} for c in ex.get("captions", [])],
            "references": list(ex.get("references", []))}


def _figure_view(fig: Mapping[str, Any], fig_dir: Path, page_dir: Path) -> dict[str, Any]:
    src = fig_dir / fig["file"]
    if not src.exists():
        return {"missing": str(src)}
    return {"missing": None, "title": fig.get("title", fig["file"]), "src": _rel(src, page_dir),
            "alt": fig.get("title", ""), "caption": fig.get("caption", "")}


# the params sections whose backend makes a dataset's inputs: (section, what it makes, which datasets)
WEIGHT_SECTIONS = (("extract_features", "R2M image features", "datasets"),
                   ("detect_concepts", "concept detector", "datasets"),
                   ("sup_features", "supervised baselines' image features", "baselines"))


def random_weight_rows(params: Any) -> list[dict[str, str]]:
    """One row per dataset and params section whose backend runs with random weights
    (:func:`r2m.vision.weights.uses_random_weights`: ``options.random_init: true``, or a backend
    random by definition such as ``random_cnn``), as each dataset's stages see the section: the top
    level with the dataset's catalog ``overrides`` of it deep-merged over (only those sections are
    read, so the stage declares exactly them)."""
    from r2m.params import deep_merge

    chosen = {"datasets": list(params.datasets), "baselines": list(params.baselines.datasets)}
    rows = []
    for name in dict.fromkeys(chosen["datasets"] + chosen["baselines"]):
        entry = params.catalog.get(name)
        overrides = entry.overrides if entry is not None else {}
        for section, what, group in WEIGHT_SECTIONS:
            if name not in chosen[group]:
                continue
            sec = getattr(params, section)
            view = deep_merge({"backend": sec.backend, "options": dict(sec.options)}, overrides.get(section) or {})
            if uses_random_weights(view["backend"], view["options"]):
                why = ("random by definition" if view["backend"] in RANDOM_BY_DEFINITION
                       else "options.random_init: true")
                rows.append({"dataset": name, "what": what, "section": section, "backend": view["backend"],
                             "why": why})
    return rows


def dataset_view(dataset: str, fig_dir: Path, page_dir: Path,
                 random_weights: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
    """A dataset's section from its ``figures`` stage's ``index.json`` (``index_missing``: its path
    when the stage has not run); ``random_weights``: its rows of :func:`random_weight_rows`."""
    index_path = fig_dir / "index.json"
    if not index_path.exists():
        return {"dataset": dataset, "index_missing": str(index_path)}
    idx = read_json(index_path)
    figs = idx.get("figures", [])
    ex_fig = next((f for f in figs if f.get("kind") == "examples"), None)  # shown as cards; the PNG is linked
    return {"dataset": dataset, "index_missing": None, "label": idx.get("label") or dataset,
            "random_weights": [dict(r) for r in random_weights if r["dataset"] == dataset],
            "notes": list(idx.get("notes", [])),
            "figures": [_figure_view(f, fig_dir, page_dir) for f in figs if f.get("kind") != "examples"],
            "examples": [example_view(e, fig_dir, page_dir) for e in idx.get("examples") or []],
            "examples_link": ({"href": _rel(fig_dir / ex_fig["file"], page_dir), "file": ex_fig["file"]}
                              if ex_fig else None)}


def attention_view(fig_dir: Path, page_dir: Path) -> dict[str, Any] | None:
    """Show, Attend and Tell's per-word attention maps and its attention hit rate (from the baselines
    stage), or None when there is nothing to show."""
    index = Path(fig_dir) / "index.json"
    if not index.exists():
        return None
    idx = json.loads(index.read_text())
    if not idx.get("figures") and not idx.get("notes"):
        return None
    return {"notes": list(idx.get("notes", [])),
            "figures": [{"src": _rel(Path(fig_dir) / f["file"], page_dir), "dataset": f["dataset"],
                         "image_id": str(f["image_id"]), "caption": f["caption"], "model": f.get("model", "")}
                        for f in idx.get("figures", [])]}


# --------------------------------------------------------------------------- page
def render_page(tables: Mapping[str, Path], figure_dirs: Sequence[tuple[str, Path]], page_path: Path,
                extra: Mapping[str, Path] | None = None, attention_dir: Path | None = None,
                random_weights: Sequence[Mapping[str, str]] = (), claims: Path | None = None) -> str:
    """The report page: the random-weights lines (rows of :func:`random_weight_rows`), Tables 1–3,
    the ``extra`` tables, each dataset's figures and (from ``attention_dir``) Show, Attend and Tell's
    attention maps, and (from ``claims``, ``reports/claims.csv``) the verdict on each of the paper's claims; every
    value auto-escaped."""
    page_dir = page_path.parent
    extra = extra or {}
    nav = ([{"id": "weights", "text": "Random weights"}] if random_weights else []) + (
        [{"id": "tables", "text": "Tables"}] + ([{"id": "claims", "text": "Claims"}] if claims is not None else [])
        + [{"id": n, "text": n.capitalize()} for n in extra]
        + [{"id": f"ds-{d}", "text": d} for d, _ in figure_dirs])
    return _env().get_template("page").render(
        nav=nav, tables=tables_view(tables), concept_note=CONCEPT_NOTE, extra=extra_tables_view(extra),
        datasets=[dataset_view(d, Path(p), page_dir, random_weights) for d, p in figure_dirs],
        random_weights=[dict(r) for r in random_weights], claims=claims_view(claims),
        attention=attention_view(Path(attention_dir), page_dir) if attention_dir is not None else None,
        stamp=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"))


def run(ctx: StageContext) -> None:
    tables = {name: ctx.deps[name] for name in ("table1", "table2", "table3")}
    figs = [(keys["dataset"], Path(path)) for keys, path in ctx.gather("figures")]
    out = ctx.outs["html"]
    extra = {name: ctx.deps[name] for name in EXTRA_TABLES if name in ctx.deps}
    attention = Path(ctx.deps["baselines_attention"]) if "baselines_attention" in ctx.deps else None
    # the backends come from params: a change there changes the features or detections and so the tables above
    claims = Path(ctx.deps["claims"]) if "claims" in ctx.deps else None
    write_text(out, render_page(tables, figs, Path(out), extra, attention, random_weight_rows(ctx.params), claims))
    ctx.log.info("report: wrote %s", out)

"""``reports/index.html``: one static, self-contained page (inline CSS, no scripts) with Tables 1–3,
the verdict on each of the paper's claims, each dataset's figures and qualitative examples, and a red
"random weights" line for every dataset whose features or detector ran with random weights
(:func:`random_weight_rows`). Images are referenced by relative paths (``figures/<dataset>/*.png``) so
the page works when the ``reports/`` folder is opened or copied. It reads at a desktop's and a phone's
width (``tests/test_report_browser.py`` opens it in Chromium), and the same files give the same bytes
(no date on the page).

The page comes from the template files ``templates/report.html`` and ``templates/report_parts.html``
(:mod:`r2m.reports.pages`, auto-escaping, shared with the caption gallery): the functions here turn the
tables' CSV files, ``claims.csv`` and the figures' ``index.json`` into plain data (dataset names,
captions, notes, file names, paths: all text, never markup), and the templates lay them out. The only
markup marked safe is written in this module: the titles and captions of :data:`EXTRA_TABLES`
(constants with entities and ``<i>``).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from markupsafe import Markup

from r2m.reports import cells as CL
from r2m.reports.pages import environment, render
from r2m.reports.published import COLUMNS, METRIC_OF
from r2m.reports.tables import CONCEPT_COLUMNS, CONCEPT_NOTE, PUBLISHED, SCOPE_COLUMNS, TABLES
from r2m.stage.context import StageContext
from r2m.utils.io import read_json, write_text
from r2m.vision.weights import RANDOM_BY_DEFINITION, uses_random_weights


def _macros() -> Any:
    """The report's parts (``templates/report_parts.html``), for the functions that render one of them."""
    return environment().get_template("report_parts.html").module


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
    cols = CL.diff_columns(header)
    compared = [r for r in rows if r.get("vs")]
    diffs = {"header": ["Dataset", "Method", "vs", *cols],
             "rows": [{"cls": "run", "cells": [{"value": r.get(k, "") or "", "num": False, "ci": ""}
                                               for k in ("dataset", "method", "vs")]
                       + [_diff_cell(r, c) for c in cols]} for r in compared]}
    return {"diffs": diffs if compared and cols else None, "sentence": CL.table_sentence(rows, cols)}


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
    return str(_macros().metrics_table(table_view(rows)))


def csv_table_view(rows: Sequence[Mapping[str, str]], header: Sequence[str]) -> dict[str, Any]:
    """A generic CSV table (the baselines and retrieval tables) as data: text columns left, numbers
    right, each value with its interval below it; published rows grey, skipped rows as notes; the
    paired differences and the table's sentence (:func:`interval_parts`)."""
    text = {"dataset", "method", "source", "note", "interval", "split"}
    cols = CL.display_columns(header)
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


# claims.csv's columns a claim's card shows in its head (verdict, where, statement), its effect line and its
# note; every other column goes to the card's folded details, labelled here or else by its own name (so a
# column added to claims.csv shows up without a change here), in this order; an empty or absent one is left out
CLAIM_SHOWN = ("verdict", "dataset", "table", "statement", "comparison", "metric", "difference", "low", "high",
               "p_adjusted", "seeds", "images", "published", "note")
CLAIM_DETAILS = {"claim": "Claim", "p": "p (unadjusted)",
                 "test": "Test", "correction": "Correction", "level": "Interval level",
                 "images_to_resolve": "Test images to resolve", "seeds_to_resolve": "Seed pairs to resolve"}


def _signed(value: str) -> str:
    return value if not value or value.startswith(("-", "+", "\u2212")) else f"+{value}"


def claim_card(row: Mapping[str, str], classes: Mapping[str, str]) -> dict[str, Any]:
    """One row of ``claims.csv`` as a claim's card: its verdict (and CSS class from ``classes``), dataset,
    table, statement, effect line (``label``, ``value``: the difference with its interval, the adjusted p,
    the seeds and images behind it), the published numbers, note and details (``label``, ``value``: every
    other non-empty column)."""
    get = {k: (v or "").strip() for k, v in row.items() if k}.get
    difference = _signed(get("difference", ""))
    if difference and get("low", "") and get("high", ""):
        difference += f" [{get('low', '')}, {get('high', '')}]"
    what = ", ".join(v for v in (get("comparison", ""), METRIC_OF.get(get("metric", ""), get("metric", ""))) if v)
    effect = [(f"{what or 'difference'} \u00d7 100", difference),
              ("adjusted p", get("p_adjusted", "")), ("seeds", get("seeds", "")), ("test images", get("images", ""))]
    others = [k for k in row if k and k not in CLAIM_SHOWN and k not in CLAIM_DETAILS]
    details = [(CLAIM_DETAILS.get(k, k.replace("_", " ")), get(k, "")) for k in (*CLAIM_DETAILS, *others)]
    verdict = get("verdict", "")
    return {"verdict": verdict, "cls": classes.get(verdict, "untestable"), "dataset": get("dataset", ""),
            "table": get("table", ""), "statement": get("statement", ""), "claim": get("claim", ""),
            "published": get("published", ""), "note": get("note", ""),
            "effect": [{"label": label, "value": value} for label, value in effect if value],
            "details": [{"label": label, "value": value} for label, value in details if value]}


def claims_view(path: Path | None) -> dict[str, Any] | None:
    """``reports/claims.csv`` as data for the "Claims" section, one card per row (:func:`claim_card`; ``rows``
    None: the file is missing; None: no claims file is part of this page)."""
    if path is None:
        return None
    from r2m.reports import claims as CL

    path = Path(path)
    view: dict[str, Any] = {"path": str(path), "source": path.name, "rows": None, "alpha": f"{CL.ALPHA:g}",
                            "level": "95 %"}
    if not path.exists():
        return view
    rows = read_table_csv(path)
    classes = {CL.SUPPORTED: "supported", CL.CONTRADICTED: "contradicted", CL.UNRESOLVED: "unresolved"}
    cards, ids = [], set()
    for r in rows:
        card = claim_card(r, classes)
        base = "claim-" + "-".join(v for v in (card["claim"], card["dataset"]) if v) if card["claim"] else "claim"
        card["id"], n = base, 1
        while card["id"] in ids:  # one id each, so a link to a card lands on it
            n += 1
            card["id"] = f"{base}-{n}"
        ids.add(card["id"])
        cards.append(card)
    view.update(counts=CL.counts_sentence(rows).capitalize(),
                tests=sorted({r["test"] for r in rows if r.get("test")}),
                corrections=sorted({r["correction"] for r in rows if r.get("correction")}), rows=cards)
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
    return render("report.html",
                  nav=nav, tables=tables_view(tables), concept_note=CONCEPT_NOTE, extra=extra_tables_view(extra),
                  datasets=[dataset_view(d, Path(p), page_dir, random_weights) for d, p in figure_dirs],
                  random_weights=[dict(r) for r in random_weights], claims=claims_view(claims),
                  attention=attention_view(Path(attention_dir), page_dir) if attention_dir is not None else None)


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

"""The supervised baselines' tables: ``reports/baselines.csv|md`` (captioning metrics per dataset and
model, the "most frequent training caption" reference point, and the seeds' published numbers with
their dataset named) and ``reports/retrieval.csv|md`` (R@K, Med r for every supervised model and
for R²M through its joint space, the chance level of this run's test set, and m-RNN's published
rows). A dataset without paired training captions is one "skipped" line saying why.

Every row of this run carries its 95 % intervals, ``seeds``, ``images`` and ``interval``
(:mod:`r2m.reports.intervals`, the cells :mod:`r2m.reports.cells`); each baseline is compared with the most-frequent-caption reference
point (randomization test over images and seeds, Holm within the table; ``vs``, ``d_seeds``, ``d_C``, ``d_C_lo``, ``d_C_hi``, ``d_C_p``, ``d_C_holm``, ``d_C_mark``).
R@K and Med r get a bootstrap interval over the queries when ``retrieval.json`` keeps per-query ranks.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from r2m.params import SUP_MODEL_LABELS
from r2m.reports import cells as CL
from r2m.reports import intervals as I
from r2m.reports import published as P
from r2m.reports.tables import PUBLISHED, PUBLISHED_SCOPE, THIS_RUN, apply_holm, fmt, scope_cells
from r2m.stage.context import StageContext
from r2m.utils.io import atomic_path, read_json, write_text

SKIPPED = "skipped"
REFERENCE = "reference point"
CHANCE = "chance"
# row labels: each baseline's from its catalogue entry (r2m.baselines.BASELINES), plus R2M's and
# the reference point's
MODEL_LABELS = {**SUP_MODEL_LABELS, "r2m": "R2M (joint space)", "mostfreq": "most frequent training caption"}

BASE_COLUMNS = (*P.COLUMNS, "PPL")
BASE_HEADER = ("dataset", "method", "source", *CL.interval_header(P.COLUMNS), "PPL", *CL.COUNT_COLUMNS, "split",
               *CL.diff_header(P.COLUMNS), "note")
RET_COLUMNS = ("Sent R@1", "Sent R@5", "Sent R@10", "Sent Med r", "Img R@1", "Img R@5", "Img R@10", "Img Med r")
RET_HEADER = ("dataset", "method", "source", *CL.interval_header(RET_COLUMNS), *CL.COUNT_COLUMNS, "note")
RET_METRIC = dict(zip(RET_COLUMNS, (f"{t}/{m}" for t in I.RET_TASKS for m in I.RET_METRICS), strict=True))
NO_RANKS = "no per-query ranks in retrieval.json (made before they were kept): no interval; re-run its retrieval stage"

# Published captioning numbers of the seeds (percent; PPL as printed), per model:
# (dataset named as in the paper, method, values in BASE_COLUMNS order, where from)
_ = None
PUBLISHED_BASELINES: dict[str, list[tuple[str, str, tuple[float | None, ...], str]]] = {
    "mrnn": [
        ("MSCOCO (c5, test server)", "m-RNN-beam", (68.0, 50.6, 36.9, 27.2, 22.5, 49.9, 79.1, _, _),
         "Mao et al., seed 003 (COCO test server, not the Karpathy test split)"),
        ("Flickr8K", "m-RNN-AlexNet", (56.5, 38.6, 25.6, 17.0, _, _, _, _, 24.39),
         "Mao et al., seed 001"),
    ],
    "sat": [  # Xu et al. 2015, Table 1 (BLEU without brevity penalty, METEOR), soft attention
        ("Flickr8K", "Soft-Attention", (67.0, 44.8, 29.9, 19.5, 18.93, _, _, _, _), "Xu et al., seed 004"),
        ("Flickr30K", "Soft-Attention", (66.7, 43.4, 28.8, 19.1, 18.49, _, _, _, _), "Xu et al., seed 004"),
        ("MSCOCO", "Soft-Attention", (70.7, 49.2, 34.4, 24.3, 23.90, _, _, _, _), "Xu et al., seed 004"),
    ],
    "sat_hard": [  # the same table, hard attention
        ("Flickr8K", "Hard-Attention", (67.0, 45.7, 31.4, 21.3, 20.30, _, _, _, _), "Xu et al., seed 004"),
        ("Flickr30K", "Hard-Attention", (66.9, 43.9, 29.6, 19.9, 18.46, _, _, _, _), "Xu et al., seed 004"),
        ("MSCOCO", "Hard-Attention", (71.8, 50.4, 35.7, 25.0, 23.04, _, _, _, _), "Xu et al., seed 004"),
    ],
    "scnn": [  # Liu et al. 2017, Tables 3 and 4 (fine-tuned CNN, not the Fix variant)
        ("MSCOCO (c5, test server)", "S-CNN-RNN", (74.3, 57.8, 43.4, 32.3, 25.5, 54.0, 98.6, _, _),
         "Liu et al., seed 002 (end-to-end fine-tuned Inception-v3)"),
        ("MSCOCO (val split)", "S-CNN-RNN", (_, _, _, 34.0, 26.0, 55.0, 105.4, _, _),
         "Liu et al., seed 002, Table 4"),
    ],
}
# S-CNN-RNN's multi-label results (Liu et al. 2017, Table 2: COCO's 80 object classes; percent)
ML_COLUMNS = ("C-P", "C-R", "C-F1", "O-P", "O-R", "O-F1")
ML_HEADER = ("dataset", "method", "source", *ML_COLUMNS, "note")
PUBLISHED_MULTILABEL = [
    ("MSCOCO (80 object classes)", "S-CNN-RNN", (67.40, 59.83, 63.39, 76.63, 68.73, 72.47),
     "Liu et al., seed 002, Table 2 (the model picks its own number of labels; 80 object classes, not caption words)"),
    ("MSCOCO (80 object classes)", "CNN+logistic (top-3)", (59.30, 58.60, 58.90, 61.70, 65.00, 63.30),
     "Liu et al., seed 002, Table 2 (top-3 labels; 80 object classes, not caption words)"),
]
# how this run's rows are computed (the seed's Sec. 4.2 protocol), printed beside the published ones
ML_PROTOCOL = ("Protocol (seed 002, Sec. 4.2): C-P/C-R = per-class precision/recall averaged over all classes, "
               "O-P/O-R = per-image precision/recall averaged over all images, F1 = harmonic mean of the averaged "
               "P and R; this run: the top-3 of the concept head's k caption-word concepts on the test images, "
               "a 0/0 counted as 0 (a concept never predicted has precision 0). The published rows are COCO's "
               "80 object classes: a different label set, shown for scale, not as a like-for-like comparison.")
# Published retrieval numbers (m-RNN, seed 003; R@K in percent), RET_COLUMNS order
PUBLISHED_RETRIEVAL: dict[str, list[tuple[str, str, tuple[float, ...], str]]] = {
    "mrnn": [
        ("Flickr30K (1000 test images)", "m-RNN-VggNet", (35.4, 63.8, 73.7, 3, 22.8, 50.7, 63.1, 5),
         "Mao et al., seed 003"),
        ("MSCOCO", "m-RNN-VggNet", (41.0, 73.0, 83.5, 2, 29.0, 42.2, 77.0, 3),
         "Mao et al., seed 003 (image R@5 42.2 as printed)"),
        ("Flickr30K (1000 test images)", "random ranking", (0.1, 0.6, 1.1, 631, 0.1, 0.5, 1.0, 500),
         "Mao et al., seed 003"),
    ],
}


def _label(ds: str) -> str:
    return P.dataset_label(ds)


def _num(v: Any, scale: float = 1.0, digits: int = 1) -> str:
    if v is None or isinstance(v, str):
        return ""
    return f"{float(v) * scale:.{digits}f}"


def _read(path: Path, what: str) -> dict[str, Any]:
    if not path.exists():
        raise FileNotFoundError(f"missing {path} ({what}); run the stage that makes it")
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def _csv(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def _markdown(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], note: str) -> str:
    """A table as Markdown: each value with its interval in one cell, then (rows with ``vs``) the
    paired differences and the sentence saying what stands behind the table."""
    cols = CL.display_columns(header)
    recs = [dict(zip(header, r, strict=True)) for r in rows]
    head = [h.capitalize() if h in ("dataset", "method", "source", "note", "seeds", "images", "interval") else h
            for h in cols]
    out = [f"# {title}", "", CL.md_line(head),
           "|" + "|".join("---" if h in ("dataset", "method", "source", "note", "interval", "split") else "---:"
                          for h in cols) + "|"]
    prev = None
    for r in recs:
        out.append(CL.md_line(["" if h == "dataset" and r["dataset"] == prev else CL.display_cell(r, h) for h in cols]))
        prev = r["dataset"]
    out += ["", note, ""]
    if "seeds" in header:
        out += CL.diff_markdown(recs, CL.diff_columns(header)) + [CL.table_sentence(recs, CL.diff_columns(header)), ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- baselines table
def _as_row(value: I.RowEval | dict[str, Any]) -> I.RowEval:
    return value if isinstance(value, I.RowEval) else I.RowEval([value])


def _published_cells(values: Sequence[float | None]) -> list[str]:
    """A published baseline row after dataset/method/source (``values`` in BASE_COLUMNS order)."""
    cells = [x for v in values[:len(P.COLUMNS)] for x in (fmt(v), "", "")]
    return [*cells, fmt(values[-1]) if values[-1] is not None else "", "", PUBLISHED_SCOPE[1], "",
            PUBLISHED_SCOPE[0]]


def baseline_rows(datasets: Sequence[str], models: Sequence[str],
                  evals: dict[tuple[str, str], I.RowEval | dict[str, Any]],
                  train: dict[tuple[str, str], dict[str, Any]],
                  mostfreq: dict[str, I.RowEval | dict[str, Any]]) -> list[list[str]]:
    """Rows per dataset (this run's models, each against the reference point, then the reference
    point itself; or one skipped line), then the published rows of the configured models."""
    metrics = [P.METRIC_OF[c] for c in P.COLUMNS]
    no_diff = CL.diff_cells(P.COLUMNS, P.METRIC_OF, "", None)
    width = len(BASE_HEADER) - 3 - 1  # every cell but dataset, method, source and the note
    rows: list[list[str]] = []
    diffs: dict[int, dict[str, Any]] = {}  # row index -> its paired differences (one Holm family per table)
    for ds in datasets:
        label = _label(ds)
        ref = _as_row(mostfreq[ds])
        runs = {m: _as_row(evals[(ds, m)]) for m in models}
        reason = ref.first.get(SKIPPED) or next((r.first[SKIPPED] for r in runs.values() if r.first.get(SKIPPED)), None)
        if reason:
            rows.append([label, ", ".join(MODEL_LABELS.get(m, m) for m in models), SKIPPED, *[""] * width, reason])
            continue
        ref_label = MODEL_LABELS["mostfreq"]
        for m in models:
            run, tm = runs[m], train.get((ds, m), {})
            summary = I.summarise(run, metrics)
            split, images, scope = scope_cells(run.first)
            counts = CL.count_cells(summary)
            counts[1] = counts[1] or images
            note = "; ".join(x for x in (scope, f"{tm.get('steps', '')} steps, {tm.get('train_pairs', '')} "
                                                "training pairs") if x)
            method = tm.get("label") or MODEL_LABELS.get(m, m)  # e.g. "S-CNN-RNN (end to end)"
            rows.append([label, method, THIS_RUN, *CL.interval_cells(P.COLUMNS, P.METRIC_OF, summary),
                         _num(tm.get("test_perplexity"), digits=2), *counts, split,
                         *CL.diff_cells(P.COLUMNS, P.METRIC_OF, CL.vs_label(ref_label, run, ref),
                                       diffs.setdefault(len(rows), I.paired(run, ref, metrics))), note])
        summary = I.summarise(ref, metrics)
        split, images, scope = scope_cells(ref.first)
        counts = CL.count_cells(summary)
        counts[1] = counts[1] or images
        note = "; ".join(x for x in (scope, f"“{ref.first.get('caption', '')}” for every image") if x)
        rows.append([label, ref_label, REFERENCE, *CL.interval_cells(P.COLUMNS, P.METRIC_OF, summary), "", *counts,
                     split, *no_diff, note])
    apply_holm(rows, diffs, BASE_HEADER, P.COLUMNS, P.METRIC_OF)
    for m in models:
        for ds_label, method, values, note in PUBLISHED_BASELINES.get(m, []):
            rows.append([ds_label, method, PUBLISHED, *_published_cells(values), *no_diff, note])
    return rows


def _inspections(ctx: StageContext) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for key, (_, path) in _first_seed(ctx, "inspect").items():
        f = Path(path) / "inspect.json"
        out[key] = read_json(f) if f.exists() else {SKIPPED: f"{f} missing"}
    return out


def _first_seed(ctx: StageContext, name: str) -> dict[tuple[str, str], tuple[dict[str, str], Any]]:
    """Gathered dependency ``name`` at each (dataset, model)'s first seed (none when the stage lacks it)."""
    gathered = ctx.gather(name) if name in ctx.stage.deps else []
    return I.first_seeds(gathered, lambda k: (k["dataset"], k["model"]))


def multilabel_rows(inspections: dict[tuple[str, str], dict[str, Any]]) -> list[list[str]]:
    """S-CNN-RNN's concept head as a multi-label classifier (top-3) and the frequency baseline,
    per dataset, then the paper's rows."""
    rows = []
    for (ds, m), ins in inspections.items():
        if m != "scnn" or "multilabel" not in ins:
            continue
        note = (f"top-{ins['top_k']} of {ins['concepts']} caption-word concepts, {ins['images']} test images; "
                "seed 002 protocol: C- over all concepts, O- over all images, 0/0 = 0")
        head = f"{ins.get('label', MODEL_LABELS['scnn'])}: concept head"
        for method, key in ((head, "multilabel"),
                            ("frequency baseline (3 most frequent)", "frequency_baseline")):
            rows.append([_label(ds), method, THIS_RUN, *[_num(ins[key][c], 100.0) for c in ML_COLUMNS], note])
    for ds_label, method, values, note in PUBLISHED_MULTILABEL:
        rows.append([ds_label, method, PUBLISHED, *[f"{v:.1f}" for v in values], note])
    return rows


def attention_notes(inspections: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    notes = []
    for (ds, m), ins in inspections.items():
        hits = ins.get("attention_hits") if m in ("sat", "sat_hard") else None
        if isinstance(hits, dict) and "hit_rate" in hits:
            notes.append(f"{MODEL_LABELS.get(m, m)} on {_label(ds)}: for {hits['events']} generated object words, "
                         f"the most attended cell lies on the named object's ground-truth box "
                         f"{100 * hits['hit_rate']:.1f}% of the time (chance {100 * hits['chance']:.1f}%); "
                         f"attention mass on the box {100 * hits['attention_mass_in_box']:.1f}% "
                         f"(box area {100 * hits['box_area_fraction']:.1f}%).")
    return notes


def copy_attention_figures(inspections: dict[tuple[str, str], dict[str, Any]], gathered, out_dir: Path) -> None:
    """The SAT attention maps into ``reports/figures/baselines/`` (the report page shows them), the folder
    written whole (:func:`r2m.utils.io.atomic_path`: nothing of an older run outlives this one)."""
    import shutil

    index = []
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        for keys, path in gathered:
            ins = inspections.get((keys["dataset"], keys["model"]), {})
            for fig in ins.get("figures", []):
                src = Path(path) / fig["file"]
                if src.exists():
                    name = f"{keys['dataset']}_{keys['model']}_{fig['file']}"
                    shutil.copy2(src, tmp / name)
                    index.append({"dataset": keys["dataset"], "model": keys["model"], "file": name,
                                  "caption": fig.get("caption", ""), "image_id": fig.get("image_id", "")})
        (tmp / "index.json").write_text(json.dumps({"figures": index, "notes": attention_notes(inspections)},
                                                   indent=2))


def _seed_rows(ctx: StageContext, evals: str, stats: str, key_of) -> dict[Any, I.RowEval]:
    """Each row's seeds (gathered ``eval.json`` and, deps ``stats``, ``per_image.parquet``)."""
    return I.gathered_rows(ctx, evals, stats if stats in ctx.stage.deps else None, key_of,
                           lambda p, k: _read(p, f"{k} evaluation"))


def baselines(ctx: StageContext) -> None:
    datasets = list(ctx.params.baselines.datasets)
    models = list(ctx.params.baselines.models)
    train = {}
    for (ds, model), (_, path) in _first_seed(ctx, "train").items():  # perplexities: the first seed's
        train[(ds, model)] = _read(Path(path), f"{model} on {ds}")
    evals = _seed_rows(ctx, "evals", "stats", lambda k: (k["dataset"], k["model"]))
    mostfreq = _seed_rows(ctx, "mostfreq", "mostfreq_stats", lambda k: k["dataset"])
    rows = baseline_rows(datasets, models, evals, train, mostfreq)
    inspections = _inspections(ctx)
    write_text(ctx.outs["csv"], _csv(BASE_HEADER, rows))
    md = _markdown(
        "Supervised baselines (captioning)", BASE_HEADER, rows,
        "Scores × 100 on each dataset's test split (B = BLEU, M = METEOR, R = ROUGE-L, C = CIDEr, S = SPICE; "
        "empty = not computed / not published); PPL = per-word perplexity of the test references given "
        "their image. Published rows name the paper's dataset; they are not this run's datasets. "
        "S-CNN-RNN's label says how its CNN was trained: end to end (the seed: pre-trained with the concept "
        "head, then fine-tuned jointly) or frozen CNN (precomputed features, `scnn.cnn: frozen`).")
    ml = multilabel_rows(inspections)
    if "multilabel" in ctx.outs:
        write_text(ctx.outs["multilabel"], _csv(ML_HEADER, ml))
        md += "\n" + _markdown(
            "S-CNN-RNN concept head as a multi-label classifier", ML_HEADER, ml,
            "Per-class (C-) and per-image (O-) precision / recall / F1 × 100 of the top-3 concepts, against "
            "the concept words of each test image's references. " + ML_PROTOCOL)
    notes = attention_notes(inspections)
    if notes:
        md += "\n## Show, Attend and Tell: attention against ground-truth boxes\n\n" + "\n".join(
            f"- {n}" for n in notes) + "\n"
    if "attention" in ctx.outs:
        copy_attention_figures(inspections, list(_first_seed(ctx, "inspect").values()), Path(ctx.outs["attention"]))
    write_text(ctx.outs["md"], md)
    ctx.log.info("wrote %s (%d rows)", ctx.outs["csv"], len(rows))


# --------------------------------------------------------------------------- retrieval table
def _ret_cells(res: dict[str, Any]) -> list[str]:
    s, i = res["sentence_retrieval"], res["image_retrieval"]
    return [_num(s["R@1"]), _num(s["R@5"]), _num(s["R@10"]), _num(s["Med r"], digits=0 if float(s["Med r"]).is_integer() else 1),
            _num(i["R@1"]), _num(i["R@5"]), _num(i["R@10"]), _num(i["Med r"], digits=0 if float(i["Med r"]).is_integer() else 1)]


def _ret_run_cells(results: Sequence[dict[str, Any]]) -> tuple[list[str], str]:
    """This run's retrieval cells (values as printed before, each with its interval) and counts; a
    note when there is no interval to give."""
    summary = I.retrieval_summary(results)
    mean_cells = _ret_cells(results[0]) if len(results) == 1 else None
    cells = []
    for k, c in enumerate(RET_COLUMNS):
        v, lo, hi = summary.values[RET_METRIC[c]]
        cells += [mean_cells[k] if mean_cells else _num(v), _num(lo), _num(hi)]
    return [*cells, *CL.count_cells(summary)], ("" if summary.interval else NO_RANKS)


def _seeds(value: dict[str, Any] | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [value] if isinstance(value, dict) else list(value)


def retrieval_rows(sup: dict[tuple[str, str], Any], r2m: dict[str, Any],
                   sup_datasets: Sequence[str], models: Sequence[str], r2m_datasets: Sequence[str]) -> list[list[str]]:
    """Rows per dataset: each supervised model, R2M, the chance level; then the published rows. A
    row's value is its ``retrieval.json`` (or a list of them, one per seed)."""
    blank = [""] * len(CL.interval_header(RET_COLUMNS)) + ["", "", ""]

    def plain(cells: Sequence[str]) -> list[str]:  # values without interval or counts
        return [x for c in cells for x in (c, "", "")] + ["", "", ""]

    rows: list[list[str]] = []
    for ds in dict.fromkeys([*sup_datasets, *r2m_datasets]):
        label = _label(ds)
        chance = None
        if ds in sup_datasets:
            runs = {m: _seeds(sup[(ds, m)]) for m in models}
            reason = next((r[0][SKIPPED] for r in runs.values() if r[0].get(SKIPPED)), None)
            if reason:
                rows.append([label, ", ".join(MODEL_LABELS.get(m, m) for m in models), SKIPPED, *blank, reason])
            else:
                for m in models:
                    res = runs[m][0]
                    chance = res
                    cells, why = _ret_run_cells(runs[m])
                    note = (f"{res['n_images']} images × {res['n_sentences']} sentences; by P(sentence given image), "
                            f"sentence retrieval normalised by P(sentence)")
                    rows.append([label, MODEL_LABELS.get(m, m), THIS_RUN, *cells, "; ".join(x for x in (note, why) if x)])
        if ds in r2m_datasets:
            runs_r2m = _seeds(r2m[ds])
            res = runs_r2m[0]
            chance = chance or res
            cells, why = _ret_run_cells(runs_r2m)
            note = f"{res['n_images']} images × {res['n_sentences']} sentences; v̂ · ṽ (unpaired training)"
            rows.append([label, MODEL_LABELS["r2m"], THIS_RUN, *cells, "; ".join(x for x in (note, why) if x)])
        if chance is not None:
            c = chance["chance"]
            rows.append([label, "random ranking", CHANCE,
                         *plain(_ret_cells({"sentence_retrieval": c["sentence_retrieval"],
                                            "image_retrieval": c["image_retrieval"]})),
                         "expected for this test set"])
    for m in models:
        for ds_label, method, values, note in PUBLISHED_RETRIEVAL.get(m, []):
            rows.append([ds_label, method, PUBLISHED,
                         *plain([f"{v:g}" if "Med" in c else f"{v:.1f}" for c, v in zip(RET_COLUMNS, values, strict=True)]),
                         note])
    return rows


def retrieval(ctx: StageContext) -> None:
    sup = {k: [_read(p, f"retrieval of {k[1]} on {k[0]}") for p in paths]
           for k, paths in I.group_paths(ctx.gather("sup"), lambda k: (k["dataset"], k["model"])).items()}
    r2m = {k: [_read(p, f"R2M retrieval on {k}") for p in paths]
           for k, paths in I.group_paths(ctx.gather("r2m"), lambda k: k["dataset"]).items()}
    rows = retrieval_rows(sup, r2m, list(ctx.params.baselines.datasets), list(ctx.params.baselines.models),
                          list(ctx.params.datasets))
    write_text(ctx.outs["csv"], _csv(RET_HEADER, rows))
    write_text(ctx.outs["md"], _markdown(
        "Image-sentence retrieval", RET_HEADER, rows,
        "Sent = sentence retrieval (image query, its 5 references relevant), Img = image retrieval "
        "(sentence query). R@K in percent, Med r = median rank of the first ground truth; ties count "
        "against the query. [low, high] (`_lo`, `_hi`): 95 % interval — the percentile bootstrap over the "
        "queries (1,000 resamples, fixed seed) for one seed, Student t over seeds for several. Published "
        "rows name the paper's dataset and test set size."))
    ctx.log.info("wrote %s (%d rows)", ctx.outs["csv"], len(rows))

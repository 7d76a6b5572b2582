"""Paper Tables 1–3 as CSV + Markdown: this run's numbers beside the published ones.

Numbers are percentages with one decimal like the paper (coco-caption scores × 100); a metric that
was not computed (SPICE without its jars) or that the paper does not print is an empty cell.
Every row says where it comes from: ``source = published`` or ``source = this run``. Each metric of
a row of this run has its 95 % interval (``C``, ``C_lo``, ``C_hi``) with ``seeds``, ``images`` and
``interval`` (which interval), and Tables 2 and 3 compare each row with its reference (Table 2: R2M;
Table 3: the stage before, as the paper reads it; ``vs``, ``d_C``, ``d_C_lo``, ``d_C_hi``, ``d_C_mark``,
``d_C_mde``): :mod:`r2m.reports.intervals`, their cells :mod:`r2m.reports.cells`. Published rows leave those
cells empty.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from r2m.params import TRAIN_STAGES, VARIANT_NAMES
from r2m.reports import cells as CL
from r2m.reports import intervals as I
from r2m.reports import published as P
from r2m.stage.context import StageContext
from r2m.utils.io import read_json, write_text

PUBLISHED = "published"
THIS_RUN = "this run"
# concept recall (r2m.evaluation.concepts), this run only: share of an image's input concepts that its
# caption names, and share of captions naming at least one (× 100)
CONCEPT_COLUMNS = ("CR", "CR≥1")
CONCEPT_METRICS = dict(zip(CONCEPT_COLUMNS, ("concept_recall", "concept_any"), strict=True))
CONCEPT_NOTE = ("CR = concept recall of this run: the share of an image's input concepts that its caption "
                "names; CR≥1 = the share of captions naming at least one (images with ≥ 1 concept; no "
                "references needed).")
# what each row scored: the split (the paper's rows: the test split), the number of images, and a
# note marking rows that are not a full test-set evaluation (partial, val split, no metrics)
SCOPE_COLUMNS = ("split", "images", "note")
SCOPE_NOTE = ("Split / Images: the split each row scored and how many of its images (published rows: the "
              "paper's test split); Note marks rows that are not a full test-set score.")
METRIC_COLUMNS = (*P.COLUMNS, *CONCEPT_COLUMNS)
METRIC_FOR = {**P.METRIC_OF, **CONCEPT_METRICS}  # table column -> eval.json / per-image metric name
HEADER = ("dataset", "method", "source", *CL.interval_header(METRIC_COLUMNS), *CL.COUNT_COLUMNS, "split",
          *CL.diff_header(METRIC_COLUMNS), "note")
PUBLISHED_SCOPE = ("test", "", "")
INTERVAL_NOTE = ("[low, high]: 95 % interval of this run's value — t over the seeds and the test images "
                 "(variance components: the seeds' spread and the image component from 1,000 bootstrap draws, "
                 "fixed seed; one seed: over the images); Seeds / Images: what stands behind the row.")


@dataclass(frozen=True)
class TableSpec:
    """How one table is laid out: which gathered axis makes its rows and how rows are labelled."""

    number: int
    title: str
    axis: str | None  # the Gather axis besides "dataset" ("variant", "ckpt") or None
    order: Sequence[str]  # row keys in paper order
    labels: Mapping[str, str]
    published: Mapping[str, Mapping[str, P.Row]]
    note: str
    compared: Mapping[str, str] = field(default_factory=dict)  # row key -> the row key it is compared with

    def comparisons(self, row_keys: Sequence[str]) -> list[tuple[str, str]]:
        """``(row, reference)`` of every comparison this table makes among ``row_keys``, in row order: one
        family per dataset and metric (:mod:`r2m.reports.intervals`), the claims' too."""
        have = set(row_keys)
        return [(k, self.compared[k]) for k in self.order if k in self.compared and k in have
                and self.compared[k] in have]


TABLES: dict[str, TableSpec] = {
    "table1": TableSpec(
        1, "Performance comparison with the state of the art (R2M, final checkpoint)", None, ("r2m",),
        {"r2m": "R2M"}, P.TABLE1,
        "Published rows: Guo et al. (IJCAI 2020) Table 1, including UC-GAN (Feng et al., 2019) and "
        "SME-GAN (Laina et al., 2019)."),
    "table2": TableSpec(
        2, "Ablations of the memory (final checkpoints)", "variant",
        ("no_fm", "d_lstm", "r_lstm", "dr_lstm", "r2m"), P.VARIANT_LABELS, P.TABLE2,
        "Published rows: Guo et al. (IJCAI 2020) Table 2.",
        {v: "r2m" for v in ("no_fm", "d_lstm", "r_lstm", "dr_lstm")}),
    "table3": TableSpec(
        3, "Ablations of the losses (the four training-stage checkpoints of R2M)", "ckpt", TRAIN_STAGES,
        P.CKPT_LABELS, P.TABLE3, "Published rows: Guo et al. (IJCAI 2020) Table 3; each stage is compared with "
        "the stage before (the loss it adds).", dict(zip(TRAIN_STAGES[1:], TRAIN_STAGES[:-1], strict=True))),
}
assert set(TABLES["table2"].order) == set(VARIANT_NAMES)


# --------------------------------------------------------------------------- pure helpers
def fmt(value: float | None) -> str:
    """A percentage with one decimal; empty for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.1f}"


def published_row(values: P.Row) -> list[str]:
    """A published row's cells after dataset/method/source: the paper's values, no interval, no comparison."""
    cells = [x for v in values for x in (fmt(v), "", "")] + [""] * (3 * len(CONCEPT_COLUMNS))
    return [*cells, "", PUBLISHED_SCOPE[1], "", PUBLISHED_SCOPE[0], *CL.diff_cells(METRIC_COLUMNS, METRIC_FOR, "", None),
            PUBLISHED_SCOPE[2]]


def scope_notes(metrics: Mapping[str, Any]) -> list[str]:
    """Why an ``eval.json`` is not a full test-set score: partial (``--allow-partial``), another split,
    no metric computed."""
    notes = []
    missing = int(metrics.get("missing_images") or 0)
    if missing:
        n = metrics.get("n_images")
        of = f"{n} of {int(n) + missing}" if n is not None else f"{missing} missing"
        notes.append(f"PARTIAL: {of} images (--allow-partial)")
    split = metrics.get("split")
    if split and split != "test":
        notes.append(f"split {split}, not the test set")
    if split is None and "split" in metrics:
        notes.append("split unknown (the references name none)")
    if metrics.get("selected_on_test"):
        notes.append("checkpoint SELECTED ON THE TEST IMAGES (fidelity.select_on_test: leakage)")
    if not any(metrics.get(m) is not None for m in P.METRIC_OF.values()):
        notes.append("no scorers: no caption metric computed")
    return notes


def scope_cells(metrics: Mapping[str, Any]) -> list[str]:
    """The ``split``, ``images`` and ``note`` cells of this run's row (an ``eval.json`` written before
    the split was recorded: split empty)."""
    n = metrics.get("n_images")
    return [str(metrics.get("split") or ""), "" if n is None else str(int(n)), "; ".join(scope_notes(metrics))]


def this_run_row(label: str, method: str, row: I.RowEval, summary: I.Summary,
                 diffs: Mapping[str, Any] | None = None, vs: str = "") -> list[str]:
    """A row of this run: its values with their intervals, the counts, its scope and its comparison cells."""
    split, images, note = scope_cells(row.first)
    counts = CL.count_cells(summary)
    counts[1] = counts[1] or images
    return [label, method, THIS_RUN, *CL.interval_cells(METRIC_COLUMNS, METRIC_FOR, summary), *counts, split,
            *CL.diff_cells(METRIC_COLUMNS, METRIC_FOR, vs, diffs), note]


def apply_holm(rows: list[list[str]], diffs: Mapping[int, Mapping[str, Any]], header: Sequence[str] = HEADER,
               columns: Sequence[str] = METRIC_COLUMNS, metric_of: Mapping[str, str] = METRIC_FOR) -> None:
    """Rewrite the difference cells of ``rows[i]`` for every ``i`` in ``diffs`` with the Holm-adjusted p, the
    mark and the minimum detectable effect: one family per dataset (a row's first cell) and metric."""
    at = list(header).index("vs")
    datasets = list(dict.fromkeys(rows[i][0] for i in diffs))
    for ds in datasets:
        family = {i: d for i, d in diffs.items() if rows[i][0] == ds}
        adjusted, sizes = I.holm_by_metric(family), I.family_sizes(family)
        for i, ds_diffs in family.items():
            if not ds_diffs:
                continue
            cells = CL.diff_cells(columns, metric_of, rows[i][at], ds_diffs, adjusted=adjusted.get(i, {}),
                                 family=sizes)
            rows[i][at:at + len(cells)] = cells


def read_eval(path: Path, what: str) -> dict[str, float | None]:
    """An ``eval.json``; a missing file names the combination and the stage that makes it."""
    if not path.exists():
        raise FileNotFoundError(
            f"missing evaluation file {path} ({what}); run `r2m evaluate` for it "
            "(or remove that dataset/variant from params.yaml)"
        )
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object of metrics, got {type(data).__name__}")
    ids = data.get("unreadable_image_ids", [])
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"{path}: 'unreadable_image_ids' must be a list of image ids, got {ids!r}")
    split = data.get("split")
    if split is not None and not isinstance(split, str):
        raise ValueError(f"{path}: 'split' must be a split name or null, got {split!r}")
    for k, v in data.items():
        if k in ("unreadable_image_ids", "split"):
            continue
        if v is not None and not isinstance(v, (int, float)):
            raise ValueError(f"{path}: metric {k!r} must be a number or null, got {v!r}")
    return data


def _as_row(value: I.RowEval | Mapping[str, Any]) -> I.RowEval:
    return value if isinstance(value, I.RowEval) else I.RowEval([value])


def build_rows(spec: TableSpec, datasets: Sequence[str], row_keys: Sequence[str],
               evals: Mapping[tuple[str, str], I.RowEval | Mapping[str, Any]]) -> list[list[str]]:
    """Rows for one table: per dataset, per row key, the published row (if any) then this run's
    (an ``eval.json`` dict is one seed without per-image statistics: no interval)."""
    metrics = list(METRIC_FOR.values())
    rows: list[list[str]] = []
    diffs: dict[int, dict[str, Any]] = {}  # row index -> its paired differences (one Holm family per table)
    for ds in datasets:
        label = P.dataset_label(ds)
        pub = spec.published.get(ds, {})
        if spec.axis is None:  # Table 1: the published baselines and R2M, then ours
            for method, values in pub.items():
                rows.append([label, method, PUBLISHED, *published_row(values)])
            run = _as_row(evals[(ds, "r2m")])
            rows.append(this_run_row(label, "R2M", run, I.summarise(run, metrics)))
            continue
        keys = [k for k in spec.order if k in row_keys]
        present = [k for k in keys if (ds, k) in evals]
        refs = dict(spec.comparisons(present))
        for key in keys:
            method = spec.labels.get(key, key)
            if key in pub:
                rows.append([label, method, PUBLISHED, *published_row(pub[key])])
            run = _as_row(evals[(ds, key)])
            vs = ""
            if key in refs:
                ref = _as_row(evals[(ds, refs[key])])
                vs = CL.vs_label(spec.labels.get(refs[key], refs[key]), run, ref)
                diffs[len(rows)] = I.paired(run, ref, metrics)
            rows.append(this_run_row(label, method, run, I.summarise(run, metrics), diffs.get(len(rows)), vs))
    apply_holm(rows, diffs)
    if spec.axis is None:  # Table 1 always shows the paper's targets, configured or not
        for ds, pub in spec.published.items():
            if ds not in datasets:
                rows += [[P.dataset_label(ds), m, PUBLISHED, *published_row(v)] for m, v in pub.items()]
    return rows


def to_csv(rows: Sequence[Sequence[str]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(HEADER)
    w.writerows(rows)
    return buf.getvalue()


def eval_notes(evals: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[str]:
    """One note per evaluation whose scored images include unreadable ones (captioned from no concepts),
    and one per evaluation that is not a full test-set score (:func:`scope_notes`)."""
    notes = []
    for (ds, key), m in evals.items():
        n = int(m.get("unreadable_images") or 0)
        if n:
            ids = list(m.get("unreadable_image_ids") or [])
            shown = ", ".join(ids[:5]) + (" …" if len(ids) > 5 else "")
            total = m.get("n_images")
            of = f" of {total}" if total is not None else ""
            notes.append(f"{ds} / {key}: {n}{of} scored image(s) were unreadable and captioned from no "
                         f"concepts ({shown}); they are included in the scores.")
        scope = scope_notes(m)
        if scope:
            notes.append(f"{ds} / {key}: {'; '.join(scope)}.")
    return notes


def to_markdown(spec: TableSpec, rows: Sequence[Sequence[str]], notes: Sequence[str] = ()) -> str:
    head = ["Dataset", "Method", "Source", *METRIC_COLUMNS, "Seeds", "Interval", "Split", "Images", "Note"]
    out = [f"# Table {spec.number}: {spec.title}", "",
           CL.md_line(head), "|" + "|".join(["---"] * 3 + ["---:"] * (len(METRIC_COLUMNS) + 1) + ["---", "---", "---:", "---"]) + "|"]
    recs = [dict(zip(HEADER, r, strict=True)) for r in rows]
    prev = None
    for r in recs:
        out.append(CL.md_line(["" if r["dataset"] == prev else r["dataset"], r["method"], r["source"],
                            *(CL.cell_with_interval(r, c) for c in METRIC_COLUMNS),
                            *(r[c] for c in ("seeds", "interval", "split", "images", "note"))]))
        prev = r["dataset"]
    out += ["", f"Scores × 100 (B = BLEU, M = METEOR, R = ROUGE-L, C = CIDEr, S = SPICE); empty = not "
            f"reported / not computed. {INTERVAL_NOTE} {CONCEPT_NOTE} {SCOPE_NOTE} {spec.note}", ""]
    out += CL.diff_markdown(recs, METRIC_COLUMNS)
    out += [CL.table_sentence(recs, METRIC_COLUMNS), ""]
    out += [f"Note: {n}" for n in notes] + ([""] if notes else [])
    return "\n".join(out)


# --------------------------------------------------------------------------- stage functions
def _gathered_evals(ctx: StageContext, spec: TableSpec) -> tuple[dict[tuple[str, str], I.RowEval], list[str]]:
    """Each row's seeds: their ``eval.json`` and (deps ``stats``) ``per_image.parquet``, grouped per
    (dataset, row key); several gathered seeds of one row become one :class:`~r2m.reports.intervals.RowEval`."""
    def key_of(keys: Mapping[str, str]) -> tuple[str, str]:
        return keys["dataset"], keys[spec.axis] if spec.axis else keys.get("variant", "r2m")

    gathered = ctx.gather("evals")
    evals, seeds = I.group_paths(gathered, key_of), I.group_seeds(gathered, key_of)
    stats = I.group_paths(ctx.gather("stats"), key_of) if "stats" in ctx.stage.deps else {}
    rows: dict[tuple[str, str], I.RowEval] = {}
    for k, paths in evals.items():
        what = f"dataset={k[0]}, {spec.axis or 'variant'}={k[1]}"
        evs = [read_eval(p, what) for p in paths]
        rows[k] = I.RowEval(evs, [I.read_stats(p, ev) for p, ev in zip(stats.get(k, []), evs, strict=False)],
                            seeds[k])
    return rows, list(dict.fromkeys(k for _, k in evals))


def make_table(ctx: StageContext, name: str) -> list[list[str]]:
    spec = TABLES[name]
    evals, row_keys = _gathered_evals(ctx, spec)
    rows = build_rows(spec, list(ctx.params.datasets), row_keys, evals)
    write_text(ctx.outs["csv"], to_csv(rows))
    notes = eval_notes({k: v.first for k, v in evals.items()})
    for n in notes:
        ctx.log.warning("%s: %s", name, n)
    write_text(ctx.outs["md"], to_markdown(spec, rows, notes))
    ctx.log.info("wrote %s and %s (%d rows)", ctx.outs["csv"], ctx.outs["md"], len(rows))
    return rows


def table1(ctx: StageContext) -> None:
    make_table(ctx, "table1")


def table2(ctx: StageContext) -> None:
    make_table(ctx, "table2")


def table3(ctx: StageContext) -> None:
    make_table(ctx, "table3")

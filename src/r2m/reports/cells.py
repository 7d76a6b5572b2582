"""The tables' cells and text from the statistics of :mod:`r2m.reports.intervals`, and read back.

A row of this run writes its values with their intervals (``C``, ``C_lo``, ``C_hi`` per column, × 100:
:func:`interval_cells`), what stands behind them (``seeds``, ``images``, ``interval``:
:func:`count_cells`) and, against its reference row, the ``vs`` cell (:func:`vs_label`), ``d_seeds``
and per column the difference, its interval, p, Holm-adjusted p, mark and minimum detectable effect
(:func:`diff_cells`). Published rows have no interval (empty cells). Read back from a table's CSV rows:
the cells a reader sees (:func:`display_columns`, :func:`display_cell`), the differences as a Markdown
table with the note on what the marks rest on (:func:`diff_markdown`), and one sentence on the run
(:func:`table_sentence`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from r2m.evaluation import noise as N
from r2m.reports.intervals import ALPHA, SIGNIFICANT, RowEval, Summary, mark, mde, shared_seeds

# --------------------------------------------------------------------------- cells
COUNT_COLUMNS = ("seeds", "images", "interval")  # the header of :func:`count_cells`


def vs_label(label: str, row: RowEval, ref: RowEval) -> str:
    """The ``vs`` cell: the reference's label, and the seeds compared when some seed of either row is left out."""
    shared = shared_seeds(row, ref)
    if shared is None or (len(shared) == len(row.seeds) == len(ref.seeds)):
        return label
    return f"{label} ({'seed' if len(shared) == 1 else 'seeds'} {', '.join(shared)})"


def _pct(value: float | None, scale: float, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return f"{value * scale:.{digits}f}"


def interval_header(columns: Sequence[str]) -> list[str]:
    """``C, C_lo, C_hi`` for each table column."""
    return [h for c in columns for h in (c, f"{c}_lo", f"{c}_hi")]


DIFF_FIELDS = ("", "_lo", "_hi", "_p", "_holm", "_mark", "_mde")


def diff_header(columns: Sequence[str]) -> list[str]:
    """``vs`` (the reference row), ``d_seeds`` (the seeds behind the difference: each system's runs), then
    ``d_C``, ``d_C_lo``, ``d_C_hi``, ``d_C_p`` (the test's p), ``d_C_holm`` (Holm-adjusted within the
    family: the table's comparisons on that dataset and metric), ``d_C_mark`` and ``d_C_mde`` (the minimum
    detectable effect, :func:`mde`) for each table column."""
    return ["vs", "d_seeds", *(f"d_{c}{f}" for c in columns for f in DIFF_FIELDS)]


def interval_cells(columns: Sequence[str], metric_of: Mapping[str, str], summary: Summary | None,
                   scale: float = 100.0) -> list[str]:
    """Value, low, high per column (× ``scale``); empty without a summary (published rows)."""
    if summary is None:
        return [""] * (3 * len(columns))
    out = []
    for c in columns:
        v, lo, hi = summary.values.get(metric_of[c], (None, None, None))
        out += [_pct(v, scale), _pct(lo, scale), _pct(hi, scale)]
    return out


def count_cells(summary: Summary | None) -> list[str]:
    if summary is None:
        return ["", "", ""]
    return [str(summary.seeds), "" if summary.images is None else str(int(summary.images)), summary.interval]


def _p_cell(p: float | None) -> str:
    return "" if p is None or p != p else f"{p:.4g}"


def seeds_cell(diffs: Mapping[str, N.Estimate]) -> str:
    """``3`` (every system's runs), ``3 vs 1`` (the row's against the reference's) when they differ."""
    runs = {d.runs for d in diffs.values()}
    if len(runs) != 1:
        return ""
    got = runs.pop()
    return str(got[0]) if len(set(got)) == 1 else " vs ".join(map(str, got))


def diff_cells(columns: Sequence[str], metric_of: Mapping[str, str], vs: str,
               diffs: Mapping[str, N.Estimate] | None, scale: float = 100.0,
               adjusted: Mapping[str, float] | None = None, family: Mapping[str, int] | None = None) -> list[str]:
    """``vs``, ``d_seeds``, then difference, low, high, p, Holm-adjusted p, mark and minimum detectable
    effect per column (the mark on the adjusted p when ``adjusted`` is given; the effect at level
    0.05 / the metric's ``family`` size, 1 when not given); all empty without a comparison."""
    if not diffs:
        return [""] * (2 + len(DIFF_FIELDS) * len(columns))
    out = [vs, seeds_cell(diffs)]
    for c in columns:
        d = diffs.get(metric_of[c])
        if d is None:
            out += [""] * len(DIFF_FIELDS)
            continue
        adj = (adjusted or {}).get(metric_of[c])
        out += [_pct(d.value, scale), _pct(d.low, scale), _pct(d.high, scale), _p_cell(d.p), _p_cell(adj),
                mark(d, adj), _pct(mde(d, (family or {}).get(metric_of[c], 1)), scale)]
    return out


# --------------------------------------------------------------------------- reading the rows back
def cell_with_interval(row: Mapping[str, str], column: str) -> str:
    """``value [low, high]`` (or the value alone) from a table's CSV row."""
    v, lo, hi = row.get(column, "") or "", row.get(f"{column}_lo", "") or "", row.get(f"{column}_hi", "") or ""
    return f"{v} [{lo}, {hi}]" if v and lo and hi else v


def diff_text(row: Mapping[str, str], column: str) -> str:
    """``+1.2 [-0.4, 2.9] n.s. (mde 9.8)`` from a CSV row's ``d_<column>`` cells; empty when not compared."""
    d = row.get(f"d_{column}", "") or ""
    if not d:
        return ""
    sign = "+" if not d.startswith("-") else ""
    m = row.get(f"d_{column}_mde", "") or ""
    mark_ = row.get(f"d_{column}_mark", "")
    tail = f" (mde {m})" if m and mark_ != SIGNIFICANT else ""
    return f"{sign}{d} [{row.get(f'd_{column}_lo', '')}, {row.get(f'd_{column}_hi', '')}] {mark_}{tail}"


def display_columns(header: Sequence[str]) -> list[str]:
    """The columns a reader sees: each value column once (its ``_lo``/``_hi`` shown beside it), no
    comparison columns (they make their own table, :func:`diff_markdown`)."""
    have = set(header)
    return [h for h in header if h != "vs" and not h.startswith("d_")
            and not ((h.endswith("_lo") or h.endswith("_hi")) and h[:-3] in have)]


def display_cell(row: Mapping[str, str], column: str) -> str:
    return cell_with_interval(row, column) if f"{column}_lo" in row else (row.get(column, "") or "")


def diff_columns(header: Sequence[str]) -> list[str]:
    return [c for c in display_columns(header) if f"d_{c}" in header]


def md_line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def family_size(recs: Sequence[Mapping[str, str]], column: str) -> dict[str, int]:
    """Per dataset, how many differences the family of ``column`` holds (compared rows with a p)."""
    out: dict[str, int] = {}
    for r in recs:
        if r.get("vs") and (r.get(f"d_{column}_p") or "").strip():
            out[r.get("dataset", "")] = out.get(r.get("dataset", ""), 0) + 1
    return out


def comparison_note(recs: Sequence[Mapping[str, str]], columns: Sequence[str]) -> str:
    """What the marks of a table rest on: the model, the interval, the test, the correction and its family."""
    compared = [r for r in recs if r.get("vs")]
    if not compared:
        return ""
    seeds = {r.get("d_seeds", "") for r in compared}
    parts = [("Difference = the row's mean over its seeds minus the reference's; 95 % interval = t with "
              "Welch-Satterthwaite degrees of freedom on a variance with one term per source of noise — each "
              "system's spread over its seeds and the image component (the covariance of different runs over "
              "1,000 bootstrap draws of the images, every corpus metric recomputed on each draw); p = the same "
              "t's two-sided p (docs/guide/statistics.md).")]
    if "1" in seeds:
        parts.append("Rows with one seed each: test images only (the paired bootstrap variance over images), "
                     "which says \"these two models on these images\", not \"these methods\".")
    sizes = family_size(recs, PRIMARY_COLUMN)
    k = ", ".join(f"{v} on {d}" for d, v in sizes.items()) if len(sizes) > 1 else str(next(iter(sizes.values()), 0))
    parts.append(f"Multiple comparisons: one family per dataset and metric (this table's {k} comparisons), "
                 f"Holm's step-down correction; * = Holm-adjusted p ≤ {ALPHA:g}, n.s. otherwise, with the "
                 "minimum detectable effect (mde: 80 % power at level 0.05 / family) in brackets. "
                 f"Primary metric: {PRIMARY_LABEL}. The intervals are per comparison (not adjusted): one that "
                 "excludes 0 can still be n.s. after the correction.")
    return " ".join(parts)


PRIMARY_COLUMN = "C"  # CIDEr: the column the paper's claims are read on
PRIMARY_LABEL = "C (CIDEr)"


def diff_markdown(recs: Sequence[Mapping[str, str]], columns: Sequence[str]) -> list[str]:
    """The paired differences of the compared rows as a Markdown table (none compared: no lines)."""
    compared = [r for r in recs if r.get("vs")]
    if not compared:
        return []
    out = ["## Differences (row − reference, × 100)", "",
           md_line(["Dataset", "Method", "vs", "Seeds", *columns]),
           "|" + "|".join(["---"] * 3 + ["---:"] * (1 + len(columns))) + "|"]
    out += [md_line([r["dataset"], r["method"], r["vs"], r.get("d_seeds", ""), *(diff_text(r, c) for c in columns)])
            for r in compared]
    return out + ["", comparison_note(recs, columns), ""]


def table_sentence(rows: Sequence[Mapping[str, str]], columns: Sequence[str]) -> str:
    """One sentence: how many seeds and images stand behind this run's rows, which interval, and
    which paired differences are resolved (``*``)."""
    run = [r for r in rows if (r.get("seeds") or "").strip()]
    if not run:
        return "No row of this run has per-image statistics: no intervals."
    seeds = sorted({int(r["seeds"]) for r in run})
    images = sorted({int(r["images"]) for r in run if (r.get("images") or "").strip()})
    kinds = sorted({r["interval"] for r in run if r.get("interval")})
    seed_txt = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}–{seeds[-1]}"
    img_txt = (f"{images[0]}" if len(images) == 1 else f"{images[0]}–{images[-1]}") if images else "an unknown number of"
    head = (f"{len(run)} row(s) of this run, {seed_txt} seed(s) and {img_txt} test images each; "
            f"95 % intervals: {', '.join(kinds) or 'none'}.")
    compared = [r for r in run if r.get("vs")]
    if not compared:
        return head
    resolved = []
    for r in compared:
        hits = [c for c in columns if r.get(f"d_{c}_mark") == SIGNIFICANT]
        if hits:
            resolved.append(f"{r.get('method', '')} ({r.get('dataset', '')}) on {', '.join(hits)}")
    vs = sorted({r["vs"] for r in compared})
    mdes = [float(r[f"d_{PRIMARY_COLUMN}_mde"]) for r in compared if (r.get(f"d_{PRIMARY_COLUMN}_mde") or "").strip()]
    tail = (f" Differences against {' / '.join(vs)} marked after Holm's correction within each dataset's and "
            "metric's family: " + ("; ".join(resolved) if resolved else "none") + "; every other difference n.s.")
    if mdes:
        lo, hi = min(mdes), max(mdes)
        tail += (f" At this run's size a {PRIMARY_LABEL} difference is detected with 80 % power from about "
                 + (f"{lo:.1f}" if lo == hi else f"{lo:.1f}–{hi:.1f}") + " points (the mde column).")
    if any(r.get("d_seeds") == "1" for r in compared):
        tail += (" A comparison at one seed each tests the test images only, not the spread between training "
                 "seeds (`r2m power` plans seeds and images).")
    return head + tail

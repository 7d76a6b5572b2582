"""A verdict on each claim the paper makes with Tables 1–3 (:mod:`r2m.reports.paper_claims`):
``reports/claims.csv`` and the report's "Claims" section.

For every dataset of this run, each claim between two rows this pipeline trains (Table 2's variants,
Table 3's checkpoints of R2M) is the comparison ``higher − lower`` on the claim's metric (× 100),
paired image by image and seed by seed over the seeds both rows ran. The statistics come from one
function, :func:`compare_family` (the only place this module calls the statistics code), over one
family: the testable claims of one table on one dataset. The verdict (:func:`verdict`):

* **supported** — the difference's interval lies wholly above 0 and its family-adjusted p < α;
* **contradicted** — the interval lies wholly below 0 and its adjusted p < α;
* **unresolved** — anything else; the row then says how many test images or seed pairs would resolve
  a difference of the size observed (:func:`resolve_with`: the seed-aware interval's spreads of the
  pairs compared, :mod:`r2m.evaluation.power`'s paired rules);
* **not testable here** — the run has no pair of rows for it (Table 1's baselines UC-GAN and
  SME-GAN are not run by this pipeline; a variant not configured; no per-image statistics), with
  the reason.

A verdict is about this run's dataset: on the demo (16 test images, a short schedule) it says whether
the ordering holds there, not whether the paper's benchmark numbers are reproduced.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from r2m.evaluation import power
from r2m.evaluation import randomization as RZ
from r2m.evaluation.bootstrap import DEFAULT_LEVEL, PerImage, t_quantile
from r2m.reports import intervals as I
from r2m.reports import paper_claims as C
from r2m.reports import published as P
from r2m.stage.context import StageContext
from r2m.utils.io import write_text

ALPHA = 0.05
SUPPORTED, CONTRADICTED, UNRESOLVED, NOT_TESTABLE = "supported", "contradicted", "unresolved", "not testable here"
VERDICTS = (SUPPORTED, CONTRADICTED, UNRESOLVED, NOT_TESTABLE)
COLUMNS = ("claim", "table", "statement", "published", "dataset", "comparison", "metric", "seeds", "images",
           "difference", "low", "high", "level", "test", "p", "correction", "p_adjusted", "verdict",
           "images_to_resolve", "seeds_to_resolve", "note")
ROW_LABELS = {2: P.VARIANT_LABELS, 3: {**P.CKPT_LABELS, "train_i": "R2M final (+L_rec^I)"}}


# --------------------------------------------------------------------------- the statistics (one adapter)
@dataclass(frozen=True)
class Comparison:
    """What the statistics say of ``higher − lower`` on one metric: the difference (× 100) and its interval at
    ``level``, the test's two-sided p and the p adjusted within the family, the names of both, and what stands
    behind it (the seeds both rows ran, paired seed by seed; the test images both scored)."""

    difference: float
    low: float
    high: float
    p: float
    p_adjusted: float
    test: str
    correction: str
    seeds: int
    images: int
    level: float = DEFAULT_LEVEL


CORRECTION = "Holm over the claims of one table on one dataset"


def compare_family(pairs: Sequence[tuple[I.RowEval, I.RowEval]], metric: str,
                   level: float = DEFAULT_LEVEL) -> list[Comparison | None]:
    """THE adapter between the claims and the statistics code: one family of comparisons, each pair
    ``(higher row, lower row)`` (each row: its seeds' ``eval.json`` and ``per_image.parquet``,
    :class:`r2m.reports.intervals.RowEval`), on ``metric`` (an ``eval.json`` name, e.g. ``CIDEr``).

    Returns, per pair and in order, a :class:`Comparison` (``higher − lower`` × 100, its interval, p, the p
    adjusted within the family, the test's and the correction's names, the shared seeds and images), or None
    where the pair cannot be compared (no per-image statistics, no shared seed or image, the metric absent).

    The difference and its test are the tables' (:func:`r2m.reports.intervals.paired`: seed by seed and image
    by image — with several seed pairs the interval holds the seed-to-seed spread and the test must reject
    both within seeds over images and over the seeds; one seed pair: images only), and the correction is
    :func:`r2m.evaluation.randomization.holm` within the family."""
    diffs = [I.paired(higher, lower, [metric], level=level).get(metric) for higher, lower in pairs]
    done = {i: d.p for i, d in enumerate(diffs) if d is not None and d.p == d.p}
    adjusted = RZ.holm(done) if done else {}
    out: list[Comparison | None] = []
    for i, d in enumerate(diffs):
        if d is None or i not in adjusted:
            out.append(None)
            continue
        out.append(Comparison(100 * d.delta, 100 * d.low, 100 * d.high, d.p, adjusted[i], d.method, CORRECTION,
                              d.seeds, d.images, d.level))
    return out


# --------------------------------------------------------------------------- verdicts
def verdict(comp: Comparison | None, alpha: float = ALPHA) -> str:
    """supported / contradicted / unresolved from a comparison of ``higher − lower``; not testable without one."""
    if comp is None:
        return NOT_TESTABLE
    if comp.p_adjusted < alpha and comp.low > 0:
        return SUPPORTED
    if comp.p_adjusted < alpha and comp.high < 0:
        return CONTRADICTED
    return UNRESOLVED


@dataclass(frozen=True)
class Resolve:
    """How many test images (at the seed pairs compared) or seed pairs (on the images compared) would
    resolve a difference of ``delta`` (× 100): :func:`r2m.evaluation.power.paired_images_needed` /
    ``paired_seeds_needed`` from the spreads of the pairs themselves. None: cannot say, and ``why_images`` /
    ``why_seeds`` say why (the metric has no per-image values, one seed pair, the other spread alone is wider
    than the difference)."""

    delta: float
    images: int | None
    seeds: int | None
    why_images: str = ""
    why_seeds: str = ""


def _metric_column(pair: tuple[PerImage, PerImage], metric: str) -> tuple[np.ndarray, np.ndarray] | None:
    a, b = pair
    if metric not in a.columns or metric not in b.columns:
        return None
    return 100.0 * np.asarray(a.columns[metric], dtype=np.float64), 100.0 * np.asarray(b.columns[metric], dtype=np.float64)


def resolve_with(higher: I.RowEval, lower: I.RowEval, metric: str, delta: float,
                 level: float = DEFAULT_LEVEL) -> Resolve:
    """The planning figures for ``higher − lower`` on ``metric`` (× 100), from the same seed pairs and images
    as the comparison (:func:`r2m.reports.intervals.seed_pairs`): with ``k`` seed pairs on ``n`` images,
    ``d_s`` the per-seed paired differences (each seed's mean of per-image differences: the metric's corpus
    value when it is a mean of per-image values) and ``sd_i`` the standard deviation over images of the
    per-image differences averaged over the seeds, the seed-aware interval's half-width is
    ``hypot(t_{k-1} · sd(d_s) / √k, z · sd_i / √n)``. Images: the fewest ``n`` that bring it to the
    difference at these ``k`` seeds; seeds: the fewest ``k`` at these images (image half-width held). One
    seed pair: images only (``z · sd_i / √n``), and no seed figure (no paired seed spread measured)."""
    delta = abs(delta)
    if not (math.isfinite(delta) and delta > 0):
        return Resolve(delta, None, None, "no difference", "no difference")
    cols = [_metric_column(pair, metric) for pair in I.seed_pairs(higher, lower)]
    if not cols or any(c is None for c in cols):
        why = f"no per-image {metric} values to plan from"
        return Resolve(delta, None, None, why, why)
    diffs = np.stack([b - a for a, b in cols])  # [k, n]: higher − lower per seed pair and image
    k, n = diffs.shape
    if n < 2 or not np.isfinite(diffs).all():
        why = "fewer than two images with values to plan from"
        return Resolve(delta, None, None, why, why)
    sd_images = float(diffs.mean(axis=0).std(ddof=1))
    image_half = power.z_quantile(level) * sd_images / math.sqrt(n)
    if k == 1:
        return Resolve(delta, power.paired_images_needed(sd_images, delta, 0.0, level), None, "",
                       "seeds: one seed pair, no paired seed-to-seed spread measured")
    sd_seeds = float(diffs.mean(axis=1).std(ddof=1))
    seed_half = t_quantile(level, k - 1) * sd_seeds / math.sqrt(k)
    images = power.paired_images_needed(sd_images, delta, seed_half, level)
    seeds = power.paired_seeds_needed(sd_seeds, delta, image_half, level)
    return Resolve(delta, images, seeds,
                   "" if images is not None else (f"more images cannot: the seed-to-seed spread alone ({k} seed "
                                                  "pairs) is wider than the difference"),
                   "" if seeds is not None else (f"more seeds cannot: the image spread alone ({n} images) is wider "
                                                 "than the difference"))


# --------------------------------------------------------------------------- rows of claims.csv
def _num(v: float | None, digits: int = 1) -> str:
    return "" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def _p(v: float) -> str:
    return f"{v:.3f}"


def _label(claim: C.Claim, key: str) -> str:
    return ROW_LABELS.get(claim.table, {}).get(key, key)


def base_cells(claim: C.Claim, dataset: str) -> dict[str, str]:
    return {"claim": claim.id, "table": str(claim.table), "statement": claim.statement,
            "published": C.published_text(claim), "dataset": dataset,
            "comparison": f"{_label(claim, claim.higher)} − {_label(claim, claim.lower)}", "metric": claim.metric}


def untestable(claim: C.Claim, dataset: str, reason: str) -> dict[str, str]:
    return {**{k: "" for k in COLUMNS}, **base_cells(claim, dataset), "verdict": NOT_TESTABLE, "note": reason}


def tested(claim: C.Claim, dataset: str, comp: Comparison, resolve: Resolve | None) -> dict[str, str]:
    v = verdict(comp)
    row = {**{k: "" for k in COLUMNS}, **base_cells(claim, dataset),
           "seeds": str(comp.seeds), "images": str(comp.images), "difference": _num(comp.difference),
           "low": _num(comp.low), "high": _num(comp.high), "level": f"{comp.level:g}", "test": comp.test,
           "p": _p(comp.p), "correction": comp.correction, "p_adjusted": _p(comp.p_adjusted), "verdict": v}
    if v == UNRESOLVED and resolve is not None:
        row["images_to_resolve"] = "" if resolve.images is None else str(resolve.images)
        row["seeds_to_resolve"] = "" if resolve.seeds is None else str(resolve.seeds)
        parts = []
        if resolve.images is not None:
            parts.append(f"about {resolve.images:,} test images (paired, at the {comp.seeds} seed pair"
                         f"{'s' if comp.seeds != 1 else ''} compared)")
        if resolve.seeds is not None:
            parts.append(f"{resolve.seeds} seed pairs (on these {comp.images} images)")
        cannot = list(dict.fromkeys(why for why in (resolve.why_images, resolve.why_seeds) if why))
        if parts:
            row["note"] = (f"a difference of {resolve.delta:.1f} would need {' or '.join(parts)} to resolve (the "
                           "interval's half-width at most the difference)")
        else:
            row["note"] = "cannot say how many images or seeds would resolve it here"
        if cannot:
            row["note"] += "; " + "; ".join(cannot)
    return row


def table1_reason(claim: C.Claim, datasets: Sequence[str]) -> str:
    names = [P.dataset_label(d) for d in claim.datasets]
    absent = [P.dataset_label(d) for d in claim.datasets if d not in datasets]
    baseline = "UC-GAN and SME-GAN are" if claim.lower_table else f"{claim.lower} is"
    reason = (f"{baseline} not run by this pipeline: only published numbers exist, with no per-image scores or "
              "seeds to pair with")
    if absent:
        reason += f"; {' / '.join(absent)} not in this run (datasets: {', '.join(datasets) or 'none'})"
    elif names:
        reason += f" on {' / '.join(names)}"
    return reason


def build(datasets: Sequence[str], rows: Mapping[int, Mapping[tuple[str, str], I.RowEval]],
          claims: Sequence[C.Claim] = C.CLAIMS) -> list[dict[str, str]]:
    """One row per claim and dataset of this run, in claim order (a claim on rows this pipeline does not run:
    one row).
    ``rows``: per table (2, 3) the gathered rows of this run, keyed ``(dataset, row key)``."""
    results: dict[str, list[dict[str, str]]] = {c.id: [] for c in claims}
    for claim in claims:
        if not claim.runs_rows:
            results[claim.id].append(untestable(claim, " / ".join(P.dataset_label(d) for d in claim.datasets),
                                                table1_reason(claim, datasets)))
    for ds in datasets:
        for table in (2, 3):
            family = [c for c in claims if c.runs_rows and c.table == table]
            have = rows.get(table, {})
            pairs, where = [], []
            for c in family:
                missing = [k for k in (c.higher, c.lower) if (ds, k) not in have]
                if missing:
                    axis = "variant" if table == 2 else "checkpoint"
                    results[c.id].append(untestable(c, ds, f"this run has no {axis} {', '.join(missing)} on {ds}"))
                    continue
                pairs.append((have[(ds, c.higher)], have[(ds, c.lower)]))
                where.append(c)
            metric_of = {c.id: P.METRIC_OF[c.metric] for c in where}
            for metric in dict.fromkeys(metric_of.values()):  # one family per table, dataset and metric
                at = [k for k, c in enumerate(where) if metric_of[c.id] == metric]
                comps = compare_family([pairs[k] for k in at], metric)
                for k, comp in zip(at, comps, strict=True):
                    c = where[k]
                    if comp is None:
                        results[c.id].append(untestable(c, ds, "no per-image statistics, or no seed and image both "
                                                                  f"rows share, for {metric}"))
                        continue
                    res = resolve_with(pairs[k][0], pairs[k][1], metric, comp.difference)
                    results[c.id].append(tested(c, ds, comp, res))
    return [r for c in claims for r in results[c.id]]


def to_csv(rows: Sequence[Mapping[str, str]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def counts_sentence(rows: Sequence[Mapping[str, str]]) -> str:
    """``3 supported, 0 contradicted, 4 unresolved, 3 not testable here``."""
    return ", ".join(f"{sum(r.get('verdict') == v for r in rows)} {v}" for v in VERDICTS)


# --------------------------------------------------------------------------- the stage
def _gathered(ctx: StageContext, evals: str, stats: str, axis: str) -> dict[tuple[str, str], I.RowEval]:
    from r2m.reports.tables import read_eval

    def key_of(keys: Mapping[str, str]) -> tuple[str, str]:
        return keys["dataset"], keys[axis]

    return I.gathered_rows(ctx, evals, stats, key_of,
                           lambda p, k: read_eval(p, f"dataset={k[0]}, {axis}={k[1]}"))


def run(ctx: StageContext) -> None:
    rows = {2: _gathered(ctx, "t2_evals", "t2_stats", "variant"), 3: _gathered(ctx, "t3_evals", "t3_stats", "ckpt")}
    out = build(list(ctx.params.datasets), rows)
    write_text(ctx.outs["csv"], to_csv(out))
    ctx.log.info("claims: wrote %s (%s)", ctx.outs["csv"], counts_sentence(out))

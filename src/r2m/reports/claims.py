"""A verdict on each claim the paper makes with Tables 1–3 (:mod:`r2m.reports.paper_claims`):
``reports/claims.csv`` and the report's "Claims" section.

For every dataset of this run, each claim between two rows this pipeline trains (Table 2's variants,
Table 3's checkpoints of R2M) is one of the comparisons its table makes (Table 2: a variant against
R2M; Table 3: a stage against the stage before, :meth:`r2m.reports.tables.TableSpec.comparisons`),
computed by the same function (:func:`r2m.reports.intervals.paired`: the model of seeds and images of
:mod:`r2m.evaluation.noise`) in the same family (the table's comparisons on that dataset and metric,
Holm's correction), so the table and the claim give one difference one adjusted p
(:func:`compare_family`). The verdict (:func:`verdict`):

* **supported** — the difference ``higher − lower`` has its interval wholly above 0 and its adjusted
  p < α;
* **contradicted** — the interval lies wholly below 0 and the adjusted p < α;
* **unresolved** — anything else;
* **not testable here** — the run has no pair of rows for it (Table 1's baselines UC-GAN and
  SME-GAN are not run by this pipeline; a variant not configured; no per-image statistics), with
  the reason.

Beside the verdict: the relative difference of this run next to the published one (the paper's base:
R2M in Table 2, the stage before in Table 3), the minimum detectable effect at this run's size (80 %
power at α / family), and how many test images (at the run's seeds) or seeds per system (on the run's
images) would detect the published relative effect with 80 % power after the correction — from the
fitted components, and again at their 80 % upper confidence bounds (:func:`plan`).

A verdict is about this run's dataset: on the demo (a few dozen photos, a short schedule) it says whether
the ordering holds there, not whether the paper's benchmark numbers are reproduced.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from r2m.evaluation import noise as N
from r2m.evaluation.bootstrap import DEFAULT_LEVEL
from r2m.reports import cells as CL
from r2m.reports import intervals as I
from r2m.reports import paper_claims as C
from r2m.reports import published as P
from r2m.reports import tables as T
from r2m.stage.context import StageContext
from r2m.utils.io import write_text

ALPHA = I.ALPHA
SUPPORTED, CONTRADICTED, UNRESOLVED, NOT_TESTABLE = "supported", "contradicted", "unresolved", "not testable here"
VERDICTS = (SUPPORTED, CONTRADICTED, UNRESOLVED, NOT_TESTABLE)
COLUMNS = ("claim", "table", "statement", "published", "dataset", "comparison", "metric", "seeds", "images",
           "difference", "low", "high", "level", "relative", "published_relative", "test", "p", "correction",
           "family", "p_adjusted", "mde", "verdict", "planned_effect", "images_to_resolve", "images_to_resolve_hi",
           "seeds_to_resolve", "seeds_to_resolve_hi", "note")
ROW_LABELS = {2: P.VARIANT_LABELS, 3: P.CKPT_LABELS}
CONFIDENCE = 0.8  # the upper bounds the *_hi plans put the variances at


# --------------------------------------------------------------------------- the statistics (one adapter)
@dataclass(frozen=True)
class Comparison:
    """What the statistics say of ``higher − lower`` on one metric: the difference (× 100) and its interval at
    ``level``, the test's two-sided p and the p adjusted within the family (of ``family`` comparisons), the
    minimum detectable effect (× 100), the names of the test and the correction, the seeds and images behind
    it, and the fit of the table's own comparison (``row − reference``) with the reference's side."""

    difference: float
    low: float
    high: float
    p: float
    p_adjusted: float
    test: str
    correction: str
    seeds: str
    images: int
    family: int = 1
    mde: float = math.nan
    fit: N.Fit | None = None
    higher_is_reference: bool = False
    level: float = DEFAULT_LEVEL


CORRECTION = "Holm within the family: the comparisons its table makes on this dataset and metric"


def compare_family(comparisons: Sequence[tuple[I.RowEval, I.RowEval]], metric: str,
                   level: float = DEFAULT_LEVEL) -> list[tuple[N.Estimate | None, float | None, int]]:
    """THE adapter between the claims and the statistics code: one family, ``comparisons`` = one table's
    ``(row, reference)`` pairs on one dataset (:meth:`r2m.reports.tables.TableSpec.comparisons`), on ``metric``
    (an ``eval.json`` name, e.g. ``CIDEr``). Per pair, in order: the estimate of ``row − reference``
    (:func:`r2m.reports.intervals.paired`, as the table computes it; None where the pair cannot be compared),
    its Holm-adjusted p within the family and the family's size."""
    diffs = {i: I.paired(row, ref, [metric], level=level) for i, (row, ref) in enumerate(comparisons)}
    adjusted, sizes = I.holm_by_metric(diffs), I.family_sizes(diffs)
    return [(diffs[i].get(metric), adjusted.get(i, {}).get(metric), sizes.get(metric, 0))
            for i in range(len(comparisons))]


def as_claim(est: N.Estimate, p_adjusted: float, family: int, higher_is_reference: bool) -> Comparison:
    """The table's ``row − reference`` as the claim reads it, ``higher − lower`` (× 100)."""
    sign = -1.0 if higher_is_reference else 1.0
    low, high = sorted((sign * est.low, sign * est.high))
    return Comparison(100 * sign * est.value, 100 * low, 100 * high, est.p, p_adjusted, est.fit.method,
                      f"{CORRECTION} ({family})", CL.seeds_cell({"m": est}), est.fit.n, family,
                      100 * N.mde(est.fit, ALPHA / max(1, family)), est.fit, higher_is_reference, est.level)


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


def published_relative(claim: C.Claim, dataset: str) -> float | None:
    """The paper's relative difference of the claim, ``(row − reference) / reference`` in percent (the base the
    paper's sentences use: R2M in Table 2, the stage before in Table 3): on ``dataset`` when it is one of the
    paper's, else the mean over the datasets it is published on."""
    pairs = C.published_pairs(claim)
    ref_higher = reference_is_higher(claim)
    rel = {ds: 100 * ((lo - hi) / hi if ref_higher else (hi - lo) / lo) for ds, hi, lo in pairs
           if hi is not None and lo is not None}
    if dataset in rel:
        return rel[dataset]
    return sum(rel.values()) / len(rel) if rel else None


def reference_is_higher(claim: C.Claim) -> bool:
    """Whether the claim's higher row is its table's reference (Table 2: R2M against a variant)."""
    spec = T.TABLES[f"table{claim.table}"]
    return spec.compared.get(claim.lower) == claim.higher


@dataclass(frozen=True)
class Plan:
    """How many test images (at the run's seeds) or seeds per system (on the run's images) detect ``effect``
    (× 100) with 80 % power at ``alpha`` (α / family), from the fit and from its upper bounds (``*_hi``);
    ``why`` says what could not be planned and why."""

    effect: float
    images: int | None
    images_hi: int | None
    seeds: int | None
    seeds_hi: int | None
    why: str = ""


def plan(fit: N.Fit, effect: float, alpha: float) -> Plan:
    """:func:`r2m.evaluation.noise.images_needed` / ``seeds_needed`` for ``effect`` (× 100) at level ``alpha``,
    from ``fit`` and from :meth:`r2m.evaluation.noise.Fit.upper` (the variances at their 80 % upper bounds)."""
    delta = abs(effect) / 100
    if not (math.isfinite(delta) and delta > 0):
        return Plan(effect, None, None, None, None, "no effect to plan for")
    upper = fit.upper(CONFIDENCE)
    got = [N.images_needed(fit, delta, alpha), N.images_needed(upper, delta, alpha),
           N.seeds_needed(fit, delta, alpha), N.seeds_needed(upper, delta, alpha)]
    why = []
    if got[0] is None:
        runs = max(s.runs for s in fit.sides)
        seed_sd = ", ".join(f"{100 * math.sqrt(s.seed_effect()):.1f}" for s in fit.sides if not s.fixed)
        why.append(f"at {runs} seeds per system no number of test images reaches 80 % power: the fitted seed "
                   f"effects (sd {seed_sd}) alone keep it below")
    if got[2] is None:
        if all(s.fixed for s in fit.sides):
            why.append("one run per system: no seed spread measured, so no seed figure")
        else:
            why.append(f"on these {fit.n} images no number of seeds reaches 80 % power: the image component "
                       f"(sd {100 * math.sqrt(fit.image):.1f} at {fit.n} images) alone keeps it below")
    return Plan(effect, *got, "; ".join(why))


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


def _signed(v: float | None, digits: int = 1) -> str:
    return "" if v is None or not math.isfinite(v) else f"{v:+.{digits}f}"


def tested(claim: C.Claim, dataset: str, comp: Comparison) -> dict[str, str]:
    """The row of a tested claim: the comparison, the relative effects, the verdict and the plan."""
    v = verdict(comp)
    row = {**{k: "" for k in COLUMNS}, **base_cells(claim, dataset),
           "seeds": comp.seeds, "images": str(comp.images), "difference": _num(comp.difference),
           "low": _num(comp.low), "high": _num(comp.high), "level": f"{comp.level:g}", "test": comp.test,
           "p": _p(comp.p), "correction": comp.correction, "family": str(comp.family),
           "p_adjusted": _p(comp.p_adjusted), "mde": _num(comp.mde), "verdict": v}
    notes = []
    fit = comp.fit
    pub = published_relative(claim, dataset)
    row["published_relative"] = _signed(pub)
    base = fit.a.mean if fit is not None and fit.a is not None else None
    if fit is not None and base:
        rel = 100 * fit.delta / base
        row["relative"] = _signed(rel)
        ref = claim.higher if comp.higher_is_reference else claim.lower
        notes.append(f"{_label(claim, claim.lower if comp.higher_is_reference else claim.higher)}: {rel:+.1f} % of "
                     f"{_label(claim, ref)}'s {claim.metric} here"
                     + (f", {pub:+.1f} % published" if pub is not None else ""))
    if fit is not None and pub is not None and base:
        pl = plan(fit, pub / 100 * base * 100, ALPHA / max(1, comp.family))
        row["planned_effect"] = _num(abs(pl.effect))
        for key, value in (("images_to_resolve", pl.images), ("images_to_resolve_hi", pl.images_hi),
                           ("seeds_to_resolve", pl.seeds), ("seeds_to_resolve_hi", pl.seeds_hi)):
            row[key] = "" if value is None else str(value)
        parts = []
        if pl.images is not None:
            parts.append(f"{pl.images:,} test images at these seeds ({_hi(pl.images_hi)} if the spreads are at "
                         f"their {int(100 * CONFIDENCE)} % upper bounds)")
        if pl.seeds is not None:
            parts.append(f"{pl.seeds} seeds per system on these {comp.images} images ({_hi(pl.seeds_hi)} at the "
                         "upper bounds)")
        if parts:
            notes.append(f"the published effect here ({abs(pl.effect):.1f} points) is detected with 80 % power "
                         f"after the correction by {' or '.join(parts)}")
        if pl.why:
            notes.append(pl.why)
    if v == UNRESOLVED:
        notes.append(f"differences of {comp.mde:.1f} points or more are detected with 80 % power at this size "
                     "(mde)")
    row["note"] = "; ".join(notes)
    return row


def _hi(v: int | None) -> str:
    return "more than the search's limit" if v is None else f"{v:,}"


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
            spec = T.TABLES[f"table{table}"]
            have = rows.get(table, {})
            comps = spec.comparisons([k for k in spec.order if (ds, k) in have])
            index = {pair: i for i, pair in enumerate(comps)}
            metrics = {}
            for c in (c for c in claims if c.runs_rows and c.table == table):
                missing = [k for k in (c.higher, c.lower) if (ds, k) not in have]
                if missing:
                    axis = "variant" if table == 2 else "checkpoint"
                    results[c.id].append(untestable(c, ds, f"this run has no {axis} {', '.join(missing)} on {ds}"))
                    continue
                at = index.get((c.lower, c.higher), index.get((c.higher, c.lower)))
                if at is None:
                    results[c.id].append(untestable(c, ds, f"Table {table} does not compare {c.higher} with "
                                                           f"{c.lower}"))
                    continue
                metric = P.METRIC_OF[c.metric]
                if metric not in metrics:
                    metrics[metric] = compare_family([(have[(ds, r)], have[(ds, f)]) for r, f in comps], metric)
                est, adjusted, family = metrics[metric][at]
                if est is None or adjusted is None:
                    results[c.id].append(untestable(c, ds, "no per-image statistics, or no seed and image both "
                                                           f"rows share, for {metric}"))
                    continue
                results[c.id].append(tested(c, ds, as_claim(est, adjusted, family, comps[at][1] == c.higher)))
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
    def key_of(keys: Mapping[str, str]) -> tuple[str, str]:
        return keys["dataset"], keys[axis]

    return I.gathered_rows(ctx, evals, stats, key_of,
                           lambda p, k: T.read_eval(p, f"dataset={k[0]}, {axis}={k[1]}"))


def run(ctx: StageContext) -> None:
    rows = {2: _gathered(ctx, "t2_evals", "t2_stats", "variant"), 3: _gathered(ctx, "t3_evals", "t3_stats", "ckpt")}
    out = build(list(ctx.params.datasets), rows)
    write_text(ctx.outs["csv"], to_csv(out))
    ctx.log.info("claims: wrote %s (%s)", ctx.outs["csv"], counts_sentence(out))

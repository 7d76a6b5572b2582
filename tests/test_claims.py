"""The verdict on each of the paper's claims (src/r2m/reports/claims.py, paper_claims.py): the verdict rules on
hand-made comparisons, Holm's correction in the adapter on hand-picked p-values, the planning figures of an
unresolved claim worked by hand (z_0.975 = 1.959964; t quantiles from scipy, not from the code under test),
claims.csv's columns, the stage in the DAG and the report's section."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from r2m import params as P
from r2m.evaluation import per_image
from r2m.evaluation.bootstrap import PerImage
from r2m.evaluation.randomization import SEEDS_AND_IMAGES, SeedDifference
from r2m.reports import claims as CL
from r2m.reports import intervals as I
from r2m.reports import paper_claims as PC
from r2m.stage import registry as S
from r2m.stage.context import StageContext

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
N = 16
SEED_SHIFT = (0.0, 0.02, -0.02)  # R2M's three seeds: corpus CIDEr 50, 52, 48 (× 100): sd 2


def comp(low: float, high: float, p_adj: float) -> CL.Comparison:
    return CL.Comparison((low + high) / 2, low, high, p_adj, p_adj, "test", "correction", 3, 16)


# --------------------------------------------------------------------------- the rules, hand-made inputs
@pytest.mark.parametrize(("low", "high", "p_adj", "expected"), [
    (1.0, 5.0, 0.01, CL.SUPPORTED),  # interval wholly above 0, adjusted p < 0.05
    (-5.0, -1.0, 0.01, CL.CONTRADICTED),  # wholly below 0
    (1.0, 5.0, 0.2, CL.UNRESOLVED),  # above 0, but the family's correction leaves p ≥ 0.05
    (-5.0, -1.0, 0.05, CL.UNRESOLVED),  # p = α is not below α
    (-1.0, 5.0, 0.01, CL.UNRESOLVED),  # interval across 0
    (0.0, 5.0, 0.01, CL.UNRESOLVED),  # touching 0 is not wholly above it
])
def test_verdict_rules(low, high, p_adj, expected) -> None:
    assert CL.verdict(comp(low, high, p_adj)) == expected


def test_no_comparison_is_not_testable() -> None:
    assert CL.verdict(None) == CL.NOT_TESTABLE


# --------------------------------------------------------------------------- rows made by hand
def row(per_seed: list[np.ndarray], seeds=("0", "1", "2")) -> I.RowEval:
    """One row: per seed its per-image CIDEr (a mean metric: the corpus value is the mean) and eval.json."""
    ids = tuple(str(i) for i in range(N))
    stats = [PerImage(ids, {"CIDEr": np.asarray(v, dtype=np.float64)}) for v in per_seed]
    return I.RowEval([{"CIDEr": float(np.mean(v))} for v in per_seed], stats, list(seeds))


ALT = np.array([(-1.0) ** i for i in range(N)])
BASE = np.full(N, 0.5)
R2M = [BASE + s for s in SEED_SHIFT]
SPREAD = 0.01 + 0.2 * ALT  # R2M − R w/o Memory per image: mean 1.0, ±20 around it (× 100)


def table2_rows() -> dict[tuple[str, str], I.RowEval]:
    return {("tiny", "r2m"): row(R2M),
            ("tiny", "no_fm"): row([v - 0.05 - 0.001 * ALT for v in R2M]),  # 5 below R2M on every image
            ("tiny", "d_lstm"): row([v + 0.05 + 0.001 * ALT for v in R2M]),  # 5 above R2M on every image
            ("tiny", "r_lstm"): row([v - SPREAD for v in R2M])}  # 1 below on average, ±20 per image


def by_claim(rows: list[dict[str, str]], dataset: str = "tiny") -> dict[str, dict[str, str]]:
    return {r["claim"]: r for r in rows if r["dataset"] == dataset}


def test_each_verdict_from_hand_made_rows() -> None:
    rows = CL.build(["tiny"], {2: table2_rows(), 3: {}})
    got = by_claim(rows)
    assert got["t2.no_fm"]["verdict"] == CL.SUPPORTED  # R2M − D w/o FM = +5.0 on every image
    assert float(got["t2.no_fm"]["difference"]) == pytest.approx(5.0, abs=0.05)
    assert float(got["t2.no_fm"]["low"]) > 0 and float(got["t2.no_fm"]["p_adjusted"]) < 0.05
    assert got["t2.d_lstm"]["verdict"] == CL.CONTRADICTED  # R2M − D w/o Memory = −5.0 on every image
    assert float(got["t2.d_lstm"]["high"]) < 0
    assert got["t2.r_lstm"]["verdict"] == CL.UNRESOLVED
    assert got["t2.dr_lstm"]["verdict"] == CL.NOT_TESTABLE and "no variant dr_lstm" in got["t2.dr_lstm"]["note"]
    for r in (got["t2.no_fm"], got["t2.d_lstm"], got["t2.r_lstm"]):
        assert (r["seeds"], r["images"], r["metric"]) == ("3", "16", "C")
        assert r["test"] == SEEDS_AND_IMAGES and r["correction"] == CL.CORRECTION
    for cid in ("t3.rec_s", "t3.match", "t3.rec_i"):  # no Table 3 rows in this run
        assert got[cid]["verdict"] == CL.NOT_TESTABLE and "no checkpoint" in got[cid]["note"]


def test_an_unresolved_claim_says_what_would_resolve_it() -> None:
    """R2M − R w/o Memory: per image 1 ± 20 (× 100) at every seed, so the per-seed paired differences are 1, 1, 1
    (sd 0: no seed half-width) and the per-image differences averaged over the seeds have sd 20·√(16/15) =
    20.656: a difference of 1.0 needs (1.959964 · 20.656 / 1.0)² = 1639.02 → 1,640 images. More seeds cannot
    resolve it: on these 16 images the image half-width alone, 1.959964 · 20.656 / 4 = 10.12, exceeds 1."""
    got = by_claim(CL.build(["tiny"], {2: table2_rows(), 3: {}}))["t2.r_lstm"]
    assert got["verdict"] == CL.UNRESOLVED and float(got["difference"]) == pytest.approx(1.0, abs=0.05)
    sd = 20.0 * math.sqrt(16 / 15)
    assert int(got["images_to_resolve"]) == math.ceil((1.959964 * sd / 1.0) ** 2) == 1640
    assert got["seeds_to_resolve"] == "" and 1.959964 * sd / 4 > 1.0
    assert "1,640 test images (paired, at the 3 seed pairs compared)" in got["note"]
    assert "more seeds cannot: the image spread alone (16 images)" in got["note"]


def test_images_and_seeds_to_resolve_come_from_the_paired_seed_differences() -> None:
    """R2M − R w/o Memory = c_s + 15 · (±1 alternating over the 16 images) (× 100) at seeds 0–2 with
    c = 6.5, 10, 13.5: per-seed paired differences 6.5, 10, 13.5 (mean 10, sd 3.5), per-image differences
    averaged over the seeds 10 ± 15 (sd 15 · √(16/15) = 15.492). The seed-aware half-width is
    hypot(t_{0.975, k−1} · 3.5 / √k, 1.959964 · 15.492 / √n): 11.5 at k = 3, n = 16, so the interval holds 0.
    Images at k = 3 (seed half-width 4.3027 · 3.5 / √3 = 8.694): the first n with half-width ≤ 10, worked by a
    loop here (≈ 921.95 / (100 − 75.59) = 37.8 → 38). Seeds at n = 16 (image half-width 7.591): the first k
    with t_{0.975, k−1} · 3.5 / √k ≤ √(100 − 57.62) = 6.51 (k = 3: 8.69; k = 4: 3.1824 · 3.5 / 2 = 5.57 → 4).
    An unpaired rule (pooled sd of each row's seeds, images from one seed) would give other figures: the
    rows' own seed values are 50, 52, 48 and 43.5, 42, 34.5."""
    from scipy import stats

    shift = np.array([0.065, 0.10, 0.135])
    rows = {("tiny", "r2m"): row(R2M),
            ("tiny", "r_lstm"): row([v - c - 0.15 * ALT for v, c in zip(R2M, shift, strict=True)])}
    got = by_claim(CL.build(["tiny"], {2: rows, 3: {}}))["t2.r_lstm"]
    assert got["verdict"] == CL.UNRESOLVED and float(got["difference"]) == pytest.approx(10.0, abs=1e-9)
    assert float(got["low"]) < 0 < float(got["high"])
    z, sd_i = 1.959964, 15.0 * math.sqrt(16 / 15)
    seed_half = stats.t.ppf(0.975, 2) * 3.5 / math.sqrt(3)
    images = next(n for n in range(1, 10_000) if math.hypot(seed_half, z * sd_i / math.sqrt(n)) <= 10.0)
    seeds = next(k for k in range(2, 1000)
                 if math.hypot(stats.t.ppf(0.975, k - 1) * 3.5 / math.sqrt(k), z * sd_i / 4) <= 10.0)
    assert (images, seeds) == (38, 4)
    assert (int(got["images_to_resolve"]), int(got["seeds_to_resolve"])) == (images, seeds)
    assert "about 38 test images (paired, at the 3 seed pairs compared) or 4 seed pairs (on these 16 images)" \
        in got["note"]
    # one seed pair: images only, from that pair's per-image differences; no seed figure
    one = {k: I.RowEval(r.evals[:1], r.stats[:1], ["0"]) for k, r in rows.items()}
    got1 = by_claim(CL.build(["tiny"], {2: one, 3: {}}))["t2.r_lstm"]
    assert got1["seeds"] == "1" and float(got1["difference"]) == pytest.approx(6.5, abs=1e-9)
    assert got1["verdict"] == CL.UNRESOLVED  # 6.5 ± 15 on 16 images: half-width about 1.96 · 15.492 / 4 = 7.6
    assert int(got1["images_to_resolve"]) == math.ceil((z * sd_i / 6.5) ** 2) == 22  # 21.82
    assert got1["seeds_to_resolve"] == "" and "one seed pair" in got1["note"]
    # more images cannot help when the seed spread alone is wider than the difference
    wide = {("tiny", "r2m"): row(R2M),
            ("tiny", "r_lstm"): row([v - c - 0.15 * ALT for v, c in zip(R2M, (0.0, 0.10, 0.20), strict=True)])}
    gotw = by_claim(CL.build(["tiny"], {2: wide, 3: {}}))["t2.r_lstm"]  # d_s 0, 10, 20: 4.3027 · 10 / √3 = 24.8 > 10
    assert gotw["images_to_resolve"] == "" and "more images cannot" in gotw["note"]


def test_claims_on_rows_this_pipeline_does_not_run_are_not_testable() -> None:
    rows = CL.build(["tiny"], {2: table2_rows(), 3: {}})
    for cid in ("t1.uc_gan", "t1.sme_gan", "t3.xe_sota"):
        (r,) = [r for r in rows if r["claim"] == cid]
        assert r["verdict"] == CL.NOT_TESTABLE and "not run by this pipeline" in r["note"]
        assert "not in this run (datasets: tiny)" in r["note"]
        assert r["difference"] == r["p"] == ""
    (uc,) = [r for r in rows if r["claim"] == "t1.uc_gan"]
    assert uc["published"] == "MSCOCO↔Shutterstock 29.0 vs 28.6"  # Table 1's CIDEr: R2M, UC-GAN


def test_every_claim_rests_on_published_numbers_that_agree_with_it() -> None:
    """The claims as data: each names two rows of the paper's tables, and on every dataset it is published for
    the paper's own numbers order them as claimed (checked against the printed tables: e.g. Table 2, CIDEr on
    MSCOCO↔GCC, R2M 29.3 against D w/o FM 23.9)."""
    assert ("coco_gcc", 29.3, 23.9) in PC.published_pairs(PC.BY_ID["t2.no_fm"])
    assert PC.published_pairs(PC.BY_ID["t3.match"])[0] == ("coco_shutterstock", 28.9, 27.0)
    for c in PC.CLAIMS:
        pairs = PC.published_pairs(c)
        assert pairs and all(a is not None and b is not None and a > b for _, a, b in pairs), c.id


# --------------------------------------------------------------------------- the adapter's correction
def test_the_adapter_adjusts_the_family_by_holm(monkeypatch) -> None:
    """p = 0.01, 0.04, 0.03 → Holm: 0.01·3 = 0.03; 0.03·2 = 0.06; 0.04·1 = 0.04, kept ≥ 0.06 → 0.03, 0.06, 0.06."""
    ps = iter([0.01, 0.04, 0.03])

    def fake(higher, lower, metrics, *a, **k):
        return {metrics[0]: SeedDifference(a=0.5, b=0.6, delta=0.1, low=0.05, high=0.15, p=next(ps), p_images=0.0,
                                           p_seeds=None, per_seed=(0.1,), seeds=1, images=N, trials=999,
                                           resamples=1000, level=0.95, method="m")}

    monkeypatch.setattr(CL.I, "paired", fake)
    r = row(R2M)
    out = CL.compare_family([(r, r), (r, r), (r, r)], "CIDEr")
    assert [c.p for c in out] == [0.01, 0.04, 0.03]
    assert [c.p_adjusted for c in out] == pytest.approx([0.03, 0.06, 0.06])
    assert out[0].difference == pytest.approx(10.0) and (out[0].low, out[0].high) == pytest.approx((5.0, 15.0))


def test_the_adapter_gives_none_without_per_image_statistics() -> None:
    bare = I.RowEval([{"CIDEr": 0.5}], [], ["0"])
    assert CL.compare_family([(bare, row(R2M))], "CIDEr") == [None]


# --------------------------------------------------------------------------- the stage and claims.csv
COLUMNS = ["claim", "table", "statement", "published", "dataset", "comparison", "metric", "seeds", "images",
           "difference", "low", "high", "level", "test", "p", "correction", "p_adjusted", "verdict",
           "images_to_resolve", "seeds_to_resolve", "note"]


def _write(root: Path, variant: str, ckpt: str, seed: str, values: np.ndarray) -> None:
    folder = root / f"results/tiny/{variant}/s{seed}/{ckpt}"
    folder.mkdir(parents=True)
    metrics = {"CIDEr": float(np.mean(values)), "n_images": N, "split": "test"}
    (folder / "eval.json").write_text(json.dumps(metrics))
    per_image.write(folder / "per_image.parquet", PerImage(tuple(str(i) for i in range(N)), {"CIDEr": values}),
                    {"metrics": metrics})


def test_the_stage_writes_claims_csv(tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw.update(datasets=["tiny"], variants=["r2m", "no_fm"])
    raw["catalog"]["tiny"]["seeds"] = {"r2m": [0, 1, 2], "no_fm": [0, 1, 2]}
    params = P.validate(raw)
    for k, seed in enumerate("012"):
        for ckpt, shift in zip(P.TRAIN_STAGES, (0.0, 0.04, 0.08, 0.12), strict=True):  # each stage 4 above the last
            _write(tmp_path, "r2m", ckpt, seed, R2M[k] + shift - 0.12 + 0.001 * ALT * (ckpt == "train_xe"))
        _write(tmp_path, "no_fm", "train_i", seed, R2M[k] - 0.05 - 0.001 * ALT)
    CL.run(StageContext(stage=S.get("claims"), params=params, root=tmp_path))
    with open(tmp_path / "reports/claims.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == COLUMNS
    got = by_claim(rows)
    assert [got[c]["verdict"] for c in ("t2.no_fm", "t3.rec_s", "t3.match", "t3.rec_i")] == [CL.SUPPORTED] * 4
    assert float(got["t3.match"]["difference"]) == pytest.approx(4.0, abs=0.05)
    assert got["t2.d_lstm"]["verdict"] == CL.NOT_TESTABLE  # not among this run's variants
    assert len(rows) == len(PC.CLAIMS)  # one dataset: one row per claim


def test_the_report_shows_the_verdicts(tmp_path: Path) -> None:
    from r2m.reports import html

    path = tmp_path / "claims.csv"
    path.write_text(CL.to_csv(CL.build(["tiny"], {2: table2_rows(), 3: {}})))
    page = html.render_page({}, [], tmp_path / "index.html", claims=path)
    section = page[page.index('<section id="claims">'):]
    section = section[:section.index("</section>")]
    for v in (CL.SUPPORTED, CL.CONTRADICTED, CL.UNRESOLVED, CL.NOT_TESTABLE):
        assert f">{v}</span>" in section
    assert "1 supported, 1 contradicted, 1 unresolved" in section and CL.CORRECTION in section
    missing = html.render_page({}, [], tmp_path / "index.html", claims=tmp_path / "nope.csv")
    assert "nope.csv is missing: run <code>r2m claims</code>" in missing


def test_snakemake_plans_the_claims_stage_in_all(tmp_path: Path) -> None:
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    r = subprocess.run([str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path), "-n",
                        "--cores", "1", "all"], cwd=tmp_path, capture_output=True, text=True)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert re.search(r"^claims\s+1$", out, re.M) and "Missing output files: reports/claims.csv" in out
    # every seed of every Table 2 row is evaluated for it, paired with R2M's
    for v in ("r2m", "no_fm", "d_lstm", "r_lstm", "dr_lstm"):
        for s in (0, 1, 2):
            assert f"results/demo/{v}/s{s}/train_i/per_image.parquet" in out, (v, s)

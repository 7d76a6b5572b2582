"""`r2m power`: images and seeds that resolve a metric difference (src/r2m/evaluation/power.py).

Expectations from outside the code: z_0.975 = 1.959964 and t_0.975 quantiles from printed tables
(df 4: 2.776, df 6: 2.447), and standard deviations worked by hand on small folders."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from r2m.evaluation import power


def test_z_quantile_is_the_tabled_value() -> None:
    assert power.z_quantile(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert power.z_quantile(0.99) == pytest.approx(2.575829, abs=1e-6)


def test_images_needed_follows_z_sd_over_delta_squared() -> None:
    # (1.96 · 39.1 / 10)² = 58.73 → 59 images; (1.96 · 39.1 / 5)² = 234.9 → 235
    assert power.images_needed(39.1, 10) == 59
    assert power.images_needed(39.1, 5) == 235
    assert power.images_needed(0.0, 1) == 1
    with pytest.raises(ValueError):
        power.images_needed(10, 0)


def test_seeds_needed_matches_the_t_table() -> None:
    # k = 3: df 4, 2.776 · √(2/3) = 2.267 sd; k = 4: df 6, 2.447 · √(1/2) = 1.730 sd;
    # k = 5: df 8, 2.306 · √(2/5) = 1.458 sd
    assert power.seeds_needed(1.0, 2.27) == 3
    assert power.seeds_needed(1.0, 2.26) == 4
    assert power.seeds_needed(1.0, 1.74) == 4
    assert power.seeds_needed(1.0, 1.72) == 5
    assert power.seeds_needed(1.0, 1.46) == 5
    assert power.seeds_needed(1.0, 1e-4, most=100) is None


def test_paired_rules_add_the_other_spread_in_quadrature() -> None:
    """Images at a seed half-width of 3 and sd 10 for a difference of 5: (1.959964 · 10)² / (25 − 9) =
    384.15 / 16 = 24.01 → 25; seed half-width 0 → images_needed's (384.15 / 25 = 15.4 → 16); a seed half-width
    of 5 leaves no room. Seeds at an image half-width of 3, sd 2, difference 5: room √(25 − 9) = 4 for
    t_{k−1} · 2 / √k (t table: df 2 4.3027 → 4.968; df 3 3.182 → 3.18) → 4."""
    assert power.paired_images_needed(10, 5, 3.0) == 25
    assert power.paired_images_needed(10, 5, 0.0) == power.images_needed(10, 5) == 16
    assert power.paired_images_needed(10, 5, 5.0) is None
    assert power.paired_seeds_needed(2, 5, 3.0) == 4
    assert power.paired_seeds_needed(2, 5, 5.0) is None
    assert power.paired_seeds_needed(2, 4.96, 0.0) == 4 and power.paired_seeds_needed(2, 4.97, 0.0) == 3  # 4.968
    with pytest.raises(ValueError):
        power.paired_images_needed(10, 5, -1.0)


def _row(root: Path, rel: str, corpus: float, per_image: dict[str, float]) -> None:
    d = root / rel
    d.mkdir(parents=True)
    (d / "eval.json").write_text(json.dumps({"CIDEr": corpus}))
    pd.DataFrame({"image_id": list(per_image), "CIDEr": list(per_image.values())}).to_parquet(d / "per_image.parquet")


def test_the_command_measures_both_spreads_from_a_results_folder(tmp_path) -> None:
    root = tmp_path / "results" / "syn"
    # row r2m/train_i over seeds 0, 1, 2 with corpus CIDEr 0.50, 0.60, 0.40 → sd over seeds 10.0 (×100)
    _row(root, "r2m/s0/train_i", 0.50, {"1": 0.2, "2": 0.6, "3": 0.7})
    _row(root, "r2m/s1/train_i", 0.60, {"1": 0.9, "2": 0.9, "3": 0.0})
    _row(root, "r2m/s2/train_i", 0.40, {"1": 0.1, "2": 0.1, "3": 1.0})
    # a second row, one seed: per-image differences against r2m's seed 0 are 0.1, 0.0, -0.1 → sd 10.0 (×100)
    _row(root, "no_fm/s0/train_i", 0.5, {"1": 0.3, "2": 0.6, "3": 0.6})
    (root / "mostfreq").mkdir()
    (root / "mostfreq" / "eval.json").write_text(json.dumps({"skipped": "no paired captions"}))
    r = subprocess.run([sys.executable, "-m", "r2m.cli", "power", str(root), "--json", "--deltas", "10,20"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["datasets"]) == 1
    s = out["datasets"][0]
    assert s["rows"] == 2 and s["images"] == 3 and s["pairs"] == 1 and s["seeds"] == 3
    assert s["sd_seed"] == pytest.approx(10.0)
    assert s["sd_paired_image"] == pytest.approx(10.0)
    by = {d["delta"]: d for d in s["deltas"]}
    assert by[10]["images"] == math.ceil(1.959964**2)  # (z · 10 / 10)² = 3.84 → 4
    # sd 10 over seeds: k = 3 gives 2.776 · 10 · √(2/3) = 22.7 > 20, k = 4 gives 2.447 · 10 · √(1/2) = 17.3
    assert by[20]["seeds"] == 4 and by[10]["seeds"] == 9  # k = 9: df 16, 2.120 · 10 · √(2/9) = 9.99


def test_bad_input_is_one_line(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "r2m.cli", "power", str(tmp_path), "--deltas", "0,5"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--deltas" in r.stderr
    r = subprocess.run([sys.executable, "-m", "r2m.cli", "power", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no result folder" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "x" / "s0" / "ck"
    bad.mkdir(parents=True)
    (bad / "eval.json").write_text("{not json")
    (bad / "per_image.parquet").write_bytes(b"junk")
    r = subprocess.run([sys.executable, "-m", "r2m.cli", "power", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and str(bad) in r.stderr and "Traceback" not in r.stderr


def test_datasets_with_different_test_images_are_not_pooled(tmp_path) -> None:
    """``results`` holding two datasets: one summary each (their rows, their images), never one pool."""
    root = tmp_path / "results"
    _row(root, "demo/r2m/s0/train_i", 0.50, {"1": 0.2, "2": 0.6, "3": 0.7})
    _row(root, "demo/no_fm/s0/train_i", 0.5, {"1": 0.3, "2": 0.6, "3": 0.6})
    _row(root, "other/a/s0/ck", 0.1, {f"x{i}": i / 10 for i in range(5)})
    _row(root, "other/b/s0/ck", 0.2, {f"x{i}": i / 5 for i in range(5)})
    _row(root, "other/c/s0/ck", 0.3, {f"x{i}": 0.5 for i in range(5)})
    r = subprocess.run([sys.executable, "-m", "r2m.cli", "power", str(root), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = {d["dataset"]: d for d in json.loads(r.stdout)["datasets"]}
    assert set(got) == {"demo", "other"}
    assert (got["demo"]["rows"], got["demo"]["images"], got["demo"]["pairs"]) == (2, 3, 1)
    assert (got["other"]["rows"], got["other"]["images"], got["other"]["pairs"]) == (3, 5, 3)
    assert got["demo"]["sd_paired_image"] == pytest.approx(10.0)  # differences 0.1, 0.0, -0.1 (×100)
    r = subprocess.run([sys.executable, "-m", "r2m.cli", "power", str(root)], capture_output=True, text=True,
                       timeout=120)
    assert "(dataset demo)" in r.stdout and "(dataset other)" in r.stdout

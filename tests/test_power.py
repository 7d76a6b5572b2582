"""`r2m power`: the noise model fitted to a results folder, and the images / seeds it plans
(src/r2m/evaluation/power.py). The planning itself is checked by simulation in tests/test_noise.py; here the
components the command prints are worked by hand on small folders, and its inputs and outputs are checked."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from r2m.evaluation import noise as N
from r2m.evaluation import per_image
from r2m.evaluation.bootstrap import PerImage


def _row(root: Path, rel: str, values: np.ndarray) -> None:
    d = root / rel
    d.mkdir(parents=True)
    (d / "eval.json").write_text(json.dumps({"CIDEr": float(np.mean(values))}))
    ids = tuple(f"x{i}" for i in range(len(values)))
    per_image.write(d / "per_image.parquet", PerImage(ids, {"CIDEr": np.asarray(values, dtype=np.float64)}),
                    {"metrics": {"CIDEr": float(np.mean(values))}})


def _power(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "r2m.cli", "power", *args], capture_output=True, text=True,
                          timeout=300)


PATTERN = np.array([0.2, 0.9, 0.4, 0.7, 0.1, 0.8, 0.5, 0.3, 0.6, 1.0])
SHIFT = np.array([1.0, -1.0] * 5)


def test_the_command_fits_the_components_of_a_results_folder(tmp_path) -> None:
    """Two rows of three seeds on 10 images. Every run is one per-image pattern plus a constant per seed, so
    the seed × image residual is 0 and each row's seed variance is the variance of its shifts: r2m 0, +0.1,
    −0.1 (sd 10 × 100), no_fm −0.2 ± 0.05 … (sd 5). no_fm also differs from r2m by ±0.1 alternating over the
    images: the interaction's per-image sd is 0.1 · √(10/9) (× 100: 10.54), up to the bootstrap's Monte-Carlo
    error. The plans are the model's for those components (checked by simulation in tests/test_noise.py)."""
    root = tmp_path / "results" / "syn"
    for s, c in enumerate((0.0, 0.1, -0.1)):
        _row(root, f"r2m/s{s}/train_i", PATTERN + c)
    for s, c in enumerate((-0.2, -0.15, -0.25)):
        _row(root, f"no_fm/s{s}/train_i", PATTERN + c + 0.1 * SHIFT)
    (root / "mostfreq").mkdir()
    (root / "mostfreq" / "eval.json").write_text(json.dumps({"skipped": "no paired captions"}))
    r = _power(str(root), "--json", "--deltas", "10,20", "--family", "4")
    assert r.returncode == 0, r.stderr
    (s,) = json.loads(r.stdout)["datasets"]
    assert (s["rows"], s["images"], s["runs"], s["pairs"], s["family"]) == (2, 10, [3], 1, 4)
    assert s["sd_seed"] == pytest.approx(math.sqrt(np.median([0.01, 0.0025])) * 100, rel=1e-6)
    assert s["sd_residual"] == pytest.approx(0.0, abs=1e-6)
    assert s["sd_interaction"] == pytest.approx(10.0 * math.sqrt(10 / 9), rel=0.1)
    fit = N.Fit(N.Side(0, 3, False, np.median([0.01, 0.0025]), 0.0), N.Side(0, 3, False, np.median([0.01, 0.0025]), 0.0),
                (s["sd_interaction"] / 100) ** 2 / 10, 10)
    by = {d["delta"]: d for d in s["deltas"]}
    assert by[20]["seeds"] == N.seeds_needed(fit, 0.2, 0.05 / 4)
    assert by[20]["seeds_hi"] >= by[20]["seeds"]
    text = _power(str(root), "--deltas", "10,20").stdout
    assert "seed effect sd 7.9" in text and "| 20 |" in text and "0.05 / 4" in text


def test_bad_input_is_one_line(tmp_path) -> None:
    r = _power(str(tmp_path), "--deltas", "0,5")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--deltas" in r.stderr
    r = _power(str(tmp_path))
    assert r.returncode == 2 and "no result folder" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "x" / "s0" / "ck"
    bad.mkdir(parents=True)
    (bad / "eval.json").write_text("{not json")
    (bad / "per_image.parquet").write_bytes(b"junk")
    r = _power(str(tmp_path))
    assert r.returncode == 2 and str(bad) in r.stderr and "Traceback" not in r.stderr
    r = _power(str(tmp_path), "--family", "0")
    assert r.returncode == 2 and "--family" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_datasets_with_different_test_images_are_not_pooled(tmp_path) -> None:
    """``results`` holding two datasets: one summary each (their rows, their images), never one pool."""
    root = tmp_path / "results"
    _row(root, "demo/r2m/s0/train_i", PATTERN[:3])
    _row(root, "demo/no_fm/s0/train_i", PATTERN[:3] + [0.1, 0.0, -0.1])
    _row(root, "other/a/s0/ck", PATTERN[:5])
    _row(root, "other/b/s0/ck", PATTERN[:5] * 2)
    _row(root, "other/c/s0/ck", np.full(5, 0.5))
    r = _power(str(root), "--json")
    assert r.returncode == 0, r.stderr
    got = {d["dataset"]: d for d in json.loads(r.stdout)["datasets"]}
    assert set(got) == {"demo", "other"}
    assert (got["demo"]["rows"], got["demo"]["images"], got["demo"]["pairs"]) == (2, 3, 1)
    assert (got["other"]["rows"], got["other"]["images"], got["other"]["pairs"]) == (3, 5, 3)
    # one run per row: a fixed model each, images only; its component is the paired variance of 0.1, 0, −0.1
    assert got["demo"]["sd_interaction"] == pytest.approx(10.0, rel=0.1)
    assert all(d["seeds"] is None for d in got["demo"]["deltas"])
    r = _power(str(root))
    assert "(dataset demo)" in r.stdout and "(dataset other)" in r.stdout

"""Speed paths: the schedule benchmark at tiny sizes on CPU, and the tiny DAG on CUDA (fp32, TF32 and
bf16) against CPU — run where CUDA is present, reported as skipped (with the reason) where not."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from conftest import copy_sources

BIN = Path(sys.executable).parent


def test_schedule_bench_runs_every_stage_scaled():
    from r2m.bench.schedule import SCHEDULE, run_schedule

    torch.set_num_threads(1)
    r = run_schedule("cpu", scale=0.0004, batch=8, vocab=60, d=16, heads=2, d_k=8)
    assert [s["stage"] for s in r["stages"]] == [p.name for p in SCHEDULE]
    assert [s["steps"] for s in r["stages"]] == [2, 3, 1, 1]  # ceil(0.0004 x 5000, 6000, 50, 100)
    assert all(math.isfinite(s["mean_loss"]) and s["per_s"] > 0 for s in r["stages"])
    assert r["compile"] == "none" and r["dtype"] == "fp32"  # CUDA-only paths stay off on CPU
    full = sum(s["seconds"] / s["steps"] * p.steps for s, p in zip(r["stages"], SCHEDULE, strict=True))
    assert r["full_schedule_seconds"] == pytest.approx(full)


# Tolerances for the tiny DAG on CUDA against CPU (metrics x100; the tiny set has few test images,
# so one changed word moves BLEU/CIDEr by points): fp32 differs only in kernel summation order.
FP32_TOL = {"loss_rel": 1e-3, "metric_abs": 2.0}
BF16_TOL = {"loss_rel": 5e-2, "metric_abs": 15.0}


def _tiny_dag(root: Path, wd: Path, env: dict[str, str]) -> Path:
    copy_sources(root, wd, ("Snakefile", "workflow", "src", "data/dictionaries"))
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw.update(datasets=["tiny"], variants=["r2m"])
    (wd / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    r = subprocess.run([str(BIN / "snakemake"), "--cores", "2", "results/tiny/r2m/s0/train_i/eval.json"],
                       cwd=wd, env=env, capture_output=True, text=True, timeout=3000)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return wd


def _final_losses(wd: Path) -> dict[str, float]:
    out = {}
    for stage in ("train_xe", "train_s", "train_m", "train_i"):
        out[stage] = json.loads((wd / f"results/tiny/r2m/s0/{stage}/train_metrics.json").read_text())["train_loss_last10"]
    return out


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device here: the tiny DAG on CUDA (fp32, TF32, bf16) against CPU was NOT run")
@pytest.mark.parametrize("dtype", ["fp32", "tf32", "bf16"])
def test_tiny_dag_on_cuda_matches_cpu(tmp_path, request, dtype, tiny_dag):
    root = Path(request.config.rootpath)
    base = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{BIN}:{os.environ['PATH']}", "R2M_NO_PROGRESS": "1"}
    cpu = tiny_dag  # the session's one CPU run of the tiny DAG (conftest.py), default params like the CUDA run
    # fp32: TF32 off (full-precision matmuls); tf32: the CUDA default (TF32 matmuls, bf16's tolerance)
    gpu = _tiny_dag(root, tmp_path / "cuda", {**base, "R2M_DEVICE": "cuda", "R2M_BF16": "1" if dtype == "bf16" else "0",
                                              "R2M_TF32": "0" if dtype == "fp32" else "1"})
    tol = FP32_TOL if dtype == "fp32" else BF16_TOL
    lc, lg = _final_losses(cpu), _final_losses(gpu)
    for stage in lc:
        assert lg[stage] == pytest.approx(lc[stage], rel=tol["loss_rel"]), stage
    mc = json.loads((cpu / "results/tiny/r2m/s0/train_i/eval.json").read_text())
    mg = json.loads((gpu / "results/tiny/r2m/s0/train_i/eval.json").read_text())
    for k, v in mc.items():
        if isinstance(v, float) and isinstance(mg.get(k), float):
            assert abs(100 * mg[k] - 100 * v) <= tol["metric_abs"], (k, v, mg[k])
    gm = json.loads((gpu / "results/tiny/r2m/s0/train_i/train_metrics.json").read_text())
    assert gm["device"].startswith("cuda") and gm["tf32"] is (dtype != "fp32")
    assert gm["cuda_graph"] is True, gm["cuda_graph_off"]  # the whole-step graph replayed (else: why not)

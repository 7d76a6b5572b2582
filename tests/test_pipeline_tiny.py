"""End to end: the whole DAG on the synthetic `tiny` dataset through Snakemake, then the same
registry through DVC. Runs in a scratch copy of the workflow so the repository stays clean."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import tiny_dag_env

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _env(wd: Path):
    return tiny_dag_env(wd)


@pytest.fixture(scope="module")
def snakemake_run(tiny_dag):
    """The session's one tiny DAG run (conftest.py)."""
    return tiny_dag


def test_all_four_stages_and_ablations_trained(snakemake_run):
    wd = snakemake_run
    for variant in ("r2m", "no_fm", "d_lstm", "r_lstm", "dr_lstm"):
        for stage in ("train_xe", "train_s", "train_m", "train_i"):
            assert (wd / f"models/tiny/{variant}/s0/{stage}/model.pt").exists(), (variant, stage)
            assert (wd / f"models/tiny/{variant}/s0/{stage}/params.yaml").exists()
            assert (wd / f"results/tiny/{variant}/s0/{stage}/loss.tsv").exists()


def test_heldout_xe_falls_during_train_xe(snakemake_run):
    rows = list(csv.DictReader((snakemake_run / "results/tiny/r2m/s0/train_xe/loss.tsv").open(), delimiter="\t"))
    val = [float(r["loss"]) for r in rows if r["split"] == "val"]
    assert len(val) >= 2 and val[-1] < val[0], val


def test_tables_have_rows(snakemake_run):
    wd = snakemake_run
    t1 = list(csv.DictReader((wd / "reports/table1.csv").open()))
    assert any("tiny" in json.dumps(r) for r in t1)
    t2 = (wd / "reports/table2.csv").read_text()
    for label in ("D w/o FM", "D w/o Memory in RM", "R w/o Memory in RM", "D&R w/o Memory in RM"):
        assert label in t2
    t3 = list(csv.DictReader((wd / "reports/table3.csv").open()))
    assert sum("tiny" in json.dumps(r) for r in t3) == 4
    assert (wd / "reports/index.html").exists()
    metrics = json.loads((wd / "results/tiny/r2m/s0/train_i/eval.json").read_text())
    assert 0 <= metrics["Bleu_1"] <= 1 and metrics["CIDEr"] >= 0


def test_resolved_params_beside_outputs(snakemake_run):
    saved = yaml.safe_load((snakemake_run / "models/tiny/r2m/s0/train_xe/params.yaml").read_text())
    assert saved["train_xe"]["steps"] == 60  # the tiny override, not the paper's 5000


def test_snakemake_up_to_date_afterwards(snakemake_run):
    r = subprocess.run([str(BIN / "snakemake"), "-n", "--cores", "1", "all"], cwd=snakemake_run,
                       env=_env(snakemake_run), capture_output=True, text=True)
    assert r.returncode == 0
    assert "Nothing to be done" in r.stdout + r.stderr


def test_dvc_repro_runs_the_same_stages(snakemake_run, tmp_path):
    wd = tmp_path / "ws"  # a copy: the session's run stays as Snakemake left it for the other tests
    subprocess.run(["cp", "-a", str(snakemake_run), str(wd)], check=True)
    env = tiny_dag_env(wd)
    subprocess.run(["git", "init", "-q"], cwd=wd, check=True)
    subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=wd, check=True, env=env)
    r = subprocess.run([str(BIN / "dvc"), "repro", "build_vocab@tiny"], cwd=wd, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run([str(BIN / "dvc"), "status", "build_vocab@tiny"], cwd=wd, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "changed" not in r.stdout, r.stdout


def test_baselines_and_retrieval_tables(snakemake_run):
    wd = snakemake_run
    rows = list(csv.DictReader(open(wd / "reports/baselines.csv")))
    run_rows = [r for r in rows if r["dataset"] == "tiny" and r["source"] == "this run"]
    methods = [r["method"] for r in run_rows]
    assert methods == ["m-RNN", "Show, Attend and Tell (soft attention)", "Show, Attend and Tell (hard attention)",
                       "S-CNN-RNN (end to end)"], methods
    assert all(r["C"] for r in run_rows) and run_rows[0]["PPL"]
    assert any(r["method"] == "most frequent training caption" for r in rows)
    ret = list(csv.DictReader(open(wd / "reports/retrieval.csv")))
    methods = {(r["dataset"], r["method"]) for r in ret}
    assert ("tiny", "m-RNN") in methods and ("tiny", "R2M (joint space)") in methods
    assert json.loads((wd / "results/tiny/mrnn/s0/train_sup/train_metrics.json").read_text())["test_perplexity"] > 1
    assert "Supervised baselines" in (wd / "reports/index.html").read_text()


def test_end2end_trains_in_one_stage(snakemake_run, tmp_path):
    """train_e2e (the released end2end.py) on tiny, in a copy: L_S on sentences and L_I on images at every
    step, from scratch, into its own model folder, which captions like any checkpoint."""
    wd = tmp_path / "ws"
    subprocess.run(["cp", "-a", str(snakemake_run), str(wd)], check=True)
    raw = yaml.safe_load((wd / "params.yaml").read_text())
    raw["catalog"]["tiny"]["overrides"]["train_e2e"] = {"steps": 6, "batch_size": 16, "lr": 0.001, "eval_every": 3,
                                                        "checkpoint_every": 3}
    (wd / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = _env(wd)
    r = subprocess.run([str(BIN / "r2m"), "train_e2e", "--dataset", "tiny", "--variant", "r2m", "--seed", "0"],
                       cwd=wd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = list(csv.reader(open(wd / "results/tiny/r2m/s0/train_e2e/loss.tsv"), delimiter="\t"))
    header, train = rows[0], [x for x in rows[1:] if x[1] == "train"]
    assert {"xe", "rec", "rank", "rec_i"} <= set(header) and len(train) == 6
    m = json.loads((wd / "results/tiny/r2m/s0/train_e2e/train_metrics.json").read_text())
    assert m["steps"] == 6 and m["stage"] == "train_e2e"
    saved = yaml.safe_load((wd / "models/tiny/r2m/s0/train_e2e/params.yaml").read_text())
    assert saved["train_e2e"]["max_len"] == 20 and saved["train_e2e"]["steps"] == 6
    # the model folder captions like any checkpoint's (it is not on the DAG's ckpt axis: the tables never read it)
    from r2m.captioning.captioner import caption_ids, load_checkpoint_model

    model, ckpt, itos = load_checkpoint_model(wd / "models/tiny/r2m/s0/train_e2e", "cpu", wd / "data/tiny/vocab")
    assert ckpt["stage"] == "train_e2e" and ckpt["step"] in (3, 6)
    toks = caption_ids(model, [[4, 5], [6]], beam=3, max_len=20, batch_size=2, device="cpu")
    assert len(toks) == 2 and all(len(t) <= 20 for t in toks)

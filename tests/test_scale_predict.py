"""``r2m bench scale``'s predictions: the paper's schedule on this machine and one H100 from measured GPU figures;
and the supervised features' channel statistics, streamed in bounded chunks."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from r2m.bench import scale as B

ROOT = Path(__file__).resolve().parents[1]


def test_schedule_counts_every_eval_step_and_the_last():
    # evaluations at 30, 60, 90 and the last step 100; at 10, 20, ..., 50 (the last is one of them)
    assert B.Schedule(100, 64, 30, True).evaluations == 4
    assert B.Schedule(50, 256, 10, True).evaluations == 5


def test_paper_plan_reads_the_project_schedule():
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    plan = B.paper_plan(base, "coco")
    # params.yaml: train_xe 5000 x 256 every 500, no selection; train_m 50 x 256 every 10, train_i 100 x 256
    # every 10, selected by CIDEr; train_sup 30000 x 64 every 1000, SAT selected by BLEU-4 (per_model)
    assert plan.schedules["train_xe"] == B.Schedule(5000, 256, 500, False)
    assert plan.schedules["train_m"] == B.Schedule(50, 256, 10, True)
    assert plan.schedules["train_i"].evaluations == 10
    assert plan.schedules["train_sup"] == B.Schedule(30000, 64, 1000, True)
    assert plan.schedules["train_sup"].evaluations == 30
    # MSCOCO's Karpathy splits: 113,287 + 5,000 + 5,000 images, 5,000 val
    assert (plan.images, plan.val_images) == (123_287, 5_000)


def test_gpu_figures_come_from_the_table_file(tmp_path):
    # the shipped table holds the H100 train_xe row the hand-worked test below uses (18,048 sentences/s)
    assert B.GPU_FIGURES["train_xe"] == B.GpuFigure(18_048, "sentences/s", "H100", "2026-11-26",
                                                    B.GPU_FIGURES["train_xe"].source)
    f = tmp_path / "figs.csv"
    f.write_text("# a comment\nkey,value,unit,card,date,source\n"
                 'vgg16_model,900,images/s,A100,2027-01-02,"bench, with a comma"\n'
                 "train_m,fast,images/s,H100,2027-01-02,typo\n")
    with pytest.raises(ValueError, match=r"figs\.csv:4: a GPU figure row"):
        B.load_gpu_figures(f)
    f.write_text(f.read_text().splitlines()[0] + "\nkey,value,unit,card,date,source\n"
                 'vgg16_model,900,images/s,A100,2027-01-02,"bench, with a comma"\n')
    assert B.load_gpu_figures(f) == {"vgg16_model": B.GpuFigure(900, "images/s", "A100", "2027-01-02",
                                                                "bench, with a comma")}


def test_h100_prediction_hand_worked(monkeypatch):
    fig = B.GpuFigure(1_600, "images/s", "H100", "2026-01-01", "test")
    monkeypatch.setitem(B.GPU_FIGURES, "train_m", fig)
    monkeypatch.setitem(B.GPU_FIGURES, "inception_v4_files", B.GpuFigure(1_000, "images/s", "H200", "d", "test"))
    plan = B.Plan({"train_m": B.Schedule(100, 64, 30, True), "train_xe": B.Schedule(5000, 256, 500, False)},
                  images=5_000, val_images=500)
    # 100 steps x 64 images / 1,600 images/s = 4 s; the 4 selections have no GPU figure
    s, how = B.h100_prediction("train_m", plan, cpu_s=99.0)
    assert s == pytest.approx(4.0)
    assert "measured throughput x steps" in how and "4 selections" in how and "no GPU figure measured" in how
    # the real table: 5,000 x 256 / 18,048 sentences/s = 1,280,000 / 18,048 = 70.92 s
    s, how = B.h100_prediction("train_xe", plan, cpu_s=99.0)
    assert s == pytest.approx(70.92, abs=0.01) and "selections" not in how
    # 5,000 images / 1,000 images/s
    s, how = B.h100_prediction("extract_features", plan, cpu_s=99.0)
    assert s == pytest.approx(5.0) and "H200" in how
    # a CPU stage keeps its CPU time; beam search has no GPU figure
    assert B.h100_prediction("build_vocab", plan, cpu_s=12.5) == (12.5, "CPU stage (this machine's CPU time)")
    s, how = B.h100_prediction("caption", plan, cpu_s=99.0)
    assert math.isnan(s) and how == "no GPU figure measured"


def test_paper_cpu_hand_worked():
    plan = B.Plan({"train_m": B.Schedule(50, 256, 10, True), "train_xe": B.Schedule(5000, 256, 500, False)},
                  images=123_287, val_images=5_000, bench_batch=64)
    # at 10 %: 4 steps of 64 in a 100 s loop, of which one validation pass took 20 s and one selection of the
    # 500 val images 60 s. Per row (100 - 20 - 60) / 256 = 0.078125 s; x 50 x 256 rows = 1,000 s. Per
    # evaluation: validation 20 s (bounded batches) + selection at full size 60 x 5,000 / 500 = 600 s;
    # x 5 evaluations = 3,100 s. Total 4,100 s.
    row = B.Row("train_m", 0.1, steps=4, loop_s=100.0, selections=1, select_s=60.0, validations=1, val_s=20.0)
    assert B.paper_cpu_s(row, plan) == pytest.approx(4_100.0)
    # a text stage without selection: 10 s / 256 rows x 1,280,000 rows = 50,000 s
    assert B.paper_cpu_s(B.Row("train_xe", 1.0, steps=4, loop_s=10.0), plan) == pytest.approx(50_000.0)
    # no loop time in the log: no prediction
    assert math.isnan(B.paper_cpu_s(B.Row("train_xe", 1.0), plan))


def test_read_metrics_takes_the_loop_and_the_selections(tmp_path):
    f = tmp_path / "train_metrics.json"
    f.write_text('{"stage": "train_m", "steps": 8, "train_loss": 1.5, "timings": {"loop_s": 230.5, '
                 '"validations": 2, "val_s": 20.0, "selections": 2, "select_s": 160.0}}')
    row = B.read_metrics(B.Row("train_m", 1.0), f)
    assert (row.steps, row.loop_s, row.selections, row.select_s) == (8, 230.5, 2, 160.0)
    assert (row.validations, row.val_s) == (2, 20.0)
    # none of them: the counts stay 0 and their seconds NaN, as in a row without any
    f.write_text('{"steps": 4, "timings": {"loop_s": 71.1, "validations": 0, "val_s": 0.0, "selections": 0, '
                 '"select_s": 0.0}}')
    sup = B.read_metrics(B.Row("train_sup", 0.1), f)
    assert (sup.steps, sup.loop_s, sup.selections, sup.validations) == (4, 71.1, 0, 0)
    assert math.isnan(sup.select_s) and math.isnan(sup.val_s)
    # a metrics file written without --timings, a skipped baseline's, a broken one: nothing read
    for text in ('{"steps": 4, "train_loss": 1.0}', '{"skipped": "no paired captions"}', "{not json", "[]"):
        f.write_text(text)
        row = B.read_metrics(B.Row("train_sup", 0.1), f)
        assert (row.steps, row.selections, row.validations) == (0, 0, 0) and math.isnan(row.loop_s)


def test_the_bench_asks_every_training_stage_for_its_timings():
    from r2m.stage.registry import STAGES

    trained = {s.name for s in STAGES if s.impl.startswith(("r2m.training.stages:", "r2m.supervised.train:"))}
    assert trained == {s for s, flags in B.STAGE_FLAGS.items() if "--timings" in flags}
    assert B.metrics_path("train_m", "d") == "results/d/r2m/s0/train_m/train_metrics.json"
    assert B.metrics_path("train_sup", "d") == "results/d/sat/s0/train_sup/train_metrics.json"
    assert B.metrics_path("caption", "d") is None


def test_rows_round_trip_through_the_csv(tmp_path):
    rows = [B.Row("train_m", 1.0, "ok", 300.0, 250.0, 1500.0, 1234, "", 4, 230.5, 1, 150.25),
            B.Row("prepare", 1.0, "ok", 50.0, 45.0, 650.0, 99)]
    B.write_outputs(rows, tmp_path, {"date": "t"}, B.Plan({"train_m": B.Schedule(50, 256, 10, True)}, 10, 5))
    back = B.read_rows(tmp_path / "scale.csv")
    assert (back[0].steps, back[0].loop_s, back[0].selections, back[0].select_s) == (4, 230.5, 1, 150.25)
    assert back[1].steps == 0 and math.isnan(back[1].loop_s)
    md = (tmp_path / "scale.md").read_text()
    assert "one H100, s at 1.0" in md and "CPU stage (this machine's CPU time)" in md


def test_channel_stats_in_bounded_chunks_and_only_the_kinds_asked(tmp_path):
    from r2m.supervised.data import Features

    rng = np.random.default_rng(0)
    grid = rng.normal(2.0, 3.0, size=(40, 3, 3, 8)).astype(np.float16)
    pooled = rng.normal(size=(40, 8)).astype(np.float16)
    with h5py.File(tmp_path / "features.h5", "w") as h:
        h["grid"], h["pooled"] = grid, pooled
    import pandas as pd

    pd.DataFrame({"image_id": [f"i{k}" for k in range(40)], "row": range(40)}).to_parquet(tmp_path / "index.parquet")
    feats = Features(tmp_path, ("pooled", "grid"))
    rows = np.array([3, 1, 7, 20, 21, 39, 3])
    x = grid[np.unique(rows)].astype(np.float64).reshape(-1, 8)  # numpy over the whole selection
    # chunk_bytes of 2 rows (2 x 72 values x 8 bytes): 3 chunks over the 6 rows, the same statistics
    got = feats.channel_stats(rows, kinds=["grid"], chunk_bytes=2 * 72 * 8)
    assert list(got) == ["grid"]
    np.testing.assert_allclose(got["grid"][0].numpy(), x.mean(0), rtol=1e-6)
    np.testing.assert_allclose(got["grid"][1].numpy(), x.std(0), rtol=1e-5)
    assert set(feats.channel_stats(rows)) == {"pooled", "grid"}
    feats.close()


def test_the_loops_own_timings_are_what_the_bench_reads(tmp_path):
    # the toy loop of test_loop: 12 steps, an evaluation at 3, 6, 9 and 12, each with a selection
    from r2m.training import loop as L
    from r2m.utils.io import write_json
    from test_loop import spec

    res = L.fit(spec(tmp_path / "a", select=lambda model, step: float(step)))
    write_json(tmp_path / "train_metrics.json", {"steps": res.step, "timings": res.timings()})
    row = B.read_metrics(B.Row("toy", 1.0), tmp_path / "train_metrics.json")
    assert (row.steps, row.selections, row.validations) == (12, 4, 4)
    assert 0 <= row.select_s < 60 and 0 <= row.val_s < 60 and row.select_s + row.val_s <= row.loop_s


def test_train_sup_no_perplexity_skips_only_the_closing_perplexities(tmp_path):
    # the tiny set of test_sup_selection, m-RNN, once as the DAG runs it and once with --no-perplexity
    import argparse
    import importlib

    import torch

    from r2m.stage import registry as S
    from r2m.stage.context import StageContext
    from r2m.utils.io import read_json
    from test_sup_selection import _params, _run

    torch.set_num_threads(1)
    for stage in ("prepare", "references", "extract_features_sup", "sup_vocab"):
        _run(tmp_path, stage)
    metrics = tmp_path / "results/syn/mrnn/s0/train_sup/train_metrics.json"
    model = tmp_path / "models/syn/mrnn/s0/train_sup/model.pt"
    got = {}
    for flag in (False, True):
        ctx = StageContext(stage=S.get("train_sup"), params=_params(), dataset="syn", model="mrnn", root=tmp_path,
                           args=argparse.Namespace(fresh=True, no_perplexity=flag, timings=flag))
        mod, fn = S.get("train_sup").impl.split(":")
        importlib.import_module(mod).__dict__[fn](ctx)
        got[flag] = read_json(metrics), torch.load(model, weights_only=True)["state_dict"]
    (full, w_full), (short, w_short) = got[False], got[True]
    assert all(full[k] > 1.0 for k in ("train_perplexity", "val_perplexity", "test_perplexity"))
    assert all(short[k] is None for k in ("train_perplexity", "val_perplexity", "test_perplexity"))
    assert all(torch.equal(w_full[k], w_short[k]) for k in w_full)  # the training itself is the same
    assert full["selection"] == short["selection"]
    # --timings (the bench passes it too) adds the loop's seconds and nothing else; the DAG's file has none
    assert "timings" not in full and set(short) - set(full) == {"timings"}
    row = B.read_metrics(B.Row("train_sup", 1.0), metrics)
    assert row.steps == short["steps"] and row.loop_s == short["timings"]["loop_s"] > 0

"""Training stages end to end on a synthetic dataset built in tmp_path (no other helpers' stages)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import torch

from r2m import params as P
from r2m.stage import registry as S
from r2m.stage.context import StageContext
from r2m.training.stages import NonFiniteLoss
from r2m.utils.io import write_parquet

CONCEPTS = ["dog", "cat", "man", "car", "tree", "ball"]
OTHER = ["a", "the", "is", "on", "with", "near", "runs", "sits", "red", "big", "grass", "road"]
ITOS = ["<pad>", "<#start>", "<#end>", "<UNK>", *CONCEPTS, *OTHER]
STOI = {w: i for i, w in enumerate(ITOS)}


def sentence(rng: np.random.Generator) -> tuple[list[str], list[str]]:
    a, b = rng.choice(len(CONCEPTS), 2, replace=False)
    c1, c2 = CONCEPTS[a], CONCEPTS[b]
    verb = "runs" if a % 2 else "sits"
    return ["a", c1, verb, "near", "the", c2], sorted({c1, c2})


def make_synthetic(root: Path, n_sent: int = 400, n_img: int = 24, feat_dim: int = 12, seed: int = 0) -> None:
    """data/syn/{vocab,prepared,concepts,features} in the ARCHITECTURE.md formats."""
    rng = np.random.default_rng(seed)
    D = root / "data" / "syn"
    (D / "vocab").mkdir(parents=True)
    (D / "vocab" / "vocab.json").write_text(json.dumps({"itos": ITOS}))
    # a key file of the folder (Out.members): `r2m <stage>` refuses a vocab folder without it
    (D / "vocab" / "stats.json").write_text(json.dumps({"vocab_size": len(ITOS)}))
    rows = []
    for k in range(n_sent):
        toks, conc = sentence(rng)
        rows.append({"ids": [STOI[t] for t in toks], "concept_ids": [STOI[c] for c in conc],
                     "split": "val" if k % 10 == 0 else "train"})
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pa.Table.from_pylist(rows, schema=pa.schema([("ids", pa.list_(pa.int32())),
                                                     ("concept_ids", pa.list_(pa.int32())), ("split", pa.string())]))
    pq.write_table(t, D / "vocab" / "encoded.parquet", row_group_size=64)
    ids = [f"img{i}" for i in range(n_img)]
    split = ["train" if i < n_img - 8 else ("val" if i < n_img - 4 else "test") for i in range(n_img)]
    write_parquet(D / "prepared" / "images.parquet",
                  pd.DataFrame({"image_id": ids, "path": [f"x/{i}.jpg" for i in ids], "split": split}))
    det = []
    for i, iid in enumerate(ids):
        if i == 3:
            continue  # an image without concepts
        for c in rng.choice(len(CONCEPTS), 3, replace=False):
            det.append({"image_id": iid, "label": CONCEPTS[c], "concept": CONCEPTS[c],
                        "score": float(rng.uniform(0.2, 1.0)), "x1": 0.0, "y1": 0.0, "x2": 1.0, "y2": 1.0})
    write_parquet(D / "concepts" / "detections.parquet", pd.DataFrame(det))
    (D / "features").mkdir(parents=True)
    with h5py.File(D / "features" / "features.h5", "w") as f:
        f.create_dataset("pooled", data=rng.standard_normal((n_img, feat_dim)).astype(np.float16))
    write_parquet(D / "features" / "index.parquet",
                  pd.DataFrame({"image_id": ids[::-1], "row": np.arange(n_img)[::-1]}))


def refs_file(dataset_dir: Path) -> Path:
    """``<dataset>/references/references.json`` (stage ``references``), its folder made."""
    (dataset_dir / "references").mkdir(parents=True, exist_ok=True)
    return dataset_dir / "references" / "references.json"


def make_params(**stage_over) -> P.Params:
    sched = {"batch_size": 16, "lr": 3e-3, "max_len": 12, "eval_every": 10, "checkpoint_every": 10}
    raw = {
        "datasets": ["syn"],
        "catalog": {"syn": {"kind": "tiny", "beta": 1.0, "gamma": 1.0}},
        "model": {"d": 16, "heads": 2, "d_k": 8, "dropout": 0.0},
        "train_xe": {"steps": 20, **sched}, "train_s": {"steps": 10, **sched},
        "train_m": {"steps": 4, **{**sched, "lr": 1e-3}}, "train_i": {"steps": 4, **{**sched, "lr": 1e-3}},
        "caption": {"beam": 2, "max_len": 8, "batch_size": 5, "split": "test"},
    }
    for k, v in stage_over.items():
        raw[k] = {**raw.get(k, {}), **v}
    return P.for_dataset(P.validate(raw), "syn")


def ctx_for(root: Path, stage: str, params: P.Params, variant: str = "r2m", **kw) -> StageContext:
    return StageContext(stage=S.get(stage), params=params, dataset="syn", variant=variant, root=root, **kw)


def run_stage(root: Path, stage: str, params: P.Params, variant: str = "r2m") -> dict:
    from r2m.training.stages import train

    return train(ctx_for(root, stage, params, variant))


@pytest.fixture()
def syn(tmp_path: Path) -> Path:
    torch.set_num_threads(1)
    make_synthetic(tmp_path)
    return tmp_path


def test_four_stages_outputs_and_checkpoint(syn: Path) -> None:
    p = make_params()
    for st in ("train_xe", "train_s", "train_m", "train_i"):
        m = run_stage(syn, st, p)
        assert m["steps"] == p.model_dump()[st]["steps"]
        model_dir = syn / "models/syn/r2m/s0" / st
        ck = torch.load(model_dir / "model.pt", weights_only=True)
        assert ck["config"]["d"] == 16 and ck["stage"] == st
        assert sorted(f.name for f in model_dir.iterdir()) == [".r2m-owned.json", "inference.json", "model.pt",
                                                               "params.yaml"]
        info = json.loads((model_dir / "inference.json").read_text())  # what `r2m caption IMAGES` needs
        # the vocabulary, and no test-time setting (those come from the workspace's params when captioning)
        assert info["stage"] == st and info["itos"] == ITOS and "caption" not in info
        assert not (syn / ".r2m/resume" / st / "syn-r2m-0").exists()  # resumable state cleaned on completion
        tsv = (syn / f"results/syn/r2m/s0/{st}/loss.tsv").read_text().splitlines()
        assert tsv[0].startswith("step\tsplit\tloss")
        assert any("\tval\t" in line for line in tsv[1:])
        metrics = json.loads((syn / f"results/syn/r2m/s0/{st}/train_metrics.json").read_text())
        assert metrics["train_loss"] is not None and "wall_s" not in metrics  # same inputs, same bytes
    # the image stages learned an image projection of the feature size
    ck = torch.load(syn / "models/syn/r2m/s0/train_i/model.pt", weights_only=True)
    assert ck["config"]["image_dim"] == 12 and "image_proj.weight" in ck["state_dict"]


def test_val_xe_falls_during_train_xe(syn: Path) -> None:
    run_stage(syn, "train_xe", make_params(train_xe={"steps": 40}))
    rows = [r.split("\t") for r in (syn / "results/syn/r2m/s0/train_xe/loss.tsv").read_text().splitlines()[1:]]
    val = [float(r[2]) for r in rows if r[1] == "val"]
    assert len(val) == 4 and val[-1] < val[0] - 0.5


@pytest.mark.parametrize("variant", ["no_fm", "d_lstm", "r_lstm", "dr_lstm"])
def test_each_ablation_trains_text_and_image_step(syn: Path, variant: str) -> None:
    p = make_params(train_xe={"steps": 1}, train_s={"steps": 1}, train_m={"steps": 1})
    for st in ("train_xe", "train_s", "train_m"):
        m = run_stage(syn, st, p, variant)
        assert m["steps"] == 1 and np.isfinite(m["train_loss"])


def test_resume_continues_from_saved_step(syn: Path, caplog) -> None:
    from r2m.training import stages as T

    p = make_params(train_xe={"steps": 20, "checkpoint_every": 10})
    full = run_stage(syn, "train_xe", p)
    final = torch.load(syn / "models/syn/r2m/s0/train_xe/model.pt", weights_only=True)
    # interrupt a fresh run after its step-10 checkpoint
    import shutil

    shutil.rmtree(syn / "models/syn/r2m/s0/train_xe")
    work = syn / ".r2m/resume/train_xe/syn-r2m-0"
    orig = T.OBJECTIVES["train_xe"]
    calls = {"n": 0}

    def crashing(ctx, model, batch, tp):
        calls["n"] += 1
        if calls["n"] == 13:
            raise KeyboardInterrupt
        return orig.compute(ctx, model, batch, tp)

    T.OBJECTIVES["train_xe"] = T.Objective("text", orig.columns, crashing)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_stage(syn, "train_xe", p)
    finally:
        T.OBJECTIVES["train_xe"] = orig
    assert torch.load(work / "last.pt", weights_only=True)["step"] == 10
    assert not (syn / "models/syn/r2m/s0/train_xe").exists()  # a failed stage leaves no model folder
    resumed = run_stage(syn, "train_xe", p)
    rows = [r.split("\t") for r in (syn / "results/syn/r2m/s0/train_xe/loss.tsv").read_text().splitlines()[1:]]
    steps = [int(r[0]) for r in rows if r[1] == "train"]
    assert steps == list(range(1, 21))  # nothing repeated, nothing lost
    # same data order and RNG: the resumed run ends where the uninterrupted one did
    assert resumed["train_loss"] == pytest.approx(full["train_loss"], rel=1e-4)
    again = torch.load(syn / "models/syn/r2m/s0/train_xe/model.pt", weights_only=True)
    assert all(torch.equal(again["state_dict"][k], v) for k, v in final["state_dict"].items())


def test_nan_loss_raises_clear_error(syn: Path) -> None:
    from r2m.training import stages as T

    orig = T.OBJECTIVES["train_xe"]

    def nan(ctx, model, batch, tp):
        loss, comp = orig.compute(ctx, model, batch, tp)
        return loss * float("nan"), comp

    T.OBJECTIVES["train_xe"] = T.Objective("text", orig.columns, nan)
    try:
        with pytest.raises(NonFiniteLoss, match=r"train_xe: loss is nan at step 1"):
            run_stage(syn, "train_xe", make_params())
    finally:
        T.OBJECTIVES["train_xe"] = orig


def test_runs_are_repeatable(syn: Path) -> None:
    p = make_params(train_xe={"steps": 5})
    a = run_stage(syn, "train_xe", p)
    b = run_stage(syn, "train_xe", p)
    assert a["train_loss"] == b["train_loss"]


def test_timings_only_when_asked(syn: Path) -> None:
    import argparse

    from r2m.training.stages import train

    p = make_params(train_xe={"steps": 10})
    plain = train(ctx_for(syn, "train_xe", p))
    timed = train(ctx_for(syn, "train_xe", p, args=argparse.Namespace(timings=True)))
    # `r2m bench scale` passes --timings: the loop's seconds added, every other key and value kept
    assert "timings" not in plain and set(timed) - set(plain) == {"timings"}
    assert {k: v for k, v in timed.items() if k != "timings"} == plain
    t = timed["timings"]
    assert (t["validations"], t["selections"]) == (1, 0) and 0 <= t["val_s"] <= t["loop_s"]
    written = json.loads((syn / "results/syn/r2m/s0/train_xe/train_metrics.json").read_text())
    assert written["timings"] == t


def test_checkpoint_selection_hook(syn: Path) -> None:
    from r2m.training.stages import train

    scores = iter([0.1, 0.9, 0.3])
    m = train(ctx_for(syn, "train_xe", make_params(train_xe={"steps": 30})), select=lambda model, step: next(scores))
    assert m["selected_step"] == 20 and m["selected_score"] == 0.9
    kept = torch.load(syn / "models/syn/r2m/s0/train_xe/model.pt", weights_only=True)
    assert kept["step"] == 20
    # the kept weights are step 20's (a run of 20 steps), not the last step's
    train(ctx_for(syn, "train_xe", make_params(train_xe={"steps": 20})))
    at20 = torch.load(syn / "models/syn/r2m/s0/train_xe/model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(kept["state_dict"][k], v) for k, v in at20.items())


def test_image_stage_selects_checkpoint_by_val_cider(syn: Path) -> None:
    from r2m.training import selection, stages
    from r2m.training.selection import validation_set

    val = ["img16", "img17", "img18", "img19"]
    refs = {"images": [{"id": i} for i in val],
            "annotations": [{"id": k, "image_id": i, "caption": "A dog runs near the cat."}
                            for k, i in enumerate(val)]}
    refs_file(syn / "data/syn").write_text(json.dumps(refs))
    ids, concepts, tok_refs = validation_set(syn / "data/syn/prepared", syn / "data/syn/references",
                                              syn / "data/syn/concepts", STOI, 0.3, 5)
    assert ids == val and tok_refs["img16"] == ["a dog runs near the cat"]
    assert all(all(0 <= c < len(ITOS) for c in cs) for cs in concepts)

    p = make_params(train_m={"steps": 6, "eval_every": 3})
    assert p.train_m.select_by == "auto"
    run_stage(syn, "train_xe", p)
    run_stage(syn, "train_s", p)
    real, scores = selection.cider_selector, {}

    def recording(*a, **kw):
        fn = real(*a, **kw)
        return lambda model, step: scores.setdefault(step, fn(model, step))

    selection.cider_selector = recording
    try:
        stages.run(ctx_for(syn, "train_m", p))
    finally:
        selection.cider_selector = real
    m = json.loads((syn / "results/syn/r2m/s0/train_m/train_metrics.json").read_text())
    assert sorted(scores) == [3, 6]
    best = max(sorted(scores), key=scores.get)  # the first of the best on ties
    assert m["selected_step"] == best and m["selected_score"] == scores[best]
    assert torch.load(syn / "models/syn/r2m/s0/train_m/model.pt", weights_only=True)["step"] == m["selected_step"]


def test_select_by_cider_without_val_references_keeps_last(syn: Path) -> None:
    from r2m.training import stages

    refs_file(syn / "data/syn").write_text(json.dumps({"images": [], "annotations": []}))
    p = make_params()
    run_stage(syn, "train_xe", p)
    run_stage(syn, "train_s", p)
    stages.run(ctx_for(syn, "train_m", p))
    m = json.loads((syn / "results/syn/r2m/s0/train_m/train_metrics.json").read_text())
    assert m["selected_step"] is None and m["steps"] == 4


def test_frozen_random_projection_is_redrawn_at_the_last_stage(syn: Path) -> None:
    from r2m.training.stages import build_model

    p = make_params(model={"d": 16, "heads": 2, "d_k": 8, "dropout": 0.0, "image_proj": "frozen_random"})
    for st in ("train_xe", "train_s", "train_m"):
        run_stage(syn, st, p)
    m = build_model(ctx_for(syn, "train_m", p), len(ITOS), 12)
    i = build_model(ctx_for(syn, "train_i", p), len(ITOS), 12)
    again = build_model(ctx_for(syn, "train_i", p), len(ITOS), 12)
    assert not torch.equal(m.image_proj_weight, i.image_proj_weight)
    assert torch.equal(i.image_proj_weight, again.image_proj_weight)  # repeatable
    assert not any(k.startswith("image_proj") for k in i.state_dict())  # never saved

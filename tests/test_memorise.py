"""Safety net: an R²M trained to memorise three sentences (one per concept) reproduces them exactly
through the DAG's ``caption`` stage and through ``r2m caption IMAGES --model <image-stage folder>``.

Each training sentence has a single concept; each test image is detected with exactly that concept,
so a correct caption path (concept inputs → encoding → beam search → words) must give back the
sentence word for word. A perturbed word, a wrong concept order or a broken vocabulary mapping fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from r2m import params as P
from r2m.cli import main as r2m_main
from r2m.stage import registry as S
from r2m.stage.context import StageContext
from r2m.training import stages as T
from r2m.utils.io import write_parquet

SENTENCES = {"dog": "a dog runs on the grass", "cat": "the cat sits near the road", "car": "a red car is on the road"}
WORDS = sorted({w for s in SENTENCES.values() for w in s.split()} - set(SENTENCES))
ITOS = ["<pad>", "<#start>", "<#end>", "<UNK>", *SENTENCES, *WORDS]
STOI = {w: i for i, w in enumerate(ITOS)}
LABEL = {"dog": "Dog", "cat": "Cat", "car": "Car"}  # openimages labels → concepts (last word, lower case)
TEST = {"t_dog": "dog", "t_cat": "cat", "t_car": "car"}
FEAT_DIM = 8


def _build(root: Path) -> None:
    D = root / "data" / "mem"
    (D / "vocab").mkdir(parents=True)
    (D / "vocab" / "vocab.json").write_text(json.dumps({"itos": ITOS}))
    rows = []
    for k in range(60):
        c = list(SENTENCES)[k % 3]
        rows.append({"ids": [STOI[w] for w in SENTENCES[c].split()], "concept_ids": [STOI[c]],
                     "split": "val" if k >= 54 else "train"})
    schema = pa.schema([("ids", pa.list_(pa.int32())), ("concept_ids", pa.list_(pa.int32())), ("split", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), D / "vocab" / "encoded.parquet")
    train_ids = [f"tr{i}" for i in range(6)]
    val_ids = ["va0", "va1", "va2"]
    ids = [*train_ids, *val_ids, *TEST]
    split = ["train"] * 6 + ["val"] * 3 + ["test"] * 3
    write_parquet(D / "prepared" / "images.parquet",
                  pd.DataFrame({"image_id": ids, "path": [f"x/{i}.jpg" for i in ids], "split": split}))
    concept_of = {**{i: list(SENTENCES)[n % 3] for n, i in enumerate(train_ids + val_ids)}, **TEST}
    det = [{"image_id": i, "label": LABEL[c], "concept": c, "score": 0.9, "x1": 0.0, "y1": 0.0, "x2": 1.0, "y2": 1.0}
           for i, c in concept_of.items()]
    write_parquet(D / "concepts" / "detections.parquet", pd.DataFrame(det))
    rng = np.random.default_rng(0)
    (D / "features").mkdir(parents=True)
    with h5py.File(D / "features" / "features.h5", "w") as f:
        f.create_dataset("pooled", data=rng.standard_normal((len(ids), FEAT_DIM)).astype(np.float16))
    write_parquet(D / "features" / "index.parquet", pd.DataFrame({"image_id": ids, "row": np.arange(len(ids))}))


def _params() -> P.Params:
    sched = {"batch_size": 12, "max_len": 10, "eval_every": 1000, "checkpoint_every": 1000, "select_by": "last"}
    raw = {
        "datasets": ["mem"],
        "catalog": {"mem": {"kind": "tiny", "beta": 1.0, "gamma": 1.0}},
        "model": {"d": 24, "heads": 2, "d_k": 8, "dropout": 0.0},
        "train_xe": {**sched, "steps": 150, "lr": 1e-2},
        "train_s": {**sched, "steps": 2, "lr": 1e-6},
        "train_m": {**sched, "steps": 2, "lr": 1e-6},  # an image stage that keeps what train_xe learned
        "train_i": {**sched, "steps": 1, "lr": 1e-6},
        "caption": {"beam": 3, "max_len": 10, "batch_size": 2, "split": "test"},
    }
    return P.for_dataset(P.validate(raw), "mem")


def _ctx(root: Path, stage: str, params: P.Params, **kw) -> StageContext:
    return StageContext(stage=S.get(stage), params=params, dataset="mem", variant="r2m", root=root, **kw)


@pytest.fixture(scope="module")
def memorised(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("mem")
    _build(root)
    p = _params()
    for st in ("train_xe", "train_s", "train_m"):
        T.train(_ctx(root, st, p))
    return root


def test_caption_stage_reproduces_the_memorised_sentences(memorised: Path) -> None:
    import importlib

    p = _params()
    for ckpt in ("train_xe", "train_m"):
        ctx = _ctx(memorised, "caption", p, ckpt=ckpt)
        mod, fn = ctx.stage.impl.split(":")
        importlib.import_module(mod).__dict__[fn](ctx)
        caps = json.loads(Path(ctx.outs["captions"]).read_text())
        assert {c["image_id"]: c["caption"] for c in caps} == {i: SENTENCES[c] for i, c in TEST.items()}, ckpt


def test_r2m_caption_images_with_an_image_stage_checkpoint(memorised: Path, tmp_path: Path, capsys) -> None:
    folder = memorised / "models/mem/r2m/s0/train_m"
    info = json.loads((folder / "inference.json").read_text())
    assert info["stage"] == "train_m" and info["itos"] == ITOS
    photos = tmp_path / "photos"
    photos.mkdir()
    paths = {}
    for n, (name, concept) in enumerate(TEST.items()):
        paths[concept] = photos / f"{name}.png"
        Image.fromarray(np.full((16, 16, 3), 40 * n, np.uint8)).save(paths[concept])
    dets = tmp_path / "detections.jsonl"
    dets.write_text("".join(json.dumps({"image_id": str(path), "label": LABEL[c], "score": 0.9, "box": [0, 0, 8, 8]})
                            + "\n" for c, path in paths.items()))
    info["detect_concepts"] = {"backend": "precomputed", "options": {"path": str(dets)}, "batch_size": 2,
                               "min_side": 1}
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.pt").write_bytes((folder / "model.pt").read_bytes())
    (model_dir / "inference.json").write_text(json.dumps(info))
    assert r2m_main(["caption", *map(str, paths.values()), "--model", str(model_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = {Path(c["path"]).stem: c["caption"] for c in doc["captions"]}
    assert got == {name: SENTENCES[c] for name, c in TEST.items()}
    assert all(c["source"] == "detections" for c in doc["captions"])

"""Concept detection: the offline default on real photos, precomputed import errors, checksums,
Faster R-CNN plumbing (untrained model), and the stage writing its files."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
import torch
from PIL import Image

from r2m.vision import weights as W
from r2m.vision.detectors.base import COLUMNS
from r2m.vision.detectors.classifier import class_concepts, read_mapping
from r2m.vision.detectors.factory import build_detector, detect_images
from r2m.vision.detectors.precomputed import read_precomputed

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from skimage import data

    d = tmp_path_factory.mktemp("photos")
    paths = {}
    for name in ("chelsea", "coffee", "astronaut"):
        paths[name] = d / f"{name}.png"
        Image.fromarray(getattr(data, name)()).save(paths[name])
    trunc = d / "truncated.jpg"
    Image.fromarray(data.coffee()).save(d / "full.jpg")
    trunc.write_bytes((d / "full.jpg").read_bytes()[:3000])
    paths["truncated"] = trunc
    return paths


def _concepts(df, image_id, threshold=0.3):
    return set(df[(df.image_id == image_id) & (df.score >= threshold)]["concept"])


def test_offline_default_finds_cat_coffee_person(photos):
    ids = list(photos)
    df = detect_images([photos[i] for i in ids], "offline", image_ids=ids)
    assert list(df.columns) == list(COLUMNS)
    assert "cat" in _concepts(df, "chelsea")
    assert _concepts(df, "coffee") & {"coffee", "cup", "mug"}
    assert "person" in _concepts(df, "astronaut")
    assert [b[0] for b in df.attrs["bad_images"]] == ["truncated"]
    face = df[(df.image_id == "astronaut") & (df.concept == "person")].iloc[0]
    assert 150 < face.x1 < face.x2 < 300 and 30 < face.y1 < face.y2 < 200  # the astronaut's face


def test_classifier_mapping_and_coco80(photos):
    df = detect_images([photos["coffee"], photos["chelsea"]], "classifier", image_ids=["coffee", "chelsea"],
                       dictionary="coco80")
    assert "cup" in _concepts(df, "coffee") and "cat" in _concepts(df, "chelsea")
    whole = df[df.image_id == "coffee"].iloc[0]
    assert (whole.x1, whole.y1, whole.x2, whole.y2) == (0, 0, 600, 400)


def test_mapping_file_is_consistent():
    import torchvision

    from r2m.text.dictionary import load_dictionary
    from r2m.vision.detectors.classifier import MAPPING_FILE

    cats = torchvision.models.MobileNet_V2_Weights.IMAGENET1K_V1.meta["categories"]
    mapping = read_mapping(MAPPING_FILE, cats)
    oi = load_dictionary("openimages")
    per_class = class_concepts(cats, mapping, oi)
    dogs = per_class[151:269]
    assert set(dogs) == {"dog"}
    assert per_class[281:286] == ["cat"] * 5
    assert per_class[967] == "coffee" and per_class[504] == "mug"
    assert per_class[150] == "seal" and per_class[998] is None  # "sea lion" not lion; "ear" of corn blocked
    for idx, labels in mapping.items():  # every curated label maps into a dictionary (or is '-')
        assert labels == ["-"] or any(
            load_dictionary(d).label_to_concept(x) for d in ("openimages", "coco80") for x in labels), idx


def test_mapping_errors_name_the_line(tmp_path):
    bad = tmp_path / "m.tsv"
    bad.write_text("index\timagenet_class\tlabel\n1\tgoldfish\tfish\n2\tnot the name\tfish\n")
    with pytest.raises(ValueError, match=r"m.tsv:3"):
        read_mapping(bad, ["tench", "goldfish", "great white shark"])


def test_checksum_pinned_and_corruption_detected(tmp_path, monkeypatch):
    good = W.bundled(W.MOBILENET_V2)
    assert W.sha256_file(good).startswith("b0353104")
    corrupt = tmp_path / "weights" / "mobilenet_v2-b0353104.pth"
    corrupt.parent.mkdir()
    shutil.copy(good, corrupt)
    with open(corrupt, "r+b") as fh:
        fh.seek(5000)
        fh.write(b"\x00\x01\x02\x03")
    with pytest.raises(W.ChecksumError, match="SHA-256 mismatch"):
        W.verify_sha256(corrupt, W.MOBILENET_V2[2])
    monkeypatch.setattr(W, "package_file", lambda package, rel: corrupt)
    with pytest.raises(W.ChecksumError, match=str(corrupt)):
        build_detector("classifier", {})


def test_faster_rcnn_plumbing_random_init(photos, tmp_path):
    classes = tmp_path / "classes.txt"
    classes.write_text("__background__\nCat\nCoffee cup\n")
    opts = {"random_init": True, "classes": str(classes), "arch": "fasterrcnn_mobilenet_v3_large_fpn",
            "min_size": 160, "max_size": 160, "floor": 0.0}
    torch.manual_seed(0)
    df = detect_images([photos["chelsea"], photos["truncated"]], "faster_rcnn", opts, image_ids=["c", "t"])
    assert list(df.columns) == list(COLUMNS)
    assert len(df) > 0  # floor 0: a random head still scores boxes, so the subset checks below are not vacuous
    assert set(df["concept"]) <= {"cat", "cup"} and set(df["image_id"]) == {"c"}
    assert [b[0] for b in df.attrs["bad_images"]] == ["t"]
    with pytest.raises(ValueError, match="classes"):
        build_detector("faster_rcnn", {"checkpoint": str(classes)})


def _write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def test_precomputed_formats_and_errors(tmp_path):
    good = [{"image_id": "1", "label": "Coffee cup", "score": 0.9, "box": [0, 0, 5, 5]},
            {"image_id": 2, "label": "Dog", "score": 0.4, "box": [1, 2, 3, 4]}]
    p = tmp_path / "d.jsonl"
    _write_jsonl(p, good)
    assert [r[:3] for r in read_precomputed(p)] == [("1", "Coffee cup", 0.9), ("2", "Dog", 0.4)]
    _write_jsonl(p, [good[0], "{not json", good[1]])
    with pytest.raises(ValueError, match=r"d.jsonl:2: not valid JSON"):
        read_precomputed(p)
    _write_jsonl(p, [good[0], good[1], {"image_id": "3", "label": "Cat", "box": [0, 0, 1, 1]}])
    with pytest.raises(ValueError, match=r"d.jsonl:3: missing field\(s\) \['score'\]"):
        read_precomputed(p)
    _write_jsonl(p, [{"image_id": "3", "label": "Cat", "score": 0.5, "box": [0, 1]}])
    with pytest.raises(ValueError, match=r"d.jsonl:1: box"):
        read_precomputed(p)
    csv = tmp_path / "d.csv"
    csv.write_text("image_id,label,score,x1,y1,x2,y2\n1,Cat,0.8,0,0,1,1\n2,Dog,oops,0,0,1,1\n")
    with pytest.raises(ValueError, match=r"d.csv:3"):
        read_precomputed(csv)
    pq = tmp_path / "d.parquet"
    pd.DataFrame({"image_id": ["1"], "label": ["Cat"], "score": [0.7], "x1": [0.0], "y1": [0.0], "x2": [1.0],
                  "y2": [1.0]}).to_parquet(pq)
    assert read_precomputed(pq)[0] == ("1", "Cat", 0.7, (0.0, 0.0, 1.0, 1.0))


def _ctx(tmp_path, repo_root, stage):
    from r2m import params as P
    from r2m.stage import registry as S
    from r2m.stage.context import StageContext

    params = P.for_dataset(P.load(repo_root / "params.yaml"), "tiny")
    return StageContext(stage=S.get(stage), params=params, dataset="tiny", root=tmp_path)


def test_stage_precomputed(tmp_path, repo_root, photos):
    prepared = tmp_path / "data" / "tiny" / "prepared"
    prepared.mkdir(parents=True)
    pd.DataFrame({"image_id": ["1", "2", "3"], "path": [str(photos["chelsea"]), "missing.jpg", "x.jpg"],
                  "split": ["train", "train", "test"]}).to_parquet(prepared / "images.parquet")
    _write_jsonl(prepared / "detections.jsonl", [
        {"image_id": "1", "label": "Cat", "score": 0.9, "box": [0, 0, 5, 5]},
        {"image_id": "1", "label": "Not A Class", "score": 0.9, "box": [0, 0, 5, 5]},
        {"image_id": "2", "label": "Coffee cup", "score": 0.01, "box": [0, 0, 5, 5]},
        {"image_id": "99", "label": "Dog", "score": 0.9, "box": [0, 0, 5, 5]},
    ])
    ctx = _ctx(tmp_path, repo_root, "detect_concepts")
    assert ctx.params.detect_concepts.backend == "precomputed"
    from r2m.vision.detect import run

    run(ctx)
    df = pd.read_parquet(ctx.outs["concepts"] / "detections.parquet")
    assert df[["image_id", "concept"]].values.tolist() == [["1", "cat"]]
    assert (ctx.outs["concepts"] / "params.yaml").exists()
    assert pd.read_csv(ctx.outs["bad_images"]).empty

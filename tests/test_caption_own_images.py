"""Captioning without a generic sentence (caption.no_concepts) and `r2m caption IMAGES --model` for
images outside any dataset: folders with a corrupt file, JSON output, the HTML gallery."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from r2m.caption_cli import expand
from r2m.captioning.captioner import concept_inputs, encode_all, image_vectors, source_counts
from r2m.reports.browser import Browser, find_chromium

torch.set_num_threads(1)
STOI = {w: i for i, w in enumerate(["<pad>", "<#start>", "<#end>", "<UNK>", "cat", "dog", "cup", "a"])}


def _det(rows):
    return pd.DataFrame(rows, columns=["image_id", "concept", "score"])


DET = _det([("a", "cat", 0.9), ("a", "dog", 0.2),   # a: a concept above the threshold
            ("b", "zebra", 0.25), ("b", "cup", 0.1), ("b", "dog", 0.05),  # b: only below (zebra not in vocab)
            ])  # c: no detection at all


@pytest.mark.parametrize("mode, words, source", [
    ("empty", [["cat"], [], []], ["detections", "empty", "empty"]),
    ("top1", [["cat"], ["cup"], []], ["detections", "top1", "empty"]),
    ("image", [["cat"], [], []], ["detections", "image", "image"]),
])
def test_no_concepts_modes(mode, words, source):
    got_words, got_source = concept_inputs(["a", "b", "c"], DET, 0.3, 5, STOI, mode)
    assert got_words == words and got_source == source
    assert sum(source_counts(got_source).values()) == 3


def test_no_concepts_rejects_unknown_mode():
    with pytest.raises(ValueError, match="no_concepts"):
        concept_inputs(["a"], DET, 0.3, 5, STOI, "random")


def _model(image_dim=6):
    from r2m.models.r2m import R2M, R2MConfig

    torch.manual_seed(0)
    return R2M(R2MConfig(vocab_size=len(STOI), d=8, heads=2, d_k=4, image_dim=image_dim)).eval()


def test_image_mode_uses_projected_feature_only_for_image_stages():
    import logging

    m = _model()
    feats = {"b": np.ones(6, np.float32), "c": np.full(6, -1.0, np.float32)}
    rows = {1: "b", 2: "c"}
    vecs = image_vectors(m, {"stage": "train_i"}, rows, lambda ids: feats, logging.getLogger("t"))
    assert set(vecs) == {1, 2}
    v = encode_all(m, [[STOI["cat"]], [], []], 2, "cpu", vecs)
    assert torch.allclose(v[1], m.project_image(torch.ones(1, 6))[0])
    assert float(v[0].norm()) == pytest.approx(1.0, abs=1e-5) and not torch.allclose(v[1], v[2])
    empty = encode_all(m, [[STOI["cat"]], [], []], 2, "cpu")
    assert float(empty[1].abs().sum()) == 0.0  # v = 0 for an empty concept set
    # a text-stage checkpoint has no trained projection: nothing replaced (falls back to v = 0)
    assert image_vectors(m, {"stage": "train_s"}, rows, lambda ids: feats, logging.getLogger("t")) == {}


def test_expand_files_folders_globs(tmp_path):
    for name in ("b.png", "a.jpg", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    paths, missing = expand([str(tmp_path), str(tmp_path / "a.jpg"), str(tmp_path / "*.png"), "nope.jpg",
                             str(tmp_path / "*.gif")])
    assert [p.name for p in paths] == ["a.jpg", "b.png"]  # deduplicated, folder lists images only
    assert [m[0] for m in missing] == ["nope.jpg", str(tmp_path / "*.gif")]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny trained checkpoint (synthetic data) whose recorded detector is the offline classifier."""
    from test_training import make_params, make_synthetic, run_stage

    root = tmp_path_factory.mktemp("ckpt")
    make_synthetic(root)
    run_stage(root, "train_xe", make_params(train_xe={"steps": 3}))
    folder = root / "models/syn/r2m/s0/train_xe"
    info = json.loads((folder / "inference.json").read_text())
    assert info["itos"][:4] == ["<pad>", "<#start>", "<#end>", "<UNK>"] and info["stage"] == "train_xe"
    info["detect_concepts"] = {"backend": "classifier", "options": {"topk": 3}, "batch_size": 2, "min_side": 8}
    info.setdefault("concepts", {})["dictionary"] = "openimages"  # a text stage records no concept settings
    (folder / "inference.json").write_text(json.dumps(info))
    return folder


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory):
    from skimage import data

    d = tmp_path_factory.mktemp("photos")
    Image.fromarray(data.chelsea()).save(d / "chelsea.png")
    Image.fromarray(data.coffee()).save(d / "coffee.jpg")
    (d / "broken.jpg").write_bytes((d / "coffee.jpg").read_bytes()[:2000])
    return d


def _cli(*args):
    from r2m.cli import main

    return main(["caption", *map(str, args)])


def test_caption_folder_with_corrupt_file(checkpoint, photo_folder, capsys):
    assert _cli(photo_folder, "--model", checkpoint, "--no-concepts", "top1") == 0
    out, err = capsys.readouterr()
    lines = [ln.split("\t") for ln in out.splitlines() if ln]
    assert sorted(Path(p).name for p, _ in lines) == ["chelsea.png", "coffee.jpg"]
    itos = json.loads((checkpoint / "inference.json").read_text())["itos"]
    assert all(set(c.split()) <= set(itos[4:]) for _, c in lines), lines  # words only (exact content: test_memorise.py)
    by_name = {Path(p).name: c for p, c in lines}
    assert "broken.jpg" in err and "bad image" in err

    assert _cli(photo_folder / "chelsea.png", photo_folder / "broken.jpg", "--model", checkpoint, "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert [Path(c["path"]).name for c in doc["captions"]] == ["chelsea.png"]
    if doc["captions"][0]["source"] == "top1":  # the same concepts as the first run: the same caption
        assert doc["captions"][0]["caption"] == by_name["chelsea.png"]
    assert [Path(b["path"]).name for b in doc["bad_images"]] == ["broken.jpg"]
    assert {"caption", "concepts", "source"} <= set(doc["captions"][0])


def test_caption_only_bad_images_fails(checkpoint, photo_folder, capsys):
    assert _cli(photo_folder / "broken.jpg", "--model", checkpoint) == 1
    assert _cli(photo_folder / "none.jpg", "--model", checkpoint) == 1
    assert "no such file" in capsys.readouterr().err


def test_missing_model_says_what_to_do(photo_folder, tmp_path, capsys):
    assert _cli(photo_folder / "chelsea.png", "--model", tmp_path / "nothing") == 1
    assert "model.pt is missing" in capsys.readouterr().err


def test_gallery(checkpoint, photo_folder, tmp_path, capsys):
    out = tmp_path / "gallery"
    assert _cli(photo_folder, "--model", checkpoint, "--html", out) == 0
    page = (out / "index.html").read_text()
    assert page.count('<figure class="card">') == 2 and "broken.jpg" in page and "Skipped images" in page
    assert len(list((out / "images").iterdir())) == 2
    assert len(list((out / "attention").glob("*.png"))) == 2  # FM/RM plot per image
    if find_chromium():  # in a headless browser at a desktop's and a phone's width: it fits, its 2 photos and 2
        # attention plots load
        from test_report_browser import MEASURE

        with Browser() as browser:
            for width in (1280, 390):
                seen = browser.open(out / "index.html", width).evaluate(MEASURE)
                assert seen["outside"] == [] and seen["page"] <= width, (width, seen["outside"][:3])
                assert len(seen["images"]) == 4 and all(i["loaded"] for i in seen["images"]), seen["images"]

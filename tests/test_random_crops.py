"""The released code's random crop at every image step, cached as K crops per image (``extract_features.crops``).

The reference is the authors' training input (``obj2sen_tri.py:255-262``): ``tf.image.resize_images`` to
346 × 346, then ``tf.random_crop`` to 299 × 299 — a window whose top-left corner is uniform over
``0 … 346 − 299`` on each axis (both ends included) — while their test code takes the centre window
``[23:-24]``. Small sizes stand in for 346 / 299 so the checks run in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from r2m import params as P
from r2m.stage.registry import get as stage
from r2m.training.data import ImageSet
from r2m.vision.extractors.base import ResizeToUint8
from r2m.vision.extractors.crops import RandomCrops, with_crops
from r2m.vision.extractors.factory import build_extractor
from r2m.vision.extractors.tf1 import OfficialResizeCrop, tf1_resize_bilinear
from r2m.vision.features import extract_dataset


def _photo(seed: int, h: int = 50, w: int = 60) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _windows(big: np.ndarray, crop: np.ndarray) -> list[tuple[int, int]]:
    """Every (y, x) at which ``crop`` is the window of ``big`` (by exhaustive search)."""
    h, w = crop.shape[:2]
    return [(y, x) for y in range(big.shape[0] - h + 1) for x in range(big.shape[1] - w + 1)
            if np.array_equal(big[y:y + h, x:x + w], crop)]


def test_official_crops_are_windows_of_the_authors_resize_anywhere_in_range() -> None:
    resize, crop, k = 40, 30, 6
    seen: set[int] = set()
    for seed in range(60):
        img = _photo(seed)
        views = RandomCrops(OfficialResizeCrop(resize, crop), k)(img).numpy()
        assert views.shape == (1 + k, 3, crop, crop)
        big = tf1_resize_bilinear(np.asarray(img, dtype=np.float32), resize, resize)
        # the first view is the test-time centre window [(r - c) // 2 :], as before
        assert np.array_equal(views[0].transpose(1, 2, 0), big[5:35, 5:35])
        for v in views[1:]:
            where = _windows(big, v.transpose(1, 2, 0))
            assert where, "a crop that is no window of the 346-style resize"
            seen.update(c for yx in where for c in yx)
    # tf.random_crop draws each offset uniformly over 0 … resize - crop, both ends included
    assert seen == set(range(resize - crop + 1))


def test_plain_resize_crops_come_from_a_resize_larger_by_346_over_299() -> None:
    img = _photo(7)
    views = RandomCrops(ResizeToUint8((30, 30)), 4)(img)
    assert views.dtype == torch.uint8 and views.shape == (5, 3, 30, 30)
    assert torch.equal(views[0], ResizeToUint8((30, 30))(img))
    big = np.asarray(img.resize((35, 35), Image.Resampling.BILINEAR))  # round(30 * 346 / 299) = 35
    for v in views[1:]:
        assert _windows(big, v.permute(1, 2, 0).numpy())


def test_crops_are_seeded_by_the_photo_not_by_the_call() -> None:
    make = RandomCrops(OfficialResizeCrop(80, 40), 8)
    a, b = make(_photo(1, 90, 90)), make(_photo(1, 90, 90))
    assert torch.equal(a, b)
    big = tf1_resize_bilinear(np.asarray(_photo(2, 90, 90), dtype=np.float32), 80, 80)
    other = make(_photo(2, 90, 90)).numpy()
    offsets_1 = {_windows(tf1_resize_bilinear(np.asarray(_photo(1, 90, 90), dtype=np.float32), 80, 80),
                          v.transpose(1, 2, 0))[0] for v in a.numpy()[1:]}
    offsets_2 = {_windows(big, v.transpose(1, 2, 0))[0] for v in other[1:]}
    assert len(offsets_1) > 1 and offsets_1 != offsets_2


def test_a_backend_without_a_crop_form_refuses_crops() -> None:
    with pytest.raises(ValueError, match="extract_features.crops"):
        RandomCrops(lambda img: img, 4)


def _images(folder: Path, n: int) -> tuple[list[str], list[str]]:
    folder.mkdir(parents=True, exist_ok=True)
    ids = [f"im{i}" for i in range(n)]
    files = []
    for i in range(n):
        f = folder / f"im{i}.png"
        _photo(100 + i, 40, 48).save(f)
        files.append(str(f))
    return ids, files


def test_features_keep_their_usual_view_and_add_the_crops(tmp_path: Path) -> None:
    ids, files = _images(tmp_path / "img", 3)
    opts = {"size": 32, "dim": 16}
    plain = extract_dataset(ids, files, tmp_path / "plain", "random_cnn", opts)
    cropped = extract_dataset(ids, files, tmp_path / "cropped", "random_cnn", opts, crops=4)
    assert "crops" not in plain and cropped["crops"] == 4 and plain["fingerprint"] != cropped["fingerprint"]
    with h5py.File(tmp_path / "plain" / "features.h5") as a, h5py.File(tmp_path / "cropped" / "features.h5") as b:
        assert list(a) == ["pooled"] and sorted(b) == ["pooled", "pooled_crops"]
        assert np.array_equal(a["pooled"][:], b["pooled"][:])  # the usual view: the same bytes
        crops = b["pooled_crops"][:]
    assert crops.shape == (3, 4, 16)
    # each stored crop is the network on that crop of the photo
    ex = build_extractor("random_cnn", opts)
    views = with_crops(ex, 4).prepare(Image.open(files[1]).convert("RGB"))
    with torch.inference_mode():
        direct = ex.model(views[1:])["pooled"].numpy().astype(np.float16)
    assert np.allclose(crops[1].astype(np.float32), direct.astype(np.float32), atol=1e-3)
    assert not np.allclose(crops[1, 0], crops[1, 1])


def _image_set_inputs(tmp_path: Path, n: int, crops: int) -> dict:
    ids, files = _images(tmp_path / "img", n)
    prepared, concepts = tmp_path / "prepared", tmp_path / "concepts"
    prepared.mkdir()
    concepts.mkdir()
    pd.DataFrame({"image_id": ids, "split": ["train"] * (n - 1) + ["val"]}).to_parquet(prepared / "images.parquet")
    pd.DataFrame({"image_id": ids, "concept": ["dog"] * n, "score": [0.9] * n}).to_parquet(
        concepts / "detections.parquet")
    extract_dataset(ids, files, tmp_path / "features", "random_cnn", {"size": 32, "dim": 8}, crops=crops)
    return dict(prepared=prepared, concepts=concepts, features=tmp_path / "features", itos=["<pad>", "dog"],
                threshold=0.3, max_per_image=5)


def test_training_draws_one_crop_per_image_and_step_and_validation_the_usual_view(tmp_path: Path) -> None:
    kw = _image_set_inputs(tmp_path, 7, crops=3)
    with h5py.File(tmp_path / "features" / "features.h5") as f:
        usual, crops = f["pooled"][:].astype(np.float32), f["pooled_crops"][:].astype(np.float32)
    train = ImageSet(split="train", crops=True, **kw)
    rows = dict(zip(train.image_ids, train.rows, strict=True))
    picked: dict[str, set[int]] = {}
    for step, batch in zip(range(12), train.batches(4, seed=0), strict=False):
        for image_id, feat in zip(batch.image_ids, batch.feats.numpy(), strict=True):
            k = [j for j in range(3) if np.array_equal(feat, crops[rows[image_id], j])]
            assert k, f"step {step}: {image_id}'s features are none of its crops"
            picked.setdefault(image_id, set()).update(k)
    assert any(len(s) > 1 for s in picked.values())  # not one fixed crop per image
    again = next(ImageSet(split="train", crops=True, **kw).batches(4, seed=0))
    first = next(train.batches(4, seed=0))
    assert torch.equal(again.feats, first.feats)  # seeded: a resumed run draws the same crops
    val = ImageSet(split="val", **kw)
    (batch,) = list(val.ordered(4))
    assert np.array_equal(batch.feats.numpy()[0], usual[val.rows[0]])
    for s in (train, val):
        s.close()


def test_crops_asked_of_features_made_without_them_is_a_clear_error(tmp_path: Path) -> None:
    kw = _image_set_inputs(tmp_path, 3, crops=0)
    with pytest.raises(KeyError, match="pooled_crops.*run extract_features again"):
        ImageSet(split="train", crops=True, **kw)


def test_crops_are_the_official_profiles_and_read_by_the_image_stages_only() -> None:
    raw = {"extract_features": {}}
    assert P.resolve_fidelity(raw, "paper")["extract_features"]["crops"] == 0
    assert P.resolve_fidelity(raw, "official")["extract_features"]["crops"] == 8
    assert P.resolve_fidelity({"extract_features": {"crops": 2}}, "official")["extract_features"]["crops"] == 2
    with pytest.raises(ValueError):
        P.FeatureParams.model_validate({"crops": 4})  # the baselines' sup_features has no crops
    for name in ("train_m", "train_i", "train_e2e"):
        assert "extract_features.crops" in stage(name).params
    for name in ("train_xe", "train_s", "caption"):
        assert "extract_features.crops" not in stage(name).params

"""Safe image loading: conversions to RGB, truncated/unreadable/too-small files listed, not fatal."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from r2m.vision.images import BadImage, load_image, make_loader, read_image_index, write_bad_images


def _photo(tmp_path, name="coffee"):
    from skimage import data

    path = tmp_path / f"{name}.jpg"
    Image.fromarray(getattr(data, name)()).save(path, quality=90)
    return path


def test_modes_become_rgb(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 255, (40, 50, 3), dtype=np.uint8)
    cases = {
        "gray.jpg": Image.fromarray(rgb[..., 0], "L"),
        "cmyk.jpg": Image.fromarray(rgb).convert("CMYK"),
        "palette.png": Image.fromarray(rgb).convert("P"),
        "rgba.png": Image.fromarray(np.dstack([rgb, np.full((40, 50), 128, np.uint8)]), "RGBA"),
        "gray16.png": Image.fromarray(rgb[..., 0].astype(np.uint16) * 200),
        "bw.png": Image.fromarray(rgb[..., 0] > 128),
    }
    for name, img in cases.items():
        img.save(tmp_path / name)
        out = load_image(tmp_path / name)
        assert out.mode == "RGB" and out.size == (50, 40), name


def test_cmyk_colours_survive(tmp_path):
    Image.new("RGB", (40, 40), (200, 30, 30)).convert("CMYK").save(tmp_path / "red.jpg", quality=95)
    r, g, b = load_image(tmp_path / "red.jpg").getpixel((20, 20))
    assert r > 150 and g < 80 and b < 80


def test_bad_files_have_reasons(tmp_path):
    good = _photo(tmp_path)
    trunc = tmp_path / "trunc.jpg"
    trunc.write_bytes(good.read_bytes()[:4000])
    (tmp_path / "text.jpg").write_text("not an image")
    Image.new("RGB", (10, 64)).save(tmp_path / "small.png")
    with pytest.raises(BadImage, match="truncated"):
        load_image(trunc)
    with pytest.raises(BadImage, match="not a recognised image"):
        load_image(tmp_path / "text.jpg")
    with pytest.raises(BadImage, match="too small"):
        load_image(tmp_path / "small.png", min_side=32)
    with pytest.raises(BadImage, match="missing"):
        load_image(tmp_path / "nope.jpg")
    assert load_image(good).size == (600, 400)


def test_loader_skips_and_collects_bad(tmp_path):
    import torch

    good = _photo(tmp_path)
    trunc = tmp_path / "trunc.jpg"
    trunc.write_bytes(good.read_bytes()[:4000])
    files = [good, trunc, good, tmp_path / "missing.jpg", good]
    prep = lambda im: torch.zeros(3, 8, 8)  # noqa: E731
    seen, bad = [], []
    for batch in make_loader(files, prep, batch_size=2):
        seen += batch.indices
        bad += batch.bad
        if batch.indices:
            assert batch.data.shape == (len(batch.indices), 3, 8, 8)
    assert seen == [0, 2, 4]
    assert [i for i, _ in bad] == [1, 3]


def test_bad_images_csv_and_index(tmp_path):
    import pandas as pd

    out = write_bad_images(tmp_path / "r" / "bad_images.csv", [("1", "a.jpg", "unreadable: x, y")])
    df = pd.read_csv(out, dtype=str)
    assert list(df.columns) == ["image_id", "path", "reason"] and df.iloc[0]["reason"] == "unreadable: x, y"
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "img.jpg").write_bytes(b"x")
    pd.DataFrame({"image_id": [1, 2], "path": ["img.jpg", "/abs/x.jpg"], "split": ["train", "test"]}).to_parquet(
        prepared / "images.parquet")
    idx = read_image_index(prepared, root=tmp_path)
    assert list(idx["image_id"]) == ["1", "2"]
    assert idx["file"][0] == str(prepared / "img.jpg") and idx["file"][1] == "/abs/x.jpg"

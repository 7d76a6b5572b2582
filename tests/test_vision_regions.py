"""Multi-object offline concepts: region merging and NMS on constructed detections, the grid, and the
default detector on two photos side by side."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from r2m.vision.detectors.factory import detect_images
from r2m.vision.detectors.regions import grid_boxes, iou, merge_regions

torch.set_num_threads(1)


def test_iou():
    assert iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert iou((0, 0, 10, 10), (10, 0, 20, 10)) == 0.0
    assert iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0


def test_merge_keeps_best_box_and_suppresses_overlaps():
    cands = [
        ("tabby", "cat", 0.55, (0.0, 0.0, 100.0, 100.0)),
        ("tiger cat", "cat", 0.9, (10.0, 10.0, 100.0, 100.0)),   # best cat region
        ("tabby", "cat", 0.6, (300.0, 0.0, 400.0, 100.0)),       # a second cat, elsewhere
        ("espresso", "coffee", 0.7, (0.0, 0.0, 100.0, 100.0)),   # other concept, same box: kept
        ("cup", "cup", 0.2, (200.0, 200.0, 250.0, 250.0)),
    ]
    out = merge_regions(cands, nms_iou=0.5)
    assert [(r[1], r[2]) for r in out] == [("cat", 0.9), ("coffee", 0.7), ("cat", 0.6), ("cup", 0.2)]
    assert out[0][3] == (10.0, 10.0, 100.0, 100.0) and out[0][0] == "tiger cat"
    # a looser threshold suppresses nothing more, a strict one (IoU >= 0) keeps one box per concept
    assert [r[1] for r in merge_regions(cands, nms_iou=0.0)] == ["cat", "coffee", "cup"]
    assert len(merge_regions(cands, nms_iou=0.5, max_detections=2)) == 2
    assert merge_regions([], 0.5) == []


def test_grid_boxes_cover_the_image():
    boxes = grid_boxes(300, 200, [3], 0.5)
    assert len(boxes) == 9
    assert boxes[0][:2] == (0.0, 0.0) and boxes[-1][2:] == (300.0, 200.0)
    assert all(b[2] - b[0] == pytest.approx(150.0) and b[3] - b[1] == pytest.approx(100.0) for b in boxes)
    assert grid_boxes(100, 100, [1], 0.5) == [(0.0, 0.0, 100.0, 100.0)]
    with pytest.raises(ValueError, match="scales"):
        grid_boxes(10, 10, [0], 0.5)


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory):
    from skimage import data

    a, b = Image.fromarray(data.chelsea()), Image.fromarray(data.coffee())
    b = b.resize((round(b.width * a.height / b.height), a.height))
    img = Image.new("RGB", (a.width + b.width, a.height))
    img.paste(a, (0, 0))
    img.paste(b, (a.width, 0))
    path = tmp_path_factory.mktemp("composed") / "chelsea_coffee.png"
    img.save(path)
    return path, a.width


def _kept(df, threshold=0.3):
    return df[df.score >= threshold]


def test_default_finds_two_objects_side_by_side(side_by_side):
    path, split = side_by_side
    df = _kept(detect_images([path], "offline", image_ids=["both"]))
    concepts = set(df["concept"])
    assert len(concepts) >= 2, concepts
    assert "cat" in concepts and concepts & {"coffee", "cup", "mug"}
    cat = df[df.concept == "cat"].iloc[0]
    drink = df[df.concept.isin(["coffee", "cup", "mug"])].iloc[0]
    assert (cat.x1 + cat.x2) / 2 < split < (drink.x1 + drink.x2) / 2  # boxes on the right halves
    # the whole-image classifier alone names one of the two
    one = _kept(detect_images([path], "classifier", image_ids=["both"]))
    assert len({"cat", "coffee", "cup", "mug"} & set(one["concept"])) < len({"cat", "coffee", "cup", "mug"} & concepts)

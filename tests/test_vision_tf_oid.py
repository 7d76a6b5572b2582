"""The paper's detector backend (``tf_oid``) on tiny TensorFlow SavedModels built here with the
signatures of the two public releases (TF Hub: float [1,H,W,3] in, string class names out; model
zoo: uint8 batches in, class ids + num_detections out). Nothing is downloaded: the "download" path
is exercised with a file:// URL of an archive made here. Skipped, with the reason, when TensorFlow
(the optional extra ``tf``) is not installed."""

from __future__ import annotations

import sys
import tarfile

import numpy as np
import pytest
from PIL import Image

from r2m.utils.options import MissingExtraError
from r2m.vision import weights as W
from r2m.vision.detectors.factory import build_detector, detect_images

CAT = 17  # any id: the zoo-style model below emits ids into the OpenImages-v4 names file


def _tf():
    return pytest.importorskip("tensorflow", reason="optional extra 'tf' not installed "
                               "(pip install -e '.[tf]' or make setup-tf)")


def test_missing_tensorflow_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # import tensorflow -> ImportError
    with pytest.raises(MissingExtraError) as err:
        build_detector("tf_oid", {"model": "/nonexistent"})
    msg = str(err.value)
    assert "\n" not in msg and "tf_oid" in msg and "pip install -e '.[tf]'" in msg and "make setup-tf" in msg


def test_options_are_validated():
    with pytest.raises(ValueError, match="unknown option"):
        build_detector("tf_oid", {"modle": "x"})
    with pytest.raises(ValueError, match="floor must be a number"):
        build_detector("tf_oid", {"floor": "high"})
    with pytest.raises(ValueError, match="source must be one of"):
        build_detector("tf_oid", {"source": "hubb"})


def _hub_like(tf, folder):
    """Signature ``default``: images float32 [1, H, W, 3] in [0, 1] -> unbatched outputs [N].
    Three detections: Cat (score = mean pixel), Bicycle wheel (0.6), a MID-only label (0.9)."""

    class Hub(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, None, None, 3], tf.float32)])
        def default(self, images):
            m = tf.reduce_mean(images)
            return {
                "detection_boxes": tf.constant([[0.1, 0.2, 0.5, 0.6], [0.0, 0.0, 1.0, 1.0], [0.2, 0.2, 0.3, 0.3]]),
                "detection_scores": tf.stack([m, tf.constant(0.6), tf.constant(0.9)]),
                "detection_class_entities": tf.constant([b"Cat", b"Bicycle wheel", b"/m/0zzzz"]),
                "detection_class_names": tf.constant([b"/m/01yrx", b"/m/01bqk0", b"/m/0zzzz"]),
                "detection_class_labels": tf.constant([1, 2, 3], tf.int64),
            }

    m = Hub()
    tf.saved_model.save(m, str(folder), signatures={"default": m.default})
    return folder


def _zoo_like(tf, folder):
    """Signature ``serving_default``: inputs uint8 [B, H, W, 3] -> [B, 3] outputs, num_detections = 2:
    class CAT with score = mean/255 of each image, class 1 (Tortoise) 0.5, a third (0.99) beyond
    num_detections that must be ignored."""

    class Zoo(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8)])
        def serve(self, inputs):
            b = tf.shape(inputs)[0]
            m = tf.reduce_mean(tf.cast(inputs, tf.float32), axis=[1, 2, 3]) / 255.0
            ones = tf.ones([b])
            return {
                "detection_boxes": tf.tile(tf.constant([[[0.5, 0.25, 1.0, 0.75], [0.0, 0.0, 0.5, 0.5],
                                                         [0.0, 0.0, 1.0, 1.0]]]), [b, 1, 1]),
                "detection_scores": tf.stack([m, 0.5 * ones, 0.99 * ones], axis=1),
                "detection_classes": tf.stack([float(CAT) * ones, ones, 3.0 * ones], axis=1),
                "num_detections": 2.0 * ones,
            }

    m = Zoo()
    tf.saved_model.save(m, str(folder), signatures={"serving_default": m.serve})
    return folder


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("tfimg")
    paths = {}
    for name, value, size in (("grey", 128, (40, 30)), ("white", 255, (40, 30)), ("dark", 51, (20, 50))):
        paths[name] = d / f"{name}.png"
        Image.new("RGB", size, (value,) * 3).save(paths[name])
    (d / "broken.jpg").write_bytes(b"not a jpeg")
    paths["broken"] = d / "broken.jpg"
    return paths


def test_hub_signature_float_input_string_labels(tmp_path, images):
    tf = _tf()
    folder = _hub_like(tf, tmp_path / "hub")
    ids = ["grey", "white", "broken"]
    df = detect_images([images[i] for i in ids], "tf_oid", {"model": str(folder)}, image_ids=ids, batch_size=4)
    assert [b[0] for b in df.attrs["bad_images"]] == ["broken"]
    grey = df[df.image_id == "grey"].set_index("concept")
    # display names mapped to dictionary words; the MID-only label has no concept and is dropped
    assert set(grey.index) == {"cat", "wheel"} and grey.loc["wheel", "label"] == "Bicycle wheel"
    assert grey.loc["cat", "score"] == pytest.approx(128 / 255, abs=1e-4)  # pixels fed in [0, 1]
    assert df[(df.image_id == "white") & (df.concept == "cat")].score.iloc[0] == pytest.approx(1.0, abs=1e-4)
    cat = grey.loc["cat"]  # normalised (ymin, xmin, ymax, xmax) -> pixels (x1, y1, x2, y2) of a 40x30 image
    assert (cat.x1, cat.y1, cat.x2, cat.y2) == pytest.approx((0.2 * 40, 0.1 * 30, 0.6 * 40, 0.5 * 30))


def test_zoo_signature_uint8_batches_ids_and_num_detections(tmp_path, images):
    tf = _tf()
    from r2m.text.dictionary import DICTIONARY_DIR, read_names

    names = read_names(DICTIONARY_DIR / "openimages_v4_boxable.names")
    folder = _zoo_like(tf, tmp_path / "zoo_release")
    ids = ["grey", "white", "dark"]  # grey + white share a size: one batched call; dark alone
    det = build_detector("tf_oid", {"model": str(folder)})
    assert det.batched and not det.input_float
    df = detect_images([images[i] for i in ids], "tf_oid", {"model": str(folder)}, image_ids=ids, batch_size=3)
    for image_id, value in (("grey", 128), ("white", 255), ("dark", 51)):
        rows = df[df.image_id == image_id]
        assert set(rows.label) == {names[CAT - 1], "Tortoise"}  # the third detection is past num_detections
        s = rows[rows.label == names[CAT - 1]].score.iloc[0]
        assert s == pytest.approx(value / 255, abs=1e-4)  # each image of the batch gets its own output
    dark = df[(df.image_id == "dark") & (df.label == "Tortoise")].iloc[0]
    assert (dark.x1, dark.y1, dark.x2, dark.y2) == pytest.approx((0, 0, 10, 25))


def test_download_records_checksum_then_verifies(tmp_path, images):
    tf = _tf()
    folder = _zoo_like(tf, tmp_path / "release" / "faster_rcnn_oid" / "saved_model")
    archive = tmp_path / "faster_rcnn_oid.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder.parent, arcname="faster_rcnn_oid")
    cache = tmp_path / "cache"
    opts = {"source": archive.as_uri(), "cache_dir": str(cache)}  # file:// — no network involved
    det = build_detector("tf_oid", opts)
    stored = cache / "detectors" / "faster_rcnn_oid.tar.gz"
    record = stored.with_name(stored.name + ".sha256")
    assert record.read_text().strip() == W.sha256_file(archive)
    assert det.folder == cache / "detectors" / "faster_rcnn_oid" / "faster_rcnn_oid" / "saved_model"
    df = detect_images([images["grey"]], "tf_oid", opts, image_ids=["grey"])
    assert "Tortoise" in set(df.label)
    with pytest.raises(W.ChecksumError, match="mismatch"):
        build_detector("tf_oid", {**opts, "sha256": "0" * 64})
    stored.write_bytes(stored.read_bytes() + b"tampered")
    with pytest.raises(W.ChecksumError, match="mismatch"):
        build_detector("tf_oid", opts)


def test_mid_only_outputs_use_mid_names(tmp_path, images):
    tf = _tf()

    class MidsOnly(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, None, None, 3], tf.uint8)])
        def default(self, images):
            return {"detection_boxes": tf.constant([[0.0, 0.0, 1.0, 1.0]]),
                    "detection_scores": tf.constant([0.8]),
                    "detection_class_names": tf.constant([b"/m/01yrx"])}

    m = MidsOnly()
    tf.saved_model.save(m, str(tmp_path / "mids"), signatures={"default": m.default})
    csv = tmp_path / "class-descriptions-boxable.csv"
    csv.write_text("/m/011k07,Tortoise\n/m/01yrx,Cat\n")
    df = detect_images([images["grey"]], "tf_oid", {"model": str(tmp_path / "mids"), "mid_names": str(csv)},
                       image_ids=["grey"])
    assert list(df.concept) == ["cat"] and np.isclose(df.score.iloc[0], 0.8)
    df = detect_images([images["grey"]], "tf_oid", {"model": str(tmp_path / "mids")}, image_ids=["grey"])
    assert df.empty  # a MID without a name table maps to no concept


def test_free_batch_dimension_but_unbatched_outputs_falls_back_to_one_by_one(tmp_path, images):
    tf = _tf()

    class Loose(tf.Module):  # declares [None, H, W, 3] but answers for the first image only, like [1, ...]
        @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.float32)])
        def default(self, images):
            return {"detection_boxes": tf.constant([[0.0, 0.0, 1.0, 1.0]]),
                    "detection_scores": tf.reshape(tf.reduce_mean(images[0]), [1]),
                    "detection_class_entities": tf.constant([b"Cat"])}

    m = Loose()
    tf.saved_model.save(m, str(tmp_path / "loose"), signatures={"default": m.default})
    ids = ["grey", "white"]  # same size: first tried as one batch
    df = detect_images([images[i] for i in ids], "tf_oid", {"model": str(tmp_path / "loose")}, image_ids=ids)
    assert df.set_index("image_id").score.to_dict() == pytest.approx({"grey": 128 / 255, "white": 1.0}, abs=1e-4)

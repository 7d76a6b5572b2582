"""No silent random weights: a feature backend that finds no weights stops with one line
naming the file it looked for and how to provide it (no traceback from ``r2m``); random weights only
with ``options.random_init: true`` (or ``random_cnn``, random by definition), recorded in the
features folder's ``meta.json`` and shown on the report page."""

from __future__ import annotations

import copy
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from r2m import params as P
from r2m.stage.registry import BY_NAME
from r2m.utils.guard import BadInput
from r2m.vision import weights as W

BIN = Path(sys.executable).parent
VGG_DEFAULT = "data/weights/vgg16-397923af.pth"


def _tiny_paired(raw: dict, sup_features: dict) -> dict:
    raw = copy.deepcopy(raw)
    raw["catalog"]["tiny_paired"].update(n_train_images=6, n_val_images=2, n_test_images=2, n_sentences=20)
    raw["catalog"]["tiny_paired"]["overrides"]["sup_features"] = sup_features
    return raw


def _run(stage: str, params: P.Params, root: Path):
    from r2m.stage.context import StageContext

    ctx = StageContext(stage=BY_NAME[stage], params=params, dataset="tiny_paired", root=root)
    mod, fn = BY_NAME[stage].impl.split(":")
    getattr(importlib.import_module(mod), fn)(ctx)
    return ctx


# --------------------------------------------------------------------------- the backends
def test_vgg16_without_weights_names_the_file_it_looked_for(tmp_path, monkeypatch) -> None:
    from r2m.vision.extractors.factory import build_extractor

    monkeypatch.chdir(tmp_path)
    with pytest.raises(W.MissingWeights) as err:
        build_extractor("vgg16", {})
    msg = str(err.value)
    assert "\n" not in msg and VGG_DEFAULT in msg and "vgg16-397923af.pth" in msg and "random_init" in msg
    assert isinstance(err.value, BadInput) and isinstance(err.value, FileNotFoundError)
    named = tmp_path / "elsewhere" / "my_vgg.pth"
    with pytest.raises(W.MissingWeights, match=str(named)):
        build_extractor("vgg16", {"weights": str(named)})
    with pytest.raises(W.MissingWeights, match="nowhere.safetensors"):
        build_extractor("inception_v4", {"weights": "nowhere.safetensors"})
    with pytest.raises(BadInput, match="both given"):
        build_extractor("vgg16", {"weights": str(named), "random_init": True})
    with pytest.raises(ValueError, match="random_init is not supported"):
        build_extractor("inception_v3_fid", {"random_init": True})


def test_which_backends_use_random_weights() -> None:
    assert W.uses_random_weights("random_cnn", {})
    assert W.uses_random_weights("vgg16", {"random_init": True})
    assert not W.uses_random_weights("vgg16", {"weights": "x.pth"})
    assert not W.uses_random_weights("inception_v3_fid", None)
    assert W.uses_random_weights("faster_rcnn", {"random_init": True, "num_classes": 3})


# --------------------------------------------------------------------------- the CLI
def test_missing_weights_stop_the_stage_with_one_line_and_no_traceback(raw, tmp_path) -> None:
    params = P.for_dataset(P.validate(_tiny_paired(raw, {"backend": "vgg16", "options": {}})), "tiny_paired")
    _run("prepare", params, tmp_path)
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump(_tiny_paired(raw, {"backend": "vgg16", "options": {}}), sort_keys=False))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    r = subprocess.run([str(BIN / "r2m"), "extract_features_sup", "--dataset", "tiny_paired", "--params", str(f),
                        "--no-log-file"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.strip().splitlines() if " ERROR " in ln]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"vgg16: weights file not found: {VGG_DEFAULT}" in errors[0] and "random_init" in errors[0]
    assert not (tmp_path / "data/tiny_paired/sup_features").exists()


# --------------------------------------------------------------------------- recorded
@pytest.mark.parametrize("sup", [{"backend": "vgg16", "options": {"random_init": True, "kinds": ["pooled"]}},
                                 {"backend": "random_cnn", "options": {"kinds": ["pooled"]}}],
                         ids=["vgg16-random_init", "random_cnn"])
def test_random_weights_are_recorded_in_the_features_folder(raw, tmp_path, sup) -> None:
    params = P.for_dataset(P.validate(_tiny_paired(raw, sup)), "tiny_paired")
    _run("prepare", params, tmp_path)
    with pytest.warns(UserWarning, match="random") if sup["backend"] == "vgg16" else _nothing():
        out = _run("extract_features_sup", params, tmp_path).outs["sup_features"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["random_weights"] is True and meta["backend"] == sup["backend"]
    saved = yaml.safe_load((out / "params.yaml").read_text())
    assert saved["sup_features"]["backend"] == sup["backend"]
    assert saved["sup_features"]["options"].get("random_init") == sup["options"].get("random_init")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --------------------------------------------------------------------------- the report page
def test_report_page_shows_random_weights_per_dataset(raw, tmp_path) -> None:
    from r2m.reports import html

    raw = copy.deepcopy(raw)
    raw["catalog"]["demo"].setdefault("overrides", {})["sup_features"] = {
        "backend": "vgg16", "options": {"random_init": True}}
    params = P.validate(raw)
    rows = html.random_weight_rows(params)
    got = {(r["dataset"], r["section"], r["backend"], r["why"]) for r in rows}
    assert ("tiny_paired", "sup_features", "random_cnn", "random by definition") in got
    assert ("demo", "sup_features", "vgg16", "options.random_init: true") in got
    assert not any(r["section"] == "extract_features" and r["dataset"] == "demo" for r in rows)
    fig_dir = tmp_path / "reports/figures/demo"
    fig_dir.mkdir(parents=True)
    (fig_dir / "index.json").write_text(json.dumps({"figures": [], "notes": [], "examples": []}))
    page = html.render_page({"table1": tmp_path / "reports/table1.csv"}, [("demo", fig_dir)],
                            tmp_path / "reports/index.html", random_weights=rows)
    assert page.count('<span class="badge">random weights</span>') == len(rows) + 1  # + demo's own section
    assert "<b>tiny_paired</b>" in page and "random by definition" in page and "options.random_init: true" in page
    assert 'href="#weights"' in page
    clean = html.render_page({"table1": tmp_path / "reports/table1.csv"}, [("demo", fig_dir)],
                             tmp_path / "reports/index.html")
    assert "badge" not in clean.split("<main>")[1] and 'id="weights"' not in clean

"""The baselines' features: a stage of their own (``extract_features_sup``, params
``sup_features``, folder ``D/sup_features``), VGG-16 fc7 + conv5 grid on the paper benchmarks,
today's features on ``tiny_paired`` (byte for byte) and ``demo``; R²M keeps ``D/features``."""

from __future__ import annotations

import copy
import importlib
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pandas as pd
import pytest
import yaml

from r2m import params as P
from r2m.pipeline import dag
from r2m.pipeline import validate as V
from r2m.stage.registry import BY_NAME
from r2m.stage.sup_registry import SUP

BIN = Path(sys.executable).parent
SUP_READERS = ("pretrain_sup", "train_sup", "caption_sup", "inspect_sup", "retrieval_sup")


# --------------------------------------------------------------------------- defaults
@pytest.mark.parametrize("name", P.BENCHMARK_KINDS)
def test_benchmarks_give_the_baselines_vgg16_fc7_and_grid(raw, name) -> None:
    view = P.for_dataset(P.validate(raw), name)
    assert view.sup_features.backend == "vgg16"
    assert view.sup_features.options["kinds"] == ["pooled", "grid"]
    assert Path(view.sup_features.options["weights"]).parts[:2] == ("data", "weights")
    assert view.extract_features.backend == "inception_v4"  # R²M keeps the paper's features


def test_snakemake_rule_of_the_baselines_features_carries_vgg16(raw) -> None:
    """What ``snakemake -n reports/baselines.csv --config 'baselines={"datasets": ["coco_shutterstock"]}'``
    gives ``extract_features_sup``: the resolved params its rule carries (and the stage saves)."""

    p = P.validate({**raw, "baselines": {**raw["baselines"], "datasets": ["coco_shutterstock"]}})
    got = BY_NAME["extract_features_sup"].resolved(p, {"dataset": "coco_shutterstock"})
    assert got["sup_features"]["backend"] == "vgg16" and got["sup_features"]["options"]["kinds"] == ["pooled", "grid"]


def test_tiny_paired_keeps_todays_features_and_the_demo_a_stand_in(raw) -> None:
    params = P.validate(raw)
    tp = P.for_dataset(params, "tiny_paired")
    # what extract_features resolved to for tiny_paired before the baselines had a stage of their own
    before = {"backend": "random_cnn", "batch_size": 32, "shard_size": 4096, "options": {"kinds": ["pooled", "grid"]}}
    # R2M's own section adds the cached random crops (none under the paper profile)
    assert tp.sup_features.model_dump() == before == tp.extract_features.model_dump(exclude={"crops"})
    assert tp.extract_features.crops == 0
    demo = P.for_dataset(params, "demo")
    # the demo has no paired captions, so its baselines skip: R2M keeps Inception, the unused baselines' features
    # are the random CNN's pooled vector (not a second Inception pass over every photo)
    assert demo.extract_features.backend == "inception_v3_fid" and demo.extract_features.options == {}
    assert demo.sup_features.backend == "random_cnn" and demo.sup_features.options == {"kinds": ["pooled"]}


# --------------------------------------------------------------------------- the DAG
def test_supervised_stages_depend_on_sup_features() -> None:
    stage = BY_NAME["extract_features_sup"]
    assert stage.outs["sup_features"].path == "data/{dataset}/sup_features"
    assert stage.params == ("sup_features",) and stage.sources == SUP and stage.fanout is not None
    for name in SUP_READERS:
        deps = BY_NAME[name].deps
        assert deps["features"] == "data/{dataset}/sup_features", name
        assert "data/{dataset}/features" not in deps.values(), name
    assert BY_NAME["retrieval_r2m"].deps["features"] == "data/{dataset}/features"  # R²M's joint space
    from r2m import params as P

    whole = yaml.safe_load(dag.render(P.load(Path(__file__).resolve().parents[1] / "params.yaml")))
    doc, lists = whole["stages"], whole["vars"][0]["instances"]
    over = lambda name: sorted(lists[doc[name]["foreach"][len("${instances."):-1]])  # noqa: E731
    assert over("extract_features_sup") == ["demo", "tiny_paired"]  # params.yaml's baselines.datasets
    assert over("extract_features") == ["demo"]  # its datasets: no longer needed by the baselines
    # a folder dependency is its key files in dvc.yaml
    assert "data/${item.dataset}/sup_features/features.h5" in doc["train_sup"]["do"]["deps"]
    assert not any(d.startswith("data/${item.dataset}/features/") for d in doc["train_sup"]["do"]["deps"])


# --------------------------------------------------------------------------- missing weights
def _benchmark_baselines(raw: dict, weights: Path) -> dict:
    raw = copy.deepcopy(raw)
    raw["baselines"]["datasets"] = ["coco_shutterstock"]
    opts = raw["catalog"]["coco_shutterstock"]["overrides"]["sup_features"]["options"]
    opts["weights"] = str(weights)
    opts["kinds_from"]["grid"]["options"]["weights"] = str(weights.parent / "vgg19-dcbb9e9a.pth")  # SAT's grid
    return raw


def test_missing_vgg_weights_is_one_line_saying_where_to_put_them(raw, tmp_path) -> None:
    missing = tmp_path / "nowhere" / "vgg16.pth"
    with pytest.raises(P.ParamsError) as err:
        V.validate(_benchmark_baselines(raw, missing))
    msg = str(err.value)
    assert "\n" not in msg and f"sup_features.options.weights: file not found: {missing}" in msg
    assert "vgg16-397923af.pth" in msg and "coco_shutterstock" in msg
    # present: fine; and a benchmark only in `datasets` (no baselines) is not asked for VGG weights
    weights = tmp_path / "vgg16-397923af.pth"
    weights.write_bytes(b"x")
    (tmp_path / "vgg19-dcbb9e9a.pth").write_bytes(b"x")
    assert V.validate(_benchmark_baselines(raw, weights)).baselines.datasets == ["coco_shutterstock"]
    V.check_sup_files(P.validate(raw), "demo")


def test_missing_vgg_weights_stops_a_stage_before_it_runs(raw, tmp_path) -> None:
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump(_benchmark_baselines(raw, tmp_path / "no.pth"), sort_keys=False))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    r = subprocess.run([str(BIN / "r2m"), "extract_features_sup", "--dataset", "coco_shutterstock", "--params",
                        str(f), "--no-log-file"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "sup_features.options.weights: file not found" in lines[0], r.stderr
    assert not (tmp_path / "data").exists()


# --------------------------------------------------------------------------- tiny_paired, byte for byte
def test_tiny_paired_sup_features_are_what_extract_features_wrote(raw, tmp_path) -> None:
    """The new stage on tiny_paired (fewer images, same seed and size) writes the same arrays as the
    R²M stage with tiny_paired's former feature params (what the baselines read before)."""
    from r2m.stage.context import StageContext

    raw = copy.deepcopy(raw)
    raw["catalog"]["tiny_paired"].update(n_train_images=12, n_val_images=3, n_test_images=5, n_sentences=20)
    params = P.for_dataset(P.validate(raw), "tiny_paired")

    def run(stage: str) -> StageContext:
        ctx = StageContext(stage=BY_NAME[stage], params=params, dataset="tiny_paired", root=tmp_path)
        mod, fn = BY_NAME[stage].impl.split(":")
        getattr(importlib.import_module(mod), fn)(ctx)
        return ctx

    run("prepare")
    old = run("extract_features").outs["features"]
    new = run("extract_features_sup").outs["sup_features"]
    assert new == tmp_path / "data/tiny_paired/sup_features"
    with h5py.File(old / "features.h5") as a, h5py.File(new / "features.h5") as b:
        assert sorted(a) == sorted(b) == ["grid", "pooled"]
        for kind in a:
            assert a[kind].dtype == b[kind].dtype and a[kind][()].tobytes() == b[kind][()].tobytes(), kind
    assert pd.read_parquet(old / "index.parquet").equals(pd.read_parquet(new / "index.parquet"))
    assert (old / "meta.json").read_text() == (new / "meta.json").read_text()


def test_a_baseline_stage_on_an_unselected_benchmark_asks_only_for_the_baselines_files(raw, tmp_path) -> None:
    """A supervised stage run for a benchmark listed nowhere is checked for what the baselines read
    (the VGG weights), not for R2M's detector extra and Inception-V4 weights."""
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    r = subprocess.run([str(BIN / "r2m"), "sup_vocab", "--dataset", "coco_shutterstock", "--params", str(f),
                        "--no-log-file"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "sup_features.options.weights: file not found" in lines[0], r.stderr
    assert "inception_v4" not in lines[0] and "tf_oid" not in lines[0], lines[0]

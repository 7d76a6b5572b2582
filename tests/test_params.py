import copy
import re

import pytest
import yaml

from r2m import params as P
from r2m.pipeline import validate as V


@pytest.fixture
def raw(repo_root):
    return yaml.safe_load((repo_root / "params.yaml").read_text())


def test_committed_params_validate(raw):
    p = P.validate(raw)
    assert p.datasets == ["demo"]
    assert p.train_xe.steps == 5000 and p.train_s.steps == 6000
    assert p.train_m.lr == pytest.approx(1e-5)
    assert p.catalog["coco_gcc"].beta == pytest.approx(0.2)


def test_demo_text_schedule_is_the_documented_one(raw, repo_root):
    """The demo's text-stage schedule and model size (its catalog overrides) are the ones docs/guide/running.md
    states and measured (one schedule for R2M and every ablation); the paper's schedule (the top-level sections)
    stays the paper's."""
    guide = (repo_root / "docs" / "guide" / "running.md").read_text()
    found = re.search(r"`train_xe` (\d+) steps at lr ([0-9.e-]+) and `train_s` (\d+) steps at lr ([0-9.e-]+)", guide)
    assert found, "docs/guide/running.md no longer states the demo's text schedule"
    demo = P.for_dataset(P.validate(raw), "demo")
    assert (demo.train_xe.steps, demo.train_s.steps) == (int(found[1]), int(found[3]))
    assert demo.train_xe.lr == pytest.approx(float(found[2])) and demo.train_s.lr == pytest.approx(float(found[4]))
    size = re.search(r"at d = (\d+) \(`model.d`, d_k (\d+)\)", guide)
    batch = re.search(r"`train_s` \d+ steps at lr [0-9.e-]+, batch (\d+)", guide)
    assert size and batch, "docs/guide/running.md no longer states the demo's model size and batch"
    assert (demo.model.d, demo.model.d_k) == (int(size[1]), int(size[2]))
    assert demo.train_xe.batch_size == demo.train_s.batch_size == int(batch[1])
    top = P.validate(raw)
    assert (top.train_xe.steps, top.train_xe.batch_size, top.train_xe.lr) == (5000, 256, pytest.approx(1e-4))
    assert (top.train_s.steps, top.train_s.batch_size, top.train_s.lr) == (6000, 256, pytest.approx(1e-4))


def test_unknown_key_is_named(raw):
    raw["train_xe"]["stepz"] = 3
    with pytest.raises(P.ParamsError, match=r"train_xe\.stepz"):
        P.validate(raw)


def test_wrong_type_is_named(raw):
    raw["caption"]["beam"] = "three"
    with pytest.raises(P.ParamsError, match=r"caption\.beam"):
        P.validate(raw)


def test_out_of_range_is_named(raw):
    raw["concepts"]["score_threshold"] = 1.5
    with pytest.raises(P.ParamsError, match=r"concepts\.score_threshold"):
        P.validate(raw)


def test_dataset_must_be_in_catalog(raw):
    raw["datasets"] = ["nope"]
    with pytest.raises(P.ParamsError, match="nope"):
        P.validate(raw)


def test_unknown_variant(raw):
    raw["variants"] = ["r2m", "bogus"]
    with pytest.raises(P.ParamsError, match="bogus"):
        P.validate(raw)


def test_bad_override_section_and_value(raw):
    bad = copy.deepcopy(raw)
    bad["catalog"]["tiny"]["overrides"]["trian_xe"] = {"steps": 1}
    with pytest.raises(P.ParamsError, match="trian_xe"):
        P.validate(bad)
    bad = copy.deepcopy(raw)
    bad["catalog"]["tiny"]["overrides"]["train_xe"]["steps"] = -1
    with pytest.raises(P.ParamsError, match=r"(?s)catalog\.tiny\.overrides.*train_xe\.steps"):
        P.validate(bad)


def test_overrides_merge_per_dataset(raw):
    p = P.validate(raw)
    tiny = P.for_dataset(p, "tiny")
    assert tiny.train_xe.steps == raw["catalog"]["tiny"]["overrides"]["train_xe"]["steps"]
    assert tiny.train_xe.max_len == p.train_xe.max_len  # untouched keys keep the paper default
    assert P.for_dataset(p, "coco_shutterstock").train_xe.steps == 5000
    with pytest.raises(P.ParamsError, match="unknown dataset"):
        P.for_dataset(p, "missing")


def test_load_reports_missing_and_bad_yaml(tmp_path):
    with pytest.raises(P.ParamsError, match="not found"):
        P.load(tmp_path / "absent.yaml")
    f = tmp_path / "bad.yaml"
    f.write_text("datasets: [demo\n")
    with pytest.raises(P.ParamsError, match="not valid YAML"):
        P.load(f)


def test_backend_extra_missing_is_one_line_before_running(raw, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name in ("tensorflow", "transformers") else real(name, *a, **k))
    for backend, extra in (("tf_oid", "tf"), ("owl", "owl")):
        bad = copy.deepcopy(raw)
        bad["detect_concepts"] = {**bad.get("detect_concepts", {}), "backend": backend, "options": {}}
        with pytest.raises(P.ParamsError) as err:
            V.validate(bad)
        msg = str(err.value)
        assert "\n" not in msg and f"'{extra}'" in msg and f"pip install -e '.[{extra}]'" in msg


def test_tf_oid_local_model_must_exist(raw, tmp_path):
    bad = copy.deepcopy(raw)
    bad["detect_concepts"] = {"backend": "tf_oid", "options": {"model": str(tmp_path / "missing_saved_model")}}
    with pytest.raises(P.ParamsError, match=r"detect_concepts\.options\.model: file not found"):
        V.validate(bad)


def test_schema_alone_never_checks_files_the_pipeline_does(raw, tmp_path):
    bad = copy.deepcopy(raw)
    bad["fidelity"]["vocab_filter"] = str(tmp_path / "missing_words.txt")
    assert P.validate(bad).fidelity.vocab_filter  # the schema: a string is a string
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump(bad))
    with pytest.raises(P.ParamsError) as err:
        V.load(f)
    msg = str(err.value)
    assert msg.startswith(f"invalid parameters in {f} (dataset demo): fidelity.vocab_filter: file not found")
    assert "\n" not in msg

"""A supervised baseline is its model file, its params class and one line in the catalogue
(:data:`r2m.baselines.BASELINES`), plus its ``params.yaml`` section; validating params reads the
catalogue without importing a model file or torch."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from r2m import params as P
from r2m.baselines import BASELINES, Baseline, MRNNParams
from r2m.utils.registry import Catalog

TOY_MODEL = '''"""A throw-away fifth baseline (test only)."""

from __future__ import annotations

from typing import Any

from r2m.models.supervised import SupervisedCaptioner


class Toy(SupervisedCaptioner):
    name = "toy"

    @classmethod
    def from_params(cls, section: dict[str, Any], vocab_size: int, shapes: dict[str, tuple[int, ...]]):
        raise NotImplementedError
'''
TOY_PARAMS = '''class ToyParams(Section):
    """Toy sizes."""

    hidden: int = Field(7, ge=1)
    mode: Literal["a", "b"] = "a"


'''
TOY_LINE = '''    "toy": Baseline("r2m.models.toy:Toy", "Toy captioner (test)", ToyParams),
'''


def test_the_baselines_come_from_the_catalogue():
    assert P.SUP_MODEL_NAMES == ("mrnn", "sat", "sat_hard", "scnn")
    assert P.SUP_MODEL_LABELS["sat"] == "Show, Attend and Tell (soft attention)"
    assert P.SUP_MODEL_LABELS["sat_hard"] == "Show, Attend and Tell (hard attention)"
    for name in P.SUP_MODEL_NAMES:
        assert P.Params.model_fields[name].default_factory().model_dump()  # a section with defaults
    # the hard model's section is the soft one's fields (same order) with its own defaults, plus its own
    hard, soft = P.Params.model_fields["sat_hard"].default_factory(), P.Params.model_fields["sat"].default_factory()
    assert list(hard.model_dump())[:len(soft.model_dump())] == list(soft.model_dump())
    assert (soft.dsr_lambda, soft.selector, hard.dsr_lambda, hard.selector) == (1.0, True, 0.0, False)


def test_validating_params_imports_no_torch(repo_root):
    code = ("import sys; from r2m.pipeline import validate as V; V.load('params.yaml'); "
            "import r2m.stage.registry, r2m.pipeline.dag; "
            "print('torch' in sys.modules, sorted(m for m in sys.modules if m.startswith('r2m.models')))")
    r = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(repo_root / "src")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False []"


def test_sections_are_strict_and_validated(repo_root):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["sat"]["hiden"] = 3
    with pytest.raises(P.ParamsError, match=r"sat\.hiden"):
        P.validate(raw)
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["mrnn"]["dropout"] = 1.5
    with pytest.raises(P.ParamsError, match=r"mrnn\.dropout"):
        P.validate(raw)
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["scnn"]["hidden"] = "512"  # no coercion, as in every section
    with pytest.raises(P.ParamsError, match=r"scnn\.hidden"):
        P.validate(raw)


def test_every_entry_names_what_it_loads():
    from r2m.models.catalog import MODELS, sup_model
    from r2m.models.supervised import SupervisedCaptioner
    from r2m.utils.registry import load_target

    for name, entry in BASELINES.items():
        cls = sup_model(name)
        assert issubclass(cls, SupervisedCaptioner) and cls.name == name and MODELS.load(name) is cls
        if entry.inspector:
            assert callable(load_target(entry.inspector)), name
        if entry.end_to_end:
            assert callable(load_target(entry.end_to_end).end_to_end), name
    assert [n for n, b in BASELINES.items() if "pretrain" in b.phases] == ["scnn"]
    assert [n for n, b in BASELINES.items() if b.inspector is None] == ["mrnn"]


def test_an_entry_that_names_nothing_fails_clearly():
    wrong = Catalog("supervised model", {"toy": Baseline("r2m.baselines:ToyModel", "Toy", MRNNParams)},
                    member=lambda b: b.model)
    with pytest.raises(ImportError, match=r"^r2m\.baselines:ToyModel: module r2m\.baselines has no 'ToyModel'"):
        wrong.load("toy")
    with pytest.raises(KeyError, match="unknown supervised model 'tyo'; known: toy"):
        wrong.load("tyo")
    with pytest.raises(ModuleNotFoundError, match="r2m.nowhere"):
        Catalog("thing", {"x": "r2m.nowhere:X"}).load("x")


def test_a_class_without_its_catalogue_name_is_refused(monkeypatch):
    from r2m.models import catalog as models
    from r2m.models.mrnn import MRNN

    monkeypatch.setattr(MRNN, "name", "")
    with pytest.raises(TypeError, match=r"r2m\.models\.mrnn:MRNN: its class attribute name is ''; set name = 'mrnn'"):
        models.sup_model("mrnn")


def test_a_fifth_baseline_is_a_file_a_line_and_a_section(tmp_path, repo_root):
    """In a copy of the package: drop in models/toy.py, its params class and its line in the catalogue,
    add a `toy:` section, and it is a known model (params, CLI axis, model catalogue) with its params
    section and its report label."""
    src = tmp_path / "src"
    shutil.copytree(repo_root / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (src / "r2m/models/toy.py").write_text(TOY_MODEL)
    baselines = src / "r2m/baselines.py"
    text = baselines.read_text()
    text = text.replace("@dataclass(frozen=True)\nclass Baseline", TOY_PARAMS + "@dataclass(frozen=True)\nclass Baseline")
    text = text.replace("}, member=lambda b: b.model)", TOY_LINE + "}, member=lambda b: b.model)")
    assert "ToyParams)," in text and "class ToyParams(Section)" in text
    baselines.write_text(text)
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["toy"] = {"hidden": 9}
    raw["baselines"]["models"] = ["mrnn", "toy"]
    raw["train_sup"]["per_model"]["toy"] = {"steps": 5}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    code = """
import json
from r2m import params as P
from r2m.pipeline import snake
from r2m.reports.baselines import MODEL_LABELS
p = P.load("params.yaml")
out = {"names": list(P.SUP_MODEL_NAMES), "section": p.toy.model_dump(), "models": p.baselines.models,
       "steps": p.train_sup.for_model("toy").steps, "label": MODEL_LABELS["toy"],
       "wildcard": snake.wildcard_constraints_for(p)["model"]}
from r2m.models.catalog import MODELS, sup_model
out["registered"] = [sup_model("toy").__name__, "toy" in MODELS]
print(json.dumps(out))
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(src)})
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["names"] == ["mrnn", "sat", "sat_hard", "scnn", "toy"]
    assert got["section"] == {"hidden": 9, "mode": "a"}
    assert got["models"] == ["mrnn", "toy"] and got["steps"] == 5
    assert got["label"] == "Toy captioner (test)"
    assert "toy" in got["wildcard"].split("|")
    assert got["registered"] == ["Toy", True]

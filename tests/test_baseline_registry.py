"""A supervised baseline is one model file plus its params section: name, params section and
report label all come from its ``@SUP_MODELS.register(...)`` line (read without importing torch)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from r2m import params as P
from r2m.utils.declared import DeclarationError, sup_model_specs

FOURTH = '''"""A throw-away fourth baseline (test only)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from r2m.models.registry import SUP_MODELS
from r2m.models.supervised import SupervisedCaptioner


class ToyParams(BaseModel):
    """Toy sizes."""

    hidden: int = Field(7, ge=1)
    mode: Literal["a", "b"] = "a"


@SUP_MODELS.register("toy", label="Toy captioner (test)", params=ToyParams)
class Toy(SupervisedCaptioner):
    @classmethod
    def from_params(cls, section: dict[str, Any], vocab_size: int, shapes: dict[str, tuple[int, ...]]):
        raise NotImplementedError
'''


def test_the_baselines_come_from_their_model_files():
    assert P.SUP_MODEL_NAMES == ("mrnn", "sat", "sat_hard", "scnn")
    assert P.SUP_MODEL_LABELS["sat"] == "Show, Attend and Tell (soft attention)"
    assert P.SUP_MODEL_LABELS["sat_hard"] == "Show, Attend and Tell (hard attention)"
    for name in P.SUP_MODEL_NAMES:
        assert P.Params.model_fields[name].default_factory().model_dump()  # a section with defaults


def test_validating_params_imports_no_torch(repo_root):
    code = ("import sys; from r2m.pipeline import validate as V; V.load('params.yaml'); "
            "import r2m.pipeline.stages, r2m.pipeline.dag; print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(repo_root / "src")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_sections_are_strict_and_validated(repo_root):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["sat"]["hiden"] = 3
    with pytest.raises(P.ParamsError, match=r"sat\.hiden"):
        P.validate(raw)
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["mrnn"]["dropout"] = 1.5
    with pytest.raises(P.ParamsError, match=r"mrnn\.dropout"):
        P.validate(raw)


def test_scan_reads_a_new_model_file(tmp_path, repo_root):
    models = tmp_path / "models"
    shutil.copytree(repo_root / "src/r2m/models", models, ignore=shutil.ignore_patterns("__pycache__"))
    (models / "toy.py").write_text(FOURTH.replace("from typing import Any\n", "from typing import Any, Literal\n"))
    specs = {s.name: s for s in sup_model_specs((models,))}
    assert sorted(specs) == ["mrnn", "sat", "sat_hard", "scnn", "toy"]
    toy = specs["toy"]
    assert toy.label == "Toy captioner (test)"
    assert toy.params().model_dump() == {"hidden": 7, "mode": "a"}
    with pytest.raises(ValueError, match="extra"):
        toy.params(hidden=3, bogus=1)


def test_scan_names_a_bad_registration(tmp_path):
    (tmp_path / "bad.py").write_text(FOURTH.replace(', label="Toy captioner (test)"', ""))
    with pytest.raises(DeclarationError, match=r"bad\.py:\d+: write @SUP_MODELS\.register"):
        sup_model_specs((tmp_path,))
    (tmp_path / "bad.py").write_text(FOURTH.replace("hidden: int = Field(7, ge=1)", "hidden: int = torch.zeros(1)"))
    with pytest.raises(DeclarationError, match="ToyParams may use only"):
        sup_model_specs((tmp_path,))


def test_a_fourth_baseline_is_one_file_plus_its_section(tmp_path, repo_root):
    """In a copy of the package: drop in models/toy.py, add a `toy:` section, and it is a known model
    (params, CLI axis, model registry) with its params section and its report label."""
    src = tmp_path / "src"
    shutil.copytree(repo_root / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (src / "r2m/models/toy.py").write_text(FOURTH.replace("from typing import Any\n", "from typing import Any, Literal\n"))
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
from r2m.models import MODELS, SUP_MODELS
out["registered"] = [SUP_MODELS.get("toy").label, "toy" in MODELS]
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
    assert got["registered"] == ["Toy captioner (test)", True]

"""A stage instance's code dependencies (r2m.pipeline.codedeps) hold every module it loads — checked
against what really runs, not against the import graph the declaration is computed from — and a code
edit re-runs, under Snakemake and DVC alike, exactly the instances that load the edited file.

* **Loaded ⊆ declared.** The suite's shared tiny-DAG run (conftest ``tiny_dag``) records, per job, the
  ``r2m`` modules in ``sys.modules`` when the stage is done (``R2M_AUDIT_MODULES``); a second, small
  Snakemake run in a copy of it adds what it lacks (the demo's ``inputs``/``prepare``, the ``official``
  fidelity profile's text, training and caption stages). Every recorded module must
  be declared; what is declared and never loaded is printed (over-wide edges stay visible).
* **Edits.** On a stub workspace (test_granular's: outputs made by a stub ``r2m``, nothing computed), a
  comment appended to one file makes ``snakemake -n`` plan, and ``dvc status`` report, the instances
  listed here by hand from what each stage loads (plus, for Snakemake, their descendants).
* **Narrowed edges.** Where an entry module was split so that a stage cannot load what it never runs (the text
  training stages and checkpoint selection, the ``caption`` stage and ``r2m caption IMAGES``' detectors, a
  baseline and another baseline's model, inspector, end-to-end CNN or pretraining, the tables and the
  scorers), its code files are checked by hand, and the audited runs show each side loads what it declares.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import BIN, audit_dir, copy_sources, tiny_dag_env
from r2m import params as P
from r2m.pipeline import validate as V
from r2m.pipeline.codedeps import NOT_CODE, _tree_digest, code_modules
from r2m.pipeline.resolved import dag_instances
from r2m.utils.imports import closure, closure_modules

ROOT = Path(__file__).resolve().parents[1]
# modules every stage loads that are not its code: the registry and the params schema, and what they import
DEFINITION = closure_modules(NOT_CODE)


# --------------------------------------------------------------------------- loaded ⊆ declared
def recorded(folder: Path) -> dict[tuple[str, str], set[str]]:
    """(stage, instance key) -> the modules its run recorded."""
    return {(f.parent.name, f.stem): set(f.read_text().split()) for f in sorted(folder.glob("*/*.txt"))}


def undeclared(runs: dict[tuple[str, str], set[str]], params: P.Params) -> tuple[list[str], dict[str, set[str]]]:
    """One line per instance that loaded a module it does not declare; and declared − loaded per instance."""
    from r2m.pipeline.stages import BY_NAME

    errors, wide = [], {}
    for key, loaded in sorted(runs.items()):
        stage = BY_NAME[key[0]]
        values = key[1].rsplit("-", len(stage.axes) - 1) if stage.axes else []
        declared = code_modules(stage, dict(zip(stage.axes, values, strict=True)), params)
        extra = loaded - declared - DEFINITION
        if extra:
            errors.append(f"{key[0]}@{key[1]}: loaded but not declared: {sorted(extra)}")
        wide[f"{key[0]}@{key[1]}"] = declared - loaded
    return errors, wide


def test_the_check_catches_an_undeclared_module():
    """A hand-made record: ``prepare`` of ``demo`` loading the ``folder`` recipe (no demo instance declares it)."""
    params = V.validate(yaml.safe_load((ROOT / "params.yaml").read_text()), "test")
    ok = {"r2m", "r2m.cli", "r2m.datasets", "r2m.datasets.demo", "r2m.pipeline.stages"}
    assert undeclared({("prepare", "demo"): ok}, params)[0] == []
    errors, _ = undeclared({("prepare", "demo"): ok | {"r2m.datasets.folder"}}, params)
    assert errors == ["prepare@demo: loaded but not declared: ['r2m.datasets.folder']"]


def extra_raw(wd: Path) -> dict[str, Any]:
    """The tiny run's params with the ``official`` profile for ``tiny`` (``demo`` is in the catalog)."""
    raw = yaml.safe_load((wd / "params.yaml").read_text())
    raw["catalog"]["tiny"]["fidelity"] = "official"
    return raw


def extra_targets() -> list[str]:
    """The ``official`` profile's text stages, training and captions (one variant and checkpoint: train_i,
    which needs the other three), and the demo's prepared folder (its ``inputs`` and ``prepare``)."""
    from r2m.pipeline.stages import BY_NAME

    bound = {"dataset": "tiny", "variant": "r2m", "ckpt": "train_i", "seed": "0"}
    out = [o.path.format(**bound) for o in BY_NAME["caption"].outs.values()]
    return out + [o.path.format(dataset="demo") for o in BY_NAME["prepare"].outs.values()]


@pytest.fixture(scope="module")
def extra_run(tiny_dag, tmp_path_factory) -> tuple[Path, P.Params]:
    """A copy of the finished tiny DAG running the :func:`extra_targets` (their other jobs are up to date)."""
    wd = tmp_path_factory.mktemp("codedeps") / "work"
    shutil.copytree(tiny_dag, wd, symlinks=True)
    copy_sources(ROOT, wd, ("data/demo",))
    raw = extra_raw(wd)
    (wd / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    params = V.validate(raw, "test")
    env = {**tiny_dag_env(), "R2M_AUDIT_MODULES": str(audit_dir(wd))}
    r = subprocess.run(["nice", "-n", "5", str(BIN / "snakemake"), "--cores", "2", *extra_targets()],
                       cwd=wd, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return wd, params


def test_every_module_a_stage_loads_is_declared(tiny_dag, extra_run):
    tiny_params = V.validate(yaml.safe_load((tiny_dag / "params.yaml").read_text()), "test")
    base = recorded(audit_dir(tiny_dag))
    wd, params = extra_run
    extra = recorded(audit_dir(wd))
    assert {s for s, _ in base} >= {"prepare", "train_xe", "train_sup", "report"}, sorted(base)
    assert ("train_sup", "tiny-sat_hard-0") in base  # every baseline (params.yaml's), sat_hard included
    assert {("prepare", "demo"), ("train_i", "tiny-r2m-0"), ("corpus_concepts", "tiny")} <= set(extra)
    errors, wides = [], []
    for runs, p in ((base, tiny_params), (extra, params)):
        e, wide = undeclared(runs, p)
        errors += e
        wides.append(wide)
        for inst, mods in sorted(wide.items()):  # over-wide edges: visible in the log (pytest -s)
            if mods:
                print(f"declared, not loaded: {inst}: {sorted(m.removeprefix('r2m.') for m in mods)}")
    assert not errors, "\n".join(errors)
    # the edges narrowed by structure: what the runs loaded shows why each side is declared as it is
    for (stage, key), mod, loads in NARROWED:
        assert (mod in base[(stage, key)]) is loads, (stage, key, mod)
        assert mod not in wides[0][f"{stage}@{key}"], (stage, key, mod)  # declared only where it is loaded


# (stage, instance of the tiny DAG), a module, whether the instance loads it: the image stages select their
# checkpoint (training.selection), the text stages never; caption builds no detector; models.scnn is loaded
# by S-CNN-RNN's stages only; inspect_sup loads its model's inspector (m-RNN has none: no model is opened)
NARROWED = (
    (("train_m", "tiny-r2m-0"), "r2m.training.selection", True),
    (("train_xe", "tiny-r2m-0"), "r2m.training.selection", False),
    (("train_s", "tiny-r2m-0"), "r2m.training.selection", False),
    (("caption", "tiny-r2m-train_i-0"), "r2m.vision.detectors", False),
    (("detect_concepts", "tiny"), "r2m.vision.detectors", True),
    (("train_sup", "tiny-scnn-0"), "r2m.models.scnn", True),
    (("train_sup", "tiny-mrnn-0"), "r2m.models.scnn", False),
    (("inspect_sup", "tiny-sat-0"), "r2m.models.scnn", False),
    (("inspect_sup", "tiny-sat-0"), "r2m.supervised.inspect_sat", True),
    (("inspect_sup", "tiny-mrnn-0"), "r2m.decoding.captioner", False),
    (("train_sup", "tiny-scnn-0"), "r2m.supervised.finetune", True),
    (("train_sup", "tiny-sat-0"), "r2m.supervised.finetune", False),
    (("pretrain_sup", "tiny-scnn-0"), "r2m.training.loop", True),
    (("pretrain_sup", "tiny-mrnn-0"), "r2m.training.loop", False),
    (("caption_sup", "tiny-sat-0"), "r2m.vision.feature_store", False),
    (("table1", "all"), "r2m.evaluation.coco", False),
    (("evaluate", "tiny-r2m-train_i-0"), "r2m.evaluation.coco", True),
)


# --------------------------------------------------------------------------- edits under both engines
def edit_raw() -> dict[str, Any]:
    """`tiny` for R2M (one variant), `demo` for two baselines, `sat_hard` among them (few instances: fast)."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw.update(datasets=["tiny"], variants=["r2m"])
    raw["baselines"].update(datasets=["demo"], models=["mrnn", "sat_hard"])
    return raw


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    from test_granular import Workspace, built

    return built(Workspace(tmp_path_factory.mktemp("codeedit"), edit_raw()))


# (pretrain_sup too for a baseline with a pretraining phase: S-CNN-RNN, not among the baselines here)
SUP_LOADING_THE_MODEL = ("train_sup", "caption_sup", "inspect_sup", "retrieval_sup")
# R2M's stages over a dataset (its side: the runner checks the dataset with its recipe's own check)
R2M_SIDE = ("inputs", "prepare", "references", "detect_concepts", "extract_features", "corpus_concepts",
            "build_vocab", "train_xe", "train_s", "train_m", "train_i", "caption", "evaluate", "figures",
            "retrieval_r2m")


def _tiny_r2m_side(keys: set[tuple[str, str]]) -> set[tuple[str, str]]:
    return {(s, k) for s, k in keys if s in R2M_SIDE and k.split("-")[0] == "tiny"}


# the stages that save a checkpoint (training) or load one (captions, inspection, retrieval: a model's)
CHECKPOINT_STAGES = ("train_xe", "train_s", "train_m", "train_i", "caption", "retrieval_r2m", "pretrain_sup",
                     "train_sup", "caption_sup", "inspect_sup", "retrieval_sup")
# the baselines' stages, which each write a "skipped" result for a dataset without paired captions
SKIPPING_STAGES = ("sup_vocab", "pretrain_sup", "train_sup", "caption_sup", "evaluate_sup", "inspect_sup", "mostfreq",
                   "retrieval_sup")
# file -> the instances (stage, key) that load it, by hand: (instances of the params) -> set
EDITS = {
    # sat_hard's file: its own baseline's stages that build or load the model (evaluate_sup reads captions)
    "src/r2m/models/sat_hard.py": lambda keys: {(s, "demo-sat_hard-0") for s in SUP_LOADING_THE_MODEL},
    # sat.py: sat_hard subclasses it (and no other baseline here loads it); m-RNN's stages do not
    "src/r2m/models/sat.py": lambda keys: {(s, "demo-sat_hard-0") for s in SUP_LOADING_THE_MODEL},
    # the demo recipe: the demo's own inputs, prepare and references, nothing of tiny
    "src/r2m/datasets/demo.py": lambda keys: {("inputs", "demo"), ("prepare", "demo"), ("references", "demo")},
    # the tiny recipe has a check the runner runs for R2M's stages over tiny; prepare/references/inputs use it
    "src/r2m/datasets/tiny.py": _tiny_r2m_side,
    # the recipes' loader: the stages that build or digest a recipe (inputs, prepare, references) and those over
    # tiny, whose kind has a check the runner runs; no baseline stage (the runner checks their features only)
    "src/r2m/datasets/recipes.py": lambda keys: _tiny_r2m_side(keys) | {(s, "demo") for s in ("inputs", "prepare",
                                                                                               "references")},
    # a detector backend no dataset here chooses (tiny: precomputed, demo: offline): nothing
    "src/r2m/vision/detectors/owl.py": lambda keys: set(),
    # the backend tiny chooses: the stage that builds its detector; caption reads the detections, builds none
    "src/r2m/vision/detectors/precomputed.py": lambda keys: {("detect_concepts", "tiny")},
    # checkpoint selection: the image stages of R2M only (the text stages never select; the baselines: supervised.select)
    "src/r2m/training/selection.py": lambda keys: {(s, "tiny-r2m-0") for s in ("train_m", "train_i")},
    # S-CNN-RNN (not among the baselines here): nothing; its metric, topk_multilabel, is evaluation's
    "src/r2m/models/scnn.py": lambda keys: set(),
    # SAT's attention figures: the inspection of the SAT baseline here (sat_hard), not m-RNN's
    "src/r2m/supervised/attention_maps.py": lambda keys: {("inspect_sup", "demo-sat_hard-0")},
    # the baselines' skip rule (no paired captions): their stages (retrieval_r2m, R2M's side, has its own entry)
    "src/r2m/supervised/skip.py": lambda keys: {(s, k) for s, k in keys if s in SKIPPING_STAGES},
    # checkpoints (save_torch, load_checkpoint): the stages that train a model or load one, nothing else (m-RNN's
    # inspect_sup opens no model: it has nothing to inspect; neither baseline here has a pretraining phase)
    "src/r2m/utils/checkpoint.py": lambda keys: {(s, k) for s, k in keys if s in CHECKPOINT_STAGES
                                                 and (s, k) != ("inspect_sup", "demo-mrnn-0") and s != "pretrain_sup"},
    # the stage runner: everything
    "src/r2m/cli.py": lambda keys: set(keys),
}


@pytest.mark.parametrize("rel", list(EDITS))
def test_a_code_edit_reruns_exactly_the_instances_that_load_it(ws, rel):
    from test_granular import with_descendants

    params = V.validate(ws.raw, "test")
    keys = {(s.name, s.key(b)) for s, b in dag_instances(params)}
    loaders = EDITS[rel](keys)
    assert loaders <= keys
    original = (ws.sm / rel).read_text()
    (ws.sm / rel).write_text(original + "\n# an edit\n")
    _tree_digest.cache_clear()  # per process: this one digested the sources before the edit
    ws.write(ws.raw)  # what DVC's resolve_params does next: the .params files, code digests included
    try:
        assert ws.snakemake_plan() == with_descendants(params, loaders) & ws.planned
        assert ws.dvc_stale() == loaders
    finally:
        (ws.sm / rel).write_text(original)
        _tree_digest.cache_clear()
        ws.write(ws.raw)
    if rel == "src/r2m/cli.py":  # (the last one) undone: nothing to run
        assert ws.snakemake_plan() == set() and ws.dvc_stale() == set()


def test_the_declared_tables_name_the_modules_that_register_each_member():
    """RECIPE_MODULES / BACKEND_MODULES / FEATURE_MODULES against the source: each module registers the names it is
    given for; INSPECTOR_MODULES / END_TO_END_MODULES: each module defines what is asked of it."""
    from r2m.datasets.recipes import RECIPE_MODULES
    from r2m.utils.registry import declared_names
    from r2m.vision.detectors import BACKEND_MODULES
    from r2m.vision.extractors import FEATURE_MODULES

    def file_of(mod: str) -> Path:
        return ROOT / "src" / (mod.replace(".", "/") + ".py")

    kinds = P.registered_names(P.RECIPE_SOURCES, "RECIPES", ("Benchmark",))
    assert sorted(RECIPE_MODULES) == sorted(kinds)
    for kind, mod in RECIPE_MODULES.items():
        assert kind in declared_names([file_of(mod)], "RECIPES", ("Benchmark",)), (kind, mod)
    backends = declared_names([ROOT / "src/r2m/vision/detectors"], "DETECTORS")
    assert sorted(BACKEND_MODULES) == backends
    for name, mod in BACKEND_MODULES.items():
        assert declared_names([file_of(mod)], "DETECTORS") == [name]
    assert sorted(FEATURE_MODULES) == declared_names([ROOT / "src/r2m/vision/extractors"], "FEATURES")
    for name, mod in FEATURE_MODULES.items():
        assert declared_names([file_of(mod)], "FEATURES") == [name]
    # the inspectors: one per baseline that has something to show beyond its captions, each defining `inspect`
    from r2m.supervised.inspect import INSPECTOR_MODULES
    from r2m.supervised.train import END_TO_END_MODULES

    def functions(mod: str) -> set[str]:
        return {f.name for f in ast.parse(file_of(mod).read_text()).body if isinstance(f, ast.FunctionDef)}

    assert sorted(INSPECTOR_MODULES) == ["sat", "sat_hard", "scnn"]
    for name, mod in INSPECTOR_MODULES.items():
        assert "inspect" in functions(mod), (name, mod)
    # the CNN trained end to end: S-CNN-RNN (seed 002), the one baseline whose params have a `cnn` switch
    assert sorted(END_TO_END_MODULES) == ["scnn"]
    assert [m for m in P.SUP_MODEL_NAMES if "cnn" in P.Params.model_fields[m].annotation.model_fields] == ["scnn"]
    for name, mod in END_TO_END_MODULES.items():
        assert {"end_to_end", "end_to_end_class"} <= functions(mod), (name, mod)
    # pretraining: the baselines whose model has a "pretrain" phase (S-CNN-RNN's parallel pretraining)
    from r2m.models import sup_model
    from r2m.supervised.pretrain import PRETRAINING_MODULES

    assert sorted(PRETRAINING_MODULES) == [m for m in P.SUP_MODEL_NAMES if "pretrain" in sup_model(m).phases]
    for name, mod in PRETRAINING_MODULES.items():
        assert "train_phase" in functions(mod), (name, mod)



# --------------------------------------------------------------------------- the edges narrowed by structure
SELECTION = ("src/r2m/training/selection.py", "src/r2m/decoding/captioner.py", "src/r2m/decoding/beam.py",
             "src/r2m/evaluation/val_score.py", "src/r2m/evaluation/cider.py")
PHOTOS = ("src/r2m/caption_cli.py", "src/r2m/decoding/photos.py", "src/r2m/reports/gallery.py",
          "src/r2m/vision/detectors/__init__.py", "src/r2m/vision/extractors/__init__.py")


def _files(stage: str, params: P.Params, **bound: str) -> list[str]:
    from r2m.pipeline.codedeps import code_files
    from r2m.pipeline.stages import BY_NAME

    return code_files(BY_NAME[stage], bound, params)


def test_the_narrowed_edges_hold_what_each_stage_can_load_and_no_more():
    """By hand, from what each stage runs: only the image stages select a checkpoint by val CIDEr (captioning
    the val images, scoring them), the text stages never (``select_by: cider`` is refused there); the DAG's
    ``caption`` reads detections from its ``concepts`` folder and builds no detector (new photos, which do, are
    ``r2m caption IMAGES``); S-CNN-RNN's file is loaded by the stages of S-CNN-RNN only (its multi-label metric,
    which ``inspect_sup`` computes for it alone, is evaluation's)."""
    params = V.validate(yaml.safe_load((ROOT / "params.yaml").read_text()), "test")
    for stage in ("train_xe", "train_s"):
        files = _files(stage, params, dataset="demo", variant="r2m", seed="0")
        assert "src/r2m/training/stages.py" in files and not set(SELECTION) & set(files), stage
    for stage in ("train_m", "train_i"):
        files = _files(stage, params, dataset="demo", variant="r2m", seed="0")
        assert set(SELECTION) <= set(files), stage
    caption = _files("caption", params, dataset="demo", variant="r2m", ckpt="train_i", seed="0")
    assert "src/r2m/decoding/stage.py" in caption and "src/r2m/decoding/captioner.py" in caption
    # the features folder: read by the caption stage alone (caption.no_concepts: image), not by what reuses
    # the captioning library (checkpoint selection, the baselines' captions)
    store = "src/r2m/vision/feature_store.py"
    assert store in caption
    assert store not in _files("train_m", params, dataset="demo", variant="r2m", seed="0")
    assert store not in _files("caption_sup", params, dataset="demo", model="sat", seed="0")
    assert not [f for f in caption if f.startswith("src/r2m/vision/detectors/") or f in PHOTOS], caption
    # the photos' command: its own entry, which the runner does not import (r2m.cli names it as a string)
    photo = {str(p.relative_to(ROOT)) for p in closure(["r2m.caption_cli"])}
    assert set(PHOTOS) <= photo
    runner = {str(p.relative_to(ROOT)) for p in closure(["r2m.cli"])}
    assert not runner & set(PHOTOS)
    # the runner loads the recipes by name, only where it checks a kind: a table's code holds no recipe
    assert not [f for f in runner if f.startswith("src/r2m/datasets/")], sorted(runner)
    # the tables read the scores' per-image statistics (bootstrap): they run no scorer
    scorers = {"src/r2m/evaluation/coco.py", "src/r2m/evaluation/cider.py", "src/r2m/evaluation/meteor.py"}
    for stage in ("table1", "table2", "table3", "baselines", "report"):
        table = set(_files(stage, params))
        assert not [f for f in table if f.startswith("src/r2m/datasets/")] and not table & scorers, (stage, table)
        assert "src/r2m/evaluation/stats.py" in table or stage == "report", stage
    assert scorers <= set(_files("evaluate", params, dataset="demo", variant="r2m", ckpt="train_i", seed="0"))
    assert not set(_files("figures", params, dataset="demo")) & scorers  # it reads results and references only
    # inspect_sup: m-RNN has nothing to inspect (no model opened), SAT its attention, S-CNN-RNN its concept head
    mrnn = _files("inspect_sup", params, dataset="demo", model="mrnn", seed="0")
    assert not [f for f in mrnn if f.startswith(("src/r2m/decoding/", "src/r2m/models/", "src/r2m/supervised/inspect_"))]
    sat = _files("inspect_sup", params, dataset="demo", model="sat", seed="0")
    assert {"src/r2m/supervised/inspect_sat.py", "src/r2m/supervised/attention_maps.py", "src/r2m/models/sat.py"} <= set(sat)
    assert "src/r2m/supervised/inspect_scnn.py" not in sat
    for model, holds in (("mrnn", False), ("sat", False), ("sat_hard", False), ("scnn", True)):
        for stage in ("pretrain_sup", "train_sup", "inspect_sup"):
            files = _files(stage, params, dataset="demo", model=model, seed="0")
            assert ("src/r2m/models/scnn.py" in files) is holds, (stage, model)
            sat = model in ("sat", "sat_hard") and stage != "pretrain_sup"  # SAT has no pretraining phase
            assert ("src/r2m/models/sat.py" in files) is sat, (stage, model)
        # pretrain_sup: S-CNN-RNN alone has a pretraining phase; the others' write their skip marker only
        pre = set(_files("pretrain_sup", params, dataset="demo", model=model, seed="0"))
        loop = {"src/r2m/supervised/train.py", "src/r2m/training/loop.py"}
        assert (loop <= pre if holds else not loop & pre), model
        for stage in ("pretrain_sup", "train_sup"):  # S-CNN-RNN alone trains its CNN (a feature backend) end to end
            files = set(_files(stage, params, dataset="demo", model=model, seed="0"))
            e2e = {"src/r2m/supervised/finetune.py", "src/r2m/vision/extractors/__init__.py"}
            assert (e2e <= files if holds else not e2e & files), (stage, model)

"""One definition of a stage instance: its name (``Stage.key``), its input paths (``Stage.inputs``) and the
params sections it reads as its dataset sees them (``Stage.resolved``) — what ``StageContext`` saves beside the
outputs and what a training stage's resume fingerprint holds are the same mapping."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from r2m import params as P
from r2m.pipeline.resolved import needed_by_other_datasets
from r2m.stage import registry as S
from r2m.stage.context import StageContext
from r2m.stage.record import stamp_path
from r2m.stage.spec import Gather, Out, Stage
from r2m.utils.resume import resume_dir

ROOT = Path(__file__).resolve().parents[1]


def _raw() -> dict[str, Any]:
    """The repository's params on `tiny` for R²M (two variants, seeds 0 and 1) and `demo` for one baseline."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw.update(datasets=["tiny"], variants=["r2m", "no_fm"], seeds=[0, 1])
    raw["baselines"].update(datasets=["tiny", "demo"], models=["mrnn", "sat"])
    raw["catalog"]["demo"].pop("seeds", None)
    return raw


def _context(params: P.Params, stage: Stage, bound: dict[str, str], root: Path = Path(".")) -> StageContext:
    """A stage's context as ``r2m <stage>`` builds it: the params already seen by the dataset."""
    view = P.for_dataset(params, bound["dataset"]) if "dataset" in bound else params
    return StageContext(stage=stage, params=view, root=root, **bound)


# one instance of each kind of stage: a data stage, training (seed 1: shifted seeds), a baseline (per_model),
# a stage gathering every run, the report (every catalog entry as each dataset sees it)
SAMPLES = (("build_vocab", {"dataset": "tiny"}), ("train_s", {"dataset": "tiny", "variant": "no_fm", "seed": "1"}),
           ("train_sup", {"dataset": "demo", "model": "sat", "seed": "0"}), ("table1", {}), ("report", {}))


def test_the_saved_params_are_the_instances_resolved_sections(tmp_path):
    """``StageContext.resolved()`` (a stage run's view of the params) and the file ``save_params`` writes hold
    exactly ``Stage.resolved`` of the instance: the dataset's overrides merged, ``per_model`` applied, the seed
    shifted."""
    params = P.validate(_raw())
    for name, bound in SAMPLES:
        stage = S.get(name)
        want = json.loads(json.dumps(stage.resolved(params, bound)))
        ctx = _context(params, stage, bound, tmp_path)
        assert ctx.resolved() == want, name
        assert yaml.safe_load(ctx.save_params(tmp_path / name).read_text()) == want, name
    sat = S.get("train_sup").resolved(params, SAMPLES[2][1])["train_sup"]
    assert sat["select_by"] == "bleu4" and not sat["per_model"]  # params.yaml: per_model: {sat: {select_by: bleu4}}
    vocab = S.get("build_vocab").resolved(params, SAMPLES[0][1])
    assert vocab["build_vocab"]["min_count"] == 1  # tiny's override (params.yaml), not the top-level value
    train_s = S.get("train_s").resolved(params, SAMPLES[1][1])
    assert train_s["train_s"]["seed"] == params.train_s.seed + 1 and train_s["catalog"] == {"beta": 1.0}


def test_the_resume_fingerprint_follows_what_the_stage_reads(tmp_path):
    """A training stage resumes unless what it reads changed: another dataset section's override leaves its
    fingerprint alone (before: the whole entry, overrides included, was in it), its own section's changes it."""
    from r2m.training.loop import fingerprint

    raw = _raw()
    bound = {"dataset": "tiny", "variant": "r2m", "seed": "0"}

    def fp(edit: dict[str, Any]) -> str:
        r = yaml.safe_load(yaml.safe_dump(raw))
        r["catalog"]["tiny"]["overrides"].update(edit)
        return fingerprint(_context(P.validate(r), S.get("train_xe"), bound, tmp_path))

    base = fp({})
    assert fp({"sup_vocab": {"min_count": 3}}) == base  # train_xe reads no sup_vocab
    assert fp({"train_xe": {"steps": 61}}) != base  # tiny's own train_xe.steps is 60


def test_an_instance_has_one_name_everywhere():
    """Logs, the stamps (``.stamps/``), DVC's matrix items and resume folders spell an instance alike."""
    caption, report = S.get("caption"), S.get("report")
    bound = {"dataset": "demo", "variant": "r2m", "ckpt": "train_s", "seed": "2"}
    assert caption.key(bound) == "demo-r2m-train_s-2" and report.key({}) == "all"
    assert caption.log == "logs/caption/{dataset}-{variant}-{ckpt}-{seed}.log" and report.log == "logs/report/all.log"
    assert stamp_path(Path("."), caption, bound).as_posix() == ".stamps/caption/demo-r2m-train_s-2.json"
    assert stamp_path(Path("."), caption).as_posix() == ".stamps/caption/{dataset}-{variant}-{ckpt}-{seed}.json"
    assert resume_dir("w", "caption", bound) == Path("w/.r2m/resume/caption/demo-r2m-train_s-2")


def test_an_instances_inputs_expand_each_runs_seeds():
    """``table1`` at R²M on tiny with seeds 0 and 1 and demo's three: every eval and per-image file, by hand."""
    raw = _raw()
    raw.update(datasets=["tiny", "demo"])
    raw["catalog"]["demo"]["seeds"] = {"r2m": [0, 1, 2]}
    got = S.get("table1").inputs(P.validate(raw), {})
    want = [f"results/{d}/r2m/s{s}/train_i/{f}" for f in ("eval.json", "per_image.parquet")
            for d, seeds in (("tiny", (0, 1)), ("demo", (0, 1, 2))) for s in seeds]
    assert got == want


def test_needed_by_other_datasets_takes_its_argument():
    """Before: ``needed_by_other_datasets(stages)`` raised TypeError (a cache over unhashable stages)."""
    assert needed_by_other_datasets(S.STAGES) == needed_by_other_datasets()
    assert needed_by_other_datasets() >= {"inputs", "prepare"}  # the baselines' datasets need them
    make = Stage("make", "m:f", "", ("dataset",), outs={"x": Out("x/{dataset}")})
    side = Stage("side", "m:f", "", ("dataset",), outs={"y": Out("y/{dataset}")})
    use = Stage("use", "m:f", "", ("dataset",), deps={"x": "x/{dataset}", "all": Gather("y/{dataset}", ("dataset",))},
                sources=(("dataset", "baselines.datasets"),))
    assert needed_by_other_datasets((make, side, use)) == {"make"}  # a Gather is read over its own list


def test_one_views_object_per_run_sees_each_instance_as_its_run_does():
    """``r2m.params.Views``: a run's dataset/seed views, each made once and shared by every instance looked at
    (the planner's, :class:`r2m.stage.record.Planner`). Each instance's view is the params its stage's context
    holds (what the runner records reads from), sharing changes no instance's resolved params, and a view is
    keyed by dataset and seed both (a cache keyed by one would hand seed 1 the seed-0 view)."""
    from r2m.pipeline.resolved import dag_instances

    params = P.validate(_raw())
    views = P.Views(params)
    instances = dag_instances(params)
    assert len(instances) > 20
    for stage, bound in instances:
        assert stage.resolved(views, bound) == stage.resolved(params, bound), (stage.name, bound)
        assert views.view(bound.get("dataset"), bound.get("seed")) == _context(params, stage, bound).params, \
            (stage.name, bound)
    # tiny's overrides (params.yaml: train_xe steps 60, model d 64), the run's seed added to each seeded section
    tiny, tiny1 = views.view("tiny"), views.view("tiny", "1")
    assert (tiny.train_xe.steps, tiny.model.d, tiny1.train_xe.steps) == (60, 64, 60)
    assert (tiny1.train_xe.seed, tiny1.caption.seed) == (params.train_xe.seed + 1, params.caption.seed + 1)
    assert views.view("tiny", 1) is tiny1 and views.view("tiny") is tiny  # made once
    assert views.dumped("tiny", 1)["train_xe"]["seed"] == params.train_xe.seed + 1
    assert views.view() is params and views.view(None, 0) is params  # seed 0: the params themselves
    with pytest.raises(P.ParamsError, match="unknown dataset 'elsewhere'"):
        views.view("elsewhere")

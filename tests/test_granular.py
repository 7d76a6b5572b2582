"""Change one setting, recompute only what depends on it — under Snakemake and DVC alike.

* Generated from the registry: every params key some stage reads (top-level section keys, a run
  dataset's override of each — which must change something —, the baselines' ``per_model`` keys, the
  catalog entry's own items, the fidelity items): changing it changes the resolved params of exactly the
  stage instances that declare it and see the new value (and nothing else) — the values both engines
  depend on (:meth:`r2m.stage.spec.Stage.resolved`);
* on ONE small workspace run with a stub ``r2m`` (outputs created, nothing computed; built once for the
  module): an edit of each kind (overrides, a top-level key, ``per_model``, a catalog item, a fidelity
  item and profile, a detector's backend and options, the scorers, data files outside the DAG) makes
  ``snakemake -n`` plan, and ``dvc status`` report, exactly the instances written down by hand from what
  each stage reads — not computed by the code under test; edits that mean nothing stale nothing; a code
  edit re-runs the stages whose entry imports the file. Each edit costs one ``snakemake -n`` beside one
  ``dvc status`` and is undone by writing back what it touched; the last test checks nothing is left stale.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import copy_sources, copy_workflow
from r2m import params as P
from r2m.pipeline import validate as V
from r2m.pipeline.resolved import all_instance_params, dag_instances
from r2m.stage.registry import STAGES
from r2m.stage.spec import NOT_RECIPE
from stub_r2m import make_outputs, outputs_map

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STUB = ROOT / "tests" / "stub_r2m.py"
Edit = tuple[str, ...]  # a path into params.yaml


def small_raw() -> dict[str, Any]:
    """params.yaml on `tiny`, two variants and two baselines (every stage kind, few instances); `demo` (files
    outside the DAG: photos.yaml, references.json) for the baselines only."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw.update(datasets=["tiny"], variants=["r2m", "no_fm"])
    raw["baselines"].update(datasets=["tiny", "demo"], models=["mrnn", "sat"])
    return raw


# --------------------------------------------------------------------------- the keys stages read
def _choices(annotation: Any) -> list[Any]:
    """The values a Literal (possibly optional) field allows."""
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return [c for arg in typing.get_args(annotation) for c in _choices(arg)]


def _candidates(value: Any, annotation: Any) -> list[Any]:
    """Values different from ``value`` a field of this type may take."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1]
    if isinstance(value, float):
        return [round(value * 1.5 + 0.1, 6), round(value / 2, 6)]
    return [c for c in _choices(annotation) if c != value]


def _field(section: str, key: str) -> Any:
    model = P.Params.model_fields[section].annotation
    fields = getattr(model, "model_fields", {})
    return fields[key].annotation if key in fields else None


def read_sections(params: P.Params) -> set[str]:
    """Every params section some stage instance declares (``{model}`` resolved)."""
    return {name.format(**bound).partition(".")[0] for stage, bound in dag_instances(params) for name in stage.params}


def params_edits(raw: dict[str, Any]) -> Iterator[tuple[Edit, Any]]:
    """(path, new value) for every key a stage reads, each spelled every way params.yaml allows."""
    params = V.validate(raw, "test")
    dumped, views = params.model_dump(mode="json"), {}  # views: params stays alive while this runs
    run: dict[str, set[str]] = {}  # dataset -> the names its stages declare (the registry's word, not resolved)
    for stage, bound in dag_instances(params):
        if "dataset" in bound:
            run.setdefault(bound["dataset"], set()).update(n.format(**bound) for n in stage.params)
    for section in sorted(read_sections(params) - {"catalog", "datasets", "variants", "baselines"}):
        items = dumped.get(section)
        if not isinstance(items, dict):
            continue
        for key, value in items.items():
            if isinstance(value, (dict, list)):
                continue  # backend options, per_model: below
            field = _field(section, key)
            for new in _candidates(value, field):
                yield (section, key), new
            for ds in (d for d in run if run[d] & {section, f"{section}.{key}"}):  # a run dataset's stage reads it
                for new in _candidates(_effective(params, ds, None, section, key, views), field):
                    yield ("catalog", ds, "overrides", section, key), new
            if section == "train_sup":
                for model in raw["baselines"]["models"]:
                    for new in _candidates(_effective(params, None, model, section, key, views), field):
                        yield ("train_sup", "per_model", model, key), new
    for ds, entry in raw["catalog"].items():
        for key, value in entry.items():
            if key in ("kind", "overrides", "fidelity") or isinstance(value, (dict, list, str)):
                continue
            for new in _candidates(value, None):
                yield ("catalog", ds, key), new


def set_path(raw: dict[str, Any], path: Edit, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(raw))
    node = out
    for k in path[:-1]:
        node = node.setdefault(k, {})
    node[path[-1]] = value
    return out


def resolved_all(params: P.Params) -> dict[tuple[str, str], str]:
    """(stage, instance) -> its resolved params, as the .params/ files hold them."""
    return {tuple(rel.removeprefix(".params/").removesuffix(".json").split("/")): text
            for rel, text in all_instance_params(params).items()}


def _effective(params: P.Params, dataset: str | None, model: str | None, section: str, key: str,
               views: dict[tuple[int, str | None, str | None], dict[str, Any]] | None = None) -> Any:
    """The value of ``section.key`` as ``dataset`` (and baseline ``model``) sees it. ``views``: a cache of the
    dumped views, for the caller to share while ``params`` stays alive (it is keyed by ``id(params)``)."""
    model = model if section == "train_sup" else None
    vkey = (id(params), dataset, model)
    if views is None or vkey not in views:
        view = P.for_dataset(params, dataset) if dataset else params
        dumped = view.train_sup.for_model(model).model_dump(mode="json") if model else view.model_dump(mode="json")
        if views is None:
            return (dumped if model else (dumped.get(section) or {})).get(key)
        views[vkey] = dumped
    dumped = views[vkey]
    return (dumped if model else (dumped.get(section) or {})).get(key)


def declared_readers(before: P.Params, after: P.Params, path: Edit) -> set[tuple[str, str]]:
    """The instances that, by the registry's declarations, read the value at ``path`` and see it change."""
    out, views = set(), {}  # views: before and after stay alive for the whole call
    for stage, bound in dag_instances(after):
        names = [n.format(**bound) for n in stage.params]
        ds, model = bound.get("dataset"), bound.get("model")
        if path[0] == "catalog" and path[2] != "overrides":  # an entry's own item
            item = path[2]
            recipe = item not in NOT_RECIPE  # what a stage declaring "catalog" reads of it
            if (ds in (None, path[1]) and "catalog" in names and recipe) or \
                    (ds == path[1] and f"catalog.{item}" in names):
                out.add((stage.name, stage.key(bound)))
            continue
        section, key = (path[3], path[4]) if path[0] == "catalog" else (path[0], path[-1])
        if ds is None and "catalog" in names:  # reads the section as every dataset sees it
            if section in names and any(_effective(before, d, model, section, key, views)
                                        != _effective(after, d, model, section, key, views) for d in after.catalog):
                out.add((stage.name, stage.key(bound)))
            continue
        if not (section in names or f"{section}.{key}" in names):
            continue
        if _effective(before, ds, model, section, key, views) != _effective(after, ds, model, section, key, views):
            out.add((stage.name, stage.key(bound)))
    return out


def test_every_key_a_stage_reads_changes_exactly_its_readers():
    raw = small_raw()
    base = V.validate(raw, "test")
    before = resolved_all(base)
    tested, invalid = 0, []
    for path, new in params_edits(raw):
        try:
            after_params = V.validate(set_path(raw, path, new), "test")
        except (P.ParamsError, ValueError):
            invalid.append(path)
            continue
        after = resolved_all(after_params)
        changed = {k for k in after if after[k] != before.get(k)}
        want = declared_readers(base, after_params, path)
        assert changed == want, f"{'.'.join(path)} -> {new!r}: changed {sorted(changed)}, declared {sorted(want)}"
        # an override of a section a run dataset's stages read always reaches them (a value other than the one
        # the dataset sees): an override the resolution dropped would otherwise pass as "nothing changed"
        assert changed or path[2:3] != ("overrides",), f"{'.'.join(path)} -> {new!r}: changed nothing"
        tested += 1
    print(f"{tested} edits checked ({len(invalid)} candidate values rejected by validation)")
    assert tested > 300


def test_meaningless_edits_change_no_resolved_params():
    raw = small_raw()
    before = resolved_all(V.validate(raw, "test"))
    restated = set_path(raw, ("catalog", "tiny", "overrides", "train_xe", "clip"),
                        V.validate(raw, "test").train_xe.clip)  # the value it has anyway, spelled out
    reordered = {k: raw[k] for k in reversed(list(raw))}
    for variant in (restated, reordered):
        assert resolved_all(V.validate(variant, "test")) == before


# --------------------------------------------------------------------------- the engines
def instance_graph(params: P.Params) -> tuple[dict[tuple[str, str], set[str]], dict[tuple[str, str], set[str]]]:
    """(outputs, inputs) of every instance, as paths."""
    outs, ins = {}, {}
    for stage, bound in dag_instances(params):
        key = (stage.name, stage.key(bound))
        outs[key] = {o.path.format(**bound) for o in stage.outs.values()}
        ins[key] = set(stage.inputs(params, bound))
    return outs, ins


def with_descendants(params: P.Params, start: set[tuple[str, str]]) -> set[tuple[str, str]]:
    outs, ins = instance_graph(params)
    done, todo = set(start), list(start)
    while todo:
        made = outs[todo.pop()]
        for key, needs in ins.items():
            if key not in done and any(n == o or n.startswith(o + "/") for n in needs for o in made):
                done.add(key)
                todo.append(key)
    return done


def _env(bin_dir: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{bin_dir}:{BIN}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
            "PYTHONPATH": str(ROOT / "src")}


def ws_raw() -> dict[str, Any]:
    """The engines' one workspace: R²M on `demo` (files outside the DAG: photos.yaml, references.json) with two
    variants at seed 0; the baselines mrnn and sat on `demo` and `tiny` (every stage kind, few instances)."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw.update(datasets=["demo"], variants=["r2m", "no_fm"], seeds=[0])
    raw["baselines"].update(datasets=["demo", "tiny"], models=["mrnn", "sat"])
    raw["catalog"]["demo"].pop("seeds", None)  # one seed: a third of the instances
    return raw


Job = tuple[str, str]  # (stage, instance)


class Workspace:
    """A copy of the workflow on :func:`ws_raw` built once by Snakemake with the stub r2m, then recorded by DVC
    as it is (``dvc commit``: both engines see the same outputs, nothing runs twice). Every edit asks both
    engines at once (:meth:`check`: one ``snakemake -n`` and one ``dvc status``, side by side) and is undone
    by writing back what it touched (a params edit: params.yaml and the ``.params/`` files, DVC's lock untouched;
    a data file: the file, then its stage under DVC again)."""

    def __init__(self, wd: Path, raw: dict[str, Any] | None = None):
        self.sm = self.dvc = wd / "work"
        self.raw = raw or ws_raw()
        copy_workflow(ROOT, self.sm)
        copy_sources(ROOT, self.sm, ("data/demo",))
        self.write(self.raw)
        bin_dir = wd / "bin"
        bin_dir.mkdir()
        (bin_dir / "r2m").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" "$@"\n')
        (bin_dir / "r2m").chmod(0o755)
        (bin_dir / "outs.json").write_text(json.dumps(outputs_map(STAGES)))
        self.env = {**_env(bin_dir), "R2M_STUB_OUTS": str(bin_dir / "outs.json")}
        self.planned: set[Job] = set()
        self.seconds: dict[str, float] = {}  # how long the last dry run / status took
        self.smk = [str(BIN / "snakemake"), "--cores", "2", "all", "--config", f"r2m_command={bin_dir / 'r2m'}"]

    def write(self, raw: dict[str, Any], text: str | None = None) -> None:
        """params.yaml, its dvc.yaml (``r2m dag --write``: the instance lists) and the resolved-params files of it
        (what DVC's first stage, ``resolve_params``, writes: :meth:`dvc_stale` leaves that stage out; the
        meaningless-edits test runs it under DVC)."""
        from r2m.pipeline.dag import render
        from r2m.pipeline.resolved import write_if_changed, write_params_files

        (self.sm / "params.yaml").write_text(text if text is not None else yaml.safe_dump(raw, sort_keys=False))
        params = V.validate(raw, "test")
        write_if_changed(self.dvc / "dvc.yaml", render(params))
        write_params_files(params, self.dvc)

    def restore(self) -> None:
        self.write(self.raw)

    def _start(self, cmd: list[str]) -> subprocess.Popen:
        return subprocess.Popen(cmd, cwd=self.sm, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def _wait(self, proc: subprocess.Popen, what: str, t0: float) -> str:
        out, _ = proc.communicate(timeout=900)
        self.seconds[what] = time.perf_counter() - t0
        assert proc.returncode == 0, f"{proc.args}: {out[-6000:]}"
        return out

    def run(self, cmd: list[str], cwd: Path | None = None) -> str:
        return self._wait(self._start(cmd), "run", time.perf_counter())

    def check(self) -> tuple[set[Job], set[Job]]:
        """(the jobs ``snakemake -n`` plans, the stages ``dvc status`` reports), the two run side by side."""
        t0 = time.perf_counter()
        sm = self._start([*self.smk, "-n", "-p"])
        dvc = self._start([str(BIN / "dvc"), "status", "--json"])
        return parse_plan(self._wait(sm, "snakemake -n", t0)), parse_status(self._wait(dvc, "dvc status", t0))

    def snakemake_plan(self) -> set[Job]:
        return parse_plan(self.run([*self.smk, "-n", "-p"]))

    def dvc_stale(self) -> set[Job]:
        return parse_status(self.run([str(BIN / "dvc"), "status", "--json"]))


def parse_plan(out: str) -> set[Job]:
    """(stage, instance) of every job in a ``snakemake -n -p`` plan (from each job's log path); as many as the
    plan's own job count says, and none only where it says there is nothing to be done."""
    jobs = set()
    for line in out.splitlines():
        if "exec " in line and "> logs/" in line:
            log = line.split("> logs/", 1)[1].split()[0].rstrip("'")
            stage, _, name = log.rpartition("/")
            jobs.add((stage, name.removesuffix(".log")))
    counts: dict[str, int] = {}  # the plan's "Job stats" table (rule `all`: the target, no stage)
    if "Job stats:" in out:
        for ln in out.split("Job stats:", 1)[1].splitlines():
            cells = ln.split()
            if cells[:1] == ["total"]:  # the table's last line
                break
            if len(cells) == 2 and cells[1].isdigit() and cells[0] != "all":
                counts[cells[0]] = int(cells[1])
    if not jobs:
        assert "Nothing to be done" in out and not counts, f"no job parsed from a plan:\n{out[-3000:]}"
    per_stage = {s: sum(1 for n, _ in jobs if n == s) for s in {n for n, _ in jobs}}
    assert per_stage == counts, f"parsed {per_stage}, the plan counts {counts}"
    return jobs


def parse_status(text: str) -> set[Job]:
    """(stage, instance) of every stage ``dvc status --json`` reports, but ``always_changed`` ones and the
    resolver stage (its files are written in-process)."""
    lines = text.strip().splitlines()
    status = json.loads(lines[-1]) if lines else {}
    out = set()
    for name, changes in status.items():
        stage, _, key = name.partition("@")
        if changes == ["always changed"] or stage == "resolve_params":
            continue
        out.add((stage, key or "all"))
    return out


def built(w: Workspace) -> Workspace:
    """``w`` made by Snakemake (stub r2m), recorded by DVC; nothing stale under either."""
    w.planned = parse_plan(w.run([*w.smk, "-p"]))  # every job `all` needs
    w.run([str(BIN / "dvc"), "init", "--no-scm", "-q"])
    with open(w.dvc / ".dvcignore", "a") as fh:  # the project's (Snakemake's folder stamp: not content)
        fh.write("\n" + (ROOT / ".dvcignore").read_text())
    w.run([str(BIN / "r2m"), "resolve-params"])
    for stage, bound in dag_instances(V.validate(w.raw, "test")):
        if not all((w.dvc / o.path.format(**bound)).exists() for o in stage.outs.values()):
            make_outputs(stage, bound, w.dvc)
    w.run([str(BIN / "dvc"), "commit", "-f", "-q"])
    assert w.check() == (set(), set())
    # the dry runs on the up-to-date workspace, for the benchmark log
    w.up_to_date_seconds = {k: w.seconds[k] for k in ("snakemake -n", "dvc status")}
    return w


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Workspace:
    return built(Workspace(tmp_path_factory.mktemp("granular")))


# --------------------------------------------------------------------------- what each edit re-runs, by hand
# Written from what each stage reads (the registry's deps and params as the guide lists them), not computed by
# the code under test. Snakemake plans what `all` needs: R²M's `r2m` at every checkpoint (Tables 1, 3, the
# figures), `no_fm` at train_i only (Table 2); DVC reports the instances of its matrices whose own params file
# or input changed (every variant at every checkpoint).
VARIANTS, MODELS, CKPTS = ("r2m", "no_fm"), ("mrnn", "sat"), ("train_xe", "train_s", "train_m", "train_i")


def r2m(*stages: str) -> set[Job]:
    """Training stages of both variants on demo."""
    return {(s, f"demo-{v}-0") for s in stages for v in VARIANTS}


def decoded(*ckpts: str, stages: tuple[str, ...] = ("caption", "evaluate")) -> set[Job]:
    """caption/evaluate at these checkpoints: what `all` needs (``no_fm`` at train_i only; DVC has the same)."""
    return {(s, f"demo-{v}-{c}-0") for s in stages for v in VARIANTS for c in ckpts if v == "r2m" or c == "train_i"}


def sup(*stages: str, datasets: tuple[str, ...] = ("demo",), models: tuple[str, ...] = MODELS) -> set[Job]:
    return {(s, f"{d}-{m}-0") for s in stages for d in datasets for m in models}


SUP_AFTER_TRAIN = ("caption_sup", "evaluate_sup", "inspect_sup", "retrieval_sup")
R2M_REPORTS = {("retrieval_r2m", "demo-0"), ("figures", "demo"), ("table1", "all"), ("table2", "all"),
               ("table3", "all"), ("retrieval", "all"), ("report", "all"), ("claims", "all")}
SUP_REPORTS = {("baselines", "all"), ("retrieval", "all"), ("report", "all")}
AFTER_CONCEPTS = r2m("train_m", "train_i") | decoded(*CKPTS) | R2M_REPORTS  # what reads the detections, onwards


def _edits() -> list[tuple[str, Edit, Any, set[Job], set[Job]]]:
    """(what, params path, new value, Snakemake's plan, DVC's stale stages)."""
    after_train_s = r2m("train_s", "train_m", "train_i") | decoded("train_s", "train_m", "train_i") | R2M_REPORTS
    sup_lr = sup("pretrain_sup", "train_sup", "retrieval_sup")
    per_model = sup("pretrain_sup", "train_sup", "retrieval_sup", datasets=("demo", "tiny"), models=("sat",))
    detector = {("detect_concepts", "demo"), ("report", "all")}  # report lists each dataset's detector
    return [
        ("a dataset's override of a late stage (the issue's first case): train_s and retrieval_r2m read it",
         ("catalog", "demo", "overrides", "train_s", "steps"), 201, after_train_s,
         r2m("train_s") | {("retrieval_r2m", "demo-0")}),
        ("a dataset's override of a baseline's size (the issue's second case): demo's mrnn only",
         ("catalog", "demo", "overrides", "mrnn", "embed1"), 136,
         sup("pretrain_sup", "train_sup", *SUP_AFTER_TRAIN, models=("mrnn",)) | SUP_REPORTS,
         sup("pretrain_sup", "train_sup", models=("mrnn",))),
        ("a top-level key one dataset's override masks (tiny sets train_sup.lr): demo's baselines only",
         ("train_sup", "lr"), 0.0008, sup_lr | sup(*SUP_AFTER_TRAIN) | SUP_REPORTS, sup_lr),
        ("a baseline's per-model key: sat on both datasets (tiny's per_model merges over it)",
         ("train_sup", "per_model", "sat", "weight_decay"), 0.001,
         per_model | sup(*SUP_AFTER_TRAIN, datasets=("demo", "tiny"), models=("sat",)) | SUP_REPORTS, per_model),
        ("a catalog entry's own item: gamma, read by train_i",
         ("catalog", "demo", "gamma"), 0.5, r2m("train_i") | decoded("train_i") | R2M_REPORTS, r2m("train_i")),
        ("a fidelity item: ban_unk, read by the stages that decode (train_m, train_i: selection; caption)",
         ("fidelity", "ban_unk"), False, AFTER_CONCEPTS, r2m("train_m", "train_i") | decoded(*CKPTS, stages=("caption",))),
        # caption reads the detections from its concepts folder and builds no detector (`r2m caption IMAGES`,
        # which does, is a module of its own): under DVC only detect_concepts itself is stale
        ("a detector backend", ("catalog", "demo", "overrides", "detect_concepts", "backend"), "precomputed",
         detector | AFTER_CONCEPTS, detector),
        ("a detector's options", ("catalog", "demo", "overrides", "detect_concepts", "options"),
         {"parts": ["classifier", "faces"]}, detector | AFTER_CONCEPTS, detector),
        ("the scorers: every evaluation (R²M's, the baselines', most-frequent) and the tables",
         ("evaluate", "scorers"), ["bleu", "meteor", "rouge", "cider"],
         decoded(*CKPTS, stages=("evaluate",)) | sup("evaluate_sup", datasets=("demo", "tiny"))
         | {("mostfreq", "demo"), ("mostfreq", "tiny"), ("table1", "all"), ("table2", "all"), ("table3", "all"),
            ("baselines", "all"), ("report", "all"), ("claims", "all")},
         decoded(*CKPTS, stages=("evaluate",)) | sup("evaluate_sup", datasets=("demo", "tiny"))
         | {("mostfreq", "demo"), ("mostfreq", "tiny")}),
        ("a dataset's fidelity profile (paper -> official): the text stages, R²M's model and training, captioning",
         ("catalog", "demo", "fidelity"), "official",
         {("corpus_concepts", "demo"), ("build_vocab", "demo")} | r2m(*CKPTS) | decoded(*CKPTS) | R2M_REPORTS,
         {("corpus_concepts", "demo"), ("build_vocab", "demo")} | r2m(*CKPTS)
         | decoded(*CKPTS, stages=("caption",))),
    ]


EDITS = _edits()


@pytest.mark.parametrize("what,path,value,plan,stale", EDITS, ids=[".".join(e[1]) for e in EDITS])
def test_an_edit_stales_exactly_its_readers_and_their_descendants(ws, what, path, value, plan, stale):
    assert plan and stale and plan <= ws.planned and stale <= instance_names(ws.raw), what  # the table's own sanity
    ws.write(set_path(ws.raw, path, value))
    try:
        got_plan, got_stale = ws.check()
    finally:
        ws.restore()
    assert got_plan == plan, f"{what}: snakemake plans {sorted(got_plan - plan)} more, {sorted(plan - got_plan)} fewer"
    assert got_stale == stale, f"{what}: dvc reports {sorted(got_stale - stale)} more, {sorted(stale - got_stale)} fewer"


def instance_names(raw: dict[str, Any]) -> set[Job]:
    """Every instance of the DAG (DVC's instance lists)."""
    return {(s.name, s.key(b)) for s, b in dag_instances(V.validate(raw, "test"))}


def test_meaningless_edits_stale_nothing_under_either_engine(ws):
    """A comment, another layout and key order, an override restating the value a key has anyway, the scorers
    in another order (a set: issue 38.6; before, reversing them re-ran every evaluation), a comment in a parsed
    data file (issue 38.6: before, `inputs`, `prepare` and everything after) — all at once; DVC's resolver stage
    and `inputs` run under DVC itself here."""
    raw = set_path(ws.raw, ("catalog", "demo", "overrides", "train_xe", "clip"), V.validate(ws.raw, "test").train_xe.clip)
    raw = set_path(raw, ("evaluate", "scorers"), list(reversed(ws.raw["evaluate"]["scorers"])))
    text = yaml.safe_dump(raw, sort_keys=True, indent=4)  # reformatted, keys reordered
    text = "# a comment\n" + text.replace("\ncatalog:", "\n# another comment\ncatalog:", 1)
    undo = _edit_file(ws.sm / "data/demo/photos.yaml", lambda t: "# a comment\n" + t.replace("\n", "\n# more\n", 1))
    try:
        ws.write(raw, text)
        ws.run([str(BIN / "dvc"), "repro", "-s", "-q", "resolve_params", "inputs@demo"])  # `inputs`: always_changed
        assert ws.check() == (set(), set())
    finally:
        undo()
        ws.restore()


def test_resolved_params_files_are_rewritten_only_on_change(tmp_path):
    from r2m.pipeline.resolved import write_params_files

    params = V.validate(small_raw(), "test")
    first = write_params_files(params, tmp_path)
    assert len(first) == len(list(dag_instances(params)))
    stamp = {p: p.stat().st_mtime_ns for p in (tmp_path / ".params").rglob("*.json")}
    assert write_params_files(params, tmp_path) == []
    assert stamp == {p: p.stat().st_mtime_ns for p in (tmp_path / ".params").rglob("*.json")}


def test_no_instance_depends_on_a_whole_catalog_entry():
    """Overrides reach a stage through the sections it declares, never as the entry's ``overrides``."""
    params = V.validate(small_raw(), "test")
    for stage, bound in dag_instances(params):
        got = stage.resolved(params, bound)
        assert "overrides" not in (got.get("catalog") or {}), stage.name


def test_dry_runs_on_an_up_to_date_workspace_are_quick(ws):
    """Figures, not a timed assertion: printed for the benchmark log (the fixture's own final check, which
    found nothing to run under either engine, timed; the two run side by side)."""
    assert sorted(ws.up_to_date_seconds) == ["dvc status", "snakemake -n"]
    for name, seconds in sorted(ws.up_to_date_seconds.items(), reverse=True):
        print(f"{name}: {seconds:.2f} s")


# --------------------------------------------------------------------------- issue 38: integrity
def _params_file(plan: str, stage: str) -> Path:
    """The ``--params`` file of ``stage``'s job in a ``snakemake -n -p`` plan."""
    line = next(ln for ln in plan.splitlines() if f" {stage} --dataset" in ln and "--params" in ln)
    return Path(line.split("--params", 1)[1].split()[0].strip("'"))


def test_a_dry_run_with_other_params_never_changes_a_planned_jobs_params(ws):
    """Issue 38.2: a job reads the params of the invocation that started it, not the last one's
    (before: one shared .snakemake/r2m/params.yaml, rewritten by every invocation, a dry run too)."""
    running = ws.run([*ws.smk, "-n", "-p", "--forcerun", "train_s"])  # the job a run would start
    mine = ws.sm / _params_file(running, "train_s")
    before = mine.read_text()
    other = ws.run([*ws.smk, 'fidelity={"rec_loss": "mse_raw"}', "-n", "-p", "--forcerun", "train_s"])
    theirs = ws.sm / _params_file(other, "train_s")
    assert mine.read_text() == before, "a dry run rewrote the params file a running job reads"
    assert yaml.safe_load(theirs.read_text())["fidelity"]["rec_loss"] == "mse_raw"
    assert yaml.safe_load(before)["fidelity"].get("rec_loss") != "mse_raw"
    # that neither invocation made anything stale: the last test of this file (nothing to run after every edit)


def test_a_finished_folder_missing_a_key_file_is_rebuilt(ws):
    """Issue 38.5: `rm models/<D>/r2m/s0/train_s/model.pt` re-runs train_s (and what follows) under Snakemake
    (before: nothing to be done); DVC reports train_s and the two stages that read its folder."""
    member = ws.sm / "models/demo/r2m/s0/train_s/model.pt"
    text, st = member.read_text(), member.stat()
    member.unlink()
    try:
        plan, stale = ws.check()
    finally:
        member.write_text(text)
        os.utime(member, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = {(s, "demo-r2m-0") for s in ("train_s", "train_m", "train_i")} | R2M_REPORTS
    assert plan == after | {(s, f"demo-r2m-{c}-0") for s in ("caption", "evaluate") for c in CKPTS[1:]}
    assert stale == {("train_s", "demo-r2m-0"), ("train_m", "demo-r2m-0"), ("caption", "demo-r2m-train_s-0")}


def _edit_file(path: Path, edit: Callable[[str], str]) -> Callable[[], None]:
    original = path.read_text()
    assert edit(original) != original, f"{path}: the edit changes nothing"
    path.write_text(edit(original))
    return lambda: path.write_text(original)


def test_a_changed_value_in_a_parsed_data_file_reruns_prepare(ws):
    """The other side of a comment (the meaningless edits): what the file says still counts — everything of
    demo and every report re-runs, nothing of tiny; DVC (after its always-changed `inputs`) reports prepare."""
    undo = _edit_file(ws.sm / "data/demo/photos.yaml",
                      lambda t: t.replace("  - id: astronaut\n", "  - id: astronaut\n    note: a value\n", 1))
    try:
        ws.run([str(BIN / "dvc"), "repro", "-s", "-q", "inputs@demo"])
        plan, stale = ws.check()
    finally:
        undo()
        ws.run([str(BIN / "dvc"), "repro", "-s", "-q", "inputs@demo"])  # its output and DVC's lock as they were
    assert plan == {(s, k) for s, k in ws.planned if k == "all" or k.split("-")[0] == "demo"}
    assert ("inputs", "demo") in plan and not any(k.startswith("tiny") for _, k in plan)
    assert stale == {("prepare", "demo")}


# what reads the references (stage `references`), by hand: a word of a caption re-runs these and what follows
REFERENCE_READERS = (decoded(*CKPTS, stages=("evaluate",)) | r2m("train_m", "train_i")
                     | {("figures", "demo"), ("sup_vocab", "demo"), ("mostfreq", "demo"), ("retrieval_r2m", "demo-0")}
                     | sup("train_sup", "evaluate_sup", "inspect_sup"))


def test_a_reference_edit_reruns_what_reads_references_and_nothing_else(ws):
    """Issue 38.6: one word of one reference caption of the demo (before: 78 jobs on the default params,
    `inputs`, `prepare`, concept detection, both feature extractions, the corpus, the vocabulary and every
    training stage among them). After: the `references` stage, its readers and what follows them."""
    undo = _edit_file(ws.sm / "data/demo/references.json", lambda t: t.replace(" woman ", " lady ", 1))
    try:
        ws.run([str(BIN / "dvc"), "repro", "-s", "-q", "references@demo"])  # DVC runs it at every repro
        plan, stale = ws.check()
    finally:
        undo()
        ws.run([str(BIN / "dvc"), "repro", "-s", "-q", "references@demo"])
    assert plan == ({("references", "demo")} | r2m("train_m", "train_i") | decoded(*CKPTS[2:])
                    | decoded(*CKPTS[:2], stages=("evaluate",)) | R2M_REPORTS | {("sup_vocab", "demo"), ("mostfreq", "demo")}
                    | sup("pretrain_sup", "train_sup", *SUP_AFTER_TRAIN) | SUP_REPORTS)
    assert stale == REFERENCE_READERS  # DVC: the readers, whose input changed


def test_scorer_order_changes_no_result():
    """What makes the scorers a set: the metrics of two orders are the same (CIDEr-D and BLEU on a hand-made pair)."""
    from r2m.evaluation import coco

    results = {"1": "a dog runs on grass", "2": "a cat sits"}
    refs = {"1": ["a dog runs on the grass", "a dog on grass"], "2": ["a cat sits on a mat", "the cat sits"]}
    one = coco.evaluate(results, refs, ["bleu", "cider"], tokenizer="none", parallel="serial")
    two = coco.evaluate(results, refs, ["cider", "bleu"], tokenizer="none", parallel="serial")
    assert one[0] == two[0] and one[1] == two[1] and one[0]["CIDEr"] > 0


def test_dvc_runs_the_jobs_snakemake_all_plans(ws):
    """Issue 34: `dvc stage list` on the workspace names exactly the jobs `snakemake -n all` planned when it
    was built, one for one (before, DVC's matrices also captioned every ablation at its early checkpoints and
    ran every run at every seed some run used: 350 instances on the repository's params, for 134 jobs)."""
    out = ws.run([str(BIN / "dvc"), "stage", "list", "--name-only"])
    listed = {(n.partition("@")[0], n.partition("@")[2] or "all") for n in out.split() if n != "resolve_params"}
    assert ws.planned and listed == ws.planned


def test_the_repository_dag_has_one_instance_per_job(tmp_path):
    """The repository's params: the demo's R2M and its four ablations at seeds 0-2; the baselines on demo and
    tiny_paired. Counted by hand: 3 data stages x 2 datasets, 4 per-dataset stages and `figures` on demo,
    4 training stages x 15 runs, caption and evaluate x (3 seeds x 4 checkpoints + 4 ablations x 3 seeds),
    `retrieval_r2m` at R2M's 3 seeds, 2 per-dataset baseline stages and `mostfreq` x 2, 6 baseline stages x 4
    models x 2 datasets, and the 7 gathering stages: 6 + 5 + 60 + 48 + 3 + 6 + 48 + 7 = 183. The committed
    dvc.yaml lists exactly the jobs Snakemake's own dry run of `all` plans on those params (in an empty folder)."""
    params = V.load(ROOT / "params.yaml")
    assert len(dag_instances(params)) == 183
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    r = subprocess.run([str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path), "-n", "-p",
                        "--cores", "1", "all"], cwd=tmp_path, env=_env(BIN), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    lists = doc["vars"][0]["instances"]
    listed = {(name, key) for name, entry in doc["stages"].items() if "foreach" in entry
              for key in lists[entry["foreach"][len("${instances."):-1]]}
    listed |= {(name, "all") for name, entry in doc["stages"].items() if "foreach" not in entry}
    assert listed - {("resolve_params", "all")} == parse_plan(r.stdout + r.stderr)
    guide = " ".join((ROOT / "docs/guide/running.md").read_text().split())
    assert "the same 183 stage instances" in guide and "216 more instances" not in guide


def runs_at_seed(seed: int) -> set[Job]:
    """The seeded instances `all` needs on :func:`ws_raw`, by hand: R2M's four training stages for both variants;
    captions and evaluations of r2m at every checkpoint (Table 3) and of no_fm at its final one (Table 2);
    Table 1's retrieval; each baseline's six stages on demo and tiny."""
    s = str(seed)
    train = {(st, f"demo-{v}-{s}") for st in CKPTS for v in ("r2m", "no_fm")}
    decoded = {(st, f"demo-r2m-{c}-{s}") for st in ("caption", "evaluate") for c in CKPTS}
    decoded |= {(st, f"demo-no_fm-train_i-{s}") for st in ("caption", "evaluate")}
    sup = {(st, f"{d}-{m}-{s}") for st in ("pretrain_sup", "train_sup", "caption_sup", "evaluate_sup", "inspect_sup",
                                            "retrieval_sup") for d in ("demo", "tiny") for m in ("mrnn", "sat")}
    return train | decoded | sup | {("retrieval_r2m", f"demo-{s}")}


def test_adding_a_seed_runs_only_the_new_seeds_stages(ws):
    """Issue 33: `seeds: [0, 1]` plans seed 1's instances — the same runs seed 0 has, at seed 1 — and the stages
    that gather every seed (tables, figures, report) under Snakemake; DVC reports seed 1's instances as new and
    the gathering stages as stale (their declared `seeds` changed; `report` follows from their outputs).
    Nothing of seed 0 re-runs under either engine."""
    after = {**ws.raw, "seeds": [0, 1]}
    ws.write(after)
    try:
        planned, stale = ws.check()
    finally:
        ws.restore()
    seeded = {s.name for s in STAGES if "seed" in s.axes}
    gatherers = {(s.name, "all") for s in STAGES if not s.axes} | {("figures", "demo")}
    assert {(n, k) for n, k in ws.planned if n in seeded} == runs_at_seed(0)  # the hand-written runs, at seed 0
    assert planned - gatherers == runs_at_seed(1)
    assert planned & gatherers == gatherers and not any(k.endswith("-0") for _, k in planned)
    assert stale == runs_at_seed(1) | (gatherers - {("report", "all")})  # DVC: the same runs, by hand


def test_snakemake_all_plans_the_documented_instances(ws):
    """The engine's own plan of `all` on a fresh workspace is :func:`needed_instances`."""
    from r2m.pipeline.resolved import ALL_TARGETS, needed_instances

    params = V.validate(ws.raw, "test")
    assert ws.planned == {(s.name, s.key(b)) for s, b in needed_instances(params, ALL_TARGETS)}


def test_a_stage_refuses_an_incomplete_input_folder_in_one_line(tmp_path, monkeypatch, capsys):
    """Issue 38.5 on use: `evaluate` on a prepared folder without its images.parquet names the file, no traceback."""
    from r2m.cli import main

    raw = small_raw()
    raw["baselines"]["datasets"] = ["tiny"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    prepared = tmp_path / "data/tiny/prepared"
    prepared.mkdir(parents=True)
    for name in ("references.json", "corpus.txt", "manifest.json"):
        (prepared / name).write_text("{}")
    monkeypatch.chdir(tmp_path)
    rc = main(["evaluate", "--dataset", "tiny", "--variant", "r2m", "--ckpt", "train_s", "--params", "params.yaml",
               "--no-log-file"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "Traceback" not in "\n".join(err)
    assert "data/tiny/prepared/images.parquet is missing" in err[-1] and "re-run prepare" in err[-1]
    assert len([ln for ln in err if "missing" in ln]) == 1


def test_a_checkpoint_dependency_names_the_folder_of_its_ckpt(tmp_path):
    """`caption`'s `models/{dataset}/{variant}/s{seed}/{ckpt}` at ckpt=train_s is train_s's folder: its model.pt is
    required (the issue's case: caption on a train_s folder whose model.pt was deleted)."""
    from r2m.stage.context import StageContext
    from r2m.stage.registry import get

    folder = tmp_path / "models/tiny/r2m/s0/train_s"
    folder.mkdir(parents=True)
    (folder / "params.yaml").write_text("{}\n")
    ctx = StageContext(stage=get("caption"), params=V.validate(small_raw(), "test"), dataset="tiny", variant="r2m",
                       ckpt="train_s", root=tmp_path)
    lines = ctx.incomplete_inputs()
    assert len(lines) == 1 and lines[0].startswith(f"{folder / 'model.pt'} is missing") and "re-run train_s" in lines[0]
    (folder / "model.pt").write_bytes(b"")
    assert ctx.incomplete_inputs() == []


def test_a_file_the_ownership_marker_lists_is_checked_on_use(tmp_path):
    """Beyond the key files: a file r2m wrote into a folder (its marker lists it) and that is gone, or of
    another size, makes the folder incomplete for every consumer."""
    from r2m.stage.context import StageContext
    from r2m.stage.registry import get
    from r2m.utils.io import mark_owned

    folder = tmp_path / "data/tiny/corpus"
    folder.mkdir(parents=True)
    for name, text in (("corpus.parquet", "x"), ("stats.json", "{}"), ("params.yaml", "{}\n")):
        (folder / name).write_text(text)
    mark_owned(folder)
    ctx = StageContext(stage=get("build_vocab"), params=V.validate(small_raw(), "test"), dataset="tiny", root=tmp_path)
    assert ctx.incomplete_inputs() == []
    (folder / "params.yaml").write_text("{}\n# longer\n")
    assert ctx.incomplete_inputs() == [f"{folder / 'params.yaml'} changed size since it was written: {folder} "
                                       "(output of corpus_concepts) is incomplete; re-run corpus_concepts "
                                       "(snakemake and dvc repro rebuild it)"]
    (folder / "params.yaml").unlink()
    assert ctx.incomplete_inputs()[0].startswith(f"{folder / 'params.yaml'} is missing: ")


def test_the_shared_workspace_is_clean_after_every_edit(ws):
    """Every test above undid its edit: nothing to run under either engine (runs last in this file)."""
    assert ws.check() == (set(), set())

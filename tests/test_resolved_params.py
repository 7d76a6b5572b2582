"""The resolved params of each stage instance (:meth:`r2m.stage.spec.Stage.resolved`): what a stage saves
beside its outputs (``params.yaml``) and what its resume fingerprint holds.

Generated from the registry: every params key some stage declares (top-level section keys, a run dataset's
override of each — which must change something —, the baselines' ``per_model`` keys, the catalog entry's own
items): changing it changes the resolved params of exactly the instances that declare it and see the new value,
and nothing else; edits that mean nothing (a value restated, keys reordered) change none. What the engines rerun
is another matter (the run-time records: tests/test_plans.py).
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from r2m import params as P
from r2m.pipeline import validate as V
from r2m.pipeline.resolved import dag_instances
from r2m.stage.spec import NOT_RECIPE

ROOT = Path(__file__).resolve().parents[1]
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
    """(stage, instance) -> its resolved params (:meth:`r2m.stage.spec.Stage.resolved`) as JSON text."""
    views = P.Views(params)  # one views object for every instance of the run
    return {(stage.name, stage.key(bound)): json.dumps(stage.resolved(views, bound), sort_keys=True)
            for stage, bound in dag_instances(params)}


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


def test_no_instance_depends_on_a_whole_catalog_entry():
    """Overrides reach a stage through the sections it declares, never as the entry's ``overrides``."""
    params = V.validate(small_raw(), "test")
    for stage, bound in dag_instances(params):
        got = stage.resolved(params, bound)
        assert "overrides" not in (got.get("catalog") or {}), stage.name


def test_scorer_order_changes_no_result():
    """What makes the scorers a set: the metrics of two orders are the same (CIDEr-D and BLEU on a hand-made pair)."""
    from r2m.evaluation import coco

    results = {"1": "a dog runs on grass", "2": "a cat sits"}
    refs = {"1": ["a dog runs on the grass", "a dog on grass"], "2": ["a cat sits on a mat", "the cat sits"]}
    one = coco.evaluate(results, refs, ["bleu", "cider"], tokenizer="none", parallel="serial")
    two = coco.evaluate(results, refs, ["cider", "bleu"], tokenizer="none", parallel="serial")
    assert one[0] == two[0] and one[1] == two[1] and one[0]["CIDEr"] > 0

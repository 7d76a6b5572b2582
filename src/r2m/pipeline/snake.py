"""Helpers the Snakefile uses to turn registry stages into rules (kept out of the .smk files so
they are plain, testable Python)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import yaml

from r2m import params as P
from r2m.pipeline.stages import Gather, Stage


def snake_template(path: str) -> str:
    """Registry templates already use Snakemake's ``{wildcard}`` syntax."""
    return path


def axis_values(params: P.Params) -> dict[str, list[str]]:
    return {"dataset": list(params.datasets), "variant": list(params.variants), "ckpt": list(P.TRAIN_STAGES)}


def gather_paths(g: Gather, params: P.Params, bound: dict[str, str]) -> list[str]:
    values = axis_values(params)
    fixed = dict(g.fixed)
    out = []
    for combo in itertools.product(*(values[a] for a in g.over)):
        keys = {**bound, **fixed, **dict(zip(g.over, combo, strict=True))}
        out.append(g.pattern.format(**keys))
    return out


def expand_gather(g: Gather, params: P.Params):
    """A Snakemake input function expanding ``g`` with the rule's own wildcards bound."""

    def _inputs(wildcards: Any) -> list[str]:
        return gather_paths(g, params, dict(wildcards.items()))

    return _inputs


def rule_params(params: P.Params, stage: Stage, wildcards: Any) -> str:
    """The params a stage reads, as its dataset sees them: changing them re-runs the rule."""
    dataset = getattr(wildcards, "dataset", None)
    view = P.for_dataset(params, dataset) if dataset else params
    dumped = view.model_dump(mode="json")
    data: dict[str, Any] = {}
    for name in stage.params:
        if name == "catalog" and dataset:
            data[name] = dumped["catalog"][dataset]
        else:
            data[name] = dumped.get(name)
    return json.dumps(data, sort_keys=True)


def stage_command(r2m: str, stage: Stage, wildcards: Any, params_file: str) -> str:
    """``r2m <stage> --dataset X … --params FILE`` for one job (values quoted for the shell)."""
    import shlex

    axes = " ".join(f"--{a} {shlex.quote(str(getattr(wildcards, a)))}" for a in stage.axes)
    return " ".join(x for x in (r2m, stage.name, axes, "--params", shlex.quote(params_file)) if x)


def wildcard_constraints_for(params: P.Params) -> dict[str, str]:
    names = lambda xs: "|".join(sorted(xs, key=len, reverse=True))  # noqa: E731
    return {
        "dataset": names(params.catalog),
        "variant": names(P.VARIANT_NAMES),
        "ckpt": names(P.TRAIN_STAGES),
    }


def write_merged_params(config: dict[str, Any], path: str) -> str:
    """Write the merged Snakemake config for the r2m commands; untouched when unchanged."""
    from r2m.utils.io import write_text

    text = yaml.safe_dump(dict(config), sort_keys=False)
    p = Path(path)
    if not p.exists() or p.read_text() != text:
        write_text(p, text)
    return str(p)

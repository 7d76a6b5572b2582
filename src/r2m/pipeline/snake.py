"""Helpers the Snakefile uses to turn registry stages into rules (kept out of the .smk files so
they are plain, testable Python).

What Snakemake sees of an instance is its *done file* (:func:`r2m.stage.record.done_path`), not its outputs:
a rule's output is the instance's done file (and, for the summaries over the whole run, its files under
``reports/``, the targets people name), its inputs the done files of the instances that wrote its
dependencies, plus its stamp. Snakemake deletes a job's declared outputs before running it; declaring the done
file alone leaves the outputs to r2m, so a job whose upstream reran with byte-identical results finds its
record current and exits at once with its outputs as they were (early cutoff, :func:`r2m.stage.record.up_to_date`),
and Snakemake's own deleting flags can take no file of the user's. Whether an instance must rerun is its record's
answer (its stamp), a removed or changed output included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from r2m import params as P
from r2m.pipeline.resolved import needed_instances
from r2m.stage.axes import gathered
from r2m.stage.registry import BY_NAME, STAGES, Gather, Stage


def snake_template(path: str) -> str:
    """Registry templates already use Snakemake's ``{wildcard}`` syntax."""
    return path


def external_param(stage: Stage, params: P.Params):
    """A Snakemake param function: the digest of the files outside the DAG a stage reads
    (:attr:`Stage.external`). A param, not inputs: Snakemake compares it by content, so a touched or
    re-commented file re-runs nothing, and an edit of what the file says re-runs the stage."""
    import importlib

    module, func = stage.external.split(":")

    def _digest(wildcards: Any) -> str:
        return getattr(importlib.import_module(module), func)(params, wildcards.dataset)

    return _digest


def plan_input(stage: Stage, planner: Any):
    """A Snakemake input function: the instance's stamp (:mod:`r2m.stage.record`), written now from its
    record — current (modification time 0) or stale (the time now, newer than its outputs) — so Snakemake's
    mtime check reruns exactly the instances whose record names something that changed, and their
    descendants."""

    def _stamp(wildcards: Any) -> str:
        return str(planner.plan(stage, {a: getattr(wildcards, a) for a in stage.axes})[0])

    return _stamp


def stage_command(r2m: str, stage: Stage, wildcards: Any, params_file: str | None = None) -> str:
    """``r2m <stage> --dataset X … [--params FILE]`` for one job (values quoted for the shell).

    The Snakefile leaves ``params_file`` out: the rule's ``cmd`` param is compared by Snakemake's params
    trigger, and the invocation's params file (:func:`write_merged_params`, named by its content) is
    appended by the rule's ``shell:`` instead, so a params edit a job does not read changes no ``cmd``."""
    import shlex

    axes = " ".join(f"--{a} {shlex.quote(str(getattr(wildcards, a)))}" for a in stage.axes)
    tail = ("--params", shlex.quote(params_file)) if params_file else ()
    return " ".join(x for x in (r2m, stage.name, axes, *tail) if x)


# Snakemake-only config keys: how to run, not what to compute (never in params.yaml)
RUNTIME_KEYS = ("r2m_command", "shards")


def split_config(config: dict[str, Any], cli: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(params part validated by r2m.params, runtime part for Snakemake only). ``cli``: the command line's
    ``--config`` (Snakemake's ``workflow.config_settings.config``): a runtime key comes from there only, so a
    config file (``params.yaml``, which DVC reads too and refuses them in) can never set one (ValueError)."""
    params = {k: v for k, v in config.items() if k not in RUNTIME_KEYS}
    runtime = {k: config[k] for k in RUNTIME_KEYS if k in config}
    if cli is not None:
        filed = [k for k in runtime if k not in cli]
        if filed:
            raise ValueError(f"config {filed[0]}: a runtime setting, taken from the command line only "
                             f"(--config {filed[0]}=...), never from params.yaml or a --configfile")
    return params, runtime


def r2m_command(runtime: dict[str, Any], default: str) -> str:
    """The r2m program every job runs, shell-quoted: ``default``, or the command line's ``r2m_command`` when it
    names an executable file (a path, quoted: never a shell command line); ValueError otherwise."""
    import os
    import shlex

    value = runtime.get("r2m_command")
    if value is None:
        return default
    if not isinstance(value, str) or not os.path.isfile(value) or not os.access(value, os.X_OK):
        raise ValueError(f"config r2m_command: {value!r} is not an executable file; give the path of an r2m "
                         "program (each job runs it quoted, never through a shell's reading of it)")
    return shlex.quote(os.path.abspath(value))


def shard_counts(runtime: dict[str, Any]) -> dict[str, int]:
    shards = runtime.get("shards") or {}
    if not isinstance(shards, dict):
        raise ValueError(f"config shards: expected a mapping stage -> number of jobs, got {shards!r}")
    out = {}
    for name, n in shards.items():
        stage = BY_NAME.get(name)
        if stage is None or stage.fanout is None:
            fan = [s.name for s in STAGES if s.fanout]
            raise ValueError(f"config shards.{name}: not a stage that can be sharded (those: {fan})")
        try:
            count = int(n)  # --config may hand numbers over as strings
        except (TypeError, ValueError):
            count = 0
        if count < 1 or str(count) != str(n).strip():
            raise ValueError(f"config shards.{name}: expected a positive integer, got {n!r}")
        out[name] = count
    return out


def shard_command(r2m: str, stage: Stage, wildcards: Any, params_file: str | None, n: int) -> str:
    fo = stage.fanout
    assert fo is not None
    import shlex

    folder = shlex.quote(fo.folder.format(**dict(wildcards.items())))
    extra = fo.shard_args.format(shard=shlex.quote(str(wildcards.shard)), n=n, folder=folder)
    return f"{stage_command(r2m, stage, wildcards, params_file)} {extra}"


def merge_command(r2m: str, stage: Stage, wildcards: Any, params_file: str | None, n: int) -> str:
    base = stage_command(r2m, stage, wildcards, params_file)
    if n <= 1 or stage.fanout is None:
        return base
    import shlex

    folder = shlex.quote(stage.fanout.folder.format(**dict(wildcards.items())))
    return f"{base} {stage.fanout.merge_args.format(folder=folder)}"


def shard_output(stage: Stage) -> str:
    assert stage.fanout is not None
    return f"{stage.fanout.folder}/{{shard}}"


def shard_log(stage: Stage) -> str:
    return f"logs/{stage.name}_shard/{stage.key()}-{{shard}}.log"


def shard_inputs(stage: Stage, n: int):
    def _inputs(wildcards: Any) -> list[str]:
        folder = stage.fanout.folder.format(**dict(wildcards.items()))
        return [f"{folder}/{i}" for i in range(n)] if n > 1 else []

    return _inputs


def wildcard_constraints_for(params: P.Params) -> dict[str, str]:
    """Each axis matches exactly its values (regex-escaped: a dataset name may hold ``.``)."""
    import re

    names = lambda xs: "|".join(re.escape(x) for x in sorted(xs, key=len, reverse=True))  # noqa: E731
    return {
        "dataset": names(params.catalog),
        "variant": names(P.VARIANT_NAMES),
        "ckpt": names(P.TRAIN_STAGES),
        "model": names(P.SUP_MODEL_NAMES),
        "seed": r"\d+",
        "shard": r"\d+",
    }


def write_merged_params(config: dict[str, Any], folder: str) -> str:
    """The merged Snakemake config for the r2m commands, in ``folder/<digest of its content>.yaml``.

    Content-addressed and written once (atomically; an existing file is never rewritten), so an
    invocation with other params — a dry run, a second ``snakemake`` beside a running one — writes
    another file and never changes the params a running job reads or saves beside its outputs."""
    import hashlib

    from r2m.utils.io import write_text

    text = yaml.safe_dump(dict(config), sort_keys=False)
    p = Path(folder) / f"{hashlib.sha256(text.encode()).hexdigest()[:20]}.yaml"
    if not p.exists():
        write_text(p, text)
    return str(p)


# --------------------------------------------------------------------------- done files
def _out_patterns(params: P.Params) -> list[tuple[Stage, Any]]:
    """Each stage output's path template as a regular expression (each axis matching its values only; a folder
    output also matches the paths inside it)."""
    import re

    values = wildcard_constraints_for(params)
    out = []
    for stage in STAGES:
        for o in stage.outs.values():
            parts = re.split(r"\{(\w+)\}", o.path)
            rx = "".join(re.escape(x) if i % 2 == 0 else f"(?P<{x}>{values.get(x, '[^/]+')})"
                         for i, x in enumerate(parts))
            out.append((stage, re.compile(rx + ("(?:/.*)?" if o.directory else ""))))
    return out


class Producers:
    """Which instance writes a path: ``(stage, axes)`` of the first output template it matches, or None (a file
    outside the DAG)."""

    def __init__(self, params: P.Params) -> None:
        self.patterns = _out_patterns(params)
        self.known: dict[str, tuple[Stage, dict[str, str]] | None] = {}

    def __call__(self, path: str) -> tuple[Stage, dict[str, str]] | None:
        if path not in self.known:
            hit = None
            for stage, rx in self.patterns:
                m = rx.fullmatch(path)
                if m is not None and all(a in m.groupdict() for a in stage.axes):
                    hit = (stage, {a: m.group(a) for a in stage.axes})
                    break
            self.known[path] = hit
        return self.known[path]


def done_file(stage: Stage, axes: dict[str, str] | None = None) -> str:
    """The instance's done file, relative to the workspace (with ``axes`` None: the rule's template)."""
    from r2m.stage.record import done_path

    return str(done_path(Path("."), stage, axes))


def input_files(paths: list[str], producers: Producers) -> list[str]:
    """What a job asks Snakemake for in place of ``paths``: the done file of the instance that writes each, the
    path itself for a file outside the DAG."""
    out = []
    for path in paths:
        hit = producers(path)
        out.append(done_file(*hit) if hit is not None else path)
    return list(dict.fromkeys(out))


def dep_inputs(template: str | Gather, params: P.Params, producers: Producers):
    """A Snakemake input function for one dependency (a :class:`Gather` expanded over the configured values)."""

    def _inputs(wildcards: Any) -> list[str]:
        bound = dict(wildcards.items())
        paths = ([path for _, path in gathered(params, template, bound)] if isinstance(template, Gather)
                 else [template.format(**bound)])
        return input_files(paths, producers)

    return _inputs


def rule_inputs(stage: Stage, params: P.Params, producers: Producers | None = None) -> dict[str, Any]:
    """The rule's ``input:``: each dependency through :func:`dep_inputs`."""
    producers = producers or Producers(params)
    return {k: dep_inputs(v, params, producers) for k, v in stage.deps.items()}


def summary_stage(stage: Stage) -> bool:
    """A stage over the whole run (no axes): its files under ``reports/`` are declared, the targets people name
    (``snakemake reports/table1.csv``); such a job has no early cutoff (Snakemake deletes what it declares)."""
    return not stage.axes


def rule_outputs(stage: Stage) -> dict[str, Any]:
    """The rule's ``output:``: the instance's done file, and a summary stage's report files."""
    out: dict[str, Any] = {"done": done_file(stage)}
    if summary_stage(stage):
        out.update({k: o.path for k, o in stage.outs.items() if not o.directory})
    return out


def target_files(stage: Stage) -> list[str]:
    """The files of an instance a user may name as a Snakemake target (``snakemake results/…/eval.json``,
    ``…/train_xe/model.pt``): its file outputs and its folders' key files (a summary stage declares its own).
    Each is the output of a rule of its own whose input is the instance's done file, marked ``ancient``: it runs
    only when the file is missing (after the instance, which rebuilds it), and deletes nothing."""
    if summary_stage(stage):
        return []
    out = []
    for o in stage.outs.values():
        out += [f"{o.path}/{m}" for m in o.members] if o.directory else [o.path]
    return out


def target_folders(stage: Stage) -> list[str]:
    """An instance's output folders, which a user may name as targets too (``snakemake models/…/train_xe``),
    each the output of a rule like :func:`target_files`' (a summary stage's folders are named by its done file)."""
    if summary_stage(stage):
        return []
    return [o.path for o in stage.outs.values() if o.directory]


def done_targets(params: P.Params, targets: tuple[str, ...]) -> list[str]:
    """The done file of every instance the ``targets`` need (``rule all`` asks for them: an instance whose record
    says it is stale, an output removed included, reruns)."""
    return [done_file(stage, bound) for stage, bound in needed_instances(params, targets)]


# --------------------------------------------------------------------------- folders the jobs will replace
def output_refusals(planned: Any) -> list[str]:
    """One line per output a planned job may not replace: ``planned`` holds ``(rule name, [(path,
    is_directory)])`` per job. Snakemake deletes a job's declared outputs before it runs (and again when it
    fails), so the stage's own check (:meth:`r2m.stage.context.StageContext.output_problems`) would come
    too late: the Snakefile's ``onstart`` runs this over every job it is about to run, before the first one
    starts. The rules of the registry's stages (and their ``_shard`` jobs) are checked by the stage's ownership
    kind (the writer check, :func:`r2m.utils.owner.write_problem`)."""
    from r2m.utils.owner import stage_kind, write_problem

    out = []
    for rule, outputs in planned:
        stage = rule.removesuffix("_shard") if rule.removesuffix("_shard") in BY_NAME else rule
        if stage not in BY_NAME:
            continue
        signature = {f for o in BY_NAME[stage].outs.values() if o.directory for f in o.adopt}
        for path, is_dir in outputs:
            problem = write_problem(path, stage_kind(stage), folder=is_dir, declared=True, adopt=signature)
            if problem:
                out.append(f"{rule}: output {path}: {problem}")
    return out


def snakemake_planned(dag: Any) -> list[tuple[str, list[tuple[str, bool]]]]:
    """The jobs Snakemake's ``dag`` is about to run, as :func:`output_refusals` takes them: a stage's outputs as the
    registry names them (Snakemake knows only its done file), a shard job's folder as declared."""
    out = []
    for job in dag.needrun_jobs():
        stage = BY_NAME.get(job.rule.name)
        if stage is None:
            out.append((job.rule.name, [(str(f), bool(f.is_directory)) for f in job.output]))
            continue
        axes = {a: str(job.wildcards_dict[a]) for a in stage.axes}
        out.append((job.rule.name, [(o.path.format(**axes), o.directory) for o in stage.outs.values()]))
    return out


def _told_to_run(dag: Any, job: Any) -> bool:
    """Whether the command line names ``job`` for rerunning (``--forcerun RULE``, ``-R FILE``, ``-F``), as Snakemake
    decides it: a job whose upstream also reruns shows that as its reason instead, but was still told to run."""
    told = job.rule in getattr(dag, "forcerules", ()) and job not in getattr(dag, "omitforce", ())
    return told or not set(getattr(dag, "forcefiles", ())).isdisjoint(job.output)


def forget_forced(dag: Any, root: Path = Path(".")) -> list[str]:
    """Delete the record of every job Snakemake runs because it was told to (``--forcerun``, ``-F``): such a job
    recomputes instead of finding itself current. Returns the records removed."""
    from r2m.stage.record import record_path

    gone = []
    for job in dag.needrun_jobs():
        stage = BY_NAME.get(job.rule.name)
        if stage is not None and (dag.reason(job).forced or _told_to_run(dag, job)):
            path = record_path(root, stage, {a: str(job.wildcards_dict[a]) for a in stage.axes})
            if path.exists():
                path.unlink()
                gone.append(str(path))
    return gone

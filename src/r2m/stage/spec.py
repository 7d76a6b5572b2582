"""The building blocks of the stage registry: :class:`Stage`, its outputs, :class:`Gather`
dependencies, fan-out and resources, and the path prefixes and source lists stages share.

What one stage instance (a stage at one value of each of its axes) is, defined once here and used by
both engines, the stage runner (:class:`r2m.stage.context.StageContext`: the params saved beside
its outputs, the training stages' resume fingerprint) and the reports: its name
(:meth:`Stage.key`), its input paths (:meth:`Stage.inputs`; a Gather's: :func:`r2m.stage.axes.gathered`) and the params
it reads (:meth:`Stage.resolved`).

Cheap to import (no torch, no pandas): Snakemake imports it on every run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from r2m import params as P
from r2m.stage.axes import AXIS_SOURCES, gathered, pick
from r2m.utils.resume import stage_key

Axis = Literal["dataset", "variant", "ckpt", "model", "seed"]


@dataclass(frozen=True)
class Gather:
    """One dependency per combination of ``over`` axes (values from the config; ``fixed`` pins some)."""

    pattern: str
    over: tuple[Axis, ...]
    fixed: tuple[tuple[str, str], ...] = ()
    dvc_path: str = ""
    sources: tuple[tuple[str, str], ...] = ()  # axis -> value list other than the default (AXIS_SOURCES)

    def source(self, axis: str) -> str:
        return dict(self.sources).get(axis, AXIS_SOURCES[axis])


@dataclass(frozen=True)
class Out:
    path: str
    kind: Literal["out", "metrics", "plots"] = "out"
    directory: bool = False
    cache: bool = True
    persist: bool = False
    plot: tuple[tuple[str, str], ...] = ()  # DVC plot options, e.g. (("x", "step"), ("y", "loss"))
    # a folder's key files, present whenever it is complete: Snakemake's outputs and its consumers' inputs (it
    # sees folders, not what is in them: a deleted one re-runs the stage), checked by every consumer on use
    # (``r2m`` refuses in one line naming the missing file); DVC hashes the whole folder anyway
    members: tuple[str, ...] = ()
    # a folder output's file that shows an r2m older than the ownership kinds wrote it (r2m.utils.io.adoptable):
    # the stage adopts such a folder as its own; the params.yaml most stages write beside their outputs
    adopt: tuple[str, ...] = ("params.yaml",)


@dataclass(frozen=True)
class FanOut:
    """Snakemake only: the stage can run as N parallel shard jobs (``--config shards='{name: N}'``)
    writing into ``folder/<shard>/``, the stage's own job then merging them. DVC runs one job."""

    folder: str
    shard_args: str = "--shard {shard} --num-shards {n} --parts-dir {folder}/{shard}"
    merge_args: str = "--merge --parts-from {folder}"


@dataclass(frozen=True)
class Resources:
    """What one job of the stage holds, for Snakemake's scheduler (``--resources gpu=N``, the SLURM
    executor's ``--gpus``/``--mem``). ``gpu`` stages use CUDA when present and run on CPU otherwise."""

    gpu: int = 0
    mem_mb: int = 4000

    def snakemake(self) -> dict[str, int]:
        """The rule's ``resources:`` (``gpu`` only where one is used, so CPU jobs ask for none)."""
        return {"mem_mb": self.mem_mb, **({"gpu": self.gpu} if self.gpu else {})}


GPU_JOB = Resources(gpu=1, mem_mb=16000)
# catalog entry items that are not the recipe's: they reach stages through the sections they feed
# (overrides, fidelity), are declared on their own (beta, gamma: ``catalog.beta``) or are the seed axis (seeds)
NOT_RECIPE = ("overrides", "fidelity", "beta", "gamma", "seeds")


def _entry_view(views: P.Views, dataset: str, sections: list[str]) -> dict[str, Any]:
    """A catalog entry's recipe items, and the given sections as that dataset sees them."""
    dumped = views.dumped(dataset)
    out = {k: v for k, v in dumped["catalog"][dataset].items() if k not in NOT_RECIPE}
    for name in sections:
        pick(dumped, name, out)
    return out


@dataclass(frozen=True)
class Stage:
    name: str
    impl: str  # "module:function" run with a StageContext
    help: str
    axes: tuple[Axis, ...]
    deps: dict[str, str | Gather] = field(default_factory=dict)
    outs: dict[str, Out] = field(default_factory=dict)
    params: tuple[str, ...] = ()  # params.yaml sections the stage reads
    fanout: FanOut | None = None
    resources: Resources = Resources()
    # Snakemake's rule ``priority:``: among the jobs ready at once, higher runs first. About the CPU seconds of
    # the longest chain of jobs the stage starts on the demo (itself to the last table, measured from the
    # logs), so the long chains (R2M's train_xe -> train_s -> ...) start early and no core idles at the end
    priority: int = 0
    sources: tuple[tuple[str, str], ...] = ()  # axis -> value list other than the default
    # values the stage's paths pin for an axis it does not have (retrieval_r2m: R2M's final checkpoint, variant
    # r2m): its instances run at the seeds of that run (:func:`r2m.pipeline.resolved.instances`)
    fixed: tuple[tuple[str, str], ...] = ()
    # files outside the DAG the stage reads: "module:function" ``(params, dataset) -> digest`` of what it
    # records of them, the rule's ``external`` param under Snakemake (compared by content); DVC cannot list
    # them per instance, so such a stage is ``always_changed`` there and its output (a digest of those
    # files) is what later stages depend on
    external: str = ""
    always_changed: bool = False

    def source(self, axis: str) -> str:
        return dict(self.sources).get(axis, AXIS_SOURCES[axis])

    # ------------------------------------------------------------------ one instance
    def key(self, bound: Mapping[str, Any] | None = None) -> str:
        """An instance's name: its axis values joined by ``-`` (``all`` without axes), as logs, ``.stamps/``
        files, DVC (``stage@key``) and resume folders spell it; without ``bound``, the ``{axis}`` template."""
        return stage_key({a: f"{{{a}}}" if bound is None else bound[a] for a in self.axes})

    def inputs(self, params: P.Params, bound: Mapping[str, str]) -> list[str]:
        """Every path the instance at ``bound`` reads: each dependency, a :class:`Gather` expanded."""
        out: list[str] = []
        for dep in self.deps.values():
            out += [p for _, p in gathered(params, dep, bound)] if isinstance(dep, Gather) else [dep.format(**bound)]
        return out

    def resolved(self, params: P.Params | P.Views, bound: Mapping[str, str]) -> dict[str, Any]:
        """The params the instance at ``bound`` reads, as its dataset's run sees them: the sections
        :attr:`params` names (``{model}`` filled in) with the catalog entry's ``overrides`` merged, the fidelity
        profile resolved, a baseline's ``per_model`` keys applied to its own model, the run's seed added
        (:func:`r2m.params.with_seed`); ``catalog``: the entry's recipe items (never :data:`NOT_RECIPE`),
        ``catalog.X``: item X. The params saved beside the outputs and the training stages' resume fingerprint
        (not what reruns an instance: the engines go by its run record, :mod:`r2m.stage.record`). ``params``:
        the run's :class:`r2m.params.Views` where many instances are resolved (each view made once), else the
        params themselves."""
        views = params if isinstance(params, P.Views) else P.Views(params)
        dataset = bound.get("dataset")
        # a dataset outside the catalog: an in-process caller's context (the engines know only catalog entries)
        seen = (dataset if dataset and dataset in views.params.catalog else None, bound.get("seed"))
        view, dumped = views.view(*seen), views.dumped(*seen)
        data: dict[str, Any] = {}
        for name in self.params:
            name = name.format(**{a: bound[a] for a in self.axes})
            head, _, item = name.partition(".")
            if head == "catalog" and dataset:
                entry = dumped["catalog"].get(dataset) or {}
                data.setdefault("catalog", {}).update(
                    {item: entry.get(item)} if item else {k: v for k, v in entry.items() if k not in NOT_RECIPE})
            elif head == "catalog" and item:  # a stage over no dataset reading one item of every entry (seeds)
                data.setdefault("catalog", {}).update({ds: {item: e.get(item)} for ds, e in dumped["catalog"].items()})
            elif head == "catalog":  # a stage over no dataset reading every entry: as each dataset sees it
                others = [n for n in self.params if n.partition(".")[0] not in ("catalog", "datasets", "baselines")]
                data["catalog"] = {ds: _entry_view(views, ds, others) for ds in views.params.catalog}
            elif head == "train_sup" and not item and "model" in bound:
                data[head] = view.train_sup.for_model(bound["model"]).model_dump(mode="json")
            else:
                pick(dumped, name, data)
        return data

    @property
    def log(self) -> str:
        return f"logs/{self.name}/{self.key()}.log"

    def command_args(self, fmt: str) -> str:
        """``--dataset X --variant Y`` with values formatted by ``fmt`` (e.g. ``{wildcards.%s}``)."""
        return " ".join(f"--{a} {fmt % a}" for a in self.axes)


D = "data/{dataset}"
# key files (Out.members) of folders two kinds of stage write
PREPARED = ("images.parquet", "corpus.txt", "manifest.json")  # datasets.base.write_prepared
REFERENCES = ("references.json",)  # datasets.base.write_references (+ train_references.json when paired)
FEATURES = ("features.h5", "index.parquet", "meta.json")  # vision.feature_store
# what a stage gathering over the seed axis reads: each run's seeds (the top-level list, a catalog entry's own)
SEEDS = ("seeds", "catalog.seeds")
# a run (one variant or baseline at one seed) keeps its checkpoints and results under its seed's folder
M = "models/{dataset}/{variant}/s{seed}"
R = "results/{dataset}/{variant}/s{seed}/{ckpt}"

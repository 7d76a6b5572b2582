"""The building blocks of the stage registry: :class:`Stage`, its outputs, :class:`Gather`
dependencies, fan-out and resources, and the path prefixes and source lists stages share.

Cheap to import (no torch, no pandas): Snakemake imports it on every run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from r2m.pipeline.axes import AXIS_SOURCES

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


@dataclass(frozen=True)
class Stage:
    name: str
    impl: str  # "module:function" run with a StageContext
    help: str
    axes: tuple[Axis, ...]
    deps: dict[str, str | Gather] = field(default_factory=dict)
    outs: dict[str, Out] = field(default_factory=dict)
    params: tuple[str, ...] = ()  # params.yaml sections the stage reads
    # files besides deps and code that the stage reads (e.g. data/dictionaries); its code dependencies are
    # not declared: they are the files its ``impl`` imports, transitively (r2m.pipeline.resolved.code_files)
    data: tuple[str, ...] = ()
    fanout: FanOut | None = None
    resources: Resources = Resources()
    # Snakemake's rule ``priority:``: among the jobs ready at once, higher runs first. About the CPU seconds of
    # the longest chain of jobs the stage starts on the demo (itself to the last table, measured from the
    # logs), so the long chains (R2M's train_xe -> train_s -> ...) start early and no core idles at the end
    priority: int = 0
    sources: tuple[tuple[str, str], ...] = ()  # axis -> value list (DVC matrix) other than the default
    # files outside the DAG the stage reads: "module:function" ``(params, dataset) -> digest`` of what it
    # records of them, the rule's ``external`` param under Snakemake (compared by content); DVC cannot list
    # them per matrix item, so such a stage is ``always_changed`` there and its output (a digest of those
    # files) is what later stages depend on
    external: str = ""
    always_changed: bool = False

    def source(self, axis: str) -> str:
        return dict(self.sources).get(axis, AXIS_SOURCES[axis])

    @property
    def log(self) -> str:
        key = "-".join(f"{{{a}}}" for a in self.axes) or "all"
        return f"logs/{self.name}/{key}.log"

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

"""What a stage implementation receives: its resolved params, paths, runtime, logger and command-line flags.

A stage implementation is a function ``run(ctx: StageContext) -> None`` registered in
:mod:`r2m.stage.registry`. It reads inputs from ``ctx.deps[...]``, writes outputs to
``ctx.outs[...]`` (atomically, see :mod:`r2m.utils.io`) and calls :meth:`StageContext.save_params`
for each output folder so the resolved params sit beside what they produced.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from r2m import params as P
from r2m.runtime import Runtime
from r2m.stage.axes import gathered
from r2m.stage.registry import Gather, Stage, folder_members
from r2m.utils.guard import BadInput, inside
from r2m.utils.io import write_text
from r2m.utils.owner import marker_mismatch, stage_kind, write_problem
from r2m.utils.reads import unrecorded


@dataclass
class StageContext:
    stage: Stage
    params: P.Params  # already merged with the dataset's overrides
    runtime: Runtime = field(default_factory=Runtime)
    dataset: str | None = None
    variant: str | None = None
    ckpt: str | None = None
    model: str | None = None
    seed: str | None = None  # the run's seed (the DAG's seed axis): shifts every section's seed (P.with_seed)
    root: Path = Path(".")
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("r2m"))
    args: argparse.Namespace | None = None  # the command line's flags (a stage module's own too); None in-process
    # the params before the run's seed is added: what :meth:`resolved` resolves (as both engines do)
    base: P.Params = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # a stage always sees explicit ``fidelity`` items (for_dataset resolves them already)
        if self.dataset is not None and self.dataset in self.params.catalog:
            self.params = P.with_profile(self.params, self.dataset)
        self.base = self.params
        if "seed" in self.stage.axes and self.seed is None:  # in-process callers: the first run's seed
            self.seed = "0"
        if self.seed is not None:
            self.params = P.with_seed(self.params, int(self.seed))

    # ------------------------------------------------------------------ paths
    @property
    def axes(self) -> dict[str, str]:
        return {a: getattr(self, a) for a in self.stage.axes}

    def path(self, template: str, **extra: str) -> Path:
        """``root / template`` with the axes filled in; refused (one line) when it would leave ``root``."""
        return inside(self.root, template.format(**{**self.axes, **extra}), f"{self.stage.name}: path")

    @property
    def deps(self) -> dict[str, Path]:
        return {k: self.path(v) for k, v in self.stage.deps.items() if not isinstance(v, Gather)}

    @property
    def outs(self) -> dict[str, Path]:
        return {k: self.path(o.path) for k, o in self.stage.outs.items()}

    def incomplete_inputs(self) -> list[str]:
        """One line per input folder that exists but is incomplete: a key file its producer always writes
        (:attr:`r2m.stage.spec.Out.members`) is missing, or a file its ownership marker lists
        (:func:`r2m.utils.owner.mark_owned`) is missing or changed size. A damaged output is refused, not used."""
        out = []
        for template in (v for v in self.stage.deps.values() if isinstance(v, str)):
            found = folder_members(template, self.axes)
            folder = self.path(template)
            if found is None or not folder.is_dir():
                continue
            gone = next((f"{folder / n} is missing" for n in found[1] if not (folder / n).exists()), None)
            gone = gone or marker_mismatch(folder)
            if gone:
                out.append(f"{gone}: {folder} (output of {found[0]}) is incomplete; "
                           f"re-run {found[0]} (snakemake and dvc repro rebuild it)")
        return out

    def output_problems(self) -> list[str]:
        """One line per declared output this run may not write, found before any work (the writer check,
        :func:`r2m.utils.owner.write_problem`, by the stage's kind): a path below a file or inside another
        command's folder, a file output where a folder is, a folder output r2m may not replace as this stage's
        (a user's file in it, another command's output, a marker naming no kind or listing no files)."""
        out = []
        for key, o in self.stage.outs.items():
            path = self.outs[key]
            problem = write_problem(path, stage_kind(self.stage.name), folder=o.directory, declared=True,
                                    adopt=o.adopt)
            if problem:
                out.append(f"output {path}: {problem}")
        return out

    def gather(self, name: str) -> list[tuple[dict[str, str], Path]]:
        """Expand a :class:`Gather` dependency over the configured datasets/variants/ckpts (and each run's seeds)."""
        g = self.stage.deps[name]
        assert isinstance(g, Gather)
        return [(keys, inside(self.root, path, f"{self.stage.name}: path"))
                for keys, path in gathered(self.params, g, self.axes)]

    # ------------------------------------------------------------------ params
    @property
    def entry(self) -> P.DatasetEntry:
        assert self.dataset is not None
        return self.params.catalog[self.dataset]

    def section(self, name: str) -> Any:
        return getattr(self.params, name)

    def resolved(self) -> dict[str, Any]:
        """The params this instance reads (:meth:`r2m.stage.spec.Stage.resolved`), for its outputs and resume."""
        with unrecorded():  # bookkeeping (saved beside the outputs, resume fingerprints), not a read
            return self.stage.resolved(self.base, self.axes)

    def save_params(self, folder: str | Path, filename: str = "params.yaml") -> Path:
        """Write the resolved params (:meth:`resolved`) into an output folder, for people to read."""
        return write_text(Path(folder) / filename, P.dump(self.resolved()))


FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")


def setup_logging(log_path: Path | None, level: int = logging.INFO) -> logging.Logger:
    """The ``r2m`` logger: to stderr, and to ``log_path`` when given (:func:`log_to_file`; the stage runner
    opens its job's log only once it holds the instance's lock, so a refused second run never touches it)."""
    logger = logging.getLogger("r2m")
    logger.setLevel(level)
    logger.handlers.clear()
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(FORMAT)
    logger.addHandler(h)
    logger.propagate = False
    if log_path is not None:
        log_to_file(logger, log_path)
    return logger


def log_to_file(logger: logging.Logger, log_path: Path) -> None:
    """Also log to ``log_path``, started afresh (a folder there, or a link, is refused in one line)."""
    if log_path.is_symlink() or log_path.is_dir():
        raise BadInput(f"log {log_path}: is a {'link' if log_path.is_symlink() else 'folder'}, not a log file; "
                       "move it away")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fh = logging.FileHandler(log_path, mode="w")
    fh.setFormatter(FORMAT)
    logger.addHandler(fh)

"""The one training loop of the project: R²M's four stages and every supervised baseline run here.

A trainer builds its model, optimiser, data and objective, and hands them to :func:`fit` as a
:class:`Loop`; the loop owns everything between the first and the last step:

* **resume** — ``last.pt`` in the stage's resume folder (model, optimiser, step, loss rows, RNG
  state, selection state) is loaded when its fingerprint matches (:func:`restore_last`), and
  written every ``checkpoint_every`` steps, at the last step and on preemption (rank 0 only);
* **preemption** — SIGTERM/SIGINT stop at the next step boundary after saving ``last.pt``
  (:class:`r2m.utils.resume.Preemption`); the fault suite's ``R2M_FAULT`` hook fires after each step;
* **the step** — :mod:`r2m.training.step`: forward under autocast (through DDP when distributed),
  ``zero_grad``, ``backward``, global-norm clipping and ``optimizer.step``; with a static mode the
  batch is padded to fixed shapes first (``Loop.static``), and on CUDA the whole step may be one
  CUDA graph. The step returns its losses as a device vector: no host read per step;
* **the deferred non-finite check** — the step losses stay on the device and are read in one host
  read every ``checkpoint_every`` steps, before every validation, selection or ``last.pt`` write
  and at the end (:class:`Pending`); a NaN/Inf raises :class:`NonFiniteLoss` (one line naming the
  run, the first bad step and the learning rate to lower) before anything is written, so no
  ``last.pt`` holds poisoned weights;
* **validation and selection** — every ``eval_every`` steps and at the last: the mean validation
  components (a ``val`` row) and, given a selector, its score; the best-scoring weights are kept;
* **loss rows** — ``[step, split, loss, *columns]``, written as ``loss.tsv`` by :func:`write_loss`;
* **timings** — the loop's seconds and those of its validation passes and selections
  (:meth:`Result.timings`), kept across a resume; a trainer adds them to its metrics only when asked
  (``--timings``, what ``r2m bench scale`` passes): by default the same inputs give the same bytes.

What stays with the trainer: building the model (and its init checkpoint), the output files and
their metrics. :func:`epoch_batch` is the shuffled batcher both image sets draw from.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

from r2m.stage.context import StageContext
from r2m.training import distributed
from r2m.training import step as ST
from r2m.utils import resume as RS
from r2m.utils.checkpoint import CheckpointError, load_checkpoint, save_torch
from r2m.utils.digest import data_digest, tree_digest
from r2m.utils.io import file_digest, write_text
from r2m.utils.progress import progress

Selector = Callable[[Any, int], float]
"""``select(model, step) -> score`` (higher is better), called at every validation step."""

LAST_KEYS = ("model", "optimizer", "step", "rows", "rng", "fingerprint")


class NonFiniteLoss(RuntimeError):
    """Raised when a training loss becomes NaN or Inf."""


# --------------------------------------------------------------------------- batcher
def epoch_batch(n: int, batch_size: int, seed: int, step: int) -> tuple[np.ndarray, int, int]:
    """The indices of training batch ``step`` over ``n`` rows, with its ``(epoch, index in epoch)``.

    Every epoch is a permutation drawn from ``(seed, epoch)`` cut into ``n // batch_size`` full
    batches (the rest of the epoch is dropped), so a run resumed at step s draws what a run that
    never stopped would have drawn."""
    bs = min(batch_size, n)
    epoch, b = divmod(step, n // bs)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return perm[b * bs: (b + 1) * bs], epoch, b


# --------------------------------------------------------------------------- resume state
def resume_folder(ctx: StageContext) -> Path:
    """Where the stage keeps ``last.pt`` while it runs (not a declared output)."""
    return RS.resume_dir(ctx.root, ctx.stage.name, ctx.axes)


def fingerprint(ctx: StageContext) -> str:
    """What ``last.pt`` must have been written with to be resumed: the resolved params, the init
    checkpoint's digest and the digest of every other input the stage reads (corpus, vocabulary,
    concepts, features, prepared data…: :func:`r2m.utils.digest.tree_digest`, cached by size and
    mtime), so a run whose data changed starts over instead of resuming on other data."""
    data: dict[str, Any] = {"resolved": ctx.resolved()}
    if "init" in ctx.deps:
        data["init"] = file_digest(ctx.deps["init"] / "model.pt")
    cache = ctx.root / ".r2m" / "digests" / ctx.stage.name / f"{ctx.stage.key(ctx.axes)}.json"
    data["inputs"] = {name: tree_digest(path, cache) for name, path in sorted(ctx.deps.items())
                      if name != "init" and path.exists()}
    return data_digest(data, spaced=True, default=str)


def load_last(path: Path) -> dict[str, Any]:
    """``last.pt`` checked: clear one-line errors naming the file, suggesting ``--fresh``."""
    last = load_checkpoint(path, LAST_KEYS, hint="delete it or rerun with --fresh")
    if not isinstance(last["model"], dict) or "state_dict" not in last["model"]:
        raise CheckpointError(f"{path}: 'model' holds no state_dict; delete it or rerun with --fresh")
    return last


def rng_state() -> dict[str, Any]:
    s: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["cpu"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def restore_last(log, name: str, work: Path, fp: str, model, opt, fresh: bool = False) -> dict[str, Any] | None:
    """The resume state ``work/last.pt`` loaded into ``model``/``opt`` (and the RNGs) when it was
    written with the same fingerprint, else ``None``; ``fresh`` deletes it first. A state that does
    not fit the model is a one-line :class:`CheckpointError` naming the file."""
    last_path = work / "last.pt"
    if fresh:
        RS.clear(work)
    if not last_path.exists():
        return None
    last = load_last(last_path)
    if last["fingerprint"] != fp:
        log.info("%s: %s is from other params, init or input data; starting over", name, last_path)
        return None
    try:
        model.load_state_dict(last["model"]["state_dict"])
        opt.load_state_dict(last["optimizer"])
    except (RuntimeError, ValueError, KeyError) as err:
        raise CheckpointError(f"{last_path}: does not fit the model ({str(err).splitlines()[0][:160]}); "
                              "delete it or rerun with --fresh") from None
    try:
        set_rng_state(last["rng"])
    except (KeyError, TypeError, RuntimeError, ValueError) as err:
        raise CheckpointError(f"{last_path}: RNG state missing or malformed ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:80] if str(err) else 'rng'}); delete it or rerun "
                              "with --fresh") from None
    log.info("%s: resuming from %s at step %d", name, last_path, int(last["step"]))
    return last


# --------------------------------------------------------------------------- loss rows
def write_loss(path: Path, columns: tuple[str, ...], rows: list[list[Any]]) -> None:
    """``loss.tsv``: ``step split loss *columns``, floats as ``%.6g``, missing values empty."""
    head = "\t".join(("step", "split", "loss", *columns))
    lines = [head] + ["\t".join("" if x is None else (f"{x:.6g}" if isinstance(x, float) else str(x)) for x in r)
                      for r in rows]
    write_text(path, "\n".join(lines) + "\n")


def loss_summary(rows: list[list[Any]]) -> dict[str, float | None]:
    """``train_loss`` (the last step's), ``train_loss_last10`` and ``val_loss`` (the last val row)."""
    train = [r for r in rows if r[1] == "train"]
    val = [r for r in rows if r[1] == "val"]
    return {"train_loss": train[-1][2] if train else None,
            "train_loss_last10": (sum(r[2] for r in train[-10:]) / len(train[-10:])) if train else None,
            "val_loss": val[-1][2] if val else None}


def finite_or_none(metrics: dict[str, Any]) -> dict[str, Any]:
    """NaN/Inf floats as ``None`` (JSON has neither)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}


# --------------------------------------------------------------------------- what a trainer hands over
class Schedule(Protocol):
    steps: int
    eval_every: int
    checkpoint_every: int
    clip: float


class Ratio(NamedTuple):
    """A validation component averaged over tokens, not rows: :func:`fit` sums ``num`` and ``den``
    over the validation batches and logs ``num / den`` (e.g. a held-out token accuracy)."""

    num: Tensor
    den: Tensor


@dataclass(frozen=True)
class LoopObjective:
    """A model's training objective as the loop sees it.

    ``loss(model, batch) -> (loss, components)`` is the training step's forward (it runs through
    DDP when distributed); ``val(model, batch) -> components`` the validation forward (no grad, eval
    mode, plain model; a :class:`Ratio` component is averaged over its own denominator); ``val_loss(mean
    components) -> float`` the ``loss`` column of a val row."""

    columns: tuple[str, ...]
    loss: Callable[[Any, Any], tuple[Tensor, dict[str, Tensor]]]
    val: Callable[[Any, Any], dict[str, Tensor]]
    val_loss: Callable[[dict[str, float]], float]


@dataclass
class Loop:
    """Everything :func:`fit` needs. ``batches(start_step)`` yields the training batches from that
    step on, ``val_batches()`` the (bounded) validation batches; ``name`` is the fault-injection
    point and the log prefix, ``desc`` (default ``name``) labels the progress bar and the
    non-finite-loss message, ``lr_param`` names the learning rate there."""

    name: str
    model: Any
    optimizer: torch.optim.Optimizer
    objective: LoopObjective
    schedule: Schedule
    batches: Callable[[int], Iterator[Any]]
    val_batches: Callable[[], Iterable[Any]]
    device: torch.device
    work: Path
    fingerprint: str
    log: Any
    lr_param: str
    fresh: bool = False
    select: Selector | None = None
    dist: distributed.Dist = field(default_factory=distributed.Dist)
    autocast: Callable[[], Any] = contextlib.nullcontext
    desc: str = ""
    mode: ST.StepMode = ST.StepMode()
    static: Callable[[Any], Any] | None = None  # pads a batch to static shapes (used when mode.static)


@dataclass
class Best:
    score: float
    step: int
    state_dict: dict[str, Tensor]


@dataclass
class Result:
    """Where the loop ended: the step, the loss rows, the best selection (if any), every selection
    score as ``(step, score)``, the training time (resumed runs included) and the rows seen; the
    validation passes made and the wall seconds of all of them and of all selections together."""

    step: int
    rows: list[list[Any]]
    best: Best | None
    selections: list[tuple[int, float]]
    elapsed: float
    seen: int
    step_info: dict[str, Any] = field(default_factory=dict)  # :func:`r2m.training.step.graph_record`
    validations: int = 0
    val_s: float = 0.0
    select_s: float = 0.0

    def timings(self) -> dict[str, Any]:
        """The loop's wall seconds (``loop_s``, validations and selections included), its validation
        passes and selections, each count with the seconds of all of them together."""
        return {"loop_s": self.elapsed, "validations": self.validations, "val_s": self.val_s,
                "selections": len(self.selections), "select_s": self.select_s}

    def keep_best(self, model) -> int:
        """Load the best-scoring weights into ``model`` (when there was a selection); the step kept."""
        if self.best is None:
            return self.step
        model.load_state_dict(self.best.state_dict)
        return self.best.step


def state_snapshot(model) -> dict[str, Tensor]:
    """A copy of the model's weights on the CPU (unaffected by later steps)."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------- deferred check
@dataclass
class Pending:
    """Train rows whose values are still on the device: ``(row index, step, stats, names)`` with
    ``stats`` the step's :func:`r2m.training.step.pack` vector."""

    items: list[tuple[int, int, Tensor, tuple[str, ...]]] = field(default_factory=list)

    def add(self, row: int, step: int, stats: Tensor, names: tuple[str, ...]) -> None:
        self.items.append((row, step, stats, names))

    def flush(self, rows: list[list[Any]], columns: tuple[str, ...]) -> tuple[int, float, dict[str, float]] | None:
        """Fill the pending rows in (one host read); the first step whose loss is not finite as
        ``(step, loss, components)``, else ``None``."""
        if not self.items:
            return None
        values = torch.cat([s.reshape(-1) for _, _, s, _ in self.items]).tolist()
        bad, at = None, 0
        for row, step, _, names in self.items:
            loss, comp = values[at], dict(zip(names, values[at + 1: at + 1 + len(names)], strict=True))
            at += 1 + len(names)
            rows[row][2:] = [loss, *(comp.get(c) for c in columns)]
            if bad is None and not math.isfinite(loss):
                bad = (step, loss, comp)
        self.items.clear()
        return bad


# --------------------------------------------------------------------------- the loop
def _restored_best(b: dict[str, Any] | None) -> Best | None:
    if not b:
        return None
    return Best(float(b["score"]), int(b["step"]), b["state_dict"])


def fit(spec: Loop) -> Result:
    """Train ``spec.model`` for ``spec.schedule.steps`` steps (resuming when it can); see the module."""
    model, opt, obj, tp, dist = spec.model, spec.optimizer, spec.objective, spec.schedule, spec.dist
    step_fn = dist.wrap(model, obj.loss, spec.device)
    train_step = ST.make_step(ST.EagerStep(model, opt, step_fn, tp.clip, spec.autocast, dist.mean),
                              spec.mode, spec.log, spec.desc or spec.name)
    static = spec.static if spec.mode.static and spec.static is not None else (lambda b: b)
    pending = Pending()
    last_path = spec.work / "last.pt"
    step, rows, best, selections = 0, [], None, []
    elapsed_prev, seen = 0.0, 0
    validations, val_s, select_s = 0, 0.0, 0.0  # the validation passes made, their and the selections' seconds
    last = restore_last(spec.log, spec.name, spec.work, spec.fingerprint, model, opt, fresh=spec.fresh)
    if last is not None:
        step, rows, best = int(last["step"]), list(last["rows"]), _restored_best(last.get("best"))
        selections = [(int(s), float(v)) for s, v in last.get("selections", [])]
        elapsed_prev, seen = float(last.get("elapsed", 0.0)), int(last.get("seen", 0))
        timed = last.get("timings") or {}
        validations, val_s = int(timed.get("validations", 0)), float(timed.get("val_s", 0.0))
        select_s = float(timed.get("select_s", 0.0))

    def evaluate() -> dict[str, float]:
        """The mean validation components over the rows; a :class:`Ratio` summed part by part."""
        model.eval()
        tot: dict[str, float] = {}
        ratios: dict[str, list[float]] = {}
        n = 0
        with torch.no_grad(), spec.autocast():
            for b in spec.val_batches():
                b = b.to(spec.device)
                for k, v in obj.val(model, b).items():
                    if isinstance(v, Ratio):
                        r = ratios.setdefault(k, [0.0, 0.0])
                        r[0], r[1] = r[0] + float(v.num), r[1] + float(v.den)
                    else:
                        tot[k] = tot.get(k, 0.0) + float(v) * len(b)
                n += len(b)
        model.train()
        if not n:
            return {}
        return {**{k: v / n for k, v in tot.items()},
                **{k: (num / den if den else math.nan) for k, (num, den) in ratios.items()}}

    def eval_and_select() -> None:
        nonlocal best, validations, val_s, select_s
        t_val = time.perf_counter()
        ev = evaluate()
        if ev:
            rows.append([step, "val", obj.val_loss(ev), *(ev.get(c) for c in obj.columns)])
            took = time.perf_counter() - t_val
            validations, val_s = validations + 1, val_s + took
            spec.log.info("%s step %d: val %s in %.2f s", spec.name, step, " ".join(f"{k}={v:.4f}" for k, v in ev.items()),
                          took)
        if spec.select is not None:
            t_sel, c_sel = time.perf_counter(), time.process_time()
            score = float(spec.select(model, step))
            selections.append((step, score))
            if best is None or score > best.score:
                best = Best(score, step, state_snapshot(model))
            took = time.perf_counter() - t_sel
            select_s += took
            spec.log.info("%s step %d: selection score %.4f (best %.4f @ %d) in %.2f s (%.2f CPU s)", spec.name,
                          step, score, best.score, best.step, took, time.process_time() - c_sel)

    def save_last() -> None:
        save_torch(last_path, {"model": model.checkpoint(), "optimizer": opt.state_dict(), "step": step,
                               "rows": rows, "rng": rng_state(), "fingerprint": spec.fingerprint,
                               "best": ({"score": best.score, "step": best.step, "state_dict": best.state_dict}
                                        if best else None),
                               "selections": selections,
                               "elapsed": elapsed_prev + (time.perf_counter() - t0), "seen": seen,
                               "timings": {"validations": validations, "val_s": val_s, "select_s": select_s}})

    def check() -> None:
        """The deferred non-finite check: read the pending step losses (one host read)."""
        bad = pending.flush(rows, obj.columns)
        if bad is not None:
            at, value, comp = bad
            raise NonFiniteLoss(f"{spec.desc or spec.name}: loss is {value} at step {at} "
                                f"({', '.join(f'{k}={v:.4g}' for k, v in comp.items())}); "
                                f"try a lower learning rate (params: {spec.lr_param})")

    model.train()
    t0 = time.perf_counter()
    batches = spec.batches(step)
    bar = progress(total=tp.steps, initial=step, desc=spec.desc or spec.name)
    stop = RS.Preemption()  # SIGTERM/SIGINT: finish the step, save last.pt, stop
    with stop:
        while step < tp.steps:
            batch = ST.to_device(static(dist.shard(next(batches))), spec.device)
            stats, names = train_step(batch)
            step += 1
            seen += dist.global_rows(len(batch))
            rows.append([step, "train", None, *(None for _ in obj.columns)])  # filled in by check()
            pending.add(len(rows) - 1, step, stats, names)
            bar.update(1)
            evaluating = step % tp.eval_every == 0 or step == tp.steps
            checkpoint = step % tp.checkpoint_every == 0 or step == tp.steps
            if evaluating or checkpoint:
                check()
            if evaluating:
                eval_and_select()
            if checkpoint and dist.is_main:
                save_last()
            RS.inject(spec.name, step)  # fault suite (R2M_FAULT), a no-op otherwise
            if stop.requested:
                check()
                if step % tp.checkpoint_every and step != tp.steps and dist.is_main:
                    save_last()
                bar.close()
                stop.check(f"step {step} of {tp.steps}", last_path)
    check()
    bar.close()
    return Result(step, rows, best, selections, elapsed_prev + time.perf_counter() - t0, seen,
                  ST.graph_record(train_step, spec.mode), validations, val_s, select_s)

"""``r2m bench scale``: every stage on a ``rehearsal`` dataset at several fractions of a benchmark's size.

For each size (a fraction of the benchmark: 0.01 = 1 %) it writes a scratch workspace (``params.yaml``
with one catalog entry of kind ``rehearsal`` at that ``scale``) and runs the chosen stages there one after
another as ``r2m <stage>`` child processes. Per stage and size it records the wall time, the CPU time
and the peak RSS of the child (``os.wait4``: its own rusage, java and other grandchildren it waited for
included) and the bytes of the stage's outputs. Then, per stage, it fits the growth exponent ``b`` of
``time = a * size ** b`` (least squares on log-log), predicts the full-size time, and writes
``scale.csv``, ``scale.md`` and ``scale.png`` (log-log time and peak RSS against size).

A stage whose time predicted from two or more smaller sizes exceeds ``--budget`` seconds is not run at
that size (nor are the stages that read its outputs), and one that runs past the budget is stopped: the
table says "capped" and why. ``--merge`` adds an earlier run's rows (other sizes) to the table and fits.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KIND = "bench:scale"  # the ownership kind of --out and of the scratch workspaces (r2m.utils.owner)
# the R2M chain (variant r2m, seed 0, captions of the final checkpoint) and SAT, the baseline with the grid
DEFAULT_STAGES = ("prepare", "references", "detect_concepts", "extract_features", "corpus_concepts", "build_vocab",
                  "train_xe", "train_s", "train_m", "train_i", "caption", "evaluate",
                  "extract_features_sup", "sup_vocab", "train_sup", "caption_sup")
AXES = {"variant": "r2m", "seed": "0", "ckpt": "train_i", "model": "sat"}
# the rehearsal entry: benchmark-wide sizes are the recipe's; training runs a few steps (its cost per step
# does not grow with the data; its memory must not either), features at the benchmarks' widths
TRAIN = {"steps": 4, "batch_size": 64, "eval_every": 4, "checkpoint_every": 4}
# flags of a stage's command: a training stage starts over (never resumes an earlier run's last.pt) and adds
# its loop's seconds to its metrics file (--timings: the figures read_metrics reads);
# train_sup's closing perplexities pass forward over every train (<= 50,000), val and test pair, at 4 steps
# about 6x the training at 1 % (SAT, hidden 1,000, on a CPU): measured apart, not in the stage's figures
STAGE_FLAGS = {"train_xe": ["--fresh", "--timings"], "train_s": ["--fresh", "--timings"],
               "train_m": ["--fresh", "--timings"], "train_i": ["--fresh", "--timings"],
               "train_e2e": ["--timings"], "pretrain_sup": ["--timings"],
               "train_sup": ["--fresh", "--no-perplexity", "--timings"]}
ENTRY: dict[str, Any] = {
    "kind": "rehearsal", "shape": "coco", "corpus": "shutterstock", "seed": 0, "image_size": 32,
    "fidelity": "paper", "beta": 1.0, "gamma": 1.0,
    "overrides": {
        "detect_concepts": {"backend": "precomputed"},
        "extract_features": {"backend": "random_cnn", "batch_size": 256,
                             "options": {"size": 32, "dim": 1536, "kinds": ["pooled"]}},
        "sup_features": {"backend": "random_cnn", "batch_size": 256,
                         "options": {"size": 32, "dim": 512, "grid_side": 14, "kinds": ["pooled", "grid"]}},
        "train_xe": TRAIN, "train_s": TRAIN, "train_m": TRAIN, "train_i": TRAIN,
        "train_sup": {**TRAIN, "per_model": {"sat": {"select_by": "last"}}},
        "sup_vocab": {"min_count": 5},
        "evaluate": {"scorers": ["bleu", "meteor", "rouge", "cider"]},
    },
}


@dataclass
class Row:
    stage: str
    size: float
    status: str = "ok"  # ok | failed | capped
    wall_s: float = math.nan
    cpu_s: float = math.nan
    peak_rss_mb: float = math.nan
    out_bytes: int = 0
    note: str = ""
    # from the stage's metrics file (training stages, --timings): its loop's steps and seconds, and the
    # validation passes and checkpoint selections in it
    steps: int = 0
    loop_s: float = math.nan
    selections: int = 0
    select_s: float = math.nan  # wall seconds of all its selections together
    validations: int = 0
    val_s: float = math.nan  # wall seconds of all its validation passes together


@dataclass(frozen=True)
class GpuFigure:
    """A throughput measured on a GPU (docs/guide/benchmarks.md)."""
    value: float
    unit: str
    card: str
    date: str
    source: str


GPU_FIGURES_FILE = Path(__file__).with_name("gpu_figures.csv")


def load_gpu_figures(path: Path = GPU_FIGURES_FILE) -> dict[str, GpuFigure]:
    """The GPU figures measured so far (a table file beside this module, ``#`` lines are comments):
    the H100 column is computed from these and nothing else. A malformed row is an error naming the file and line."""
    figures: dict[str, GpuFigure] = {}
    rows = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if line.strip() and not line.lstrip().startswith("#")][1:]  # the header row first
    for n, line in rows:
        try:
            key, value, unit, card, date, source = next(csv.reader([line]))
            figures[key] = GpuFigure(float(value), unit, card, date, source)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: a GPU figure row is key,value,unit,card,date,source ({e})") from None
    return figures


GPU_FIGURES: dict[str, GpuFigure] = load_gpu_figures()
# stages whose work runs on the device; every other stage is a CPU stage (its H100 time is its CPU time)
DEVICE_STAGES = ("detect_concepts", "extract_features", "extract_features_sup", "train_xe", "train_s", "train_m",
                 "train_i", "caption", "pretrain_sup", "train_sup", "caption_sup")


@dataclass(frozen=True)
class Schedule:
    """A training stage's schedule in the project's params (the paper's): steps, batch, evaluations."""
    steps: int
    batch_size: int
    eval_every: int
    selects: bool  # a checkpoint selection (captions of the val images) at each evaluation

    @property
    def evaluations(self) -> int:
        """Evaluations the loop makes: every ``eval_every`` steps and at the last step."""
        return self.steps // self.eval_every + (1 if self.steps % self.eval_every else 0)


@dataclass(frozen=True)
class Plan:
    """What the predictions need: the paper's schedules, the benchmark's image counts, the bench's batch."""
    schedules: dict[str, Schedule]
    images: int  # all images of the benchmark (the feature stages read every one)
    val_images: int  # the val split at full size (what a selection captions)
    bench_batch: int = TRAIN["batch_size"]


def paper_plan(base: dict[str, Any], shape: str, model: str = AXES["model"]) -> Plan:
    """The :class:`Plan` of the project's params ``base`` (a loaded params.yaml) for a benchmark ``shape``."""
    from r2m.datasets.rehearsal import SHAPES

    schedules = {}
    for stage in ("train_xe", "train_s", "train_m", "train_i", "train_sup"):
        sec = dict(base.get(stage) or {})
        if stage == "train_sup":
            sec.update((sec.pop("per_model", None) or {}).get(model) or {})
        if not {"steps", "batch_size", "eval_every"} <= set(sec):
            continue
        select_by = sec.get("select_by", "auto" if stage in ("train_m", "train_i") else "last")
        schedules[stage] = Schedule(int(sec["steps"]), int(sec["batch_size"]), int(sec["eval_every"]),
                                    select_by != "last")
    return Plan(schedules, sum(SHAPES[shape].values()), SHAPES[shape]["val"])


def h100_prediction(stage: str, plan: Plan, cpu_s: float) -> tuple[float, str]:
    """``(seconds, where the figure comes from)`` of ``stage`` at full size on one H100, from
    :data:`GPU_FIGURES` only: measured throughput × the paper's steps (or the benchmark's images);
    a CPU stage keeps ``cpu_s`` (its predicted CPU time here); NaN where no GPU figure was measured."""
    if stage not in DEVICE_STAGES:
        return cpu_s, "CPU stage (this machine's CPU time)"
    sched = plan.schedules.get(stage)
    if stage in ("train_xe", "train_s", "train_m", "train_i") and sched is not None:
        g = GPU_FIGURES[stage]
        how = (f"measured throughput x steps: {sched.steps:,} x {sched.batch_size} / {g.value:,.0f} {g.unit} "
               f"({g.card}, {g.date})")
        if sched.selects:
            how += (f"; training steps only: the {sched.evaluations} selections ({plan.val_images:,} val captions "
                    "each) have no GPU figure measured")
        return sched.steps * sched.batch_size / g.value, how
    if stage == "extract_features":
        g, m = GPU_FIGURES["inception_v4_files"], GPU_FIGURES["inception_v4_model"]
        return plan.images / g.value, (f"measured throughput x images: {plan.images:,} / {g.value:,.0f} {g.unit} "
                                       f"(Inception-V4 from JPEG files, {g.card}, {g.date}; the model alone "
                                       f"{m.value:,.0f} {m.unit} on the {m.card})")
    if stage == "extract_features_sup":
        g = GPU_FIGURES["vgg16_model"]
        return plan.images / g.value, (f"measured throughput x images: {plan.images:,} / {g.value:,.0f} {g.unit} "
                                       f"(VGG-16, the model alone, {g.card}, {g.date}); JPEG decoding and "
                                       "VGG-19's grid have no GPU figure measured")
    return math.nan, "no GPU figure measured"


def paper_cpu_s(row: Row, plan: Plan) -> float:
    """The paper's schedule of a training stage on this machine (wall s), from one bench row at size
    ``row.size``: the loop's seconds without its validations and selections per training row x the
    schedule's rows, plus per evaluation the seconds of one validation pass (bounded batches: the same at
    every size) and of one selection (scaled to the full val split) x the schedule's evaluations. NaN
    without a loop time in the stage's metrics."""
    from r2m.datasets.rehearsal import scaled

    sched = plan.schedules.get(row.stage)
    if sched is None or not row.steps or math.isnan(row.loop_s):
        return math.nan
    select_s = 0.0 if math.isnan(row.select_s) else row.select_s
    val_s = 0.0 if math.isnan(row.val_s) else row.val_s
    per_row = (row.loop_s - select_s - val_s) / (row.steps * plan.bench_batch)
    total = per_row * sched.steps * sched.batch_size
    if row.validations:
        total += val_s / row.validations * sched.evaluations
    if sched.selects:
        if not row.selections:
            return math.nan
        total += select_s / row.selections * plan.val_images / scaled(plan.val_images, row.size) * sched.evaluations
    return total


@dataclass
class Fit:
    exponent: float = math.nan
    predicted_s: float = math.nan  # at size 1.0
    points: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def fit_exponent(sizes: list[float], values: list[float], at: float = 1.0) -> tuple[float, float]:
    """``(b, a * at ** b)`` for ``value = a * size ** b`` fitted by least squares on ``log value`` vs ``log size``
    (points with a non-positive value are left out; one point: ``b = 1``, two or more distinct sizes needed
    for a fit; none: NaNs)."""
    pts = [(math.log(s), math.log(v)) for s, v in zip(sizes, values, strict=True) if s > 0 and v > 0]
    if not pts:
        return math.nan, math.nan
    xs = {x for x, _ in pts}
    if len(xs) < 2:
        x, y = pts[-1]
        return 1.0, math.exp(y + (math.log(at) - x))
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    a = my - b * mx
    return b, math.exp(a + b * math.log(at))


def entry_name(size: float) -> str:
    return "rehearsal_" + f"{size:g}".replace(".", "p").replace("-", "m")


def workspace_params(ws: Path, size: float) -> Path:
    """``ws/params.yaml`` of a workspace this benchmark made (``--keep``), unchanged since, whose one catalog
    entry is the rehearsal dataset at ``size``; :class:`r2m.utils.guard.BadInput` (one line) otherwise."""
    import yaml

    from r2m.utils.guard import BadInput
    from r2m.utils.owner import workspace_problem

    problem = workspace_problem(ws, KIND)
    if problem:
        raise BadInput(f"--workspace {ws}: {problem}")
    params = ws / "params.yaml"
    entry = ((yaml.safe_load(params.read_text()) or {}).get("catalog") or {}).get(entry_name(size)) or {}
    if entry.get("kind") != "rehearsal" or entry.get("scale") != size:
        raise BadInput(f"--workspace {ws}: its params.yaml holds no rehearsal entry {entry_name(size)} at size "
                       f"{size:g}; give the --sizes value of the run that kept it")
    return params


def write_params(base: Path, ws: Path, name: str, entry: dict[str, Any]) -> Path:
    """``ws/params.yaml``: the project's params with ``datasets: [name]`` and ``catalog: {name: entry}``."""
    import yaml

    params = yaml.safe_load(base.read_text())
    params["datasets"] = [name]
    params["catalog"] = {name: entry}
    params["baselines"] = {**params.get("baselines", {}), "datasets": [name], "models": [AXES["model"]]}
    params["seeds"] = [0]
    out = ws / "params.yaml"
    out.write_text(yaml.safe_dump(params, sort_keys=False))
    return out


def out_paths(stage: str, dataset: str) -> list[str]:
    from r2m.stage.registry import STAGES

    spec = next(s for s in STAGES if s.name == stage)
    return [o.path.format(dataset=dataset, **AXES) for o in spec.outs.values()]


def dep_paths(stage: str, dataset: str) -> list[str]:
    from r2m.stage.registry import STAGES

    spec = next(s for s in STAGES if s.name == stage)
    return [d.format(dataset=dataset, **AXES) for d in spec.deps.values() if isinstance(d, str)]


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def run_stage(stage: str, dataset: str, ws: Path, params: Path, budget: float, threads: int) -> Row:
    """One ``r2m <stage>`` child in ``ws``; its wall and CPU time, peak RSS (``os.wait4``), output bytes."""
    cmd = [sys.executable, "-m", "r2m.cli", stage, "--dataset", dataset, "--params", str(params), "--no-log-file"]
    spec_axes = _axes(stage)
    for axis in ("variant", "seed", "model"):
        if axis in spec_axes:
            cmd += [f"--{axis}", AXES[axis]]
    if "ckpt" in spec_axes:
        cmd += ["--ckpt", AXES["ckpt"]]
    if threads:
        cmd += ["--threads", str(threads)]
    cmd += STAGE_FLAGS.get(stage, [])
    env = {**os.environ, "R2M_NO_PROGRESS": "1", "R2M_DEVICE": os.environ.get("R2M_DEVICE", "cpu")}
    log = ws / "logs" / f"{stage}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    row = Row(stage, 0.0)
    metrics = metrics_path(stage, dataset)
    before = _signature(ws / metrics) if metrics else None
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ws, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = t0 + budget
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                os.killpg(proc.pid, signal.SIGTERM)
                time.sleep(2)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                pid, status, usage = os.wait4(proc.pid, 0)
                row.status, row.note = "capped", f"stopped after the budget ({budget:.0f} s)"
                break
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
    row.wall_s = time.perf_counter() - t0
    row.cpu_s = usage.ru_utime + usage.ru_stime
    row.peak_rss_mb = usage.ru_maxrss / 1024.0  # KiB on Linux
    if row.status == "ok" and proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        row.status, row.note = "failed", f"exit {proc.returncode}: {tail[0][:200]} (log: {log})"
    row.out_bytes = sum(tree_bytes(ws / p) for p in out_paths(stage, dataset) if (ws / p).exists())
    if metrics and _signature(ws / metrics) not in (None, before):  # written by this run, not an earlier one's
        read_metrics(row, ws / metrics)
    return row


def metrics_path(stage: str, dataset: str) -> str | None:
    """The metrics file of a stage the bench runs with ``--timings`` (its training stages), else ``None``."""
    if "--timings" not in STAGE_FLAGS.get(stage, []):
        return None
    from r2m.stage.registry import STAGES

    spec = next(s for s in STAGES if s.name == stage)
    return spec.outs["metrics"].path.format(dataset=dataset, **AXES)


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_metrics(row: Row, path: Path) -> Row:
    """The training loop's steps and seconds, its validations' and selections' count and seconds, from a
    training stage's metrics file (``steps`` and, written with ``--timings``, ``timings``:
    :meth:`r2m.training.loop.Result.timings`); a file without them (a skipped baseline, an unreadable file)
    leaves ``row`` as it is."""
    try:
        metrics = json.loads(path.read_text())
    except (OSError, ValueError):
        return row
    timings = metrics.get("timings") if isinstance(metrics, dict) else None
    try:
        steps, loop_s = int(metrics["steps"]), float(timings["loop_s"])
        selections, select_s = int(timings["selections"]), float(timings["select_s"])
        validations, val_s = int(timings["validations"]), float(timings["val_s"])
    except (KeyError, TypeError, ValueError):
        return row
    row.steps, row.loop_s = steps, loop_s
    if selections:
        row.selections, row.select_s = selections, select_s
    if validations:
        row.validations, row.val_s = validations, val_s
    return row


def _axes(stage: str) -> tuple[str, ...]:
    from r2m.stage.registry import STAGES

    return next(s for s in STAGES if s.name == stage).axes


def bench(sizes: list[float], stages: list[str], base_params: Path, workdir: Path, budget: float,
          entry: dict[str, Any], keep: bool = False, threads: int = 0, echo=print,
          workspace: Path | None = None) -> list[Row]:
    """Every stage at every size (smallest first); see the module docstring. ``workspace``: run the
    (one) size in this earlier workspace (``--keep``), whose outputs the stages read, and keep it: a workspace
    this benchmark made, its ``params.yaml`` unchanged and never rewritten (:func:`workspace_params`)."""
    from r2m.utils.owner import mark_workspace

    rows: list[Row] = []
    blocked: dict[str, str] = {}  # stage -> why it is not run at the larger sizes
    for size in sorted(sizes):
        name = entry_name(size)
        if workspace is not None:
            ws, params, keep = workspace, workspace_params(workspace, size), True
        else:
            ws = Path(tempfile.mkdtemp(prefix=f"scale-{name}-", dir=workdir))
            params = write_params(base_params, ws, name, {**entry, "scale": size})
            mark_workspace(ws, KIND)  # `--workspace` takes it up later, and only it
        missing: dict[str, str] = {}  # outputs not made at this size
        for stage in stages:
            why = blocked.get(stage)
            gone = [d for d in dep_paths(stage, name) if d in missing]
            if why is None and gone:
                why = f"needs {gone[0]} ({missing[gone[0]]})"
            done = [r for r in rows if r.stage == stage and r.status == "ok"]
            if why is None and len({r.size for r in done}) >= 2:  # one point says nothing of the growth
                _, predicted = fit_exponent([r.size for r in done], [r.wall_s for r in done], at=size)
                if predicted > budget:
                    why = f"predicted {predicted:.0f} s at size {size:g} > budget {budget:.0f} s"
            if why is not None:
                row = Row(stage, size, "capped", note=why)
            else:
                row = run_stage(stage, name, ws, params, budget, threads)
                row.size = size
            rows.append(row)
            if row.status != "ok":
                for p in out_paths(stage, name):
                    missing[p] = f"{stage} {row.status}"
                if row.status == "capped" and stage not in blocked:
                    blocked[stage] = row.note
            echo(f"size {size:g}  {stage:<22} {row.status:<7} wall {row.wall_s:8.1f} s  cpu {row.cpu_s:8.1f} s  "
                 f"rss {row.peak_rss_mb:8.0f} MB  out {row.out_bytes / 2**20:9.1f} MiB  {row.note}")
        if not keep:
            shutil.rmtree(ws, ignore_errors=True)
    return rows


def read_rows(path: Path) -> list[Row]:
    """The rows of a ``scale.csv``."""
    from r2m.utils.guard import BadInput

    try:
        with open(path, newline="") as fh:
            return [Row(r["stage"], float(r["size"]), r["status"], _num(r["wall_s"]), _num(r["cpu_s"]),
                        _num(r["peak_rss_mb"]), int(r["out_bytes"]), r["note"], int(r.get("steps") or 0),
                        _num(r.get("loop_s") or ""), int(r.get("selections") or 0), _num(r.get("select_s") or ""),
                        int(r.get("validations") or 0), _num(r.get("val_s") or ""))
                    for r in csv.DictReader(fh)]
    except (OSError, KeyError, ValueError) as err:
        raise BadInput(f"--merge {path}: not a scale.csv ({err})") from None


def _num(v: str) -> float:
    return math.nan if v in ("", "–", "nan") else float(v)


def fits(rows: list[Row]) -> dict[str, Fit]:
    out: dict[str, Fit] = {}
    for stage in dict.fromkeys(r.stage for r in rows):
        ok = [r for r in rows if r.stage == stage and r.status == "ok"]
        b, pred = fit_exponent([r.size for r in ok], [r.wall_s for r in ok])
        br, rss = fit_exponent([r.size for r in ok], [r.peak_rss_mb for r in ok])
        bb, _ = fit_exponent([r.size for r in ok], [float(r.out_bytes) for r in ok])
        bc, cpu = fit_exponent([r.size for r in ok], [r.cpu_s for r in ok])
        # between the two largest sizes: the fixed start-up cost (imports, ~1-3 s) weighs least there
        top = sorted(ok, key=lambda r: r.size)[-2:]
        bt = fit_exponent([r.size for r in top], [r.cpu_s for r in top])[0] if len({r.size for r in top}) == 2 else math.nan
        if len({r.size for r in ok}) < 2:  # one size: no exponent (the prediction is linear)
            b = br = bb = bc = math.nan
        out[stage] = Fit(b, pred, len(ok), {"rss_exponent": br, "bytes_exponent": bb, "rss_pred_mb": rss,
                                            "cpu_exponent": bc, "cpu_pred_s": cpu, "cpu_exponent_top": bt})
    return out


def _fmt(v: float, spec: str = ".1f") -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def cpu_at_full(stage: str, rows: list[Row], fit: Fit) -> float:
    """The stage's CPU seconds at size 1.0: measured when it ran there, else the fit's prediction."""
    at = [r for r in rows if r.stage == stage and r.status == "ok" and r.size == 1.0]
    return at[-1].cpu_s if at else fit.extra.get("cpu_pred_s", math.nan)


def predictions(rows: list[Row], f: dict[str, Fit], plan: Plan) -> dict[str, dict[str, Any]]:
    """Per stage: ``h100_s`` and ``h100_from`` (:func:`h100_prediction`) and ``paper_cpu_s``
    (:func:`paper_cpu_s` of its largest size with a loop time in its metrics)."""
    out = {}
    for stage, fit in f.items():
        h, how = h100_prediction(stage, plan, cpu_at_full(stage, rows, fit))
        timed = sorted((r for r in rows if r.stage == stage and r.status == "ok" and r.steps), key=lambda r: r.size)
        out[stage] = {"h100_s": h, "h100_from": how, "paper_cpu_s": paper_cpu_s(timed[-1], plan) if timed else math.nan}
    return out


def write_outputs(rows: list[Row], out: Path, meta: dict[str, str],
                  plan: Plan | None = None) -> tuple[dict[str, Fit], dict[str, dict[str, Any]]]:
    """``scale.csv``, ``scale.md`` and ``scale.png`` in the folder ``out``, written whole (a folder of this
    benchmark's kind, :data:`KIND`: :func:`r2m.utils.io.atomic_path`); returns the fits and (with ``plan``) the
    predictions (:func:`predictions`)."""
    from r2m.utils.io import atomic_path

    with atomic_path(out, kind=KIND) as tmp:
        tmp.mkdir()
        return _write_outputs(rows, tmp, meta, plan)


def _write_outputs(rows: list[Row], out: Path, meta: dict[str, str],
                   plan: Plan | None) -> tuple[dict[str, Fit], dict[str, dict[str, Any]]]:
    f = fits(rows)
    pred = predictions(rows, f, plan) if plan is not None else {}
    with open(out / "scale.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["stage", "size", "status", "wall_s", "cpu_s", "peak_rss_mb", "out_bytes", "note",
                    "steps", "loop_s", "selections", "select_s", "validations", "val_s"])
        for r in rows:
            w.writerow([r.stage, r.size, r.status, _fmt(r.wall_s, ".3f"), _fmt(r.cpu_s, ".3f"),
                        _fmt(r.peak_rss_mb, ".1f"), r.out_bytes, r.note, r.steps, _fmt(r.loop_s, ".2f"),
                        r.selections, _fmt(r.select_s, ".2f"), r.validations, _fmt(r.val_s, ".2f")])
    sizes = sorted({r.size for r in rows})
    head = ["stage"] + [f"{s:g}: s / CPU s / MB RSS / MiB out" for s in sizes] + \
        ["time exponent", "CPU exponent (all; two largest)", "RSS exponent", "predicted s at 1.0",
         "predicted CPU s at 1.0"] + \
        (["paper schedule here, s", "one H100, s at 1.0", "H100 figure from"] if pred else [])
    lines = [f"<!-- {', '.join(f'{k}: {v}' for k, v in meta.items())} -->", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for stage, fit in f.items():
        cells = [stage]
        for s in sizes:
            r = next((r for r in rows if r.stage == stage and r.size == s), None)
            if r is None:
                cells.append("")
            elif r.status != "ok":
                ran = "" if math.isnan(r.wall_s) else f" ({r.wall_s:.0f} s / {r.cpu_s:.0f} CPU s / {r.peak_rss_mb:.0f} MB when stopped)"
                cells.append(f"{r.status}: {r.note}{ran}")
            else:
                cells.append(f"{r.wall_s:.1f} / {r.cpu_s:.1f} / {r.peak_rss_mb:.0f} / {r.out_bytes / 2**20:.1f}")
        cells += [_fmt(fit.exponent, ".2f"),
                  f'{_fmt(fit.extra["cpu_exponent"], ".2f")}; {_fmt(fit.extra["cpu_exponent_top"], ".2f")}',
                  _fmt(fit.extra["rss_exponent"], ".2f"),
                  _fmt(fit.predicted_s, ".0f"), _fmt(fit.extra["cpu_pred_s"], ".0f")]
        if pred:
            p = pred[stage]
            cells += [_fmt(p["paper_cpu_s"], ".0f"), _fmt(p["h100_s"], ".1f"), p["h100_from"]]
        lines.append("| " + " | ".join(cells) + " |")
    if pred:
        lines += ["", "Paper schedule here: the training stages' seconds per training row, per validation pass and "
                  "per selection (scaled to the full val split) at their largest size, times the schedule in the "
                  "params. "
                  "One H100: measured GPU throughput (the bench's table of GPU figures) x the paper's steps or "
                  "the benchmark's images; a CPU stage keeps this machine's CPU time at 1.0."]
    (out / "scale.md").write_text("\n".join(lines) + "\n")
    plot(rows, out / "scale.png")
    return f, pred


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    for n, stage in enumerate(dict.fromkeys(r.stage for r in rows)):
        ok = sorted((r for r in rows if r.stage == stage and r.status == "ok"), key=lambda r: r.size)
        if not ok:
            continue
        xs = [r.size * 100 for r in ok]
        style = {"marker": "os^"[n % 3], "color": plt.cm.tab20(n % 20), "label": stage}
        ax1.plot(xs, [r.wall_s for r in ok], **style)
        ax2.plot(xs, [r.peak_rss_mb for r in ok], **style)
    for ax, what in ((ax1, "wall time (s)"), (ax2, "peak RSS (MB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("size (% of the benchmark)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from r2m.stage.registry import STAGES
    from r2m.utils.cliargs import OneLineParser, float_in, int_in, list_of, names_in

    per_dataset = [s.name for s in STAGES if set(s.axes) <= {"dataset", *AXES}]
    p = OneLineParser(prog="r2m bench scale", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="rehearsal",
                   help="a catalog entry of kind rehearsal in --params, or 'rehearsal' (the built-in entry)")
    p.add_argument("--shape", choices=("coco", "flickr30k"), default=None, help="image splits (built-in entry)")
    p.add_argument("--corpus", choices=("shutterstock", "gcc", "coco"), default=None, help="corpus (built-in entry)")
    p.add_argument("--sizes", type=list_of(float_in(0, 1, open_lo=True)), default=[0.01, 0.1],
                   help="fractions of the benchmark, each in (0, 1], comma-separated")
    p.add_argument("--stages", type=names_in(per_dataset), default=list(DEFAULT_STAGES),
                   help="stages to run, in order, comma-separated")
    p.add_argument("--params", default="params.yaml", help="the params file the workspaces start from")
    p.add_argument("--workdir", default=None, help="where the scratch workspaces go (default: a temp folder)")
    p.add_argument("--out", default="reports/bench/scale", help="folder of scale.csv, scale.md, scale.png")
    p.add_argument("--budget", type=float_in(0, 7 * 86400, open_lo=True), default=600.0,
                   help="seconds one stage may take at one size")
    p.add_argument("--threads", type=int_in(0, 1024), default=0, help="torch threads of each stage (0: its default)")
    p.add_argument("--keep", action="store_true", help="keep the workspaces")
    p.add_argument("--workspace", default=None, metavar="DIR",
                   help="run the stages (one size) in this workspace of an earlier --keep run, on its outputs")
    p.add_argument("--merge", default=None, metavar="CSV",
                   help="a scale.csv of an earlier run: its rows join this run's in the table, fits and plot")
    a = p.parse_args(argv)
    import yaml

    from r2m.utils.guard import BadInput
    from r2m.utils.owner import claim, write_problem

    sizes, stages = a.sizes, a.stages
    base = Path(a.params)
    if not base.is_file():
        raise BadInput(f"--params {base}: no such file")
    entry = _entry(base, a)
    # every check before the first stage runs: the table's folder, the rows to merge, the workspace
    claim(a.out, KIND, "--out", folder=True)
    merged = read_rows(Path(a.merge)) if a.merge else []
    workspace = Path(a.workspace).resolve() if a.workspace else None
    if workspace is not None:
        if len(sizes) != 1:
            raise BadInput(f"--workspace {a.workspace}: needs one --sizes value (the size of the run that kept it)")
        workspace_params(workspace, sizes[0])
    if a.workdir:
        problem = write_problem(Path(a.workdir) / "scale-workspace", KIND, folder=True)
        if problem:
            raise BadInput(f"--workdir {a.workdir}: {problem}")
    workdir = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="r2m-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"bench scale: {entry['shape']} images, {entry['corpus']} corpus, sizes {sizes}, budget {a.budget:.0f} s "
          f"per stage, workspaces in {workdir}")
    rows = bench(sizes, stages, base.resolve(), workdir, a.budget, entry, a.keep, a.threads, workspace=workspace)
    meta = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": _machine(), "shape": entry["shape"],
            "corpus": entry["corpus"], "budget_s": f"{a.budget:.0f}"}
    if a.merge:
        new = {(r.stage, r.size) for r in rows}
        rows = [r for r in merged if (r.stage, r.size) not in new] + rows
        rows.sort(key=lambda r: r.size)
    plan = paper_plan(yaml.safe_load(base.read_text()) or {}, entry["shape"])
    f, pred = write_outputs(rows, Path(a.out), meta, plan)
    print("\nstage                  exponent (wall, CPU, RSS)  predicted s at 1.0 (wall, CPU)  paper schedule here  "
          "one H100 (from)")
    for stage, fit in f.items():
        x, p = fit.extra, pred[stage]
        print(f"{stage:<22} {_fmt(fit.exponent, '5.2f')} {_fmt(x['cpu_exponent'], '5.2f')} "
              f"{_fmt(x['rss_exponent'], '5.2f')}        {_fmt(fit.predicted_s, '9.0f')} {_fmt(x['cpu_pred_s'], '9.0f')}"
              f"  {_fmt(p['paper_cpu_s'], '18.0f')}  {_fmt(p['h100_s'], '9.1f')} ({p['h100_from']})")
    print(f"\nwrote {Path(a.out) / 'scale.csv'}, scale.md, scale.png")
    if not a.workdir and not a.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if any(r.status == "failed" for r in rows) else 0


def _entry(base: Path, a: argparse.Namespace) -> dict[str, Any]:
    from r2m import params as P
    from r2m.utils.guard import BadInput

    try:  # the params the workspaces start from, checked as every stage will check them
        P.load(base)
    except P.ParamsError as err:
        raise BadInput(f"--params {base}: {err}") from None
    catalog = (P.yaml_load(P.read_text(base)) or {}).get("catalog") or {}
    builtin = False
    if a.dataset in catalog:
        entry = dict(catalog[a.dataset])
        if entry.get("kind") != "rehearsal":
            raise BadInput(f"--dataset {a.dataset}: catalog entry of kind {entry.get('kind')!r}, not rehearsal")
    elif a.dataset == "rehearsal":
        entry = dict(ENTRY)
        builtin = True
    else:
        raise BadInput(f"--dataset {a.dataset}: not in the catalog of {base} (and not 'rehearsal', the built-in)")
    for key in ("shape", "corpus"):
        if getattr(a, key):
            entry[key] = getattr(a, key)
        entry.setdefault(key, ENTRY[key])
    if builtin:  # the built-in entry counts the vocabulary at the paper's min_count for its corpus
        from r2m.datasets.rehearsal import CORPORA

        min_count = CORPORA[entry["corpus"]]["vocab"][1]
        entry["overrides"] = {**entry["overrides"], "build_vocab": {"min_count": min_count}}
    return entry


def _machine() -> str:
    import platform

    try:
        model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    except OSError:
        model = platform.processor()
    return f"{os.cpu_count()} CPU ({model})"

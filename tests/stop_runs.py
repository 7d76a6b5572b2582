"""The runs tests/test_stop_signals.py and tests/test_slurm.py stop with a signal: two chains ``train_xe`` ->
``train_s`` (R2M and its ablation ``no_fm``) of a small ``tiny`` under ``r2m warm -- snakemake --cores 2``, the
two ``train_xe`` jobs side by side; the session's workspace with their inputs built (:func:`build_upstream`) and
the chains run without interruption (:func:`build_reference`, the bytes every resumed run must end with); how a
cell's moment is reached (:func:`faults`, :func:`reach`, :func:`stop_run`) and what a stopped run leaves (:func:`last_step`, :func:`same_results`).
The moments:

- ``start``: as the first job starts (the warm server has just forked it; it is still importing);
- ``run``: both ``train_xe`` jobs held at step :data:`HELD` of :data:`STEPS` (``R2M_FAULT=train_xe@15:HOLD``;
  ``last.pt`` was written at step 10): each must save ``last.pt`` at step 15 and the next run resume there;
- ``finish``: both ``train_xe`` jobs held at their last step, released together, the signal sent as the first of
  them ends: Snakemake is taking their ends in and starting the ``train_s`` jobs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import BIN, ROOT, copy_workflow, write_params

TARGETS = ("models/tiny/r2m/s0/train_s", "models/tiny/no_fm/s0/train_s")
VARIANTS = ("r2m", "no_fm")
STEPS, CKPT, HELD = 40, 10, 15
STOP_LIMIT = 30  # seconds a stopped run may take to end here (the stop itself takes a few; the machine is shared)
SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "HUP": signal.SIGHUP}
MOMENTS = ("start", "run", "finish")


def env(**extra: str) -> dict[str, str]:
    e = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{BIN}:{os.environ['PATH']}", "R2M_NO_PROGRESS": "1",
         "R2M_THREADS": "1", "R2M_DEVICE": "cpu"}
    for key in ("R2M_FAULT", "R2M_FAULT_RELEASE", "R2M_WARM"):
        e.pop(key, None)
    return {**e, **extra}


def params() -> dict:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["datasets"], raw["variants"] = ["tiny"], ["r2m", "no_fm"]
    raw["baselines"]["datasets"] = ["tiny"]
    t = raw["catalog"]["tiny"]
    t.update(n_train_images=10, n_val_images=4, n_test_images=6, n_sentences=160, image_size=32)
    t["overrides"].update(
        model={"d": 16, "d_k": 8},
        train_xe={"steps": STEPS, "batch_size": 16, "lr": 0.003, "eval_every": CKPT, "checkpoint_every": CKPT},
        train_s={"steps": 20, "batch_size": 16, "lr": 0.003, "eval_every": CKPT, "checkpoint_every": CKPT},
    )
    return raw


def wrapped(*engine: str) -> list[str]:
    return [str(BIN / "r2m"), "warm", "--log", "warm.log", "--", *engine]


SNAKEMAKE = (str(BIN / "snakemake"), "--cores", "2", *TARGETS)


def build_upstream(wd: Path) -> Path:
    """``wd`` (empty) as the workspace with the chains' inputs built (corpus, vocabulary) and their instances
    planned once (conftest's ``stop_upstream``)."""
    copy_workflow(ROOT, wd)
    write_params(wd, params())
    r = subprocess.run([str(BIN / "snakemake"), "--cores", "2", "data/tiny/vocab"], cwd=wd, env=env(),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    for _ in range(2):  # the first plan of a target writes the stamps of its instances (.stamps/)
        r = subprocess.run([*SNAKEMAKE, "-n"], cwd=wd, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return wd


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def build_reference(upstream: Path, wd: Path) -> Path:
    """The chains run without interruption in a copy of ``upstream`` (wrapped, as the runs compared with it):
    conftest's ``stop_reference``."""
    copy(upstream, wd)
    r = subprocess.run(wrapped(*SNAKEMAKE), cwd=wd, env=env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return wd


def same_results(wd: Path, ref: Path) -> None:
    """Every chain's weights and loss curve equal the uninterrupted run's, bit for bit."""
    for variant in VARIANTS:
        for stage in ("train_xe", "train_s"):
            a = torch.load(ref / f"models/tiny/{variant}/s0/{stage}/model.pt", weights_only=True)["state_dict"]
            b = torch.load(wd / f"models/tiny/{variant}/s0/{stage}/model.pt", weights_only=True)["state_dict"]
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (variant, stage)
            loss = f"results/tiny/{variant}/s0/{stage}/loss.tsv"
            assert (wd / loss).read_text() == (ref / loss).read_text(), loss


def wait_until(what: str, ready, running, output, seconds: float = 600) -> None:
    """Poll ``ready()`` every 20 ms; fail with ``output()``'s tail when ``running()`` turns false first or after
    ``seconds``."""
    end = time.monotonic() + seconds
    while not ready():
        if not running():
            pytest.fail(f"the run ended before {what}:\n{output()[-4000:]}")
        if time.monotonic() > end:
            pytest.fail(f"no {what} within {seconds:.0f} s:\n{output()[-4000:]}")
        time.sleep(0.02)


def text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def held(wd: Path) -> int:
    return sum("fault injection: holding at" in text(wd / f"logs/train_xe/tiny-{v}-0.log") for v in VARIANTS)


def last_step(wd: Path, variant: str) -> int | None:
    path = wd / f".r2m/resume/train_xe/tiny-{variant}-0/last.pt"
    return int(torch.load(path, weights_only=True)["step"]) if path.exists() else None


def faults(wd: Path, moment: str) -> dict[str, str]:
    """The environment that holds the jobs for ``moment``."""
    return {"run": {"R2M_FAULT": f"train_xe@{HELD}:HOLD"},
            "finish": {"R2M_FAULT": f"train_xe@{STEPS}:HOLD", "R2M_FAULT_RELEASE": str(wd / "release")},
            "start": {}}[moment]


def reach(wd: Path, moment: str, running, output) -> None:
    """Return at ``moment`` of the run in ``wd`` (started with :func:`faults`), which must still be running."""
    log = wd / "warm.log"
    if moment == "start":
        wait_until("a job start", lambda: "start " in text(log), running, output)
    elif moment == "run":
        wait_until("both train_xe jobs held", lambda: held(wd) == 2, running, output)
    else:
        wait_until("both train_xe jobs at their last step", lambda: held(wd) == 2, running, output)
        (wd / "release").touch()
        wait_until("a train_xe job's end", lambda: re.search(r"^end \d+ exit 0$", text(log), re.M), running,
                   output)


def _default_stop_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


# how the tests start a wrapped run: as a shell's job from a terminal (its own process group, every stop signal at
# its default), whatever pytest itself inherited: under ``nohup`` SIGHUP is ignored, and a command a script put in
# the background (``cmd &``) ignores SIGINT; a wrapper that inherits an ignored signal keeps ignoring it, by design
AS_A_JOB = {"start_new_session": True, "preexec_fn": _default_stop_signals}


def stop_run(wd: Path, engine: tuple[str, ...], sig: str, receiver: str, moment: str) -> tuple[int, str, float]:
    """Start the wrapped ``engine`` in ``wd`` (its own process group, as a shell's job), send the signal at the
    moment, and return (exit status, output, seconds from the signal to the end)."""
    out = wd / "stopped.out"
    with out.open("w") as f:
        proc = subprocess.Popen(wrapped(*engine), cwd=wd, env=env(**faults(wd, moment)), stdout=f,
                                stderr=subprocess.STDOUT, **AS_A_JOB)
    try:
        reach(wd, moment, lambda: proc.poll() is None, out.read_text)
        t0 = time.monotonic()
        (os.kill if receiver == "wrapper" else os.killpg)(proc.pid, SIGNALS[sig])
        try:
            rc = proc.wait(timeout=STOP_LIMIT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"SIG{sig} to the {receiver} ({moment}): still running after {STOP_LIMIT} s:\n"
                        f"{out.read_text()[-4000:]}")
        return rc, out.read_text(), time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def own_count(output: str, sig: str) -> float:
    """The time to stop ``r2m warm`` reports (from the signal it received to the end of the run)."""
    m = re.search(rf"r2m warm: stopped by SIG{sig} in ([\d.]+) s", output)
    assert m, output[-3000:]
    return float(m.group(1))

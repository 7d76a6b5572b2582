"""A stop signal stops a whole ``r2m warm -- snakemake`` run (and ``r2m warm -- dvc repro``) within seconds, says
so in its exit status (128 + signal), and the next run of the same command resumes every job and ends with the
bytes an uninterrupted run writes.

The run: two chains ``train_xe`` -> ``train_s`` (R2M and its ablation ``no_fm``) of ``tiny`` on 2 cores, the two
``train_xe`` jobs side by side. A cell of the matrix is a signal (SIGINT, SIGTERM, SIGHUP), a receiver (the
wrapper alone, ``kill PID``; its process group, ``kill -- -PGID`` as Ctrl-C or ``timeout`` send) and a moment:

- ``start``: as the first job starts (the warm server has just forked it; it is still importing);
- ``run``: both ``train_xe`` jobs held at step 15 of 40 (``R2M_FAULT=train_xe@15:HOLD``; ``last.pt`` was written
  at step 10): each must save ``last.pt`` at step 15 and the next run resume there;
- ``finish``: both ``train_xe`` jobs held at their last step, released together, the signal sent as the first of
  them ends: Snakemake is taking their ends in and starting the ``train_s`` jobs.

By default the 9 cells of a pairwise design run (every pair of signal, receiver and moment values at least
once); ``R2M_STOP_MATRIX=all`` runs all 18. ``pytest -s`` prints each cell's time to stop (the Slurm cells are in
tests/test_slurm.py). Also: a second signal kills a run that does not end, a Snakemake lock left by a killed
run is removed by the next wrapped run only when no Snakemake runs in the folder, and Snakemake's own SIGTERM
deadlock (its handler waiting on the scheduler lock its main thread holds) is ended by the wrapper's SIGINT."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import BIN, ROOT, copy_workflow, write_params

pytestmark = pytest.mark.slow
TARGETS = ("models/tiny/r2m/s0/train_s", "models/tiny/no_fm/s0/train_s")
VARIANTS = ("r2m", "no_fm")
STEPS, CKPT, HELD = 40, 10, 15
STOP_LIMIT = 30  # seconds a stopped run may take to end here (the stop itself takes a few; the machine is shared)
SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "HUP": signal.SIGHUP}
# a pairwise design: every (signal, receiver), (signal, moment) and (receiver, moment) pair at least once
PAIRWISE = [("INT", "wrapper", "start"), ("INT", "group", "run"), ("INT", "wrapper", "finish"),
            ("TERM", "group", "start"), ("TERM", "wrapper", "run"), ("TERM", "group", "finish"),
            ("HUP", "wrapper", "start"), ("HUP", "wrapper", "run"), ("HUP", "group", "finish")]
ALL = [(s, r, m) for s in SIGNALS for r in ("wrapper", "group") for m in ("start", "run", "finish")]
CELLS = ALL if os.environ.get("R2M_STOP_MATRIX") == "all" else PAIRWISE
TIMES: list[str] = []


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


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> Path:
    """The workspace with the chains' inputs built (corpus, vocabulary) and their instances planned once."""
    wd = tmp_path_factory.mktemp("stop_up")
    copy_workflow(ROOT, wd)
    write_params(wd, params())
    r = subprocess.run([str(BIN / "snakemake"), "--cores", "2", "data/tiny/vocab"], cwd=wd, env=env(),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    for _ in range(2):  # the first plan of a target writes the stamps of its instances (.params/)
        r = subprocess.run([*SNAKEMAKE, "-n"], cwd=wd, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return wd


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.fixture(scope="module")
def reference(upstream, tmp_path_factory) -> Path:
    """The chains run without interruption (wrapped, as the runs they are compared with)."""
    wd = copy(upstream, tmp_path_factory.mktemp("stop_ref") / "wd")
    r = subprocess.run(wrapped(*SNAKEMAKE), cwd=wd, env=env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return wd


@pytest.fixture(scope="module", autouse=True)
def _print_times():
    yield
    if TIMES:
        print("\nstop signals: signal receiver moment -> seconds to stop (measured here | r2m warm's own count)")
        print("\n".join(TIMES))


def same_results(wd: Path, ref: Path) -> None:
    """Every chain's weights and loss curve equal the uninterrupted run's, bit for bit."""
    for variant in VARIANTS:
        for stage in ("train_xe", "train_s"):
            a = torch.load(ref / f"models/tiny/{variant}/s0/{stage}/model.pt", weights_only=True)["state_dict"]
            b = torch.load(wd / f"models/tiny/{variant}/s0/{stage}/model.pt", weights_only=True)["state_dict"]
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (variant, stage)
            loss = f"results/tiny/{variant}/s0/{stage}/loss.tsv"
            assert (wd / loss).read_text() == (ref / loss).read_text(), loss


def wait_until(what: str, ready, proc: subprocess.Popen, out: Path, seconds: float = 600) -> None:
    end = time.monotonic() + seconds
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}:\n{out.read_text()[-4000:]}")
        if time.monotonic() > end:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"no {what} within {seconds:.0f} s:\n{out.read_text()[-4000:]}")
        time.sleep(0.02)


def text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def held(wd: Path) -> int:
    return sum("fault injection: holding at" in text(wd / f"logs/train_xe/tiny-{v}-0.log") for v in VARIANTS)


def last_step(wd: Path, variant: str) -> int | None:
    path = wd / f".r2m/resume/train_xe/tiny-{variant}-0/last.pt"
    return int(torch.load(path, weights_only=True)["step"]) if path.exists() else None


def stop_run(wd: Path, engine: tuple[str, ...], sig: str, receiver: str, moment: str) -> tuple[int, str, float]:
    """Start the wrapped ``engine`` in ``wd`` (its own process group, as a shell's job), send the signal at the
    moment, and return (exit status, output, seconds from the signal to the end)."""
    out = wd / "stopped.out"
    extra = {"run": {"R2M_FAULT": f"train_xe@{HELD}:HOLD"},
             "finish": {"R2M_FAULT": f"train_xe@{STEPS}:HOLD", "R2M_FAULT_RELEASE": str(wd / "release")},
             "start": {}}[moment]
    with out.open("w") as f:
        proc = subprocess.Popen(wrapped(*engine), cwd=wd, env=env(**extra), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    log = wd / "warm.log"
    if moment == "start":
        wait_until("a job start", lambda: "start " in text(log), proc, out)
    elif moment == "run":
        wait_until("both train_xe jobs held", lambda: held(wd) == 2, proc, out)
    else:
        wait_until("both train_xe jobs at their last step", lambda: held(wd) == 2, proc, out)
        (wd / "release").touch()
        wait_until("a train_xe job's end", lambda: re.search(r"^end \d+ exit 0$", text(log), re.M), proc, out)
    t0 = time.monotonic()
    (os.kill if receiver == "wrapper" else os.killpg)(proc.pid, SIGNALS[sig])
    try:
        rc = proc.wait(timeout=STOP_LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"SIG{sig} to the {receiver} ({moment}): still running after {STOP_LIMIT} s:\n"
                    f"{out.read_text()[-4000:]}")
    return rc, out.read_text(), time.monotonic() - t0


def own_count(output: str, sig: str) -> str:
    m = re.search(rf"r2m warm: stopped by SIG{sig} in ([\d.]+) s", output)
    assert m, output[-3000:]
    return m.group(1)


@pytest.mark.parametrize(("sig", "receiver", "moment"), CELLS, ids=["-".join(c) for c in CELLS])
def test_a_stop_signal_ends_the_run_and_the_next_run_resumes_bit_identical(upstream, reference, tmp_path, sig,
                                                                           receiver, moment):
    wd = copy(upstream, tmp_path / "wd")
    rc, output, seconds = stop_run(wd, SNAKEMAKE, sig, receiver, moment)
    assert rc == 128 + SIGNALS[sig], output[-3000:]
    TIMES.append(f"SIG{sig:4} {receiver:7} {moment:6} -> {seconds:5.1f} s | {own_count(output, sig)} s")
    assert "Traceback" not in output, output[-3000:]
    assert not (wd / ".snakemake/locks").exists()  # Snakemake ended by itself: its lock is gone
    log = text(wd / "warm.log")
    if moment == "run":  # each job saved its state where it was held
        assert [last_step(wd, v) for v in VARIANTS] == [HELD, HELD], output[-3000:]
        assert re.search(rf"stopped by SIG{sig} at step {HELD} of {STEPS}", text(wd / "logs/train_xe/tiny-r2m-0.log"))
    if moment == "finish":  # the jobs that ended are done; what started after the signal was refused
        assert re.search(r"^end \d+ exit 0$", log, re.M)
        assert all("start" not in line or "train_s" not in line for line in log.split("stop ", 1)[1].splitlines())
    # the next run of the same command, with nothing done by hand
    r = subprocess.run(wrapped(*SNAKEMAKE), cwd=wd, env=env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    if moment == "run":
        for v in VARIANTS:
            assert f"at step {HELD}" in text(wd / f"logs/train_xe/tiny-{v}-0.log"), v
    same_results(wd, reference)


def test_under_dvc_repro_a_stop_signal_saves_each_job_and_the_next_repro_resumes(upstream, reference, tmp_path):
    """``r2m warm -- dvc repro``: DVC runs one stage at a time; the running job saves at step 15 and stops, DVC
    reports the failed stage and ends (its locks go with it); the next ``dvc repro`` resumes."""
    wd = copy(upstream, tmp_path / "wd")
    subprocess.run(["git", "init", "-q"], cwd=wd, check=True)
    subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=wd, check=True, env=env())
    r = subprocess.run([str(BIN / "dvc"), "repro", "-s", "resolve_params"], cwd=wd, env=env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    repro = (str(BIN / "dvc"), "repro", "-s", "train_xe@tiny-r2m-0")
    for sig, receiver in (("TERM", "wrapper"), ("INT", "group")):
        out = wd / "stopped.out"
        with out.open("w") as f:
            proc = subprocess.Popen(wrapped(*repro), cwd=wd, env=env(R2M_FAULT=f"train_xe@{HELD}:HOLD"), stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        wait_until("the job held", lambda: "holding at" in text(wd / "logs/train_xe/tiny-r2m-0.log"), proc, out)
        t0 = time.monotonic()
        (os.kill if receiver == "wrapper" else os.killpg)(proc.pid, SIGNALS[sig])
        rc = proc.wait(timeout=STOP_LIMIT)
        output = out.read_text()
        TIMES.append(f"SIG{sig:4} {receiver:7} run    -> {time.monotonic() - t0:5.1f} s | {own_count(output, sig)}"
                     f" s (dvc repro)")
        assert rc == 128 + SIGNALS[sig], output[-3000:]
        assert last_step(wd, "r2m") == HELD
        (wd / "logs/train_xe/tiny-r2m-0.log").unlink()  # the next hold is seen in a fresh log
    r = subprocess.run(wrapped(*repro), cwd=wd, env=env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert f"at step {HELD}" in text(wd / "logs/train_xe/tiny-r2m-0.log")
    a = torch.load(reference / "models/tiny/r2m/s0/train_xe/model.pt", weights_only=True)["state_dict"]
    b = torch.load(wd / "models/tiny/r2m/s0/train_xe/model.pt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_second_signal_kills_a_run_that_does_not_end(upstream, tmp_path):
    """An engine that outlives its jobs and ignores the wrapper's SIGINT (here a shell that traps it) is killed by
    a second SIGTERM at least a second after the first; the job had saved its state on the first."""
    wd = copy(upstream, tmp_path / "wd")
    job = "r2m train_xe --dataset tiny --variant r2m --seed 0"
    engine = ("sh", "-c", f"trap '' INT; {job}; echo job ended $?; sleep 300")
    out = wd / "stopped.out"
    with out.open("w") as f:
        proc = subprocess.Popen(wrapped(*engine), cwd=wd, env=env(R2M_FAULT=f"train_xe@{HELD}:HOLD"), stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
    wait_until("the job held", lambda: "holding at" in text(wd / "logs/train_xe/tiny-r2m-0.log"), proc, out)
    os.kill(proc.pid, signal.SIGTERM)
    wait_until("the job's end", lambda: "job ended 143" in text(out), proc, out)
    time.sleep(1.2)
    assert proc.poll() is None  # the engine is still there
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=STOP_LIMIT) == 143
    assert time.monotonic() - t0 < STOP_LIMIT
    output = out.read_text()
    assert "SIGTERM again: killing the run" in output
    assert last_step(wd, "r2m") == HELD


def test_a_repeat_within_a_second_is_the_same_stop_request(upstream, tmp_path):
    """``timeout`` signals its child and then its process group: two SIGTERMs at once are one stop, not a kill
    (the job still saves its state where it was held)."""
    wd = copy(upstream, tmp_path / "wd")
    job = "r2m train_xe --dataset tiny --variant r2m --seed 0"
    out = wd / "stopped.out"
    with out.open("w") as f:
        proc = subprocess.Popen(wrapped("sh", "-c", job), cwd=wd, env=env(R2M_FAULT=f"train_xe@{HELD}:HOLD"),
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    wait_until("the job held", lambda: "holding at" in text(wd / "logs/train_xe/tiny-r2m-0.log"), proc, out)
    os.kill(proc.pid, signal.SIGTERM)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=STOP_LIMIT) == 143
    output = out.read_text()
    assert "again: killing" not in output and last_step(wd, "r2m") == HELD, output[-3000:]


# a stand-in for Snakemake's scheduler with its real SIGTERM handler (JobScheduler.exit_gracefully), which takes
# the scheduler lock; the main thread holds that lock while it takes a finished job in, as Snakemake's does
DEADLOCKING_ENGINE = r"""
import os, signal, sys, threading, time
from snakemake.scheduling.job_scheduler import JobScheduler

class Scheduler:
    pass

s = Scheduler()
s._lock, s._open_jobs, s._user_kill = threading.Lock(), threading.Semaphore(0), None
signal.signal(signal.SIGTERM, lambda *a: JobScheduler.exit_gracefully(s))
try:
    with s._lock:  # _finish_jobs
        print("holding the scheduler lock", flush=True)
        while True:
            time.sleep(0.01)
except KeyboardInterrupt:
    print("interrupted; lock released:", not s._lock.locked(), flush=True)
    sys.exit(1)
"""


def test_snakemakes_sigterm_deadlock_is_ended_by_the_wrappers_sigint(tmp_path):
    """As at a Slurm time limit, every process gets SIGTERM: Snakemake's handler then waits forever for the lock its
    own main thread holds (a further SIGTERM changes nothing). The wrapper, stopping too, finds no job left and
    sends the engine one SIGINT after its grace: KeyboardInterrupt unwinds the main thread and its lock."""
    from r2m.warm.front import ENGINE_GRACE_S

    out = tmp_path / "out"
    with out.open("w") as f:
        proc = subprocess.Popen([str(BIN / "r2m"), "warm", "--", sys.executable, "-c", DEADLOCKING_ENGINE],
                                cwd=tmp_path, env=env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    wait_until("the lock held", lambda: "holding the scheduler lock" in out.read_text(), proc, out)
    engine = [p for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == proc.pid
              and text(Path(f"/proc/{p}/cmdline")).split("\0")[1:2] == ["-c"]]  # (not the server: r2m warm)
    assert len(engine) == 1
    os.kill(int(engine[0]), signal.SIGTERM)  # the engine's own SIGTERM: now deadlocked
    time.sleep(0.5)
    os.kill(int(engine[0]), signal.SIGTERM)
    time.sleep(0.5)
    assert "interrupted" not in out.read_text()  # still stuck: SIGTERM cannot end it
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)  # ... and the wrapper's
    assert proc.wait(timeout=STOP_LIMIT) == 143
    assert ENGINE_GRACE_S <= time.monotonic() - t0 < ENGINE_GRACE_S + 10
    assert "interrupted; lock released: True" in out.read_text()


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def test_a_lock_left_by_a_killed_snakemake_is_removed_only_when_no_snakemake_runs_there(tmp_path):
    """A Snakemake killed with SIGKILL leaves ``.snakemake/locks/``; the next ``r2m warm -- snakemake`` removes it
    (one line) — unless a Snakemake process runs in that folder, whose lock it may be (one line, left as is)."""
    wd = tmp_path / "wd"
    locks = wd / ".snakemake/locks"
    locks.mkdir(parents=True)
    (wd / "Snakefile").write_text("rule all:\n    output: 'x'\n    shell: 'touch x'\n")

    def lock() -> None:
        (locks / "0.input.lock").write_text("")
        (locks / "0.output.lock").write_text("x\n")

    lock()
    other = subprocess.Popen(["bash", "-c", "exec -a snakemake sleep 120"], cwd=wd)  # a Snakemake there, by name
    try:
        time.sleep(0.3)
        r = subprocess.run(wrapped(str(BIN / "snakemake"), "--cores", "1"), cwd=wd, env=env(), capture_output=True,
                           text=True, timeout=300)
        assert r.returncode != 0 and "cannot be locked" in r.stdout + r.stderr, r.stderr[-3000:]
        assert f"Snakemake runs in {wd} (pid {other.pid}); left as it is" in r.stderr
        assert (locks / "0.output.lock").exists()
    finally:
        other.kill()
        other.wait()
    r = subprocess.run(wrapped(str(BIN / "snakemake"), "--cores", "1"), cwd=wd, env=env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("removed the Snakemake lock a stopped run left") == 1 and (wd / "x").exists()

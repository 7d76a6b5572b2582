"""A stop signal stops a whole ``r2m warm -- snakemake`` run (and ``r2m warm -- dvc repro``) within seconds, says
so in its exit status (128 + signal), and the next run of the same command resumes every job and ends with the
bytes an uninterrupted run writes.

The runs and their moments are tests/stop_runs.py's. A cell of the matrix is a signal (SIGINT, SIGTERM, SIGHUP),
a receiver (the wrapper alone, ``kill PID``; its process group, ``kill -- -PGID`` as Ctrl-C or ``timeout``
send) and a moment (``start``, ``run``, ``finish``). By default 6 cells run: each signal to each receiver,
each receiver at each moment; ``R2M_STOP_MATRIX=all`` runs all 18. ``pytest -s`` prints each cell's time to
stop (the Slurm cells are in tests/test_slurm.py). Also: ``dvc repro`` under the wrapper; a second signal kills
a Snakemake that cannot end, and the next run gets past the lock and markers it left; one stop delivered twice
at once is one stop; a Snakemake lock is removed by the next wrapped run only when no Snakemake runs in the
folder; and Snakemake's own SIGTERM deadlock (its handler waiting on the scheduler lock its main thread holds)
is ended by the wrapper's SIGINT."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import BIN
from stop_runs import (
    AS_A_JOB,
    HELD,
    MOMENTS,
    SIGNALS,
    SNAKEMAKE,
    STEPS,
    STOP_LIMIT,
    VARIANTS,
    copy,
    env,
    held,
    last_step,
    own_count,
    same_results,
    stop_run,
    text,
    wait_until,
    wrapped,
)

pytestmark = pytest.mark.slow
# each signal to each receiver once, the moments turned so that each receiver meets each moment once
DEFAULT = [("INT", "wrapper", "start"), ("INT", "group", "run"), ("TERM", "wrapper", "finish"),
           ("TERM", "group", "start"), ("HUP", "wrapper", "run"), ("HUP", "group", "finish")]
ALL = [(s, r, m) for s in SIGNALS for r in ("wrapper", "group") for m in MOMENTS]
CELLS = ALL if os.environ.get("R2M_STOP_MATRIX") == "all" else DEFAULT
TIMES: list[str] = []
ONE_JOB = "r2m train_xe --dataset tiny --variant r2m --seed 0"


@pytest.fixture(scope="module", autouse=True)
def _print_times():
    yield
    if TIMES:
        print("\nstop signals: signal receiver moment -> seconds to stop (measured here | r2m warm's own count)")
        print("\n".join(TIMES))


@pytest.mark.parametrize(("sig", "receiver", "moment"), CELLS, ids=["-".join(c) for c in CELLS])
def test_a_stop_signal_ends_the_run_and_the_next_run_resumes_bit_identical(stop_upstream, stop_reference, tmp_path,
                                                                           sig, receiver, moment):
    wd = copy(stop_upstream, tmp_path / "wd")
    rc, output, seconds = stop_run(wd, SNAKEMAKE, sig, receiver, moment)
    assert rc == 128 + SIGNALS[sig], output[-3000:]
    TIMES.append(f"SIG{sig:4} {receiver:7} {moment:6} -> {seconds:5.1f} s | {own_count(output, sig):.1f} s")
    assert "Traceback" not in output, output[-3000:]
    assert not (wd / ".snakemake/locks").exists()  # Snakemake ended by itself: its lock is gone
    log = text(wd / "warm.log")
    if moment == "run":  # each job saved its state where it was held
        assert [last_step(wd, v) for v in VARIANTS] == [HELD, HELD], output[-3000:]
        assert re.search(rf"stopped by SIG{sig} at step {HELD} of {STEPS}", text(wd / "logs/train_xe/tiny-r2m-0.log"))
    if moment == "finish":  # a job that ended before the stop is done; none started after it
        assert re.search(r"^end \d+ exit 0$", log, re.M)
        assert not re.search(r"^start .* train_s ", log.split("\nstop ", 1)[1], re.M), log
    # the next run of the same command, with nothing done by hand
    r = subprocess.run(wrapped(*SNAKEMAKE), cwd=wd, env=env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    if moment == "run":
        for v in VARIANTS:
            assert f"at step {HELD}" in text(wd / f"logs/train_xe/tiny-{v}-0.log"), v
    same_results(wd, stop_reference)


def start_held(wd: Path, engine: tuple[str, ...], step: int = HELD) -> tuple[subprocess.Popen, Path]:
    """The wrapped ``engine`` started in ``wd`` (its own process group) and returned once tiny's r2m
    ``train_xe`` is held at ``step``."""
    out = wd / "stopped.out"
    with out.open("w") as f:
        proc = subprocess.Popen(wrapped(*engine), cwd=wd, env=env(R2M_FAULT=f"train_xe@{step}:HOLD"), stdout=f,
                                stderr=subprocess.STDOUT, **AS_A_JOB)
    log = wd / "logs/train_xe/tiny-r2m-0.log"  # where Snakemake sends its stderr; DVC and sh leave it to ours
    wait_until("the job held", lambda: "holding at" in text(log) + out.read_text(), lambda: proc.poll() is None,
               out.read_text)
    return proc, out


def same_weights(a: Path, b: Path) -> bool:
    x, y = (torch.load(p, weights_only=True)["state_dict"] for p in (a, b))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_under_dvc_repro_a_stop_signal_saves_each_job_and_the_next_repro_resumes(stop_upstream, stop_reference,
                                                                                 tmp_path):
    """``r2m warm -- dvc repro``: DVC runs one stage at a time; the running job saves where it is held and stops,
    DVC reports the failed stage and ends (its locks go with it); the next ``dvc repro`` resumes — stopped again
    (SIGINT to the group this time) and resumed again, it ends with the uninterrupted run's weights."""
    wd = copy(stop_upstream, tmp_path / "wd")
    subprocess.run(["git", "init", "-q"], cwd=wd, check=True)
    subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=wd, check=True, env=env())
    r = subprocess.run([str(BIN / "dvc"), "repro", "-s", "stamps"], cwd=wd, env=env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    repro = (str(BIN / "dvc"), "repro", "-s", "train_xe@tiny-r2m-0")
    log = wd / "logs/train_xe/tiny-r2m-0.log"
    for sig, receiver, step in (("TERM", "wrapper", HELD), ("INT", "group", 25)):
        log.unlink(missing_ok=True)  # each hold is seen afresh
        proc, out = start_held(wd, repro, step)
        t0 = time.monotonic()
        (os.kill if receiver == "wrapper" else os.killpg)(proc.pid, SIGNALS[sig])
        rc = proc.wait(timeout=STOP_LIMIT)
        output = out.read_text()
        TIMES.append(f"SIG{sig:4} {receiver:7} run    -> {time.monotonic() - t0:5.1f} s | "
                     f"{own_count(output, sig):.1f} s (dvc repro)")
        assert rc == 128 + SIGNALS[sig], output[-3000:]
        assert last_step(wd, "r2m") == step
    assert f"at step {HELD}" in text(log)  # the second run had resumed the first
    r = subprocess.run(wrapped(*repro), cwd=wd, env=env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "at step 25" in text(log)
    model = "models/tiny/r2m/s0/train_xe/model.pt"
    assert same_weights(wd / model, stop_reference / model)


def test_a_second_signal_kills_a_stuck_snakemake_and_the_next_run_gets_past_what_it_left(stop_upstream,
                                                                                          stop_reference, tmp_path):
    """Snakemake made unable to end (SIGSTOP, as a hung engine): the first SIGTERM stops the jobs (each saves at
    step 15), the second kills the run — Snakemake included, leaving its lock and "incomplete" markers. The
    wrapper removes the lock; the next wrapped run adds ``--rerun-incomplete`` itself and resumes bit-identically."""
    wd = copy(stop_upstream, tmp_path / "wd")
    out = wd / "stopped.out"
    with out.open("w") as f:
        proc = subprocess.Popen(wrapped(*SNAKEMAKE), cwd=wd, env=env(R2M_FAULT=f"train_xe@{HELD}:HOLD"), stdout=f,
                                stderr=subprocess.STDOUT, **AS_A_JOB)
    wait_until("both train_xe jobs held", lambda: held(wd) == 2, lambda: proc.poll() is None, out.read_text)
    snakemake = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == proc.pid
                 and text(Path(f"/proc/{p}/cmdline")).split("\0")[1:2] == [SNAKEMAKE[0]]]  # python snakemake ...
    assert len(snakemake) == 1
    os.kill(snakemake[0], signal.SIGSTOP)
    os.kill(proc.pid, signal.SIGTERM)
    wait_until("both jobs saved", lambda: [last_step(wd, v) for v in VARIANTS] == [HELD, HELD],
               lambda: proc.poll() is None, out.read_text)
    time.sleep(1.2)
    assert proc.poll() is None  # Snakemake cannot end
    assert (wd / ".snakemake/locks").exists() and any((wd / ".snakemake/incomplete").iterdir())
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=STOP_LIMIT) == 143
    output = out.read_text()
    assert "SIGTERM again: killing the run" in output and "removed the Snakemake lock" in output, output[-3000:]
    assert not (wd / ".snakemake/locks").exists()
    r = subprocess.run(wrapped(*SNAKEMAKE), cwd=wd, env=env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "running snakemake with --rerun-incomplete" in r.stderr
    for v in VARIANTS:
        assert f"at step {HELD}" in text(wd / f"logs/train_xe/tiny-{v}-0.log"), v
    same_results(wd, stop_reference)


def test_a_repeat_within_a_second_is_the_same_stop_request(stop_upstream, tmp_path):
    """``timeout`` signals its child and then its process group: two SIGTERMs at once are one stop, not a kill
    (the job still saves its state where it was held)."""
    wd = copy(stop_upstream, tmp_path / "wd")
    proc, out = start_held(wd, ("sh", "-c", ONE_JOB))
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
    own main thread holds (a further SIGTERM changes nothing). The wrapper, stopping too, finds an engine none of
    whose jobs its server ran, and sends it one SIGINT at once (one that ran jobs gets it once it has no job, no
    child and uses no CPU): KeyboardInterrupt unwinds the main thread and its lock — well before the wrapper's
    last resort (a SIGINT whatever the engine does)."""
    from r2m.warm.front import ENGINE_GRACE_S

    out = tmp_path / "out"
    with out.open("w") as f:
        proc = subprocess.Popen([str(BIN / "r2m"), "warm", "--", sys.executable, "-c", DEADLOCKING_ENGINE],
                                cwd=tmp_path, env=env(), stdout=f, stderr=subprocess.STDOUT, **AS_A_JOB)
    wait_until("the lock held", lambda: "holding the scheduler lock" in out.read_text(), lambda: proc.poll() is None,
               out.read_text)
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
    assert time.monotonic() - t0 < ENGINE_GRACE_S  # ran no job of the server's: its SIGINT comes at once
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

"""The front end of ``r2m warm``: runs COMMAND (the workflow engine: Snakemake, ``dvc repro``) and turns a stop
signal into an ordered stop of the whole run.

**Who receives a signal.** COMMAND runs in a session of its own, so a signal meant for the run — to
``r2m warm`` alone (``kill PID``, ``timeout``, a supervisor) or to its process group (Ctrl-C, ``kill -- -PGID``)
— reaches this process only, and this process decides who gets what, in which order. (A scheduler that signals
every process of a job, as Slurm does at a time limit, reaches the engine and the jobs directly as well; see
below.)

**The order: jobs first, the engine by itself.** On the first SIGINT, SIGTERM or SIGHUP the server sends that
signal to every job it runs (each training job saves ``last.pt`` at its next step boundary and exits with
128 + signal; other stages stop at once, their outputs being written atomically) and answers every job the
engine starts afterwards with the same status without running it. The engine is not signalled: it only sees
its jobs fail, and ends through its ordinary failure path (Snakemake: no new job without ``--keep-going``,
each failed job's outputs and "incomplete" markers removed, its workspace lock released; DVC: the failed stage
reported, its locks released). Snakemake 9.27's own signal handling is why (``snakemake/scheduling/
job_scheduler.py``): its SIGTERM handler ``exit_gracefully`` takes the scheduler's lock, a non-reentrant
``threading.Lock`` that the main thread holds while it processes finished or failed jobs (``_finish_jobs``,
``_error_jobs``) and selects new ones, so a SIGTERM arriving just as a job ends deadlocks Snakemake, with its
executor threads waiting in ``error_callback`` on the same lock; and "graceful" means waiting for running jobs
to *finish*: the local executor never signals its jobs (its ``cancel`` is ``ThreadPoolExecutor.shutdown``,
which waits for them). A SIGINT instead raises ``KeyboardInterrupt`` wherever the main thread is, which
releases the lock (the ``with`` block unwinds) — it even ends the deadlock above — but can cut short the
bookkeeping of a job that just finished. Hence: an engine still running after its last job ended gets one
SIGINT, never a SIGTERM — at once when the server has run none of its jobs (it is still planning, or a cluster
executor runs them: Snakemake then cancels them, and each gets its scheduler's SIGTERM); once it has had no
child process (job shells still starting or ending) and used no CPU time for :data:`ENGINE_STUCK_S` (a
Snakemake that got a SIGTERM from elsewhere, as every process does at a Slurm time limit, and deadlocked); at
the latest :data:`ENGINE_GRACE_S` after that end (``--keep-going`` starting job after job).

**A second signal** (at least :data:`REPEAT_S` after the first) kills at once: SIGKILL to the engine's session
and to every job (each job resumes from its last checkpoint, written atomically every ``checkpoint_every``
steps). A stop request delivered twice within :data:`REPEAT_S` — ``timeout`` signals its child and then its
process group, ``make`` passes a SIGTERM on to its children, Slurm signals every process — is one request.
A signal ignored when ``r2m warm`` started (``nohup``) stays ignored.

**What the next run finds.** A Snakemake killed with SIGKILL leaves its workspace lock and "incomplete"
markers: the lock is removed once no Snakemake runs in the folder, and the next ``r2m warm -- snakemake``
removes such a lock and adds ``--rerun-incomplete`` itself (:mod:`r2m.warm.engine`).

Without a server (no socket could be made) the jobs run cold in the engine's session: the stop is then one
SIGINT to that session, Ctrl-C's path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Protocol

from r2m.warm import engine as E

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
REPEAT_S = 1.0  # a stop signal this soon after the first is the same request, delivered twice
ENGINE_STUCK_S = 1.0  # an engine with no job left, no child process and no CPU time used this long: one SIGINT
ENGINE_GRACE_S = 10.0  # ... and one still running this long after its last job ended, whatever it does
POLL_S = 0.05


class Control(Protocol):
    """The server's side as the front end uses it (:class:`r2m.warm.server.Control`)."""

    def engine(self, pid: int) -> None: ...  # the engine's session, killed if the front end dies
    def stop(self, signum: int) -> None: ...  # signal every job; refuse new ones
    def kill(self) -> None: ...  # SIGKILL every job
    def idle(self) -> bool: ...  # since the stop, no job runs
    @property
    def started(self) -> bool: ...  # the server has run a job


def say(line: str) -> None:
    print(f"r2m warm: {line}", file=sys.stderr, flush=True)


class Signals:
    """The stop signals this process receives, recorded (not acted on) by their handlers: installed at once, so
    that a signal arriving while the server starts is not lost; :meth:`restore` puts the old handlers back."""

    def __init__(self) -> None:
        self.received: list[tuple[int, float]] = []
        self.ignored: set[int] = set()
        self._old: dict[int, object] = {}
        for sig in STOP_SIGNALS:
            old = signal.getsignal(sig)
            if old is signal.SIG_IGN:
                self.ignored.add(sig)  # nohup & co.; a handler (not SIG_IGN) so that COMMAND gets the default
            self._old[sig] = signal.signal(sig, self._record)

    def _record(self, signum: int, frame: object) -> None:
        if signum not in self.ignored:
            self.received.append((signum, time.monotonic()))

    def take(self) -> list[tuple[int, float]]:
        got, self.received[:] = list(self.received), []
        return got

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]


def status(code: int) -> int:
    """A ``Popen`` return code as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else code


def run(argv: list[str], env: dict[str, str], signals: Signals, control: Control | None = None) -> int:
    """Run COMMAND to its end and return its exit status, or 128 + N when signal N stopped the run (0 when
    COMMAND succeeded all the same: the signal came as it finished)."""
    if signals.received:  # stopped before anything started
        signum = signals.take()[0][0]
        say(f"stopped by {signal.Signals(signum).name} before {argv[0]} started")
        return 128 + signum
    argv, lines = E.prepare(argv, os.getcwd())
    for line in lines:
        say(line)
    try:
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
    except FileNotFoundError:
        say(f"{argv[0]}: command not found")
        return 127
    if control is not None:
        control.engine(proc.pid)
    first: tuple[int, float] | None = None
    killed = interrupted = False
    idle_since: float | None = None
    still = (0.0, -2)  # since when the engine has had no child and this CPU time (clock ticks)
    while True:
        try:
            code = proc.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        for signum, at in signals.take():
            if first is None:
                first = (signum, at)
                say(f"{signal.Signals(signum).name}: stopping the run: each job saves its state and stops, no new "
                    f"job starts (a second signal kills at once)")
                if control is not None:
                    control.stop(signum)
                else:
                    send_signal(-proc.pid, signal.SIGINT)
                    interrupted = True
            elif at - first[1] >= REPEAT_S and not killed:
                say(f"{signal.Signals(signum).name} again: killing the run (each job resumes from its last "
                    f"checkpoint)")
                send_signal(-proc.pid, signal.SIGKILL)
                if control is not None:
                    control.kill()
                killed = True
        if first is not None and not (killed or interrupted) and control is not None:
            if idle_since is None and control.idle():
                idle_since = now
                still = (now, -2)
            if idle_since is not None:
                state = -1 if has_children(proc.pid) else cpu_ticks(proc.pid)
                if state == -1 or state != still[1]:
                    still = (now, state)  # a child, or CPU time used: not stuck
                if not control.started or now - still[0] >= ENGINE_STUCK_S or now - idle_since >= ENGINE_GRACE_S:
                    send_signal(proc.pid, signal.SIGINT)
                    interrupted = True
    if first is None:
        return status(code)
    name = signal.Signals(first[0]).name
    if code == 0:  # it had done everything when the signal came
        say(f"{name} came as {argv[0]} finished: nothing left to stop")
        return 0
    args = E.snakemake_args(argv)
    if killed and args is not None:
        line = E.release_stale_lock(E.workdir(args, os.getcwd()))
        if line:
            say(line)
    say(f"stopped by {name} in {time.monotonic() - first[1]:.1f} s; run the same command again to resume")
    return 128 + first[0]


def cpu_ticks(pid: int) -> int:
    """The CPU time process ``pid`` has used (all its threads; clock ticks), or -1 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    except (OSError, ValueError, IndexError):
        return -1


def has_children(pid: int) -> bool:
    """Whether process ``pid`` has a child process (true too where the kernel does not say)."""
    try:
        for task in os.scandir(f"/proc/{pid}/task"):
            with open(f"{task.path}/children", "rb") as f:
                if f.read().strip():
                    return True
    except OSError:
        return os.path.exists(f"/proc/{pid}")
    return False


def send_signal(pid: int, signum: int) -> None:
    """``os.kill`` of a process (or, ``pid`` < 0, of the process group -``pid`` leads: COMMAND's session, it and
    what it started) that may have ended meanwhile."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


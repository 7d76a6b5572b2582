"""Resumable state, exclusive stage locks, preemption and fault injection — shared by every
long-running stage (training, feature extraction, the supervised baselines).

**Resume folder.** ``.r2m/resume/<stage>/<axes>/`` (see :func:`resume_dir`) holds a stage's
resumable state (``last.pt``, finished feature shards). It is *not* a declared output, so neither
Snakemake (which deletes the outputs of a failed or incomplete job, also under
``--rerun-incomplete``) nor ``dvc repro`` touch it; the stage deletes it once its outputs are
complete (:func:`clear`).

**Lock.** :class:`StageLock` takes an exclusive ``flock`` on ``.r2m/locks/<stage>/<axes>.lock`` for
the whole run; a second run on the same outputs fails at once with :class:`StageBusy` naming the
holder (pid, host, start time, command). The kernel drops the lock when the holder dies (also
on ``kill -9``), so a stale lock file never blocks anything.

**Preemption.** Inside :class:`Preemption` SIGTERM, SIGINT and SIGHUP (how SLURM, Kubernetes, Ctrl-C and
a closed terminal stop a job) only set a flag; the loop calls :meth:`Preemption.check` at each step
boundary, which (after the caller saved a checkpoint) raises :class:`Preempted`. ``r2m`` reports it as
one line and exits with ``128 + signal``. A second signal while the first is pending stops at once,
unless it comes within :data:`REPEAT_S` of the first: one stop request often arrives by two routes at
once (Slurm signals every process of a job, and a warm job's client passes the signal on too), and that
must not cost the job its final save.

**Fault injection (tests).** ``R2M_FAULT=<point>@<n>:<SIGNAL>`` (e.g. ``train_xe@7:KILL``; several
separated by commas; ``KILLGROUP`` kills the whole process group) makes
:func:`inject` send the signal to the running process when ``point`` reaches ``n``; the fault suite
uses it to kill a stage at a chosen step under Snakemake and DVC. ``HOLD`` instead holds the process
there — one line ``r2m: fault injection: holding at <point>@<n>`` on stderr, then waiting — until a
stop signal arrives (inside :class:`Preemption`), the file ``$R2M_FAULT_RELEASE`` exists, or
:data:`HOLD_S` pass: a job held at a known moment for the stop-signal tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

STATE_ROOT = Path(".r2m")
REPEAT_S = 1.0  # a second stop signal this soon after the first is the same request, delivered twice
HOLD_S = 300.0  # the longest a HOLD fault waits for a stop signal


def stage_key(axes: Mapping[str, Any], extra: str | None = None) -> str:
    key = "-".join(str(v) for v in axes.values() if v is not None) or "all"
    return f"{key}-{extra}" if extra else key


def resume_dir(root: str | Path, stage: str, axes: Mapping[str, Any], extra: str | None = None) -> Path:
    """``<root>/.r2m/resume/<stage>/<axes>[-extra]`` (not created)."""
    return Path(root) / STATE_ROOT / "resume" / stage / stage_key(axes, extra)


def clear(folder: str | Path) -> None:
    """Delete a resume folder (after the stage's outputs are complete)."""
    shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- lock
class StageBusy(RuntimeError):
    """Another run holds the lock on the same stage outputs."""


class StageLock:
    """Exclusive, non-blocking lock on one stage's outputs; the holder is written into the file."""

    def __init__(self, root: str | Path, stage: str, axes: Mapping[str, Any], outputs: str = "",
                 extra: str | None = None) -> None:
        self.path = Path(root) / STATE_ROOT / "locks" / stage / f"{stage_key(axes, extra)}.lock"
        self.stage, self.outputs = stage, outputs or stage_key(axes, extra)
        self._fh: Any = None

    def acquire(self) -> StageLock:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115  (kept open while held)
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip()
            fh.close()
            try:
                h = json.loads(holder)
                who = (f"pid {h.get('pid')} on {h.get('host')} since {h.get('since')} "
                       f"({h.get('command')})")
            except ValueError:
                who = "another process"
            raise StageBusy(f"{self.outputs}: already being written by {who}; wait for it to finish or stop it "
                            f"(lock {self.path})") from None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                             "command": " ".join(["r2m", *sys.argv[1:]])[:300]}))
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            import fcntl

            with contextlib.suppress(OSError):
                self._fh.seek(0)
                self._fh.truncate()
                fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None

    def __enter__(self) -> StageLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# --------------------------------------------------------------------------- preemption
class Preempted(Exception):  # noqa: N818  (a stop request, not an error of the stage)
    """The stage stopped on SIGTERM/SIGINT after saving its state."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class Preemption:
    """Turn SIGTERM/SIGINT/SIGHUP into a flag checked at step boundaries (main thread only; elsewhere a
    no-op)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    active: Preemption | None = None  # the innermost one entered (what a HOLD fault waits on)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._at = 0.0
        self._old: dict[int, Any] = {}
        self._outer: Preemption | None = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            if time.monotonic() - self._at < REPEAT_S:  # the same request by another route
                return
            raise KeyboardInterrupt  # a second signal: stop now
        self.signum, self._at = signum, time.monotonic()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def check(self, what: str, saved: str | Path | None = None) -> None:
        """Raise :class:`Preempted` if a stop was requested (call after saving state)."""
        if self.signum is None:
            return
        name = signal.Signals(self.signum).name
        where = f"; state saved to {saved}, rerun the same command to resume" if saved else ""
        raise Preempted(self.signum, f"stopped by {name} at {what}{where}")

    def __enter__(self) -> Preemption:
        import threading

        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
            self._outer, Preemption.active = Preemption.active, self
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        if self._old:
            Preemption.active = self._outer
        self._old.clear()


# --------------------------------------------------------------------------- fault injection
def inject(point: str, n: int) -> None:
    """Send ourselves the signal named by ``R2M_FAULT=<point>@<n>:<SIGNAL>[,…]`` when one matches.

    ``KILLGROUP`` sends SIGKILL to the whole process group (the workflow engine that started the
    job too, when it runs in the same group): a crash of the machine as the engine sees it."""
    spec = os.environ.get("R2M_FAULT")
    if not spec:
        return
    for item in spec.split(","):
        try:
            where, sig = item.strip().rsplit(":", 1)
            p, k = where.rsplit("@", 1)
            if p != point or int(k) != n:
                continue
            group = sig.upper() == "KILLGROUP"
            if sig.upper() == "HOLD":
                _hold(f"{p}@{k}")
                continue
            signum = signal.SIGKILL if group else getattr(signal, f"SIG{sig.upper().removeprefix('SIG')}")
        except (ValueError, AttributeError):
            raise ValueError(f"R2M_FAULT={spec!r}: expected <point>@<n>:<SIGNAL>, e.g. train_xe@7:KILL") from None
        if group:
            os.killpg(os.getpgid(0), signum)
        else:
            os.kill(os.getpid(), signum)
        if signum not in Preemption.SIGNALS:  # SIGKILL never returns; give the signal time to land
            time.sleep(5)


def _hold(where: str) -> None:
    """The ``HOLD`` fault: say so on stderr, then wait until the active :class:`Preemption` has a stop request
    or the file ``$R2M_FAULT_RELEASE`` exists (at most :data:`HOLD_S`)."""
    print(f"r2m: fault injection: holding at {where}", file=sys.stderr, flush=True)
    release = os.environ.get("R2M_FAULT_RELEASE")
    end = time.monotonic() + HOLD_S
    while time.monotonic() < end and not (Preemption.active is not None and Preemption.active.requested):
        if release and os.path.exists(release):
            break
        time.sleep(0.02)


@contextlib.contextmanager
def preemptible() -> Iterator[Preemption]:
    with Preemption() as p:
        yield p

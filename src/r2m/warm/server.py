"""``r2m warm [--] COMMAND ...``: run COMMAND (e.g. ``snakemake --cores 2 all``) while a warm server
forks its ``r2m <stage>`` jobs from a process that has already imported what they import
(see :mod:`r2m.warm`). The server lives exactly as long as COMMAND and its jobs; its socket sits in a private
temporary folder. The front end (this process; :mod:`r2m.warm.front`) runs COMMAND in a session of its own and
talks to the server over a socket pair (:class:`Control`): on a stop signal the server signals every job and
refuses new ones; when the front end is killed (``kill -9`` too) the server kills COMMAND's session and the
jobs, and ends, removing its folder. ``make run`` uses it; nothing else needs it (without it every job runs
cold).
"""

from __future__ import annotations

import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from r2m.warm import front
from r2m.warm.client import SLURM_ENV, SOCKET_ENV
from r2m.warm.front import STOP_SIGNALS

# what every job would import again: the libraries the stage modules import (not the stage modules: a job's
# record of what it read names every project module in its process, r2m.utils.reads, so a job imports its
# own stage's modules itself) and what every job's runner imports
PRELOAD = ("numpy", "pandas", "pyarrow", "pyarrow.parquet", "PIL.Image", "h5py", "yaml", "pydantic",
           "torch", "torch.optim", "torch._dynamo", "matplotlib", "r2m.params")
# what a job runs: ``r2m <argv>``'s entry (:func:`r2m.cli.main`, which hands itself over) -> its exit status
Target = Callable[[list[str]], int]
USAGE = ("usage: r2m warm [--log FILE] [--] COMMAND [ARGS...]   (e.g. r2m warm -- snakemake --cores 2 all); "
         "--log FILE: one line per job (its pid, command and exit status)")


def preload(modules: Iterable[str] = ()) -> list[str]:
    """Import :data:`PRELOAD` and ``modules`` (what the caller's jobs import besides); the names that could not
    be imported (an optional extra not installed: its jobs import it themselves, cold)."""
    missing = []
    for name in dict.fromkeys((*PRELOAD, *modules)):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def _recv_job(conn: socket.socket) -> tuple[dict, list[int]]:
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    (size,) = struct.unpack("!I", msg[:4])
    raw = msg[4:]
    while len(raw) < size:
        more = conn.recv(size - len(raw))
        if not more:
            raise ConnectionError("the client left before sending its job")
        raw += more
    return json.loads(raw), list(fds)


def _watch(conn: socket.socket) -> None:
    """In the job: forward the client's signals; when the client is gone, die as it did."""
    pending = b""
    while True:
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if not data:
            os.kill(os.getpid(), signal.SIGKILL)
        pending += data
        while len(pending) >= 2:
            if pending[:1] == b"S":
                os.kill(os.getpid(), pending[1])
            pending = pending[2:]


def _run_job(listener: socket.socket, conn: socket.socket, job: dict, fds: list[int], target: Target,
             control: socket.socket | None = None) -> None:
    """In the forked child: become the client's process (stdio, folder, environment, arguments), run
    ``r2m <argv>`` and exit with its status. Never returns."""
    code = 1
    try:
        listener.close()
        if control is not None:
            control.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # a stop signal the server sent right after the fork waited, blocked, for these handlers
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        for std, fd in enumerate(fds):
            os.dup2(fd, std)
            os.close(fd)
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        os.environ.pop(SOCKET_ENV, None)  # the job runs here; what it starts itself starts cold
        sys.argv = ["r2m", *job["argv"]]
        import random

        random.seed()  # fresh entropy, as a cold process starts with (the server's state is shared)
        tempfile.tempdir = None  # the job's own TMPDIR
        threading.Thread(target=_watch, args=(conn,), daemon=True).start()
        code = target(list(job["argv"]))
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else 1
    except KeyboardInterrupt:  # SIGINT before the job's own handling
        code = 128 + signal.SIGINT
    except BaseException as err:  # noqa: BLE001 - the job's last line, then its status
        print(f"r2m: warm job failed: {type(err).__name__}: {err}", file=sys.stderr)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code if isinstance(code, int) else 1)


def _refuse(conn: socket.socket, job: dict, fds: list[int], signum: int) -> None:
    """Answer a job that arrives while the run stops: one line on its stderr, status 128 + signal, not run."""
    try:
        name = " ".join(job["argv"][:1])
        os.write(fds[2], f"r2m {name}: not started: the run is stopping ({signal.Signals(signum).name})\n"
                 .encode())
    except (OSError, IndexError, KeyError, TypeError):
        pass
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(f"exit {128 + signum}\n".encode())
    except OSError:
        pass
    conn.close()


class Control:
    """The front end's end of its channel to the server (a socket pair; one line per message). To the server:
    ``engine PID`` (the command's session, killed if the front end dies), ``stop N`` (signal N to every job,
    refuse new ones), ``kill`` (SIGKILL every job), ``quit`` (wait for the running jobs, then end; the channel
    closing without ``quit`` means the front end died). From the server: ``ready`` once it has imported
    :data:`PRELOAD` and takes jobs (until then none runs: a job that connects waits), ``started`` when it starts
    its first job, ``idle`` once no job runs after a stop."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self._heard: set[str] = set()
        self._buf = b""
        self._stopped = False

    def _send(self, line: str) -> None:
        try:
            self.sock.sendall(line.encode() + b"\n")
        except OSError:
            pass

    def _read(self) -> None:
        try:
            self._buf += self.sock.recv(256)
        except (BlockingIOError, OSError):
            return
        *lines, self._buf = self._buf.split(b"\n")
        self._heard.update(line.decode() for line in lines)

    def engine(self, pid: int) -> None:
        self._send(f"engine {pid}")

    def stop(self, signum: int) -> None:
        self._stopped = True
        self._send(f"stop {signum}")

    def kill(self) -> None:
        self._send("kill")

    @property
    def ready(self) -> bool:
        self._read()
        return "ready" in self._heard

    def idle(self) -> bool:
        """Since the stop, no job runs (the server said so, or it has not taken any job yet)."""
        return self._stopped and (not self.ready or "idle" in self._heard)

    @property
    def started(self) -> bool:
        """The server has run a job (the engine's jobs are its jobs: not a cluster executor's)."""
        self._read()
        return "started" in self._heard

    def quit(self, server: int) -> None:
        """Tell the server (process ``server``) to end and wait for it: it ends once its running jobs have; one
        still importing :data:`PRELOAD` has none and is killed instead of waited for."""
        ready = self.ready
        self._send("quit")
        self.sock.close()
        if not ready:
            front.send_signal(server, signal.SIGKILL)
        os.waitpid(server, 0)


def serve(listener: socket.socket, target: Target, stop: threading.Event | None = None, log: Path | None = None,
          control: socket.socket | None = None) -> None:
    """Accept jobs, fork each to run ``target(argv)`` (``r2m <argv>``) and tell its client how it ended (and
    ``log``, when given: one line per job start and end), until ``stop`` is set or SIGTERM comes — or, given
    ``control`` (the server of ``r2m warm``, whose front end speaks :class:`Control`), until it says ``quit``
    (then after the running jobs end) or is gone (the front end was killed: its command's session and every job
    are killed with SIGKILL). Stop signals do not stop a server with a control channel: it acts on ``stop``."""
    def note(line: str) -> None:
        if log is not None:
            with open(log, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    running: dict[int, socket.socket] = {}
    done = stop or threading.Event()
    stopping: int | None = None  # the stop signal, once asked
    engine: int | None = None
    quitting = told_idle = ran = False
    if control is None:
        signal.signal(signal.SIGTERM, lambda *_: done.set())
    else:
        sel.register(control, selectors.EVENT_READ)
    pending = b""

    def kill_jobs() -> None:
        for pid in running:
            front.send_signal(pid, signal.SIGKILL)

    while not done.is_set() and not (quitting and not running):
        events = sel.select(timeout=0.05)
        for key, _ in sorted(events, key=lambda e: e[0].fileobj is not control):  # a stop before new jobs
            if key.fileobj is control:
                try:
                    data = control.recv(256)
                except OSError:
                    data = b""
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    word, _, arg = line.decode().partition(" ")
                    if word == "engine":
                        engine = int(arg)
                    elif word == "stop" and stopping is None:
                        stopping = int(arg)
                        note(f"stop {signal.Signals(stopping).name}")
                        for pid in running:
                            front.send_signal(pid, stopping)
                            front.send_signal(pid, signal.SIGCONT)  # a stopped job (Ctrl-Z, SIGSTOP) handles it too
                    elif word == "kill":
                        kill_jobs()
                    elif word == "quit":
                        quitting = True
                if not data:  # the front end is gone
                    sel.unregister(control)
                    control.close()
                    control = None
                    if not quitting:  # killed: take its command and the jobs with it
                        if engine is not None:
                            front.send_signal(-engine, signal.SIGKILL)
                        kill_jobs()
                        quitting = True
                if quitting and listener.fileno() >= 0:
                    sel.unregister(listener)
                    listener.close()
                continue
            if listener.fileno() < 0:  # closed just now (quit)
                continue
            conn, _ = listener.accept()
            try:
                job, fds = _recv_job(conn)
            except (OSError, ValueError, ConnectionError) as err:
                print(f"r2m warm: a job could not be read: {err}", file=sys.stderr)
                conn.close()
                continue
            if stopping is not None:
                note(f"refused r2m {' '.join(job['argv'])}")
                _refuse(conn, job, fds, stopping)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _run_job(listener, conn, job, fds, target, control)
            for fd in fds:
                os.close(fd)
            running[pid] = conn
            note(f"start {pid} r2m {' '.join(job['argv'])}")
            if not ran and control is not None:
                ran = True
                _tell(control, b"started\n")
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
            note(f"end {pid} exit {code}")
            conn = running.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"exit {code}\n".encode())
                except OSError:
                    pass
                conn.close()
        if stopping is not None and not running and not told_idle and control is not None:
            _tell(control, b"idle\n")
            told_idle = True
    if listener.fileno() >= 0:
        listener.close()


def _tell(control: socket.socket, line: bytes) -> None:
    try:
        control.sendall(line)
    except OSError:
        pass




def open_socket() -> tuple[socket.socket, Path]:
    """A listening Unix socket in a private temporary folder (under /tmp when $TMPDIR is too long for one)."""
    base = tempfile.gettempdir()
    if len(base) > 80 and Path("/tmp").is_dir():  # a socket path holds at most ~107 bytes
        base = "/tmp"
    folder = Path(tempfile.mkdtemp(prefix="r2m-warm-", dir=base))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(folder / "socket"))
        listener.listen(64)
    except OSError:
        listener.close()
        folder.rmdir()
        raise
    return listener, folder


def main(argv: list[str], target: Target, modules: Iterable[str] = ()) -> int:
    """``r2m warm [--log FILE] [--] COMMAND ...``: each job runs ``target(argv)``; ``modules``: preloaded
    besides :data:`PRELOAD` and the stage modules (what ``target`` imports when it runs)."""
    log = None
    if argv[:1] == ["--log"] and len(argv) > 1:
        log, argv = Path(argv[1]).resolve(), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    signals = front.Signals()  # from now on a stop signal is kept, not lost
    try:
        return _main(argv, target, modules, log, signals)
    finally:
        signals.restore()


def _main(argv: list[str], target: Target, modules: Iterable[str], log: Path | None, signals: front.Signals) -> int:
    env = {k: v for k, v in os.environ.items() if k not in (SOCKET_ENV, SLURM_ENV)}
    try:
        listener, folder = open_socket()
    except OSError as err:
        print(f"r2m warm: no socket for the server ({err.strerror or err}); its jobs start cold", file=sys.stderr)
        return front.run(argv, env, signals)
    sys.stdout.flush()
    sys.stderr.flush()
    ours, theirs = socket.socketpair()
    server = os.fork()
    if server == 0:
        try:
            ours.close()
            os.setsid()  # no terminal's or process group's signal reaches the server; the front end asks it
            # blocked, not ignored: a job forked from here gets a stop signal sent right after its fork once it
            # has its own handlers (_run_job), instead of losing it to an inherited SIG_IGN
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            # here, not in the front end: the jobs (forks of the server) share these pages, and the front end
            # stays a small process (it starts COMMAND meanwhile; a job that connects early waits in the backlog)
            missing = preload(modules)
            if missing:
                print(f"r2m warm: not preloaded (imported by their jobs): {', '.join(missing)}", file=sys.stderr)
            theirs.sendall(b"ready\n")
            serve(listener, target, log=log, control=theirs)
        finally:
            remove_socket(folder)  # also when r2m warm was killed and cannot
            os._exit(0)
    listener.close()
    theirs.close()
    control = Control(ours)
    try:
        env = {**env, SOCKET_ENV: str(folder / "socket"), SLURM_ENV: os.environ.get("SLURM_JOB_ID", "")}
        return front.run(argv, env, signals, control)
    finally:
        control.quit(server)
        remove_socket(folder)


def remove_socket(folder: Path) -> None:
    """Remove the server's socket and its private folder (whichever of server and front end comes first)."""
    (folder / "socket").unlink(missing_ok=True)
    try:
        folder.rmdir()
    except FileNotFoundError:
        pass

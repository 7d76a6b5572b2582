"""``r2m warm [--] COMMAND ...``: run COMMAND (e.g. ``snakemake --cores 2 all``) while a warm server
forks its ``r2m <stage>`` jobs from a process that has already imported what they import
(see :mod:`r2m.warm`). The server lives exactly as long as COMMAND; its socket sits in a private
temporary folder; the server also ends, removing that folder, when ``r2m warm`` itself is killed (any signal,
``kill -9`` too). ``make run`` uses it; nothing else needs it (without it every job runs cold).
"""

from __future__ import annotations

import importlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from r2m.warm.client import SOCKET_ENV

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


def _run_job(listener: socket.socket, conn: socket.socket, job: dict, fds: list[int], target: Target) -> None:
    """In the forked child: become the client's process (stdio, folder, environment, arguments), run
    ``r2m <argv>`` and exit with its status. Never returns."""
    code = 1
    try:
        listener.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
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
    except BaseException as err:  # noqa: BLE001 - the job's last line, then its status
        print(f"r2m: warm job failed: {type(err).__name__}: {err}", file=sys.stderr)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code if isinstance(code, int) else 1)


def serve(listener: socket.socket, target: Target, stop: threading.Event | None = None, log: Path | None = None,
          parent: int | None = None) -> None:
    """Accept jobs until ``stop`` is set (or SIGTERM), or, given ``parent`` (the pid of ``r2m warm``), until
    that process is gone (killed by any signal, ``kill -9`` included: this process is then another's child);
    fork each job to run ``target(argv)`` (``r2m <argv>``); tell its client how it ended (and ``log``, when
    given: one line per job start and end). Jobs already running go on to their end."""
    def note(line: str) -> None:
        if log is not None:
            with open(log, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    running: dict[int, socket.socket] = {}
    done = stop or threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    while not done.is_set():
        if parent is not None and os.getppid() != parent:  # r2m warm died without stopping us
            break
        for _key, _ in sel.select(timeout=0.05):
            conn, _ = listener.accept()
            try:
                job, fds = _recv_job(conn)
            except (OSError, ValueError, ConnectionError) as err:
                print(f"r2m warm: a job could not be read: {err}", file=sys.stderr)
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _run_job(listener, conn, job, fds, target)
            for fd in fds:
                os.close(fd)
            running[pid] = conn
            note(f"start {pid} r2m {' '.join(job['argv'])}")
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
    listener.close()


def run_command(argv: list[str], env: dict[str, str]) -> int:
    """Run the wrapped command to its end; SIGTERM/SIGHUP to us reach it (it stops its jobs), Ctrl-C reaches it
    by itself (we wait on)."""
    try:
        command = subprocess.Popen(argv, env=env)
    except FileNotFoundError:
        print(f"r2m warm: {argv[0]}: command not found", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: command.send_signal(signum))
    while True:
        try:
            return command.wait()
        except KeyboardInterrupt:
            continue


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
    try:
        listener, folder = open_socket()
    except OSError as err:
        print(f"r2m warm: no socket for the server ({err.strerror or err}); its jobs start cold", file=sys.stderr)
        return run_command(argv, {k: v for k, v in os.environ.items() if k != SOCKET_ENV})
    path = str(folder / "socket")
    missing = preload(modules)  # before the fork: the jobs share these pages
    if missing:
        print(f"r2m warm: not preloaded (imported by their jobs): {', '.join(missing)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    front = os.getpid()
    server = os.fork()
    if server == 0:
        try:
            os.setsid()  # the terminal's Ctrl-C reaches the command, and a job only through its client
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            serve(listener, target, log=log, parent=front)
        finally:
            remove_socket(folder)  # also when r2m warm was killed and cannot
            os._exit(0)
    listener.close()
    try:
        return run_command(argv, {**os.environ, SOCKET_ENV: path})
    finally:
        os.kill(server, signal.SIGTERM)
        os.waitpid(server, 0)
        remove_socket(folder)


def remove_socket(folder: Path) -> None:
    """Remove the server's socket and its private folder (whichever of server and front end comes first)."""
    (folder / "socket").unlink(missing_ok=True)
    try:
        folder.rmdir()
    except FileNotFoundError:
        pass

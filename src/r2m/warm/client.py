"""The client side of a warm start (:mod:`r2m.warm`): standard library only, imported by every
``r2m`` process, so it costs nothing when no server is named.

Protocol, over the server's Unix socket: the client sends one length-prefixed JSON header
(``argv``, ``cwd``, ``env``) with its file descriptors 0, 1 and 2 attached (``SCM_RIGHTS``); then a
byte ``S`` plus a signal number for each SIGTERM/SIGINT/SIGHUP it receives; the server answers one
line ``exit <status>`` when the job ends (128 + N when a signal N ended it). When the client dies,
its end of the socket closes and the job kills itself (a ``kill -9`` of the job stays one). A job that runs in
another Slurm job than ``r2m warm`` (submitted by a cluster executor) runs cold, in its own allocation.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

SOCKET_ENV = "R2M_WARM"  # the server's socket path; set by `r2m warm` for the command it runs
# the Slurm job `r2m warm` runs in ("" outside one): a job of another Slurm job (a cluster executor's) runs
# cold, inside its own allocation, whatever node it lands on
SLURM_ENV = "R2M_WARM_SLURM_JOB"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def send_header(sock: socket.socket, data: dict) -> None:
    raw = json.dumps(data).encode()
    socket.send_fds(sock, [struct.pack("!I", len(raw)) + raw], [0, 1, 2])


def run(argv: list[str]) -> int | None:
    """Run ``r2m <argv>`` in the warm server named by ``R2M_WARM``; its exit status, or ``None``
    when no server answers there (the caller then runs the job itself)."""
    path = os.environ.get(SOCKET_ENV)
    if not path or os.environ.get("SLURM_JOB_ID", "") != os.environ.get(SLURM_ENV, ""):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as err:
        print(f"r2m: warm server {path} not reachable ({err.strerror or err}); running cold", file=sys.stderr)
        sock.close()
        return None
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    send_header(sock, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)})

    def forward(signum: int, frame: object) -> None:
        try:
            sock.sendall(b"S" + bytes([signum]))
        except OSError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = sock.recv(64)  # retried by Python when a forwarded signal interrupts it (PEP 475)
        if not chunk:
            print("r2m: the warm server closed the connection before the job ended", file=sys.stderr)
            return 1
        answer += chunk
    return int(answer.split()[-1])

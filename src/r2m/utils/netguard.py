"""The network guard: no socket to another machine, no URL fetched, outside the download stages.

Inside ``with NetworkGuard():`` (the stage runner around every stage instance whose params name no
download, :mod:`r2m.pipeline.network`; ``r2m caption IMAGES``) each attempt to reach the network
through Python is refused before it happens, and becomes one line naming what tried::

    network access refused at run time: urllib.Request https://download.pytorch.org/models/x.pth
    (from torch.hub via r2m.vision.detectors.faster_rcnn)

It listens (:mod:`r2m.utils.audit`) to the audit events of name lookups (``socket.getaddrinfo``,
``socket.gethostbyname``...), of connections and datagrams (``socket.connect``, ``socket.sendto``,
``socket.sendmsg``), of URL requests (``urllib.Request``) and of the standard library's clients
(``http.client.connect``, ``ftplib.connect``, ``smtplib.connect``...). Allowed: ``AF_UNIX`` sockets (the
warm server's socket, ``multiprocessing``'s connections) and ``file:`` / ``data:`` URLs. Refused too: the
loopback (``127.0.0.1``, ``localhost``), since no stage talks to a local server (the Java scorers read
and write pipes) and a local port may forward anywhere.

The refusal is :class:`NetworkRefused`, a ``BaseException`` like ``KeyboardInterrupt``, so a library's
``except Exception`` fallback cannot swallow it; the guard also keeps every refusal
(:attr:`NetworkGuard.refused`), so a refusal in a thread still fails the stage (:meth:`check`), and a
forked child (a data-loader worker) prints its line to stderr itself. A child started by ``multiprocessing``
with "spawn" or "forkserver" (the scorers' worker process) is a new interpreter: the guard sets
:data:`ENV` while it is active, and a child that imports r2m (unpickling its task does) installs a guard of its
own at once (:func:`inherit`, from ``r2m/__init__.py``), for its whole life. Out of the guard's sight: sockets
opened by compiled code without Python's socket module, and the programs a stage starts that are not r2m.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from typing import Any

from r2m.utils import audit

LOOKUPS = ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo")
SOCKETS = ("socket.connect", "socket.sendto", "socket.sendmsg")
CLIENTS = ("urllib.Request", "http.client.connect", "ftplib.connect", "smtplib.connect", "imaplib.open",
           "poplib.connect", "nntplib.connect", "telnetlib.Telnet.open")
EVENTS = LOOKUPS + SOCKETS + CLIENTS
LOCAL_URL_SCHEMES = ("file", "data")
ENV = "R2M_NETWORK_GUARD"  # "1" in the environment of a guarded process: its r2m children guard themselves
_INHERITED: list[NetworkGuard] = []  # the guard this process installed from its parent's ENV (one at most)
# the modules that carry a request (their frames are skipped when naming who tried)
_CARRIERS = ("socket", "ssl", "urllib", "http", "ftplib", "smtplib", "imaplib", "poplib", "nntplib", "telnetlib",
             "asyncio", "selectors", "urllib3", "requests", "httpx", "httpcore", "r2m.utils.netguard",
             "r2m.utils.audit")


class NetworkRefused(BaseException):  # noqa: N818 - reads as what happened, like KeyboardInterrupt
    """An attempt to reach the network where none is allowed; ``str()`` is the one-line message."""


def _host_port(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host = address[0].decode(errors="replace") if isinstance(address[0], bytes) else str(address[0])
        return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"
    return repr(address)


def _url_scheme(url: Any) -> str:
    text = getattr(url, "full_url", url)
    return str(text).split(":", 1)[0].lower() if ":" in str(text) else ""


def describe(event: str, args: tuple[Any, ...]) -> str | None:
    """What an audit event tries, as ``"<event> <target>"``, or None when it stays on this machine."""
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        sock, address = args[0], args[1]
        if getattr(sock, "family", None) == getattr(socket, "AF_UNIX", object()) or address is None:
            return None
        return f"{event} {_host_port(address)}"
    if event == "socket.getaddrinfo":
        host, port = args[0], args[1]
        if host in (None, "", b""):  # the wildcard address of a server about to bind: no lookup
            return None
        return f"{event} {_host_port((host, port))}" if port is not None else f"{event} {host!r}"
    if event in LOOKUPS:
        return f"{event} {_host_port(args[0]) if isinstance(args[0], tuple) else args[0]}"
    if event == "urllib.Request":
        url = args[0]
        if _url_scheme(url) in LOCAL_URL_SCHEMES:
            return None
        text = str(getattr(url, "full_url", url))
        return f"{event} {text if len(text) <= 200 else text[:200] + '…'}"
    if event in CLIENTS:  # (self, host, port, ...)
        return f"{event} {_host_port((args[1], args[2]))}" if len(args) >= 3 else f"{event} {args[1:]!r}"
    return None


def caller(skip: int = 0) -> str:
    """``(from <module> via <r2m module>)``: the innermost module outside the request's carriers (the
    standard library's clients, urllib3, requests...) and, when another, the innermost r2m module."""
    frame = sys._getframe(skip + 1)
    first = ours = None
    while frame is not None:
        name = str(frame.f_globals.get("__name__", "?"))
        carrier = any(name == c or name.startswith(c + ".") for c in _CARRIERS)
        if not carrier and first is None:
            first = name
        if not carrier and ours is None and (name == "r2m" or name.startswith("r2m.")):
            ours = name
        if first is not None and ours is not None:
            break
        frame = frame.f_back
    if first is None:
        return ""
    return f" (from {first}{f' via {ours}' if ours and ours != first else ''})"


class NetworkGuard:
    """A context: the attempts to reach the network made inside it are refused (``refuse=True``) and
    kept in :attr:`refused`, one line each. Several may be active (nested); each sees every attempt."""

    def __init__(self, refuse: bool = True) -> None:
        self.refuse = refuse
        self.refused: list[str] = []
        self.owner = os.getpid()
        self._handle: Any = None
        self._excepthook: Any = threading.excepthook

    def _on_event(self, event: str, args: tuple[Any, ...]) -> None:
        what = describe(event, args)
        if what is None:
            return
        line = f"network access refused at run time: {what}{caller(2)}"
        self.refused.append(line)
        if not self.refuse:
            return
        if os.getpid() != self.owner:  # a forked worker: its parent never sees this list
            try:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
        raise NetworkRefused(line)

    def __enter__(self) -> NetworkGuard:
        self.owner = os.getpid()
        self._handle = audit.listen(EVENTS, self._on_event)
        self._excepthook = threading.excepthook
        threading.excepthook = self._thread_died
        self._env = os.environ.get(ENV)
        if self.refuse:  # children started as new interpreters guard themselves (:func:`inherit`)
            os.environ[ENV] = "1"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            audit.unlisten(self._handle)
            self._handle = None
            threading.excepthook = self._excepthook
            if self.refuse:
                if self._env is None:
                    os.environ.pop(ENV, None)
                else:
                    os.environ[ENV] = self._env

    def _thread_died(self, args: Any) -> None:
        """A thread ended by a refusal: no traceback (:meth:`check` reports its line once)."""
        if args.exc_type is not None and issubclass(args.exc_type, NetworkRefused):
            return
        self._excepthook(args)

    def check(self) -> None:
        """Raise the first refusal when one was caught and swallowed (e.g. in a thread, or by a library)."""
        if self.refused:
            raise NetworkRefused(self.refused[0])


def inherit() -> NetworkGuard | None:
    """In a process whose parent ran under the guard (:data:`ENV` is "1": a ``multiprocessing`` child started
    with "spawn", an r2m command a guarded stage started), install a guard for the rest of the process's life
    (once); None when there is nothing to inherit. Called when the ``r2m`` package is first imported."""
    if os.environ.get(ENV) != "1" or _INHERITED:
        return None
    guard = NetworkGuard()
    guard.__enter__()
    _INHERITED.append(guard)
    return guard


class NoGuard:
    """The stand-in for a download stage: nothing refused, nothing kept."""

    refused: list[str] = []

    def __enter__(self) -> NoGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def check(self) -> None:
        return None

"""One Python audit hook per process (:pep:`578`), shared by whoever wants to watch audit events.

``sys.addaudithook`` cannot be undone, and every hook runs on every event of the process, so r2m
installs exactly one (:func:`listen` installs it on first use) and dispatches each event to the
listeners registered for that event name only: an event nobody listens to costs one dict lookup.
A listener is ``fn(event, args)``; raising in it aborts the audited operation (the exception reaches
the code that tried it). Listeners are registered and removed at any time (:func:`listen` returns a
handle, :func:`unlisten` drops it; ``with listening(...)`` does both); forked children inherit the
hook and the listeners, as they were at the fork. The network guard (:mod:`r2m.utils.netguard`) is
one listener; a recorder of what a stage opens and imports would be another.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

Listener = Callable[[str, tuple[Any, ...]], None]

_by_event: dict[str, tuple[Listener, ...]] = {}  # replaced whole on change: the hook reads it without a lock
_lock = threading.Lock()
_installed = False


def _hook(event: str, args: tuple[Any, ...]) -> None:
    fns = _by_event.get(event)
    if fns:
        for fn in fns:
            fn(event, args)


def listen(events: Iterable[str], fn: Listener) -> tuple[tuple[str, ...], Listener]:
    """Call ``fn(event, args)`` on each of ``events`` from now on (in this process and its forks);
    returns the handle :func:`unlisten` takes."""
    global _by_event, _installed
    names = tuple(dict.fromkeys(events))
    with _lock:
        if not _installed:
            sys.addaudithook(_hook)
            _installed = True
        table = dict(_by_event)
        for name in names:
            table[name] = (*table.get(name, ()), fn)
        _by_event = table
    return names, fn


def unlisten(handle: tuple[tuple[str, ...], Listener]) -> None:
    """Stop calling a listener that :func:`listen` registered (the hook itself stays, idle)."""
    global _by_event
    names, fn = handle
    with _lock:
        table = dict(_by_event)
        for name in names:
            rest = tuple(f for f in table.get(name, ()) if f is not fn)
            if rest:
                table[name] = rest
            else:
                table.pop(name, None)
        _by_event = table


@contextmanager
def listening(events: Iterable[str], fn: Listener) -> Iterator[None]:
    handle = listen(events, fn)
    try:
        yield
    finally:
        unlisten(handle)


def listeners(event: str) -> tuple[Listener, ...]:
    """The listeners registered for ``event`` (tests; diagnostics)."""
    return _by_event.get(event, ())

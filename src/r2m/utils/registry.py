"""Choosing code by name: :class:`Registry`, a small name -> object table filled where the objects are
defined (tokenizers, scorers, sentence filters), and :class:`Catalog`, a plain table of members named
as ``"module:attr"`` whose module is imported only when the member is used (dataset kinds, detector and
feature backends, caption models: :mod:`r2m.catalogs`, :mod:`r2m.baselines`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
E = TypeVar("E")


class Registry(Generic[T]):
    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise KeyError(f"{self.what} {name!r} registered twice")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown {self.what} {name!r}; known: {', '.join(sorted(self._items))}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)


def load_target(target: str) -> Any:
    """What ``"module:attr"`` names (``attr`` may be dotted), or the module itself for ``"module"``; the
    module is imported now. A module without that attribute: ImportError naming the target."""
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"{target}: module {module} has no {attr!r} (a catalogue names it)") from None
    return obj


class Catalog(Generic[E]):
    """``name -> entry``, written out in one light module; ``member(entry)`` is the entry's ``"module:attr"``
    (the entry itself by default). ``catalog[name]`` is the entry, :meth:`load` the member (imported then);
    an unknown name is a KeyError listing the known ones."""

    def __init__(self, what: str, entries: dict[str, E], member: Callable[[E], str] = str) -> None:
        self.what = what
        self._entries = dict(entries)
        self._member = member

    def __getitem__(self, name: str) -> E:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"unknown {self.what} {name!r}; known: {', '.join(self.names())}") from None

    def target(self, name: str) -> str:
        """The ``"module:attr"`` of ``name``'s member."""
        return self._member(self[name])

    def load(self, name: str) -> Any:
        """The member ``name`` (its module imported now)."""
        return load_target(self.target(name))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def items(self) -> list[tuple[str, E]]:
        return [(name, self._entries[name]) for name in self.names()]

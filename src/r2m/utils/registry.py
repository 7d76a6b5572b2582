"""A small name -> object registry used instead of if/elif factories (datasets, detectors,
feature extractors, models, scorers)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, T] = {}
        self.keys: dict[str, tuple[str, ...]] = {}

    def register(self, name: str, keys: tuple[str, ...] = ()) -> Callable[[T], T]:
        """Register under ``name``; ``keys``: the options it reads (dataset recipes declare them, and
        :func:`r2m.utils.declared.declared_keys` reads them from the source for params validation)."""
        def deco(obj: T) -> T:
            if name in self._items:
                raise KeyError(f"{self.what} {name!r} registered twice")
            self._items[name] = obj
            self.keys[name] = tuple(keys)
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


def load_member(modules: Mapping[str, str], name: str) -> None:
    """Import the module a declared table (``name -> module``) names for ``name``: its members register on
    import. An unknown name imports nothing (the registry's own error names it at ``get``). Loading from a
    table rather than importing every member keeps a stage's code dependencies to the one module it uses
    (:mod:`r2m.pipeline.codedeps`)."""
    module = modules.get(name)
    if module is not None:
        importlib.import_module(module)


def declared_names(sources: list[str | Path], registry: str, constructors: tuple[str, ...] = ()) -> list[str]:
    """Names registered with ``@<registry>.register("name")`` in the given files / package folders,
    read from the source (no import: params validation must not load torch or numpy). Names made by
    ``Ctor("name", ...)`` calls count too for each ``Ctor`` in ``constructors`` (registered in a loop)."""
    import ast

    from r2m.utils.source_cache import cached_scan, is_str_list

    files: list[Path] = []
    for src in sources:
        p = Path(src)
        files += sorted(p.glob("*.py")) if p.is_dir() else ([p] if p.is_file() else [])

    def scan() -> list[str]:
        names: set[str] = set()
        for f in files:
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str)):
                    continue
                if (isinstance(node.func, ast.Attribute) and node.func.attr == "register"
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == registry):
                    names.add(node.args[0].value)
                elif isinstance(node.func, ast.Name) and node.func.id in constructors:
                    names.add(node.args[0].value)
        return sorted(names)

    # kept on disk under the files' content: every r2m job validates params (issue 33)
    return cached_scan("declared_names", [registry, list(constructors)], files, scan, is_str_list)

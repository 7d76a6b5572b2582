"""The import graph of the ``r2m`` package, read from the source (``ast``; nothing is imported), for the
house rules (tests/test_house.py: no cycles, no upward imports)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "r2m"


@dataclass(frozen=True)
class Edge:
    src: str  # importing module
    dst: str  # imported module
    line: int


def module_files(pkg: Path = PKG) -> dict[str, Path]:
    """Dotted module name -> file for every ``.py`` under ``pkg`` (a package is its ``__init__``)."""
    base = pkg.parent
    mods = {}
    for f in sorted(pkg.rglob("*.py")):
        parts = list(f.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


def _resolve(name: str, modules: set[str]) -> str | None:
    """The longest prefix of ``name`` that is one of ``modules``."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in modules:
            return cand
    return None


def _statements(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """Every statement of ``body``, nested ones (function, class, if/try/with/loop/match blocks) included.
    Imports are statements: walking statement lists only skips the expressions, most of a tree's nodes
    (``ast.walk`` over everything costs about 3x more)."""
    for node in body:
        yield node
        for name in ("body", "orelse", "finalbody"):
            sub = getattr(node, name, None)
            if isinstance(sub, list):
                yield from _statements(sub)
        for block in (*getattr(node, "handlers", ()), *getattr(node, "cases", ())):
            yield from _statements(block.body)


def imports_of(mod: str, path: Path, modules: set[str]) -> list[Edge]:
    """The arrows from ``mod`` to modules in ``modules`` (every import statement, at any depth)."""
    is_pkg = path.name == "__init__.py"
    package = mod if is_pkg else mod.rpartition(".")[0]
    edges = []
    for node in _statements(ast.parse(path.read_text(encoding="utf-8"), str(path)).body):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                up = node.level - 1
                if up > len(parts) - 1:
                    continue  # beyond the top package: not ours
                base = ".".join(parts[: len(parts) - up])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for a in node.names:
                sub = f"{base}.{a.name}"
                targets.append(sub if sub in modules else base)
        for t in targets:
            dst = _resolve(t, modules)
            if dst is not None and dst != mod:
                edges.append(Edge(mod, dst, node.lineno))
    return edges


def scan_edges(files: dict[str, Path]) -> list[Edge]:
    """Every import arrow between the modules ``files`` names, one per (line, target), sorted."""
    names = set(files)
    edges = {e for mod, f in files.items() for e in imports_of(mod, f, names)}
    return sorted(edges, key=lambda e: (e.src, e.line, e.dst))


def import_graph(pkg: Path = PKG) -> tuple[dict[str, Path], list[Edge]]:
    """The modules under ``pkg`` and their import arrows."""
    files = module_files(pkg)
    return files, scan_edges(files)

"""The import graph of the ``r2m`` package, read from the source (``ast``; nothing is imported).

Two users: the house rules (tests/test_house.py: no cycles, no upward imports) and the stage
registry's code dependencies (:func:`closure`: a stage depends on the files its entry imports,
transitively, and on nothing else in ``src/r2m``).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PKG = Path(__file__).resolve().parents[1]  # src/r2m


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
    (``ast.walk`` over everything cost the Snakefile's code digests about 3x more)."""
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


def _edge_rows(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(r, list) and len(r) == 3 and isinstance(r[0], str) and isinstance(r[1], str)
        and isinstance(r[2], int) for r in value)


def import_graph(pkg: Path = PKG) -> tuple[dict[str, Path], list[Edge]]:
    """The modules under ``pkg`` and their import arrows; the installed package's arrows are kept on disk
    under the files' contents (:func:`r2m.utils.source_cache.cached_scan`: parsing its ~160 files took about
    0.4 CPU s of every ``snakemake -n``, which digests each job's code)."""
    from r2m.utils.source_cache import cached_scan

    files = module_files(pkg)
    rows = cached_scan("import_graph", [str(pkg.resolve()), sorted(files)], list(files.values()),
                       lambda: [[e.src, e.dst, e.line] for e in scan_edges(files)], _edge_rows)
    return files, [Edge(src, dst, line) for src, dst, line in rows]


def parents(mod: str) -> list[str]:
    """The packages whose ``__init__`` runs before ``mod`` does (``r2m.a.b`` -> ``r2m``, ``r2m.a``)."""
    parts = mod.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


@functools.cache
def _graph(pkg: Path) -> tuple[dict[str, Path], dict[str, frozenset[str]]]:
    files, edges = import_graph(pkg)
    succ: dict[str, set[str]] = {m: set() for m in files}
    for e in edges:
        succ[e.src].add(e.dst)
    return files, {m: frozenset(s) for m, s in succ.items()}


def closure_modules(roots: Iterable[str], pkg: Path = PKG, stop: Iterable[str] = ()) -> frozenset[str]:
    """The module names of :func:`closure`."""
    return _closure(tuple(roots), pkg, tuple(stop))


@functools.cache
def _closure(roots: tuple[str, ...], pkg: Path, stop: tuple[str, ...]) -> frozenset[str]:
    files, succ = _graph(pkg)
    seen: set[str] = set(stop)
    todo = list(roots)
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        if mod not in files:
            raise KeyError(f"{mod}: not a module under {pkg}")
        seen.add(mod)
        todo += [m for m in (*succ[mod], *parents(mod)) if m in files and m not in seen]
    return frozenset(seen - set(stop))


def module_file(mod: str, pkg: Path = PKG) -> Path:
    return _graph(pkg)[0][mod]


def closure(roots: Iterable[str], pkg: Path = PKG, stop: Iterable[str] = ()) -> list[Path]:
    """The source files of ``roots`` and of every module they import, transitively (any import
    statement, lazy ones included, and the ``__init__`` of every package on the way); the modules in
    ``stop`` are neither included nor followed."""
    files = _graph(pkg)[0]
    return sorted(files[m] for m in closure_modules(roots, pkg, stop))


@functools.cache
def declared_table(mod: str, name: str, pkg: Path = PKG) -> dict[str, str]:
    """The literal ``name = {...}`` at the top level of module ``mod``, read from its source (not imported)."""
    path = module_file(mod, pkg)
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            return ast.literal_eval(node.value)
    raise KeyError(f"{path}: no top-level {name} = {{...}}")

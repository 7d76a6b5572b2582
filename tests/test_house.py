"""House rules as tests: what a refactor must not break in the shape of the code base.

* No committed merge-conflict markers in any tracked text file.
* No import cycle inside ``src/r2m`` and no import from a lower layer up into a higher one
  (:data:`LAYERS`). *Entry modules* — the modules the stage registry, ``r2m``'s tools and
  ``r2m bench`` name as implementations — may not be imported by a library module
  (:func:`entry_modules`); a tool's or a benchmark's may import any library module, while a *stage
  module* (:func:`stage_modules`) imports nothing above its own layer: what it receives
  (``StageContext``) and the registry sit in a layer below every stage module. Every ``import`` / ``from … import`` statement counts, at module level or inside a
  function (a lazy import is still an arrow); ``from pkg import name`` is an arrow to ``pkg.name``
  when that is a module, else to ``pkg``. Modules named by strings (``"r2m.x:main"`` in the stage
  registry or ``r2m bench``) are not imports and do not count.
* The module map ``docs/MODULES.md`` names every package and module file under ``src/r2m`` and
  names nothing that does not exist; ``docs/ARCHITECTURE.md`` stays an overview (at most
  :data:`OVERVIEW_LINES` lines, no issue numbers).

Run ``python tests/test_house.py`` to print what the module map lacks (and what it names that is
gone), the import cycles and the upward imports, without pytest.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import pytest

from import_graph import Edge, import_graph, imports_of, module_files

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "r2m"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
MODULE_MAP = ROOT / "docs" / "MODULES.md"

# ---------------------------------------------------------------------------------------------
# conflict markers

# git's markers: "<<<<<<< ours", "||||||| base" (diff3), "=======" alone, ">>>>>>> theirs", each
# exactly seven characters. "=======" alone is also a Markdown/RST underline of a 7-character title,
# so it counts only in a file that has one of the other markers.
MARKER = re.compile(r"^(?:<{7}|\|{7}|>{7})(?: |$)")
SEPARATOR = "=" * 7


def tracked_files(root: Path = ROOT) -> list[Path]:
    """The files git tracks under ``root`` (skips the test when ``root`` is not a git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"not a git checkout ({err})")
    return [root / p for p in out.decode().split("\0") if p]


def text_of(path: Path) -> str | None:
    """The file's text, or None for a missing, binary (NUL byte) or non-UTF-8 file."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def conflict_markers(files: Iterable[Path], root: Path = ROOT) -> list[str]:
    """``file:line: marker line`` for every conflict-marker line in the given files."""
    hits = []
    for path in files:
        text = text_of(path)
        if text is None:
            continue
        lines = [line.rstrip("\r") for line in text.splitlines()]
        strong = [bool(MARKER.match(line)) for line in lines]
        for n, line in enumerate(lines, 1):
            if strong[n - 1] or (line == SEPARATOR and any(strong)):
                hits.append(f"{path.relative_to(root)}:{n}: {line.rstrip()[:60]}")
    return hits


def test_no_conflict_markers_in_tracked_files():
    hits = conflict_markers(tracked_files())
    assert not hits, "merge-conflict markers committed (resolve them):\n  " + "\n  ".join(hits)


# ---------------------------------------------------------------------------------------------
# the import graph

# lowest first; a module may import from its own layer or below. A package's subpackages and
# modules share its layer; top-level modules are named one by one. Every package and top-level
# module under src/r2m must be placed (test_every_module_has_a_layer).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("r2m", "r2m.runtime", "r2m.utils"),
    ("r2m.params",),  # the params schema and profiles
    # the stage registry, what a stage receives (StageContext) and the record of what it read: below every
    # stage module; the engines (r2m.pipeline) at the top
    ("r2m.stage",),
    ("r2m.text",),
    ("r2m.models", "r2m.losses"),
    ("r2m.vision", "r2m.datasets", "r2m.evaluation"),
    ("r2m.captioning", "r2m.training", "r2m.supervised"),
    ("r2m.reports",),
    ("r2m.warm",),  # the warm server: r2m.cli hands it what its jobs run (r2m.cli.warm)
    ("r2m.pipeline", "r2m.cli", "r2m.caption_cli", "r2m.bench"),
)


def _sccs(nodes: Iterable[str], succ: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(succ.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(sorted(comp))
    return out


def _shortest_cycle(start: str, succ: dict[str, set[str]], within: set[str]) -> list[str]:
    """The shortest path start -> … -> start inside ``within`` (breadth first)."""
    prev: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        v = queue.popleft()
        for w in sorted(succ.get(v, ())):
            if w not in within:
                continue
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [*reversed(path), start]
            if w not in seen:
                seen.add(w)
                prev[w] = v
                queue.append(w)
    return []


def import_cycles(edges: Iterable[Edge]) -> list[list[str]]:
    """One shortest cycle through each module of every strongly connected component with more than
    one module, each as ``[a, b, …, a]`` starting at its smallest name, without repeats."""
    succ: dict[str, set[str]] = {}
    for e in edges:
        succ.setdefault(e.src, set()).add(e.dst)
    cycles: dict[tuple[str, ...], list[str]] = {}
    for comp in _sccs(set(succ) | {d for s in succ.values() for d in s}, succ):
        if len(comp) < 2:
            continue
        members = set(comp)
        for start in comp:
            cyc = _shortest_cycle(start, succ, members)[:-1]
            k = cyc.index(min(cyc))
            cyc = cyc[k:] + cyc[:k]
            cycles.setdefault(tuple(cyc), [*cyc, cyc[0]])
    return sorted(cycles.values())


def layer_of(mod: str) -> int | None:
    """The layer of a module: that of its longest prefix named in :data:`LAYERS`."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for k, layer in enumerate(LAYERS):
        for name in layer:
            if (mod == name or mod.startswith(name + ".")) and (best is None or len(name) > best[0]):
                best = (len(name), k)
    return None if best is None else best[1]


def entry_modules() -> frozenset[str]:
    """The modules named as ``"module:function"`` implementations by the stage registry
    (:data:`r2m.stage.registry.STAGES`), ``r2m``'s tools (:data:`r2m.cli.TOOLS`), the commands a stage's
    subcommand serves without its axes (:data:`r2m.cli.STANDALONE`) and ``r2m bench``
    (:data:`r2m.bench.registry.BENCHMARKS`): the command layer, above every library layer."""
    sys.path.insert(0, str(PKG.parent))
    try:
        from r2m import cli
        from r2m.bench import registry as bench
        from r2m.stage import registry as stages
    finally:
        sys.path.pop(0)
    specs = [s.impl for s in stages.STAGES] + [v[0] for v in cli.TOOLS.values()] + \
        [*cli.STANDALONE.values()] + [v[0] for v in bench.BENCHMARKS.values()]
    return frozenset(spec.split(":")[0] for spec in specs)


def stage_modules() -> frozenset[str]:
    """The modules the stage registry names as implementations (a stage's ``impl``)."""
    from r2m.stage import registry as stages

    return frozenset(s.impl.split(":")[0] for s in stages.STAGES)


def upward_imports(edges: Iterable[Edge], files: dict[str, Path], pkg: Path = PKG,
                   entries: frozenset[str] = frozenset(), stages: frozenset[str] = frozenset()) -> list[str]:
    """Arrows from a library module up into a higher layer, or into an entry module (``entries``);
    the imports of an entry module that is no stage module (``stages``: a tool's, a benchmark's) are
    not limited by the layers. A stage module imports nothing above its own layer (StageContext and
    the registry sit below every stage), and may import another entry module."""
    out = []
    for e in edges:
        where = files[e.src].relative_to(pkg.parent.parent)
        if e.src in entries and e.src not in stages:
            continue
        if e.dst in entries and e.src not in entries:
            out.append(f"{where}:{e.line}: library module {e.src} imports the entry module {e.dst}")
            continue
        a, b = layer_of(e.src), layer_of(e.dst)
        if a is not None and b is not None and b > a:
            out.append(f"{where}:{e.line}: {e.src} (layer {a}) imports {e.dst} (layer {b})")
    return sorted(out)


def test_every_module_has_a_layer():
    files = module_files()
    missing = sorted(m for m in files if layer_of(m) is None)
    assert not missing, f"place these modules in tests/test_house.py LAYERS: {missing}"


def test_no_import_cycles():
    _, edges = import_graph()
    cycles = import_cycles(edges)
    assert not cycles, "import cycles inside src/r2m:\n  " + "\n  ".join(" → ".join(c) for c in cycles)


def test_no_imports_up_the_layers():
    files, edges = import_graph()
    up = upward_imports(edges, files, entries=entry_modules(), stages=stage_modules())
    order = "  →  ".join(", ".join(layer) for layer in LAYERS)
    assert not up, f"imports from a lower layer up into a higher one (layers, lowest first: {order}):\n  " + \
        "\n  ".join(up)


# arrows the layers allow but the design does not: (importer prefix, imported module,
# why). A library module must not reach into another package's stage module for its helpers.
FORBIDDEN: tuple[tuple[str, str, str], ...] = (
    ("r2m.training", "r2m.captioning.stage", "captioning helpers live in a captioning library module"),
    ("r2m.training", "r2m.captioning.standalone", "captioning helpers live in a captioning library module"),
    ("r2m.supervised", "r2m.training.stages", "the shared loop lives in a training library module"),
)


def forbidden_imports(edges: Iterable[Edge], files: dict[str, Path], pkg: Path = PKG) -> list[str]:
    out = []
    for e in edges:
        for src, dst, why in FORBIDDEN:
            if (e.src == src or e.src.startswith(src + ".")) and e.dst == dst:
                where = files[e.src].relative_to(pkg.parent.parent)
                out.append(f"{where}:{e.line}: {e.src} imports {e.dst} ({why})")
    return sorted(out)


def test_no_forbidden_imports():
    files, edges = import_graph()
    bad = forbidden_imports(edges, files)
    assert not bad, "imports the design rules out:\n  " + "\n  ".join(bad)


# Arrows a package's __init__ may have, each with why it does not make readers of one member readers of others.
INIT_IMPORTS_ALLOWED = {
    ("r2m", "r2m.utils.netguard"): "only in a child of a guarded process (R2M_NETWORK_GUARD=1), and netguard is "
                                   "the runner's own module, which no run record names",
}


def package_imports(edges: Iterable[Edge], files: dict[str, Path]) -> list[str]:
    """Arrows from a package's ``__init__`` into its own package: importing one member of a package runs its
    ``__init__``, so such an arrow makes every reader of one member a reader of the others (a run's record
    names them all, and an edit of one reruns the readers of any)."""
    return sorted(f"{files[e.src].relative_to(PKG.parent.parent)}:{e.line}: {e.src} imports {e.dst}"
                  for e in edges if files[e.src].name == "__init__.py" and e.dst.startswith(e.src + ".")
                  and (e.src, e.dst) not in INIT_IMPORTS_ALLOWED)


def test_packages_import_none_of_their_members():
    files, edges = import_graph()
    bad = package_imports(edges, files)
    assert not bad, "a package's __init__ importing its own members (import them where they are used):\n  " + \
        "\n  ".join(bad)


def test_checker_finds_a_package_importing_its_member(tmp_path):
    pkg = tmp_path / "r2m"
    (pkg / "losses").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "losses" / "__init__.py").write_text("from r2m.losses.xe import f\n")
    (pkg / "losses" / "xe.py").write_text("def f():\n    return 1\n")
    files = module_files(pkg)
    edges = [e for m, f in files.items() for e in imports_of(m, f, set(files))]
    assert [e.dst for e in edges if files[e.src].name == "__init__.py"] == ["r2m.losses.xe"]


# ---------------------------------------------------------------------------------------------
# the module map (docs/MODULES.md) and the overview (docs/ARCHITECTURE.md)

MAP_BEGIN = "<!-- module-map:begin -->"
MAP_END = "<!-- module-map:end -->"
MAP_PATH = re.compile(r"`(src/r2m(?:/[\w.]+)*/?)`")


def module_map(doc: Path = MODULE_MAP) -> list[str]:
    """The ``src/r2m/…`` paths named between the module-map markers (folders keep no trailing /)."""
    text = doc.read_text(encoding="utf-8")
    assert text.count(MAP_BEGIN) == 1 and text.count(MAP_END) == 1, \
        f"{doc.name}: one module-map section delimited by {MAP_BEGIN} … {MAP_END}"
    section = text.split(MAP_BEGIN, 1)[1].split(MAP_END, 1)[0]
    return [p.rstrip("/") for p in MAP_PATH.findall(section)]


def tree_paths(pkg: Path = PKG) -> list[str]:
    """Every package folder and module file under ``src/r2m`` (``__init__.py`` is its package)."""
    base = pkg.parent.parent
    out = {pkg.relative_to(base).as_posix()}
    for f in pkg.rglob("*.py"):
        if "__pycache__" in f.parts:
            continue
        out.add(f.parent.relative_to(base).as_posix())
        if f.name != "__init__.py":
            out.add(f.relative_to(base).as_posix())
    return sorted(out)


def map_problems(doc: Path = MODULE_MAP, pkg: Path = PKG) -> tuple[list[str], list[str]]:
    """(paths under src/r2m the map does not name, paths the map names that do not exist)."""
    named = set(module_map(doc))
    base = pkg.parent.parent
    missing = [p for p in tree_paths(pkg) if p not in named]
    stale = sorted(p for p in named if not (base / p).exists())
    return missing, stale


def test_module_map_names_every_module():
    missing, _ = map_problems()
    assert not missing, (f"{MODULE_MAP.name} does not name (add one line each): "
                         f"{missing}; `python tests/test_house.py` lists them")


def test_module_map_names_only_existing_paths():
    _, stale = map_problems()
    assert not stale, f"{MODULE_MAP.name} names paths that do not exist: {stale}"


OVERVIEW_LINES = 250
ISSUE_NUMBER = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)


def overview_problems(doc: Path = ARCHITECTURE, limit: int = OVERVIEW_LINES) -> list[str]:
    """Why ``doc`` is no longer a short overview: too many lines, an issue number (history lives in git)."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    out = [f"{doc.name} has {len(lines)} lines, more than {limit}: move detail to the guide or {MODULE_MAP.name}"
           ] if len(lines) > limit else []
    out += [f"{doc.name}:{i}: names an issue ({m.group(0)!r}); say what is, not how it came to be"
            for i, line in enumerate(lines, 1) for m in ISSUE_NUMBER.finditer(line)]
    return out


def test_overview_problems_sees_length_and_issue_numbers(tmp_path):
    doc = tmp_path / "ARCHITECTURE.md"
    doc.write_text("# A\n" + "line\n" * 3)
    assert overview_problems(doc, limit=4) == []
    assert overview_problems(doc, limit=3) == [f"ARCHITECTURE.md has 4 lines, more than 3: move detail to the guide "
                                               f"or {MODULE_MAP.name}"]
    doc.write_text("fixed in issue 46\nsee Issues #7 and the tissue 3\n")
    assert [p.split(":")[1] for p in overview_problems(doc)] == ["1", "2"]


def test_architecture_is_a_short_overview():
    problems = overview_problems()
    assert not problems, "\n".join(problems)


def test_no_issue_numbers_in_the_code_or_the_tests():
    """History lives in git: no module, docstring or test names an issue by number; a comment says what was
    wrong before in words. (This file's own test data names issues on purpose, so it is left out.)"""
    files = sorted(PKG.rglob("*.py")) + sorted(p for p in (ROOT / "tests").rglob("*.py")
                                               if p.resolve() != Path(__file__).resolve())
    found = [f"{f.relative_to(ROOT)}:{i}: {m.group(0)!r}" for f in files
             for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
             for m in ISSUE_NUMBER.finditer(line)]
    assert not found, "names an issue; say what was wrong, not its number:\n  " + "\n  ".join(found)


def main() -> int:
    missing, stale = map_problems()
    for p in missing:
        print(f"module map lacks: {p}")
    for p in stale:
        print(f"module map names a missing path: {p}")
    for line in overview_problems():
        print(line)
    files, edges = import_graph()
    for c in import_cycles(edges):
        print("import cycle: " + " → ".join(c))
    for line in upward_imports(edges, files, entries=entry_modules()):
        print("upward import: " + line)
    for line in forbidden_imports(edges, files):
        print("forbidden import: " + line)
    return 1 if missing or stale else 0


if __name__ == "__main__":
    sys.exit(main())


# ---------------------------------------------------------------------------------------------
# the checkers themselves, on planted faults


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "src" / "r2m"
    for rel, text in files.items():
        f = pkg / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return pkg


def test_checker_finds_planted_cycles_and_upward_imports(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "utils/__init__.py": "",
        "utils/io.py": "def f():\n    from r2m.training import loop  # lazy, still an arrow\n",
        "training/__init__.py": "from . import loop\n",
        "training/loop.py": "from ..utils.io import f\n",
        "captioning/__init__.py": "",
        "captioning/stage.py": "from r2m.captioning import standalone\n",
        "captioning/standalone.py": "import r2m.captioning.stage as s\n",
    })
    files, edges = import_graph(pkg)
    cycles = [" → ".join(c) for c in import_cycles(edges)]
    assert "r2m.captioning.stage → r2m.captioning.standalone → r2m.captioning.stage" in cycles
    assert "r2m.training.loop → r2m.utils.io → r2m.training.loop" in cycles
    up = upward_imports(edges, files, pkg)
    assert len(up) == 1 and "r2m.utils.io (layer 0) imports r2m.training.loop (layer 6)" in up[0]
    # an entry module may import upwards; a library module may not import an entry module
    up = upward_imports(edges, files, pkg, entries=frozenset({"r2m.utils.io", "r2m.captioning.stage"}))
    assert up == ["src/r2m/captioning/standalone.py:1: library module r2m.captioning.standalone imports "
                  "the entry module r2m.captioning.stage",
                  "src/r2m/training/loop.py:1: library module r2m.training.loop imports the entry module "
                  "r2m.utils.io"]
    # a stage module's imports are limited by the layers like a library module's (it may import an entry module)
    up = upward_imports(edges, files, pkg, entries=frozenset({"r2m.utils.io", "r2m.captioning.stage"}),
                        stages=frozenset({"r2m.utils.io"}))
    assert "src/r2m/utils/io.py:2: r2m.utils.io (layer 0) imports r2m.training.loop (layer 6)" in up
    assert not any(u.startswith("src/r2m/captioning/stage.py") for u in up)


def test_checker_finds_planted_markers(tmp_path):
    f = tmp_path / "notes.md"
    f.write_text("Title\n=======\n\nLonger title\n============\nok\n<<<<<<< HEAD\na\n=======\nb\n>>>>>>> other\n")
    hits = conflict_markers([f], tmp_path)
    assert hits == ["notes.md:2: =======", "notes.md:7: <<<<<<< HEAD", "notes.md:9: =======",
                    "notes.md:11: >>>>>>> other"]
    g = tmp_path / "title.rst"  # a 7-character title's underline, no other marker: a real line
    g.write_text("Heading\n=======\n\n<<<<<<<< eight is not a marker\n")
    assert conflict_markers([g], tmp_path) == []


def test_checker_finds_planted_map_gaps(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": "", "a.py": "", "b/__init__.py": "", "b/c.py": ""})
    doc = tmp_path / "ARCH.md"
    doc.write_text(f"`src/r2m/x.py` outside\n{MAP_BEGIN}\n- `src/r2m/` pkg\n- `src/r2m/a.py` a\n"
                   f"- `src/r2m/b/` b\n- `src/r2m/gone.py` was here\n{MAP_END}\n")
    assert map_problems(doc, pkg) == (["src/r2m/b/c.py"], ["src/r2m/gone.py"])


def test_import_graph_finds_imports_in_every_kind_of_block(tmp_path):
    """Imports nested in functions, classes, if/else, try/except/else/finally, loops, with and match
    blocks are all arrows (each block kind holds one import of its own module, a to k)."""
    names = "abcdefghijk"
    src = (
        "import r2m.a\n"
        "class C:\n    def m(self):\n        from r2m import b\n"
        "if x:\n    pass\nelse:\n    import r2m.c\n"
        "try:\n    import r2m.d\nexcept ImportError:\n    import r2m.e\nelse:\n    import r2m.f\n"
        "finally:\n    import r2m.g\n"
        "for i in y:\n    import r2m.h\n"
        "async def f():\n    async with z:\n        import r2m.i\n"
        "match q:\n    case 1:\n        import r2m.j\n"
        "while w:\n    pass\nelse:\n    from .k import thing\n"
        "v = [__import__('r2m.a')]  # not an import statement: no arrow\n"
    )
    pkg = _package(tmp_path, {"__init__.py": "", "top.py": src, **{f"{n}.py": "" for n in names}})
    _, edges = import_graph(pkg)
    assert {e.dst for e in edges if e.src == "r2m.top"} == {f"r2m.{n}" for n in names}
    assert {e.line for e in edges if e.src == "r2m.top"} == {1, 4, 8, 10, 12, 14, 16, 18, 21, 24, 28}

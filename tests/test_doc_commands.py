"""Commands in the docs cannot rot: every shell command shown in a fenced ``bash``/``sh``
block of the README or of ``docs/`` is parsed and checked against what the project really offers.

- ``r2m …`` (also ``.venv/bin/r2m`` and ``torchrun … -m r2m.cli …``): the subcommand exists and every
  ``--flag`` it names is in that subcommand's ``--help``;
- ``snakemake …`` and ``dvc …``: every flag is in the tool's (sub)command ``--help``; a ``--workflow-profile``
  exists; a target path is a file of the checkout or an output the stage registry declares;
- ``make T``: ``T`` is a Makefile target;
- any repository path a command names (``data/…``, ``results/…``, ``reports/…``, ``workflow/…`` …) exists
  or is an output the DAG declares;
- params a command sets (``--config 'k=v'``, ``dvc exp run -S k=v``) and the params blocks (```` ```yaml ````
  with top-level params sections) validate against the schema merged over ``params.yaml``; every
  ``section.key`` in backticks whose section is a params section names a key of that section.

A command that cannot be checked here (another program, a download) must carry a visible marker in the doc:
a comment ``# [not run here: REASON]`` on its line, or ``<!-- not run here: REASON -->`` on the line before
its block. Marked commands are still checked where a rule above applies; ``test_markers_are_listed``
prints every accepted marker.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
MARK = re.compile(r"\[not run here: ([^\]]+)\]|<!-- not run here: (.+?) -->")
# first path components that name the checkout's own files or the DAG's outputs
REPO_DIRS = {"data", "results", "reports", "models", "workflow", "src", "docs", "tests", "logs", "scripts",
             ".stamps", "requirements.lock"}
FILE_ENDINGS = {"csv", "json", "pt", "md", "html", "yaml", "tsv", "parquet", "log", "h5", "txt", "png", "jpg"}
SEPARATORS = {";", "&&", "||", "|", "&"}


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    argv: tuple[str, ...]
    marker: str  # the reason a marker gives, or ""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}: {' '.join(self.argv)}"


def _blocks(path: Path):
    """(info string, first line number, body lines, marker before the block) of each fenced block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        before = lines[i - 1] if i else ""
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        mk = MARK.search(before)
        yield m.group(1), i + 2, lines[i + 1:j], (mk.group(1) or mk.group(2)).strip() if mk else ""
        i = j + 1


def _split(text: str) -> list[list[str]]:
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    out: list[list[str]] = [[]]
    for tok in lex:
        if tok in SEPARATORS:
            out.append([])
        else:
            out[-1].append(tok)
    return [c for c in out if c]


def commands() -> list[Command]:
    found = []
    for path in DOCS:
        rel = str(path.relative_to(ROOT))
        for info, first, body, block_mark in _blocks(path):
            if info not in SHELL_BLOCKS:
                continue
            pending, start = "", first
            for k, raw in enumerate(body):
                if not pending:
                    start = first + k
                if raw.rstrip().endswith("\\"):
                    pending += raw.rstrip()[:-1] + " "
                    continue
                logical, pending = pending + raw, ""
                mk = MARK.search(logical)
                marker = (mk.group(1) or mk.group(2)).strip() if mk else block_mark
                for argv in _split(logical):
                    found.append(Command(rel, start, tuple(argv), marker))
    return found


@functools.cache
def help_text(*argv: str) -> str:
    """``argv --help`` (stdout and stderr); empty when the command does not exist."""
    try:
        res = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                             env={"PATH": f"{BIN}:/usr/bin:/bin", "DVC_NO_ANALYTICS": "1", "HOME": str(Path.home())})
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return ""
    return res.stdout + res.stderr if res.returncode == 0 else ""


def _flags(argv: tuple[str, ...]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.startswith("--") and len(a) > 2]


def _missing_flags(help_of: tuple[str, ...], argv: tuple[str, ...]) -> list[str]:
    text = help_text(*help_of)
    assert text, f"`{' '.join(help_of)} --help` failed: the command does not exist"
    return [f for f in _flags(argv) if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]


@functools.cache
def dag_patterns() -> tuple[re.Pattern[str], ...]:
    """Regexes of every path the stage registry (and the Snakefile's targets) can produce; a path inside
    a folder output matches too."""
    from r2m.stage.registry import STAGES

    pats = []
    for st in STAGES:
        for out in st.outs.values():
            rx = re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(out.path))
            pats.append(re.compile(rx + (r"(/.*)?$" if out.directory else "$")))
            parts = out.path.split("/")
            for k in range(2, len(parts)):  # the folders an output lies in (e.g. results/{dataset}/…/s{seed}/{ckpt})
                pats.append(re.compile(re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape("/".join(parts[:k]))) + "/?$"))
        pats.append(re.compile(re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(st.log)) + "$"))
    return tuple(pats)


def _repo_path(tok: str) -> bool:
    head = tok.split("/", 1)[0]
    return "/" in tok and head in REPO_DIRS and not any(c in tok for c in "*?{<$")


def _path_problem(tok: str) -> str | None:
    if (ROOT / tok).exists() or any(p.match(tok) for p in dag_patterns()):
        return None
    return f"{tok}: neither a file of the checkout nor an output the DAG declares"


def _params_overrides(argv: tuple[str, ...]) -> list[dict]:
    """The params a command sets: snakemake ``--config k=v …`` and dvc ``-S k.x=v``."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--config":
            i += 1
            while i < len(argv) and not argv[i].startswith("-"):
                key, _, value = argv[i].partition("=")
                out.append({key: yaml.safe_load(value)})
                i += 1
            continue
        if a in ("-S", "--set-param") and i + 1 < len(argv):
            key, _, value = argv[i + 1].partition("=")
            nested: object = yaml.safe_load(value)
            for part in reversed(key.split(".")):
                nested = {part: nested}
            out.append(nested)  # type: ignore[arg-type]
            i += 2
            continue
        i += 1
    return out


def _params_problem(override: dict) -> str | None:
    from r2m import params as P
    from r2m.pipeline.snake import RUNTIME_KEYS

    override = {k: v for k, v in override.items() if k not in RUNTIME_KEYS}
    if not override:
        return None
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    try:
        P.validate(P.deep_merge(raw, override), source="doc")
    except P.ParamsError as err:
        return str(err)
    return None


def _r2m_help_path(argv: tuple[str, ...]) -> tuple[str, ...]:
    """``("r2m", sub[, subsub])``: ``bench`` and ``datasets`` take a word after them."""
    words = [a for a in argv[1:3] if re.fullmatch(r"[a-z][a-z0-9_-]*", a)]
    if not words:
        return ("r2m",)
    if words[0] in ("bench", "datasets") and len(words) > 1:
        return ("r2m", words[0], words[1])
    return ("r2m", words[0])


def check(cmd: Command) -> list[str]:
    """The problems of one command (empty when it checks out)."""
    argv = cmd.argv
    prog = Path(argv[0]).name
    problems: list[str] = []
    if prog == "torchrun" and "-m" in argv and argv[argv.index("-m") + 1] == "r2m.cli":
        problems += _missing_flags(("torchrun",), argv[: argv.index("-m")])
        argv, prog = ("r2m", *argv[argv.index("-m") + 2:]), "r2m"
    if prog == "r2m":
        problems += _missing_flags(_r2m_help_path(argv), argv)
    elif prog == "snakemake":
        problems += _missing_flags(("snakemake",), argv)
        if "--workflow-profile" in argv and not (ROOT / argv[argv.index("--workflow-profile") + 1]).is_dir():
            problems.append(f"{argv[argv.index('--workflow-profile') + 1]}: no such workflow profile")
    elif prog == "dvc":
        subs = tuple(a for a in argv[1:3] if re.fullmatch(r"[a-z]+", a))
        problems += _missing_flags(("dvc", *subs), argv)
    elif prog == "make":
        targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))
        problems += [f"make {t}: no such Makefile target" for t in argv[1:] if not t.startswith("-") and t not in targets]
    elif prog == "source" and argv[1:] == (".venv/bin/activate",):
        pass  # the virtualenv `make setup` creates
    elif not cmd.marker:
        problems.append(f"`{prog}` is not a command this test can check: mark it `# [not run here: why]`")
    problems += [p for tok in argv[1:] if _repo_path(tok) and (p := _path_problem(tok))]
    problems += [p for o in _params_overrides(argv) if (p := _params_problem(o))]
    return problems


ALL = commands()


def test_the_docs_show_commands():
    """The collector finds the README's commands (a parse that found nothing would pass everything)."""
    progs = {Path(c.argv[0]).name for c in ALL}
    assert {"make", "r2m", "snakemake", "dvc"} <= progs, progs
    assert len(ALL) >= 20


@pytest.mark.parametrize("cmd", ALL, ids=lambda c: f"{c.doc}:{c.line}:{Path(c.argv[0]).name}")
def test_doc_command(cmd: Command):
    assert not check(cmd), f"{cmd.where}\n  " + "\n  ".join(check(cmd))


def test_markers_are_listed():
    """Every marker gives a reason; the accepted ones are printed (``pytest -s`` / the CI log)."""
    marked = [c for c in ALL if c.marker]
    for c in marked:
        print(f"marker accepted: {c.where}  [{c.marker}]")
        assert len(c.marker) > 5, c.where


def _params_blocks():
    from r2m import params as P

    sections = set(P.Params.model_fields)
    for path in DOCS:
        for info, first, body, _ in _blocks(path):
            if info in ("yaml", "yml"):
                data = yaml.safe_load("\n".join(body))
                if isinstance(data, dict) and set(data) <= sections:
                    yield pytest.param(data, id=f"{path.relative_to(ROOT)}:{first}")


@pytest.mark.parametrize("block", list(_params_blocks()))
def test_params_blocks_validate(block: dict):
    assert _params_problem(block) is None, _params_problem(block)


def test_dotted_params_keys_exist():
    """``section.key`` in backticks (e.g. `train_xe.steps`) names a real key when section is a params section."""
    from r2m import params as P

    fields = P.Params.model_fields
    bad, seen = [], 0
    for path in DOCS:
        for m in re.finditer(r"`([a-z_]+)\.([a-z_0-9]+)[^`]*`", path.read_text(encoding="utf-8")):
            section, key = m.groups()
            ann = fields[section].annotation if section in fields else None
            if key in FILE_ENDINGS or section == "catalog" or not isinstance(ann, type) or not hasattr(ann, "model_fields"):
                continue
            seen += 1
            if key not in ann.model_fields:
                bad.append(f"{path.name}: `{m.group(0)}`: {section} has no key {key!r}")
    assert seen >= 5, "found almost no dotted params keys: the pattern is broken"
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("edit", [("--no-graph", "--no-graphs"), ("--workflow-profile", "--workflow-profil")])
def test_a_renamed_flag_is_caught(edit):
    """Mutation check of the checker itself: a doc flag that no longer exists is reported."""
    old, new = edit
    target = next(c for c in ALL if old in c.argv or any(a.startswith(old + "=") for a in c.argv))
    mutated = Command(target.doc, target.line, tuple(a.replace(old, new) for a in target.argv), target.marker)
    assert any(new in p for p in check(mutated)), check(mutated)


# --------------------------------------------------------------------------- the README's DAG commands, run
def _readme_dag_commands() -> list[list[str]]:
    """The ``snakemake`` commands of the README's shell blocks, as argument lists."""
    out = []
    for info, _, body, _ in _blocks(ROOT / "README.md"):
        if info in SHELL_BLOCKS:
            out += [argv for line in body for argv in _split(line) if argv and Path(argv[0]).name == "snakemake"]
    return out


@pytest.fixture(scope="module")
def scratch_workflow(tmp_path_factory) -> Path:
    from conftest import copy_sources

    wd = tmp_path_factory.mktemp("readme_dag")
    copy_sources(ROOT, wd, ("Snakefile", "workflow", "dvc.yaml", "params.yaml", "src", "data"))  # as cloned
    return wd


def test_the_readme_shows_dag_commands():
    assert len(_readme_dag_commands()) >= 3


@pytest.mark.parametrize("argv", _readme_dag_commands(), ids=lambda a: " ".join(a[1:])[:60])
def test_readme_snakemake_command_plans(argv, scratch_workflow):
    """Each README ``snakemake`` command, as a dry run (``-n``) in a scratch copy of the workflow: Snakemake reads
    the Snakefile, the params and every flag, and plans its jobs (exit 0) — not only its flags parsed."""
    import os

    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    args = list(argv[1:])
    cut = args.index("--config") if "--config" in args else len(args)  # targets before --config
    if any("profiles/slurm" in a for a in args):
        pytest.importorskip("snakemake_executor_plugin_slurm", reason="the cluster extra (make setup-cluster)")
    done = subprocess.run([str(BIN / "snakemake"), *args[:cut], "-n", "--quiet", "rules", *args[cut:]],
                          cwd=scratch_workflow, env=env, capture_output=True, text=True, timeout=300)
    said = done.stdout + done.stderr
    if done.returncode and "coco_shutterstock" in " ".join(args):
        # a benchmark needs its CNN weights first (the README says where): refused in one line naming the file
        assert "file not found: data/weights/" in said, said[-2500:]
        return
    assert done.returncode == 0, f"{' '.join(argv)}:\n{said[-3000:]}"


def test_dvc_status_answers_on_a_fresh_checkout(scratch_workflow):
    """``dvc status`` (the running guide's, after ``r2m stamps``) on the workflow as cloned: DVC reads the
    generated dvc.yaml, its instance lists and every stamp as a params file (exit 0)."""
    import os

    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    if not (scratch_workflow / ".dvc").exists():
        subprocess.run([str(BIN / "dvc"), "init", "--no-scm", "-q"], cwd=scratch_workflow, env=env, check=True)
    subprocess.run([str(BIN / "r2m"), "stamps"], cwd=scratch_workflow, env=env, check=True,
                   capture_output=True)
    done = subprocess.run([str(BIN / "dvc"), "status"], cwd=scratch_workflow, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "train_xe@demo-r2m-0" in done.stdout and "stamps" in done.stdout  # nothing ran: all to do

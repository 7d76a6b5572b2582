"""A second witness for the run records: what ``strace`` saw an instance's whole process tree open, against the
record the runner wrote (``.r2m/records/``).

The recorder listens to Python's audit hook; ``strace -f -e trace=%file`` sees every file the processes opened,
compiled code and child programs (the METEOR JVM) included. Each instance below is rerun under strace with
``--force`` on a copy of the suite's finished tiny DAG; every file opened for reading must be named by its record —
as itself, inside a folder it names, as the installed distribution that ships it (code and package metadata of
``site-packages``), or as the interpreter (its standard library) — or be on the short list of what a record leaves
out by design (:func:`by_design`, documented in docs/ARCHITECTURE.md): the kernel's and the system's files, the
run's own state and outputs, bytecode caches, and files the traced processes wrote themselves.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_dag_env

STRACE = shutil.which("strace")
pytestmark = pytest.mark.skipif(STRACE is None, reason="strace is not installed (Debian's strace; `make test` "
                                                       "installs it as root)")
BIN = Path(sys.executable).parent

# instances of the tiny DAG: a text stage, a detector, a training stage (torch), captioning and the scorers (Java)
INSTANCES = [
    ("build_vocab", {"dataset": "tiny"}),
    ("detect_concepts", {"dataset": "tiny"}),
    ("train_xe", {"dataset": "tiny", "variant": "r2m", "seed": "0"}),
    ("caption", {"dataset": "tiny", "variant": "r2m", "ckpt": "train_i", "seed": "0"}),
    ("evaluate", {"dataset": "tiny", "variant": "r2m", "ckpt": "train_i", "seed": "0"}),
]

# a successful open: `PID openat(AT_FDCWD, "path", FLAGS[, mode]) = FD`
OPEN = re.compile(r'^(\d+)\s+(?:openat|open)\((?:(AT_FDCWD|\d+)(?:<[^>]*>)?, )?"((?:[^"\\]|\\.)*)", ([A-Z_|0-9]+)'
                  r'.*\)\s+=\s+(\d+)')
CHDIR = re.compile(r'^(\d+)\s+chdir\("((?:[^"\\]|\\.)*)"\)\s+=\s+0')
SPAWN = re.compile(r'^(\d+)\s+(?:clone3?|fork|vfork)\(.*\)\s+=\s+(\d+)')
FCHDIR = re.compile(r'^(\d+)\s+fchdir\((\d+)\)\s+=\s+0')
MKDIR = re.compile(r'^(\d+)\s+mkdir(?:at)?\((?:AT_FDCWD, )?"((?:[^"\\]|\\.)*)"')


def opened(trace: str, cwd: str, until: str | None = None) -> tuple[set[str], set[str]]:
    """(files opened for reading, files opened for writing or created) by any process or thread of the trace, as
    real absolute paths (relative paths against the working folder each inherited or changed to, ``fchdir``
    included; a folder opened to be listed is neither), up to the line that moves the run's record into place
    (``until``: its path, as the trace spells it; what follows is the process ending, not the run)."""
    reads, writes = set(), set()
    where: dict[str, str] = {}
    fds: dict[tuple[str, str], str] = {}
    for line in trace.splitlines():
        if until and "rename" in line and f'"{until}"' in line:
            break
        m = FCHDIR.match(line)
        if m and (m.group(1), m.group(2)) in fds:
            where[m.group(1)] = fds[(m.group(1), m.group(2))]
            continue
        m = SPAWN.match(line)
        if m:  # a child process or thread starts in its parent's working folder
            where[m.group(2)] = where.get(m.group(1), cwd)
            continue
        m = CHDIR.match(line)
        if m:
            where[m.group(1)] = os.path.join(where.get(m.group(1), cwd), m.group(2))
            continue
        m = MKDIR.match(line)
        if m:
            writes.add(os.path.realpath(os.path.join(where.get(m.group(1), cwd), m.group(2))))
            continue
        m = OPEN.match(line)
        if m is None:
            continue
        pid, dirfd, path, flags = m.group(1), m.group(2), m.group(3), m.group(4)
        if dirfd not in (None, "AT_FDCWD") and not path.startswith("/"):
            continue  # relative to an open folder (a walk): the folder is what the record names
        full = os.path.realpath(os.path.join(where.get(pid, cwd), path))
        fds[(pid, m.group(5))] = full
        if "O_DIRECTORY" in flags or os.path.isdir(full):
            continue
        if full in writes:
            continue  # a file or folder the traced processes made themselves
        (writes if any(f in flags for f in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC")) else reads).add(full)
    return reads, writes


# modules the recorder loads after it stopped listening (the digests of what the run read and wrote)
RECORDER_AFTER = ("src/r2m/utils/digest.py",)


def by_design(path: str, wd: Path) -> bool:
    """What a record leaves out on purpose (docs/ARCHITECTURE.md, "What reruns"): the kernel's and the system's own
    files, bytecode caches, packages' metadata (read to name the distributions and their versions), the workspace's
    state (records, stamps, digests, locks, logs, the engines' folders), the params file (its keys are recorded one
    by one), the interpreter's start (``pyvenv.cfg``, ``.pth`` files), the JVM's performance counters and the stage
    runner's own modules (r2m.stage.record.RUNNER)."""
    from r2m.stage.record import RUNNER
    from r2m.utils.reads import SYSTEM

    if path.startswith(SYSTEM) or "/__pycache__/" in path or ".dist-info/" in path or ".egg-info/" in path:
        return True
    if path.endswith(".pth") or path == os.path.realpath(os.path.join(sys.prefix, "pyvenv.cfg")):
        return True  # the interpreter's start: its environment's settings and path files
    if "/hsperfdata_" in path:
        return True  # the JVM's performance counters (it reads other JVMs' to clear stale ones)
    try:
        rel = Path(path).relative_to(wd.resolve())
    except ValueError:
        return False
    if rel.parts[0] in (".r2m", ".stamps", ".snakemake", "logs", ".dvc", ".git") or rel.as_posix() == "params.yaml" \
            or any(p.startswith(".") for p in rel.parts) or rel.as_posix() in RECORDER_AFTER:
        return True
    if rel.parts[:2] == ("src", "r2m") and rel.suffix == ".py":
        module = ".".join(rel.with_suffix("").parts[1:]).removesuffix(".__init__")
        return any(module == m.removesuffix(".*") or (m.endswith(".*") and module.startswith(m[:-1]))
                   for m in RUNNER)
    return False


def covered(path: str, record: dict, wd: Path) -> str | None:
    """How the record names ``path`` (None: it does not)."""
    from r2m.utils.reads import Recorder, distribution_of, viewed

    names = {r["path"]: r for r in record["reads"]}
    # a file read through a view (r2m.utils.reads.read_view): its entry names the file
    views = {seen[1]: n for n in names if (seen := viewed(n)) is not None}
    rec = Recorder(wd)  # the recorder's own naming of a path (workspace-relative, site:, prefix:, absolute)
    name = rec.project_path(path)
    if name is None:  # inside the installation: code and metadata, or the interpreter's library
        site = next((d for d, token in rec._install if token == "site:" and path.startswith(d + os.sep)), None)
        if site is None:
            return "python:" if "python:" in names else None
        top = Path(path).relative_to(site).parts[0]
        top = re.sub(r"-[^-]+\.(dist|egg)-info$", "", top).split(".")[0]
        dist = distribution_of(top)
        if dist is None:  # a package folder whose import name differs from its metadata's (a .libs folder)
            return "a distribution's bundled library" if top.endswith(".libs") or top.startswith("_") else None
        return f"dist:{dist}" if f"dist:{dist}" in names else None
    if name in names:
        return name
    if name in views:
        return views[name]
    for n in names:  # a file inside a folder it names
        if name.startswith(n.rstrip("/") + "/"):
            return n
    outputs = {o["path"] for o in record.get("outputs") or []}
    if any(name == o or name.startswith(o + "/") for o in outputs):
        return "its own output"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("stage,axes", INSTANCES, ids=[f"{s}-{'-'.join(a.values())}" for s, a in INSTANCES])
def test_every_file_an_instance_opens_is_in_its_record(stage, axes, tiny_dag, tmp_path):
    from r2m.stage import registry as S
    from r2m.stage.record import record_path

    wd = tmp_path / "ws"
    shutil.copytree(tiny_dag, wd, symlinks=True)
    trace = tmp_path / "trace.txt"
    args = [arg for a, v in axes.items() for arg in (f"--{a}", v)]
    cmd = [STRACE, "-f", "-qq", "-e", "trace=%file,chdir,fchdir,%process", "-e", "signal=none", "-s", "4096", "-o", str(trace),
           str(BIN / "r2m"), stage, *args, "--force", "--no-log-file"]
    r = subprocess.run(cmd, cwd=wd, env=tiny_dag_env(wd), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    path = record_path(wd, S.BY_NAME[stage], axes)
    record = json.loads(path.read_text())
    reads, writes = opened(trace.read_text(errors="replace"), str(wd.resolve()), str(path.relative_to(wd)))
    assert reads, "strace saw nothing opened: the trace is not being read"
    missed = sorted(p for p in reads - writes if not by_design(p, wd) and covered(p, record, wd) is None)
    assert not missed, f"{stage} {axes}: opened but not in its record:\n  " + "\n  ".join(missed[:40])


def test_the_trace_reader_reads_opens_and_working_folders(tmp_path):
    """The parser itself, on lines written by hand in strace's format."""
    (tmp_path / "perf").mkdir()
    trace = "\n".join([
        '101 openat(AT_FDCWD, "data/x.txt", O_RDONLY|O_CLOEXEC) = 3',
        '101 openat(AT_FDCWD, "/abs/y.bin", O_RDONLY) = 4',
        '101 openat(AT_FDCWD, "out.json", O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0666) = 5',
        '101 openat(AT_FDCWD, "missing", O_RDONLY) = -1 ENOENT (No such file or directory)',
        '102 chdir("sub") = 0',
        '102 openat(AT_FDCWD, "z.txt", O_RDONLY) = 3',
        '103 open("/abs/w.txt", O_RDONLY) = 3',
        '102 clone3({flags=CLONE_VM|CLONE_VFORK, exit_signal=SIGCHLD, stack=0x7f, stack_size=0x9000}, 88) = 104',
        '104 openat(AT_FDCWD, "tool.jar", O_RDONLY) = 3',
        '101 mkdir("/tmp/made", 0700) = 0',
        '101 openat(AT_FDCWD, "/tmp/made", O_RDONLY|O_CLOEXEC) = 5',
        f'105 openat(AT_FDCWD, "{tmp_path}/perf", O_RDONLY) = 7',
        '105 fchdir(7) = 0',
        '105 openat(AT_FDCWD, "943", O_RDONLY|O_CLOEXEC) = 6',
        '101 rename(".r2m/records/x/.tmp", ".r2m/records/x/all.json") = 0',
        '101 openat(AT_FDCWD, "after.txt", O_RDONLY) = 3',
    ])
    reads, writes = opened(trace, str(tmp_path), ".r2m/records/x/all.json")
    base = os.path.realpath(tmp_path)
    assert reads == {f"{base}/data/x.txt", "/abs/y.bin", f"{base}/sub/z.txt", "/abs/w.txt", f"{base}/sub/tool.jar",
                     f"{base}/perf/943"}
    assert writes == {f"{base}/out.json", "/tmp/made"}

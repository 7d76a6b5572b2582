"""What ``r2m warm`` knows about the workflow engine it runs (Snakemake or ``dvc repro``) beyond starting it:
whether it is Snakemake, its working folder, and what a stopped Snakemake left there that would stop the next
run — its workspace lock (``.snakemake/locks/``, left by a Snakemake killed with SIGKILL) and its
"incomplete" markers (``.snakemake/incomplete/``: outputs of jobs that never reported their end).

A lock is removed only when no Snakemake process runs in that folder on this machine (:func:`snakemake_pids`
reads ``/proc``; a process whose folder this user may not read counts as running there); then nothing can be holding
it. Snakemake's own ``--unlock`` does the same removal but without that check. Markers are never removed
here: Snakemake reruns their jobs itself when given ``--rerun-incomplete``, which :func:`prepare` adds when
there are markers (safe while the lock is honoured: a job another Snakemake runs has its outputs locked, so
this run refuses to start instead of rerunning it).

DVC needs none of this: its lock is a ``flock`` (gone with its holder) and its read/write lock skips the entries
of processes that no longer exist."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

LOCKS = Path(".snakemake/locks")
INCOMPLETE = Path(".snakemake/incomplete")
RERUN_INCOMPLETE = ("--rerun-incomplete", "--ri")


def snakemake_args(argv: list[str]) -> list[str] | None:
    """The arguments after the program when ``argv`` runs Snakemake (``snakemake ...``,
    ``python -m snakemake ...``), else None."""
    if not argv:
        return None
    if os.path.basename(argv[0]) == "snakemake":
        return argv[1:]
    if len(argv) >= 3 and os.path.basename(argv[0]).startswith("python") and argv[1:3] == ["-m", "snakemake"]:
        return argv[3:]
    return None


def workdir(args: list[str], cwd: str | Path) -> Path:
    """Snakemake's working folder: ``-d``/``--directory`` when given, else ``cwd``."""
    folder: str | None = None
    for i, arg in enumerate(args):
        if arg in ("-d", "--directory") and i + 1 < len(args):
            folder = args[i + 1]
        elif arg.startswith("--directory="):
            folder = arg.split("=", 1)[1]
    return (Path(cwd) / folder).resolve() if folder else Path(cwd).resolve()


def _argv_of(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]


def _parent(pid: int | str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _ancestors(pid: int) -> set[int]:
    seen: set[int] = set()
    while pid is not None and pid > 1 and pid not in seen:
        seen.add(pid)
        pid = _parent(pid)
    return seen


def snakemake_pids(folder: Path, exclude: set[int] | None = None) -> list[int]:
    """Processes on this machine running Snakemake in ``folder`` (not this process, its ancestors, its children —
    ``r2m warm``'s server — nor ``exclude``); one whose working folder this user may not read is counted in (it
    may be there)."""
    me = os.getpid()
    skip = _ancestors(me) | (exclude or set())
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in skip or _parent(entry.name) == me:
            continue
        pid = int(entry.name)
        try:
            args = _argv_of(pid)
        except OSError:
            continue
        rest = snakemake_args(args)
        if rest is None and not any("snakemake" in os.path.basename(a).lower() for a in args):
            continue  # (a wrapper script such as tests/cluster/snakemake_poll.py counts as Snakemake)
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except PermissionError:
            found.append(pid)  # another user's: cannot tell where it runs
            continue
        except OSError:
            continue  # gone (or a zombie)
        if workdir(rest if rest is not None else args, cwd) == folder:
            found.append(pid)
    return found


def release_stale_lock(folder: Path, exclude: set[int] | None = None) -> str | None:
    """Remove Snakemake's lock in ``folder`` when no Snakemake runs there; one line saying what was done (or why
    not), None when there was no lock."""
    locks = folder / LOCKS
    if not locks.is_dir() or not any(locks.iterdir()):
        return None
    running = snakemake_pids(folder, exclude)
    if running:
        return (f"{locks} is held: Snakemake runs in {folder} (pid {', '.join(map(str, running))}); "
                f"left as it is")
    shutil.rmtree(locks, ignore_errors=True)
    return f"removed the Snakemake lock a stopped run left in {folder} (no Snakemake runs there)"


def incomplete_markers(folder: Path) -> int:
    markers = folder / INCOMPLETE
    if not markers.is_dir():
        return 0
    return sum(1 for p in markers.iterdir() if p.name != "migration_underway")


def prepare(argv: list[str], cwd: str | Path) -> tuple[list[str], list[str]]:
    """``argv`` as ``r2m warm`` runs it, and the lines to print: for Snakemake, a stale lock removed and
    ``--rerun-incomplete`` added when a stopped run left incomplete markers; any other command unchanged."""
    args = snakemake_args(argv)
    if args is None:
        return argv, []
    folder = workdir(args, cwd)
    lines = [line for line in (release_stale_lock(folder),) if line]
    n = incomplete_markers(folder)
    if n and not any(a in RERUN_INCOMPLETE for a in args):
        head = len(argv) - len(args)
        argv = [*argv[:head], "--rerun-incomplete", *argv[head:]]
        lines.append(f"{n} output(s) of jobs a stopped run left unfinished are marked incomplete in {folder}: "
                     f"running snakemake with --rerun-incomplete (it reruns those jobs)")
    return argv, lines

"""One line per failed Slurm job, for the Snakefile's ``onerror``: the SLURM executor reports only the job's
state ("FAILED") when its status command is ``squeue``; the reason is in the job's own Slurm log
(``logs/slurm/rule_<stage>/…/<jobid>.log``), which Snakemake names but does not show. Read from Snakemake's
log of the run; nothing here talks to Slurm."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

ERROR = re.compile(r"^Error in rule (\S+):\s*$")
FAILED = re.compile(r"SLURM-job '(\d+)' failed, SLURM status is: '([A-Z_]+)'")
OVER_MEMORY = re.compile(r"exceeded memory limit \((\d+) > (\d+)\)")
MB = 2**20


def explain(rule: str, job: str, state: str, slurm_log: Path | None) -> str:
    """The reason one Slurm job of ``rule`` failed, in one line."""
    text = slurm_log.read_text(errors="replace") if slurm_log is not None and slurm_log.is_file() else ""
    over = OVER_MEMORY.search(text)
    if over:
        used, limit = int(over[1]) // MB, int(over[2]) // MB
        return (f"{rule}: Slurm job {job} exceeded its memory limit ({used} MB > {limit} MB) and was killed; "
                f"raise mem_mb for {rule} (set-resources in the Slurm profile)")
    if state == "TIMEOUT" or "DUE TO TIME LIMIT" in text:
        return f"{rule}: Slurm job {job} reached its time limit; raise runtime for {rule} (set-resources in the Slurm profile)"
    if state == "CANCELLED":
        return f"{rule}: Slurm job {job} was cancelled; run the same command again to resume it"
    where = f" (log: {slurm_log})" if slurm_log is not None else ""
    return f"{rule}: Slurm job {job} ended {state}{where}"


def failure_reasons(snakemake_log: str | Path | Iterable[str | Path]) -> list[str]:
    """One line per ``Error in rule X:`` block of Snakemake's log that names a failed Slurm job
    (``onerror``'s ``log``: the run's log file, or a list of them)."""
    paths = [snakemake_log] if isinstance(snakemake_log, str | Path) else list(snakemake_log)
    text = "\n".join(Path(p).read_text(errors="replace") for p in paths if Path(p).is_file())
    out: list[str] = []
    rule = job = state = None
    for line in text.splitlines():
        start = ERROR.match(line)
        if start:
            rule, job, state = start[1], None, None
            continue
        failed = FAILED.search(line) if rule else None
        if failed:
            job, state = failed[1], failed[2]
        elif rule and job and line.strip().startswith("log:"):
            logs = [Path(p.strip().split(" (check")[0]) for p in line.strip()[4:].split(",")]
            mine = next((p for p in logs if p.name == f"{job}.log"), None)
            out.append(explain(rule, job, state or "FAILED", mine))
            rule = job = state = None
    return out

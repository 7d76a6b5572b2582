"""The one-line reasons the Snakefile's onerror prints for failed Slurm jobs (r2m.pipeline.slurm), on a
hand-written Snakemake log in the SLURM executor's format and Slurm logs with slurmstepd's lines."""

from __future__ import annotations

from pathlib import Path

from r2m.pipeline.slurm import failure_reasons


def _block(rule: str, job: int, state: str, slurm_log: Path) -> str:
    return (f"Error in rule {rule}:\n"
            f"    message: SLURM-job '{job}' failed, SLURM status is: '{state}'. Detailed failure reason "
            "unavailable (status command is not 'sacct').For further error details see the cluster/cloud log.\n"
            "    jobid: 3\n"
            f"    log: logs/{rule}/tiny-r2m.log, {slurm_log} (check log file(s) for error details)\n"
            f"    external_jobid: {job}\n")


def test_one_line_per_failed_job_memory_time_cancel_other(tmp_path: Path) -> None:
    logs = tmp_path / "logs/slurm"
    logs.mkdir(parents=True)
    (logs / "64.log").write_text("slurmstepd-localhost: error: StepId=64.0 exceeded memory limit "
                                 f"({400 * 2**20 + 5} > {300 * 2**20}), being killed\n")
    (logs / "65.log").write_text("slurmstepd-n1: error: *** JOB 65 ON n1 CANCELLED AT 2026-11-25T21:00:00 "
                                 "DUE TO TIME LIMIT ***\n")
    (logs / "66.log").write_text("slurmstepd-n1: error: *** JOB 66 ON n1 CANCELLED AT 2026-11-25T21:00:00 ***\n")
    (logs / "67.log").write_text("boom\n")
    text = ("Building DAG of jobs...\n" + _block("train_xe", 64, "FAILED", logs / "64.log")
            + "Logfile logs/train_xe/tiny-r2m.log: empty file\n"
            + _block("train_s", 65, "TIMEOUT", logs / "65.log") + _block("caption", 66, "CANCELLED", logs / "66.log")
            + _block("prepare", 67, "NODE_FAIL", logs / "67.log")
            + "Error in rule table1:\n    jobid: 9\n    log: logs/table1/all.log (check log file(s))\n"  # local job
            + "Exiting because a job execution failed. Look above for error messages\n")
    (tmp_path / "run.snakemake.log").write_text(text)
    assert failure_reasons(tmp_path / "run.snakemake.log") == [
        "train_xe: Slurm job 64 exceeded its memory limit (400 MB > 300 MB) and was killed; "
        "raise mem_mb for train_xe (set-resources in the Slurm profile)",
        "train_s: Slurm job 65 reached its time limit; raise runtime for train_s (set-resources in the Slurm profile)",
        "caption: Slurm job 66 was cancelled; run the same command again to resume it",
        f"prepare: Slurm job 67 ended NODE_FAIL (log: {logs / '67.log'})",
    ]
    assert failure_reasons([str(tmp_path / "run.snakemake.log")]) == failure_reasons(tmp_path / "run.snakemake.log")
    assert failure_reasons(tmp_path / "missing.log") == [] == failure_reasons([])

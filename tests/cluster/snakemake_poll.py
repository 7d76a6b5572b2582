"""``snakemake`` for tests/test_slurm.py with the SLURM executor's status checks at most
``R2M_SLURM_POLL_S`` seconds apart (default 1).

Plugin 2.8.0 has no setting for the interval between status checks: it starts at
``--slurm-init-seconds-before-status-checks`` and grows by 10 s after every check that finds no job
finished (up to 180 s), so on a small cluster each job of a chain waits 10-30 s for Snakemake to notice
that it ended. This wrapper caps that interval and changes nothing else: the jobs, their resources, the
status command (squeue) and how its answers are read are the plugin's own. Usage: as ``snakemake``, i.e.
``python tests/cluster/snakemake_poll.py --workflow-profile workflow/profiles/slurm ...``."""

from __future__ import annotations

import os
import sys


def cap_status_interval(seconds: float) -> None:
    """Make the SLURM executor's ``next_seconds_between_status_checks`` never exceed ``seconds``."""
    import snakemake_executor_plugin_slurm as slurm

    prop = slurm.Executor.next_seconds_between_status_checks  # the property RemoteExecutor defines

    def capped(self, value: float) -> None:
        prop.fset(self, min(value, seconds))

    slurm.Executor.next_seconds_between_status_checks = property(prop.fget, capped)


if __name__ == "__main__":
    cap_status_interval(float(os.environ.get("R2M_SLURM_POLL_S", "1")))
    from snakemake.cli import main

    sys.argv[0] = "snakemake"
    sys.exit(main())

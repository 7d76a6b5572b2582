"""The one-node Slurm cluster of tests/test_slurm.py and its run of the tiny Table-1 DAG, started in the
background as the session starts (conftest ``_slurm_dag_started``, only when a selected test uses them), so
that the cluster's start (installing its Debian packages on a fresh machine) and the ~14 Slurm jobs of the DAG,
mostly waiting on sbatch, squeue and job start-up, overlap the tests before test_slurm.py.

One daemon thread: ``slurm_up.sh`` (at most :data:`UP_TIMEOUT` s), then ``snakemake`` with the Slurm profile in
its own process group (output to a file beside the folder). :meth:`SlurmDagRun.wait_up` and :meth:`wait_dag`
block at most their timeouts and fail with the log tail (or skip, with slurm_up.sh's one line, where no cluster
can be had); :meth:`stop` ends the DAG's process group if it still runs, then stops the cluster if this run
started it (``slurm_down.sh``)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import tiny_dag_env, tiny_workflow

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "tests" / "cluster"
PROFILE = "workflow/profiles/slurm"
# a test's settings on top of the profile: the first status check after 1 s (default 40), files seen at once
FAST = ("--slurm-init-seconds-before-status-checks", "1", "--latency-wait", "5")
# `snakemake` with the plugin's status checks at most 1 s apart (it has no setting for that: each check that
# finds no job finished adds 10 s, so every job of the chain waited 10-30 s to be seen finished)
SNAKEMAKE = (sys.executable, str(CLUSTER / "snakemake_poll.py"))
TABLE1 = "reports/table1.csv"
UP_TIMEOUT = 900  # seconds slurm_up.sh may take (apt-get install on a fresh machine included)
DAG_TIMEOUT = 1500  # seconds the Slurm DAG may take once a test waits for it


def plugin_missing() -> str | None:
    """Why the Slurm tests cannot run here for want of the executor plugin, or None."""
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return "Slurm tests: the SLURM executor plugin is not installed (make setup-cluster)"
    return None


def snakemake_cmd(*args: str) -> list[str]:
    """``snakemake --workflow-profile workflow/profiles/slurm`` with the test settings; args: targets, options."""
    return [*SNAKEMAKE, "--workflow-profile", PROFILE, *FAST, *args]


def cluster_down() -> None:
    """Stop the cluster slurm_up.sh started; fails if ``scontrol`` still waits for a stopped controller."""
    subprocess.run(["bash", str(CLUSTER / "slurm_down.sh")], capture_output=True, text=True, timeout=300)
    # no configuration left pointing at a stopped controller: every later `snakemake` (the SLURM plugin
    # runs `scontrol show config` when it loads) would otherwise wait ~9 s for it
    t0 = time.monotonic()
    subprocess.run(["scontrol", "show", "config"], capture_output=True, timeout=60)
    assert time.monotonic() - t0 < 3, "after slurm_down.sh, scontrol still waits for a stopped controller"


class SlurmDagRun:
    """The cluster, then Table 1 of ``tiny`` through it in a scratch copy of the workflow with the shared local
    run's params (conftest.tiny_workflow), started now in a daemon thread."""

    def __init__(self, tmp_path_factory) -> None:
        self.wd = tmp_path_factory.mktemp("slurm_dag")
        tiny_workflow(ROOT, self.wd)
        self.log = self.wd.parent / f"{self.wd.name}.out"
        self.skip_reason: str | None = plugin_missing()
        self.started = False  # this run started the cluster (and stops it)
        self.error: str | None = None
        self.proc: subprocess.Popen | None = None
        self.up, self.done = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._stopping = self._stopped = False
        self._thread = threading.Thread(target=self._run, name="slurm-dag", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self.skip_reason is None:
                self._cluster_then_dag()
        except BaseException as exc:  # noqa: BLE001 - reported by wait_up / wait_dag in the test's thread
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.up.set()
            self.done.set()

    def _cluster_then_dag(self) -> None:
        r = subprocess.run(["bash", str(CLUSTER / "slurm_up.sh")], capture_output=True, text=True,
                           timeout=UP_TIMEOUT)
        if r.returncode:
            lines = r.stderr.strip().splitlines() or [f"slurm_up.sh exited {r.returncode}"]
            self.skip_reason = f"Slurm tests: {lines[-1]}"
            return
        self.started = r.stdout.strip().endswith("started")
        with self._lock:
            if self._stopping:
                return
            with self.log.open("w") as out:
                self.proc = subprocess.Popen(["nice", "-n", "5", *snakemake_cmd(TABLE1)], cwd=self.wd,
                                             env=tiny_dag_env(), stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)
        self.up.set()
        self.proc.wait()

    def _tail(self, n: int = 6000) -> str:
        return self.log.read_text()[-n:] if self.log.exists() else "(no output)"

    def wait_up(self) -> None:
        """Return once the cluster is up; skip where it cannot be had; fail on an error or after the timeout."""
        if not self.up.wait(UP_TIMEOUT + 60):
            pytest.fail(f"the Slurm cluster was not up within {UP_TIMEOUT + 60} s")
        if self.skip_reason:
            pytest.skip(self.skip_reason)
        if self.error:
            pytest.fail(f"starting the Slurm cluster and its DAG failed: {self.error}")

    def wait_dag(self) -> tuple[Path, str]:
        """(folder, snakemake's output) of the finished Slurm DAG; fails with the output's tail otherwise."""
        self.wait_up()
        if not self.done.wait(DAG_TIMEOUT):
            self._kill()
            pytest.fail(f"the Slurm DAG did not finish within {DAG_TIMEOUT} s: {self._tail()}")
        if self.error:
            pytest.fail(f"the Slurm DAG failed: {self.error}\n{self._tail()}")
        out = self.log.read_text()
        rc = None if self.proc is None else self.proc.returncode
        assert rc == 0, f"the Slurm DAG (snakemake in {self.wd}) exited {rc}; its output's tail:\n{out[-6000:]}"
        return self.wd, out

    def _kill(self) -> None:
        with self._lock:
            self._stopping = True
            if self.proc is not None and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)  # the plugin cancels its Slurm jobs on SIGTERM
                try:
                    self.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()

    def stop(self) -> None:
        """End the DAG if it still runs; stop the cluster if this run started it (slurm_down.sh cancels
        whatever jobs are left)."""
        if self._stopped:
            return
        self._stopped = True
        self._kill()
        self._thread.join(timeout=UP_TIMEOUT + 60)
        if self.started:
            cluster_down()

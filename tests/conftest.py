"""Shared fixtures. ``tiny_dag``: ONE Snakemake run of the whole DAG on the synthetic ``tiny`` dataset
per test session, shared by every test that reads a finished tiny DAG (test_pipeline_tiny.py, the CPU
side of test_speed.py, test_slurm.py's comparison) instead of each building its own; those tests treat it
as read-only. When a selected test uses it, the run starts in the background as the session starts (the
tests before it, mostly one process on one core, run meanwhile) and the fixture waits for it."""

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("R2M_NO_PROGRESS", "1")
WORKFLOW = ("Snakefile", "workflow", "dvc.yaml", "src", "data/dictionaries")


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def raw(repo_root: Path) -> dict:
    """The repository's params.yaml as a plain mapping (a test may change its copy)."""
    return yaml.safe_load((repo_root / "params.yaml").read_text())


# folders a pipeline run writes under data/<dataset>/ (git-ignored); the fallback when the checkout is not a git
# work tree (an sdist, an exported copy) leaves them out, as git leaves them out otherwise
GENERATED_NAMES = {"bad_images.csv", "prepared", "concepts", "corpus", "features", "sup_features", "sup_vocab", "vocab",
                   "inputs.json", "__pycache__"}


def source_files(root: Path, names: Sequence[str]) -> list[Path]:
    """The files under ``names`` (relative to ``root``) that belong to the project, never a run's outputs:
    git's tracked files plus new files it does not ignore; without git, every file but generated ones."""
    r = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                        "--", *names], capture_output=True)
    if r.returncode == 0 and r.stdout:
        return sorted({Path(p) for p in r.stdout.decode().split("\0") if p and (root / p).is_file()})
    files = []
    for name in names:
        top = root / name
        for path in ([top] if top.is_file() else sorted(top.rglob("*"))):
            rel = path.relative_to(root)
            if path.is_file() and not GENERATED_NAMES.intersection(rel.parts) and not any(
                    part.endswith(".egg-info") or part.endswith(".pyc") for part in rel.parts):
                files.append(rel)
    return files


def copy_sources(root: Path, wd: Path, names: Sequence[str]) -> None:
    """Copy the project's own files under ``names`` from ``root`` into ``wd``: a checkout that holds a finished
    ``make run`` (data/demo/prepared, models/, results/ ...) gives the same copy as a clean clone."""
    for rel in source_files(root, names):
        dst = wd / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dst)
    for name in names:  # an empty tracked folder still exists in the copy
        if (root / name).is_dir():
            (wd / name).mkdir(parents=True, exist_ok=True)


def copy_workflow(root: Path, wd: Path) -> None:
    """A scratch copy of what Snakemake and DVC need, so a DAG run leaves the repository clean."""
    copy_sources(root, wd, WORKFLOW)


def tiny_dag_env(wd: Path | None = None) -> dict[str, str]:
    """The shared run's environment: one thread per job, on the CPU (a CUDA machine compares against it). With
    ``wd``: its jobs run the workspace's own copy of the code (``wd/src``), so their records name the copy's
    files, relative to the workspace (a copy of the workspace is whole: tests/test_plans.py edits its code)."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{BIN}:{os.environ['PATH']}",
           "R2M_NO_PROGRESS": "1", "R2M_THREADS": "1", "R2M_DEVICE": "cpu"}
    if wd is not None:
        env["PYTHONPATH"] = str(Path(wd) / "src")
    return env


def write_params(wd: Path, raw: dict) -> None:
    """``raw`` as a scratch workspace's params.yaml, and its dvc.yaml written again as ``r2m dag --write`` would
    (DVC's instance lists follow the datasets, variants, seeds and baselines)."""
    from r2m import params as P
    from r2m.pipeline.dag import render

    (wd / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (wd / "dvc.yaml").write_text(render(P.validate(raw)))


def tiny_workflow(root: Path, wd: Path) -> None:
    """A scratch copy of the workflow whose params.yaml runs ``tiny`` only (datasets and baselines)."""
    copy_workflow(root, wd)
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw["datasets"] = ["tiny"]
    raw["baselines"]["datasets"] = ["tiny"]
    write_params(wd, raw)


TINY_DAG_TIMEOUT = 1500  # seconds the run may take once a test waits for it


class TinyDagRun:
    """``snakemake all`` on ``tiny`` in a scratch folder, started now (nice 5, its own process group; its output
    in files beside the folder); :meth:`wait` returns the folder once it finished, and fails with its log
    tails otherwise."""

    def __init__(self, root: Path, tmp_path_factory):
        self.wd = tmp_path_factory.mktemp("dag")
        tiny_workflow(root, self.wd)
        self.out = [self.wd.parent / f"{self.wd.name}.{name}" for name in ("stdout", "stderr")]
        with self.out[0].open("w") as so, self.out[1].open("w") as se:
            self.proc = subprocess.Popen(["nice", "-n", "5", str(BIN / "snakemake"), "--cores", "2", "all"],
                                         cwd=self.wd, env=tiny_dag_env(self.wd),
                                         stdout=so, stderr=se,
                                         start_new_session=True)

    def wait(self) -> Path:
        try:
            rc = self.proc.wait(timeout=TINY_DAG_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        wd = self.wd
        logs = "\n".join(f"== {p}\n{p.read_text()[-2000:]}" for p in sorted((wd / "logs").rglob("*.log"))
                         if "Error" in p.read_text() or "Traceback" in p.read_text()) if (wd / "logs").exists() else ""
        assert rc == 0, (self.out[0].read_text()[-4000:] + self.out[1].read_text()[-6000:] + logs)
        return wd

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)


def _runs(item: pytest.Item) -> bool:
    """Whether ``item`` gets past its static marks (``skip``, ``skipif`` with a bool condition) to its fixtures."""
    if any(True for _ in item.iter_markers("skip")):
        return False
    return not any(m.args and m.args[0] is True for m in item.iter_markers("skipif"))


@pytest.fixture(scope="session", autouse=True)
def _tiny_dag_started(request, tmp_path_factory):
    """Start the ``tiny_dag`` run at the session's start when a selected test will use it; stop it at the end
    if no test waited for it (an interrupted session)."""
    items = getattr(request.session, "items", [])
    run = None
    if any("tiny_dag" in item.fixturenames and _runs(item) for item in items):
        run = TinyDagRun(Path(request.config.rootpath), tmp_path_factory)
    yield run
    if run is not None:
        run.stop()


@pytest.fixture(scope="session")
def tiny_dag(_tiny_dag_started, tmp_path_factory, pytestconfig) -> Path:
    """The whole DAG (``snakemake all``) on ``tiny`` with the default params (datasets and baselines:
    ``[tiny]``), run once per session (started in the background by ``_tiny_dag_started``); returns its
    working folder."""
    run = _tiny_dag_started or TinyDagRun(Path(pytestconfig.rootpath), tmp_path_factory)
    return run.wait()


@pytest.fixture(scope="session", autouse=True)
def _slurm_dag_started(request, tmp_path_factory):
    """Start test_slurm.py's cluster and its run of the tiny DAG through Slurm (tests/slurm_background.py) at
    the session's start when a selected test uses them (fixture ``slurm_run``); stop both at the end if
    test_slurm.py's own teardown did not."""
    items = getattr(request.session, "items", [])
    run = None
    if any("slurm_run" in item.fixturenames and _runs(item) for item in items):
        from slurm_background import SlurmDagRun

        run = SlurmDagRun(tmp_path_factory)
    yield run
    if run is not None:
        run.stop()


@pytest.fixture(scope="session")
def stop_upstream(tmp_path_factory) -> Path:
    """The workspace of the runs tests/test_stop_signals.py and tests/test_slurm.py stop with a signal, with their
    inputs built (tests/stop_runs.py); one per session, shared."""
    from stop_runs import build_upstream

    return build_upstream(tmp_path_factory.mktemp("stop_up"))


@pytest.fixture(scope="session")
def stop_reference(stop_upstream, tmp_path_factory) -> Path:
    """Those runs without interruption: the bytes each stopped and resumed run must end with."""
    from stop_runs import build_reference

    return build_reference(stop_upstream, tmp_path_factory.mktemp("stop_ref") / "wd")

"""Shared fixtures. ``tiny_dag``: ONE Snakemake run of the whole DAG on the synthetic ``tiny`` dataset
per test session, shared by every test that reads a finished tiny DAG (test_pipeline_tiny.py, the CPU
side of test_speed.py) instead of each building its own; those tests treat it as read-only."""

import os
import shutil
import subprocess
import sys
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


def copy_workflow(root: Path, wd: Path) -> None:
    """A scratch copy of what Snakemake and DVC need, so a DAG run leaves the repository clean."""
    for name in WORKFLOW:
        src, dst = root / name, wd / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)


def tiny_dag_env() -> dict[str, str]:
    """The shared run's environment: one thread per job, on the CPU (a CUDA machine compares against it)."""
    return {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{BIN}:{os.environ['PATH']}",
            "R2M_NO_PROGRESS": "1", "R2M_THREADS": "1", "R2M_DEVICE": "cpu"}


@pytest.fixture(scope="session")
def tiny_dag(tmp_path_factory, pytestconfig) -> Path:
    """The whole DAG (``snakemake all``) on ``tiny`` with the default params (datasets and baselines:
    ``[tiny]``), run once per session; returns its working folder."""
    root = Path(pytestconfig.rootpath)
    wd = tmp_path_factory.mktemp("dag")
    copy_workflow(root, wd)
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw["datasets"] = ["tiny"]
    raw["baselines"]["datasets"] = ["tiny"]
    (wd / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    r = subprocess.run([str(BIN / "snakemake"), "--cores", "2", "all"], cwd=wd, env=tiny_dag_env(),
                       capture_output=True, text=True, timeout=1500)
    logs = "\n".join(f"== {p}\n{p.read_text()[-2000:]}" for p in sorted((wd / "logs").rglob("*.log"))
                     if "Error" in p.read_text() or "Traceback" in p.read_text()) if (wd / "logs").exists() else ""
    assert r.returncode == 0, (r.stdout[-4000:] + r.stderr[-6000:] + logs)
    return wd

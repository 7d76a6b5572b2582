"""Same inputs, same bytes: every report the DAG writes (the tables, the claims, the figures, the page)
comes out byte for byte the same when its stages run again on the same inputs — no date, no library
version, no random salt, no set or dict order that changes from one process to the next."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import BIN, tiny_dag_env
from r2m import params as P
from r2m.pipeline.resolved import dag_instances
from r2m.stage import registry as S

pytestmark = pytest.mark.slow  # reruns the report stages on a copy of the session's tiny DAG

REPORTS = "reports/"


def report_instances(wd: Path) -> list[tuple[str, dict[str, str]]]:
    """The DAG's instances of the stages that write under ``reports/`` only, in the DAG's order (each after
    what it reads)."""
    params = P.validate(yaml.safe_load((wd / "params.yaml").read_text()))
    return [(stage.name, bound) for stage, bound in dag_instances(params)
            if all(out.path.startswith(REPORTS) for out in stage.outs.values())]


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` but Snakemake's own (``.snakemake_timestamp`` in a folder output): relative
    path -> SHA-256."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".snakemake")}


def test_the_reports_are_the_same_bytes_from_the_same_inputs(tiny_dag, tmp_path):
    """The tiny DAG's ``reports/`` against the same stages run again on a copy of its inputs, in processes with
    another hash salt (``PYTHONHASHSEED``; the DAG's jobs each had a random one)."""
    wd = tmp_path / "again"
    shutil.copytree(tiny_dag, wd, symlinks=True,
                    ignore=lambda folder, _names: [".snakemake"] if Path(folder) == tiny_dag else [])
    runs = report_instances(wd)
    names = {name for name, _ in runs}
    assert {"table1", "table2", "table3", "claims", "figures", "report"} <= names, names
    for name, bound in runs:  # each instance's outputs go, so the run cannot keep an old file
        for out in S.get(name).outs.values():
            target = wd / out.path.format(**bound)
            shutil.rmtree(target) if target.is_dir() else target.unlink()
    env = {**tiny_dag_env(wd), "PYTHONHASHSEED": "4242"}
    for name, bound in runs:
        args = [str(BIN / "r2m"), name, *(f"--{k}={v}" for k, v in bound.items())]
        r = subprocess.run(args, cwd=wd, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{' '.join(args[1:])}: {r.stderr[-2000:]}"
    first, again = tree(tiny_dag / "reports"), tree(wd / "reports")
    assert sorted(first) == sorted(again)
    differ = [path for path in first if first[path] != again[path]]
    assert differ == [], f"not the same bytes from the same inputs: {differ}"
    assert "index.html" in first and any(p.endswith(".png") for p in first)

"""Tests copy the project's own files, never a run's outputs: `make run` then `make test` in one checkout
(data/demo/prepared, models/, results/ ... present) sees the same fixtures as a clean clone."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import WORKFLOW, copy_sources, source_files

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = ("data/demo/prepared/images.parquet", "data/demo/inputs.json", "data/demo/vocab/vocab.json",
           "models/demo/r2m/s0/train_xe/model.pt", "results/demo/r2m/s0/train_i/eval.json", "reports/table1.csv",
           "logs/demo/prepare.log", ".snakemake/r2m/params.yaml", "src/r2m/__pycache__/x.cpython-311.pyc")
SOURCES = ("data/demo/references.json", "data/demo/photos.yaml", "src/r2m/__init__.py", "params.yaml",
           "Snakefile")


def _checkout_with_outputs(root: Path, git: bool) -> Path:
    for rel in SOURCES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"source {rel}\n")
    if git:
        shutil.copy2(ROOT / ".gitignore", root / ".gitignore")
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    for rel in OUTPUTS:  # what a finished run leaves behind, after the sources were committed
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("output\n")
    return root


@pytest.mark.parametrize("git", [True, False], ids=["git-checkout", "exported-copy"])
def test_copy_sources_leaves_a_runs_outputs_behind(tmp_path, git):
    root = _checkout_with_outputs(tmp_path / "checkout", git)
    wd = tmp_path / "wd"
    names = ("Snakefile", "params.yaml", "src", "data/demo")
    copy_sources(root, wd, names)
    copied = sorted(str(p.relative_to(wd)) for p in wd.rglob("*") if p.is_file())
    expected = sorted(s for s in SOURCES if s.split("/")[0] in {n.split("/")[0] for n in names})
    assert copied == expected
    assert (wd / "data/demo/references.json").read_text() == "source data/demo/references.json\n"


def test_a_new_untracked_source_file_is_copied(tmp_path):
    """A module written but not yet `git add`ed is part of the code under test."""
    root = _checkout_with_outputs(tmp_path / "checkout", git=True)
    (root / "src/r2m/new_module.py").write_text("X = 1\n")
    assert Path("src/r2m/new_module.py") in source_files(root, ["src"])


def test_the_real_checkout_copies_nothing_git_ignores():
    """Whatever this checkout holds (a clean clone, or one after `make run`), the fixtures' copy of it is
    only the project's files."""
    files = source_files(ROOT, [*WORKFLOW, "data/demo", "params.yaml"])
    assert Path("data/demo/references.json") in files and Path("Snakefile") in files
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the git-ignore check needs git")
    r = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin"],
                       input="\n".join(map(str, files)), capture_output=True, text=True)
    assert r.stdout.strip() == ""  # no copied path is ignored (exit 1: none matched)

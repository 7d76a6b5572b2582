"""`r2m bench plan`'s parts: child CPU is counted, and the floor workflows it times are up to date."""

from __future__ import annotations

import sys
from pathlib import Path

from r2m.bench import plan as B


def test_timed_counts_the_childs_cpu(tmp_path: Path) -> None:
    # a child that spins for 0.3 s of its own CPU: the parent's clock alone would see none of it
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint('done')"
    r = B.timed([sys.executable, "-c", spin], tmp_path)
    assert r["rc"] == 0 and r["out"].strip() == "done"
    assert 0.3 <= r["cpu"] < 5.0
    assert r["wall"] >= 0.3


def test_floor_workflows_have_nothing_to_do(tmp_path: Path) -> None:
    B.snakemake_floor(tmp_path / "sm", 3)
    r = B.timed([B._tool("snakemake"), "-n", "all"], tmp_path / "sm")
    assert r["rc"] == 0, r["out"]
    assert "Nothing to be done" in r["out"]
    B.dvc_floor(tmp_path / "dvc", 3)
    lock = (tmp_path / "dvc" / "dvc.lock").read_text()
    assert lock.count("cmd: cp st/") == 3  # one locked stage per job
    r = B.timed([B._tool("dvc"), "status"], tmp_path / "dvc")
    assert r["rc"] == 0 and "up to date" in r["out"], r["out"]
    # and the floor is not blind: a changed input shows
    (tmp_path / "dvc" / "st" / "1.json").write_text('{"x": 1}')
    r = B.timed([B._tool("dvc"), "status"], tmp_path / "dvc")
    assert "make@k1" in r["out"] and "make@k0" not in r["out"], r["out"]

"""Stage start-up: a light stage never imports torch, even with ``R2M_THREADS`` set (as under
Snakemake, where every job gets it); a stage that uses torch still gets those threads
(``r2m.cli.AfterImport``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from r2m.cli import AfterImport

PROBE = textwrap.dedent("""
    import sys
    import r2m.cli as c
    rc = c.main(sys.argv[1].split() + ["--params", sys.argv[2], "--no-log-file"])
    torch = sys.modules.get("torch")
    print("RESULT", rc, torch is not None, torch.get_num_threads() if torch else 0)
""")


def _start(stage: str, tmp_path, repo_root) -> tuple[int, bool, int]:
    """Run ``r2m <stage>`` in an empty folder with R2M_THREADS=1: (exit code, torch imported, its threads).
    The stage fails on its missing inputs, after the start-up this test is about."""
    env = {**os.environ, "R2M_THREADS": "1", "PYTHONPATH": str(repo_root / "src")}
    out = subprocess.run([sys.executable, "-c", PROBE, stage, str(repo_root / "params.yaml")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT"))
    _, rc, imported, threads = line.split()
    assert f"r2m {stage.split()[0]}" in out.stderr  # the stage itself ran (and failed on its inputs)
    return int(rc), imported == "True", int(threads)


@pytest.mark.parametrize("stage", ["table1", "build_vocab --dataset demo",
                                   "evaluate --dataset demo --variant r2m --ckpt train_xe",
                                   "evaluate_sup --dataset demo --model mrnn", "mostfreq --dataset demo"])
def test_light_stage_does_not_import_torch(stage, tmp_path, repo_root):
    rc, imported, _ = _start(stage, tmp_path, repo_root)
    assert rc == 1 and not imported


def test_torch_stage_still_gets_its_threads(tmp_path, repo_root):
    rc, imported, threads = _start("train_xe --dataset demo --variant r2m", tmp_path, repo_root)
    assert rc == 1 and imported and threads == 1


def test_after_import_runs_once_after_the_module(tmp_path, monkeypatch):
    (tmp_path / "r2m_startup_probe.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    with AfterImport("r2m_startup_probe", lambda: seen.append(sys.modules["r2m_startup_probe"].VALUE)) as hook:
        assert seen == [] and hook in sys.meta_path
        import r2m_startup_probe  # noqa: F401

        assert seen == [42] and hook not in sys.meta_path
    with AfterImport("r2m_startup_probe", lambda: seen.append("now")):  # already imported: at once
        assert seen == [42, "now"]
    with AfterImport("r2m_never_imported", lambda: seen.append("never")) as hook:
        pass
    assert hook not in sys.meta_path and seen == [42, "now"]
    monkeypatch.delitem(sys.modules, "r2m_startup_probe")


def test_after_import_sets_torch_threads_on_first_import():
    code = textwrap.dedent("""
        import sys
        from r2m.cli import AfterImport
        assert "torch" not in sys.modules
        with AfterImport("torch", lambda: sys.modules["torch"].set_num_threads(3)):
            import torch
        print(torch.get_num_threads())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split()[-1] == "3"

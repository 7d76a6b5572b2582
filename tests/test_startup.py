"""Stage start-up: a light stage never imports torch, even with ``R2M_THREADS`` set (as under
Snakemake, where every job gets it); a stage that uses torch still gets those threads
(``r2m.cli.AfterImport``)."""

from __future__ import annotations

import json
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


SKIP_REASON = "no paired training captions (a test's own reason)"
SKIPPED = {  # stage -> (its output holding the reason, the key under which it is)
    "pretrain_sup": ("models/demo/mrnn/s0/pretrain_sup/skipped.json", "skipped"),
    "train_sup": ("results/demo/mrnn/s0/train_sup/train_metrics.json", "skipped"),
    "caption_sup": ("results/demo/mrnn/s0/train_sup/captions.json", None),
    "inspect_sup": ("results/demo/mrnn/s0/train_sup/inspect/inspect.json", "skipped"),
    "retrieval_sup": ("results/demo/mrnn/s0/train_sup/retrieval.json", "skipped"),
}


@pytest.mark.parametrize("stage", sorted(SKIPPED))
def test_skipped_baseline_starts_without_torch(stage, tmp_path, repo_root):
    """A dataset without paired captions: every supervised stage of it writes its skip output and
    never imports torch (before, each of these 20 jobs of the demo DAG spent ~2.3 CPU s importing it)."""
    vocab = tmp_path / "data" / "demo" / "sup_vocab"
    vocab.mkdir(parents=True)
    (vocab / "stats.json").write_text(json.dumps({"paired": False, "reason": SKIP_REASON}))
    for name in ("vocab.json", "captions.parquet"):  # key files present (never read when skipped)
        (vocab / name).write_text("")
    rc, imported, _ = _start(f"{stage} --dataset demo --model mrnn --seed 0", tmp_path, repo_root)
    assert rc == 0 and not imported
    path, key = SKIPPED[stage]
    written = json.loads((tmp_path / path).read_text())
    assert written == [] if key is None else written[key] == SKIP_REASON


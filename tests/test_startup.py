"""Stage start-up: a light stage never imports torch, even with ``R2M_THREADS`` set (as under
Snakemake, where every job gets it); a stage that uses torch still gets those threads
(``r2m.cli.AfterImport``)."""

from __future__ import annotations

import ast
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
    never imports torch (issue 33: 20 of the demo DAG's jobs, ~2.3 CPU s each before)."""
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


# --------------------------------------------------------------------------- source scans kept on disk
def _scan_setup(tmp_path, monkeypatch):
    from r2m.utils import source_cache

    src = tmp_path / "pkg"
    src.mkdir()
    monkeypatch.setattr(source_cache, "_PACKAGE", src.resolve())
    monkeypatch.setenv("R2M_CACHE", str(tmp_path / "cache"))
    (src / "a.py").write_text('@THINGS.register("alpha")\nclass A: ...\n')
    (src / "b.py").write_text('@THINGS.register("beta")\nclass B: ...\n@OTHER.register("gamma")\nclass C: ...\n')
    return src


def test_declared_names_kept_under_the_files_content(tmp_path, monkeypatch):
    from r2m.utils import registry

    src = _scan_setup(tmp_path, monkeypatch)
    calls = []
    parse = ast.parse  # count the parses: a kept scan parses nothing
    monkeypatch.setattr(ast, "parse", lambda *a, **k: calls.append(1) or parse(*a, **k))
    assert registry.declared_names([src], "THINGS") == ["alpha", "beta"]
    assert len(calls) == 2
    assert registry.declared_names([src], "THINGS") == ["alpha", "beta"] and len(calls) == 2  # kept
    assert registry.declared_names([src], "OTHER") == ["gamma"] and len(calls) == 4  # another scan
    (src / "a.py").write_text('@THINGS.register("delta")\nclass A: ...\n')  # an edit: scanned again
    assert registry.declared_names([src], "THINGS") == ["beta", "delta"] and len(calls) == 6
    (src / "c.py").write_text('THINGS.register("omega")(object)\n')  # a new file: scanned again
    assert registry.declared_names([src], "THINGS") == ["beta", "delta", "omega"]


def test_a_damaged_or_unwritable_cache_is_not_used(tmp_path, monkeypatch):
    from r2m.utils import source_cache
    from r2m.utils.registry import declared_names

    src = _scan_setup(tmp_path, monkeypatch)
    assert declared_names([src], "THINGS") == ["alpha", "beta"]
    (entry,) = (tmp_path / "cache" / "source-scans").glob("*.json")
    for junk in ("{not json", '{"a": 1}', '["alpha", 3]'):
        entry.write_text(junk)
        assert declared_names([src], "THINGS") == ["alpha", "beta"]
        assert json.loads(entry.read_text()) == ["alpha", "beta"]  # written again
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv("R2M_CACHE", str(blocked))
    assert declared_names([src], "THINGS") == ["alpha", "beta"]
    monkeypatch.setattr(source_cache, "_PACKAGE", (tmp_path / "elsewhere").resolve())  # outside: never kept
    monkeypatch.setenv("R2M_CACHE", str(tmp_path / "cache2"))
    assert declared_names([src], "THINGS") == ["alpha", "beta"]
    assert not (tmp_path / "cache2").exists()


def test_declared_keys_kept_equal_a_fresh_scan(tmp_path, monkeypatch):
    """The package's recipe keys through the cache (twice) equal those of a scan with no cache."""
    from r2m import params as P
    from r2m.utils import declared, source_cache

    monkeypatch.setenv("R2M_CACHE", str(tmp_path / "cache"))
    first = declared.declared_keys.__wrapped__(P.RECIPE_SOURCES, "RECIPES", ("Benchmark",))
    kept = declared.declared_keys.__wrapped__(P.RECIPE_SOURCES, "RECIPES", ("Benchmark",))
    monkeypatch.setattr(source_cache, "_PACKAGE", (tmp_path / "nowhere").resolve())
    fresh = declared.declared_keys.__wrapped__(P.RECIPE_SOURCES, "RECIPES", ("Benchmark",))
    assert first == kept == fresh and "demo" in fresh and all(isinstance(v, tuple) for v in fresh.values())
    assert len(list((tmp_path / "cache" / "source-scans").glob("*.json"))) == 1


def test_the_kept_import_graph_equals_a_fresh_scan(tmp_path, monkeypatch):
    """The package's import arrows through the cache (twice: the second parses nothing) equal a scan with no
    cache; an arrow read by hand is among them (training/image_stages.py imports training.selection)."""
    from r2m.utils import imports, source_cache

    monkeypatch.setenv("R2M_CACHE", str(tmp_path / "cache"))
    first = imports.import_graph()
    calls = []
    parse = ast.parse
    monkeypatch.setattr(ast, "parse", lambda *a, **k: calls.append(1) or parse(*a, **k))
    kept = imports.import_graph()
    assert calls == []  # read from the cache
    monkeypatch.setattr(source_cache, "_PACKAGE", (tmp_path / "nowhere").resolve())
    fresh = imports.import_graph()
    assert len(calls) == len(fresh[0])  # every file parsed again
    assert first == kept == fresh
    assert any(e.src == "r2m.training.image_stages" and e.dst == "r2m.training.selection" for e in fresh[1])
    assert len(list((tmp_path / "cache" / "source-scans").glob("*.json"))) == 1

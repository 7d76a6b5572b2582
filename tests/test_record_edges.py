"""What a run record holds at its edges: files outside the workspace, data files inside the Python installation,
the installed distributions and the interpreter, options looked up and not found, and the runtime settings used.

Each expectation is written from what the case means for a rerun: an edit of what a run read must show up as one
change line, an edit of anything else as none.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from r2m.utils import reads as RD
from r2m.utils.reads import Digests, ParamValues, Recorder, changes


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_of(body: dict) -> dict:
    return {"reads": body["reads"], "params": body["params"], "runtime": body.get("runtime", [])}


# ------------------------------------------------------------------------------------------ outside the workspace
def test_a_file_outside_the_workspace_is_recorded_by_its_absolute_path_and_content(tmp_path):
    ws, outside = tmp_path / "ws", tmp_path / "elsewhere" / "words.txt"
    ws.mkdir()
    outside.parent.mkdir()
    outside.write_text("dog\ncat\n")
    rec = Recorder(ws).start()
    try:
        outside.read_text()
    finally:
        body = rec.finish(ws / "cache.json")
    name = os.path.realpath(outside)
    entry = {e["path"]: e for e in body["reads"]}[name]
    assert entry["kind"] == "file" and entry["sha256"] == sha(b"dog\ncat\n")
    record = record_of(body)
    assert changes(record, ParamValues(None), Digests(ws)) == []
    outside.write_text("dog\nhorse\n")
    assert changes(record, ParamValues(None), Digests(ws)) == [f"{name}: changed (file)"]


def test_the_system_and_kernel_files_are_left_out(tmp_path):
    rec = Recorder(tmp_path).start()
    try:
        Path("/proc/self/status").read_text()
        if os.path.exists("/etc/hostname"):
            Path("/etc/hostname").read_text()
    finally:
        body = rec.finish()
    assert not [e for e in body["reads"] if e["path"].startswith(("/proc", "/etc"))]


def test_a_data_file_in_the_installation_is_named_relative_to_site_packages(tmp_path, monkeypatch):
    """A spaCy table or a wheel's weights: ``site:<path>``, the same name in any rebuilt environment; its code is
    covered by the distribution's version instead."""
    site = tmp_path / "venv" / "lib" / "site-packages"
    (site / "lookups" / "data").mkdir(parents=True)
    table = site / "lookups" / "data" / "lemma.json"
    table.write_text('{"dogs": "dog"}')
    (site / "lookups" / "tables.py").write_text("X = 1\n")
    monkeypatch.setattr(RD, "site_dirs", lambda: (str(site.resolve()),))
    ws = tmp_path / "ws"
    ws.mkdir()
    rec = Recorder(ws).start()
    try:
        table.read_text()
        (site / "lookups" / "tables.py").read_text()
    finally:
        body = rec.finish()
    names = {e["path"]: e for e in body["reads"]}
    assert "site:lookups/data/lemma.json" in names and names["site:lookups/data/lemma.json"]["kind"] == "file"
    assert not [n for n in names if n.endswith("lookups/tables.py")]
    record = record_of(body)
    table.write_text('{"dogs": "dogs"}')  # what a lemma table says: the singulariser's output changes
    assert changes(record, ParamValues(None), Digests(ws)) == ["site:lookups/data/lemma.json: changed (file)"]


def test_the_distributions_imported_and_the_interpreter_are_recorded_by_version(tmp_path, monkeypatch):
    import yaml  # noqa: F401  (a distribution every run imports: PyYAML)

    rec = Recorder(tmp_path).start()
    body = rec.finish()
    names = {e["path"]: e for e in body["reads"]}
    from importlib.metadata import version

    assert names["dist:pyyaml"]["kind"] == "dist"
    assert names["dist:pyyaml"]["sha256"] == f"version:{version('pyyaml')}"
    assert names["python:"]["sha256"] == f"version:{RD.interpreter()}"
    assert sys.version.split()[0] in names["python:"]["sha256"]
    record = record_of(body)
    assert changes(record, ParamValues(None), Digests(tmp_path)) == []
    real = RD.dist_version
    monkeypatch.setattr(RD, "dist_version", lambda n: "version:99.0" if n == "pyyaml" else real(n))
    assert changes(record, ParamValues(None), Digests(tmp_path)) == \
        [f"dist:pyyaml: {version('pyyaml')} -> 99.0 (dist)"]


# ------------------------------------------------------------------------------------------ params not set
def _catalog(extra: dict) -> object:
    from r2m import params as P

    return P.validate({"datasets": ["demo"], "catalog": {"demo": {"kind": "demo", **extra}}})


def test_an_option_a_recipe_looked_up_with_a_default_reruns_once_set_to_another_value():
    from r2m.datasets.base import option

    params = _catalog({})
    rec = Recorder(Path(".")).start(params)
    try:
        assert option(params.catalog["demo"], "crop", 0.04) == 0.04
    finally:
        body = rec.finish()
    assert [p["key"] for p in body["params"]] == ["catalog.demo.crop"]
    record = record_of(body)
    assert changes(record, ParamValues(_catalog({"crop": 0.04})), Digests(Path("."))) == []  # restates the default
    assert changes(record, ParamValues(_catalog({"crop": 0.1})), Digests(Path("."))) == \
        ["params catalog.demo.crop: changed"]
    assert changes(record, ParamValues(_catalog({"train_copies": False})), Digests(Path("."))) == []  # not read


def test_an_attribute_looked_up_and_missing_is_recorded_as_absent():
    params = _catalog({})
    rec = Recorder(Path(".")).start(params)
    try:
        assert getattr(params.catalog["demo"], "train_copies", None) is None
    finally:
        body = rec.finish()
    assert body["params"] == [{"key": "catalog.demo.train_copies", "path": ["catalog", "demo", "train_copies"],
                               "sha256": hashlib.sha256(b"null").hexdigest(), "value": None, "absent": True}]
    record = record_of(body)
    assert changes(record, ParamValues(_catalog({})), Digests(Path("."))) == []
    assert changes(record, ParamValues(_catalog({"train_copies": False})), Digests(Path("."))) == \
        ["params catalog.demo.train_copies: set (absent when it ran)"]


# ------------------------------------------------------------------------------------------ runtime settings
def test_the_runtime_settings_a_run_uses_are_recorded_and_compared(tmp_path, monkeypatch):
    from r2m.runtime import STAGE_THREADS, Runtime

    monkeypatch.delenv("R2M_THREADS", raising=False)
    runtime = Runtime.from_env(default_threads=STAGE_THREADS)
    assert runtime.settings()["threads"] == 1  # a stage's default under both engines
    rec = Recorder(tmp_path).start()
    try:
        assert runtime.threads == 1
    finally:
        body = rec.finish()
    assert body["runtime"] == [{"key": "threads", "value": 1}]  # the device was never asked for
    record = record_of(body)
    assert changes(record, ParamValues(None), Digests(tmp_path), runtime.settings()) == []
    monkeypatch.setenv("R2M_THREADS", "2")
    now = Runtime.from_env(default_threads=STAGE_THREADS).settings()
    assert changes(record, ParamValues(None), Digests(tmp_path), now) == ["runtime threads: 1 -> 2"]


# ------------------------------------------------------------------------------------------ the stat cache
def test_the_stat_cache_rereads_a_file_whose_mtime_was_put_back(tmp_path):
    """``touch -r`` puts a modification time back; the change time it cannot: the digest follows the content."""
    from r2m.utils.digest import StatCache

    f, cache = tmp_path / "x.bin", tmp_path / "cache.json"
    f.write_bytes(b"aaaa")
    st = f.stat()
    stats = StatCache(cache)
    assert stats.record(f)["sha256"] == sha(b"aaaa")
    stats.save()
    f.write_bytes(b"bbbb")  # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert StatCache(cache).record(f)["sha256"] == sha(b"bbbb")


@pytest.mark.parametrize("name,expect", [("site:a/b.json", "site"), ("prefix:share/x", "prefix"),
                                         ("dist:torch", None), ("python:", None), ("data/x", "ws")])
def test_recorded_names_resolve_to_files_now(name, expect, tmp_path, monkeypatch):
    monkeypatch.setattr(RD, "site_dirs", lambda: (str(tmp_path / "site"),))
    got = RD.resolve_name(tmp_path / "ws", name)
    want = {"site": str(tmp_path / "site" / "a/b.json"), "prefix": os.path.join(sys.prefix, "share/x"),
            "ws": str(tmp_path / "ws" / "data/x"), None: None}[expect]
    assert got == want


def test_a_datasets_seeds_are_recorded_as_the_list_they_resolved_to():
    """A run that asks a dataset's seeds (the tables, the figures) names ``catalog.<name>.seeds`` with the list it
    used: the top-level seeds restated for the dataset change nothing, another list does, and the top-level seeds
    it fell back on are read too."""
    from r2m import params as P

    params = P.validate({"datasets": ["demo"], "seeds": [0, 1], "catalog": {"demo": {"kind": "demo"}}})
    rec = Recorder(Path(".")).start(params)
    try:
        assert P.seeds_for(params, "demo", "r2m") == [0, 1]
    finally:
        body = rec.finish()
    assert sorted(p["key"] for p in body["params"]) == ["catalog.demo.seeds", "seeds"]
    record = record_of(body)

    def now(top: list[int], own: object = None) -> ParamValues:
        entry = {"kind": "demo", **({"seeds": own} if own is not None else {})}
        return ParamValues(P.validate({"datasets": ["demo"], "seeds": top, "catalog": {"demo": entry}}))

    assert changes(record, now([0, 1]), Digests(Path("."))) == []
    assert changes(record, now([0, 1], [0, 1]), Digests(Path("."))) == []  # restated for the dataset
    assert changes(record, now([0, 1], [0, 2]), Digests(Path("."))) == ["params catalog.demo.seeds: changed"]
    assert changes(record, now([0, 2]), Digests(Path("."))) == ["params seeds: changed"]

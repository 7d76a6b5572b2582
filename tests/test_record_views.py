"""A structured file read through a view: the demo's ``photos.yaml``, of which ``prepare`` reads each photo's id,
package, resource and sha256 (r2m.utils.reads.read_view, r2m.datasets.demo.photo_sources).

The expectations come from what the recipe does with each field: it copies a photo out of ``package`` at
``resource``, checks ``sha256`` and names the file after ``id``; a photo's ``description``, ``licence``, ``loader``
and ``concepts`` change nothing it writes. So an edit of one of those must leave a record current (no change
line), an edit of one of the four one line naming the file; the ``inputs`` stage's digest follows the same rule.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from r2m.stage.record import shape_problem
from r2m.utils.reads import Digests, ParamValues, Recorder, changes

ROOT = Path(__file__).resolve().parents[1]
NAME = "view:demo_photos:data/demo/photos.yaml"


@pytest.fixture
def ws(tmp_path) -> Path:
    """A workspace holding a copy of the committed photos.yaml."""
    (tmp_path / "data" / "demo").mkdir(parents=True)
    shutil.copy(ROOT / "data" / "demo" / "photos.yaml", tmp_path / "data" / "demo" / "photos.yaml")
    return tmp_path


def recorded(ws: Path) -> dict:
    """The record of a run that loads the photos as ``prepare`` does."""
    from r2m.datasets.demo import load_photos

    rec = Recorder(ws).start()
    try:
        photos = load_photos(ws / "data" / "demo")
    finally:
        body = rec.finish(ws / "cache.json")
    assert len(photos) >= 16
    return {"reads": body["reads"], "params": body["params"]}


def edit(ws: Path, photo: int, key: str, value: str) -> None:
    """Set one field of one photo (the file rewritten by YAML, comments gone)."""
    path = ws / "data" / "demo" / "photos.yaml"
    doc = yaml.safe_load(path.read_text())
    assert doc["photos"][photo].get(key) != value
    doc["photos"][photo][key] = value
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def now(ws: Path, record: dict) -> list[str]:
    return changes(record, ParamValues(None), Digests(ws))


def test_the_record_names_the_view_not_the_file(ws):
    record = recorded(ws)
    names = {r["path"]: r for r in record["reads"] if r["kind"] not in ("module", "dist", "python")}
    assert set(names) == {NAME}
    assert names[NAME]["kind"] == "view"
    assert shape_problem({"format": 2, **record, "runtime": [], "outputs": []}, ws) is None
    assert now(ws, record) == []


@pytest.mark.parametrize("key,value", [("description", "A cat."), ("licence", "mine"), ("loader", "x.y"),
                                       ("concepts", ["zebra"])])
def test_a_field_prepare_does_not_read_changes_nothing(ws, key, value):
    record = recorded(ws)
    edit(ws, 1, key, value)
    assert now(ws, record) == []


@pytest.mark.parametrize("key,value", [("sha256", "0" * 64), ("resource", "data/other.png"), ("package", "sklearn"),
                                       ("id", "renamed")])
def test_a_field_prepare_reads_is_one_change_naming_the_file(ws, key, value):
    record = recorded(ws)
    edit(ws, 1, key, value)
    assert now(ws, record) == ["data/demo/photos.yaml: changed (view demo_photos)"]


def test_a_new_photo_a_reordering_a_removed_or_broken_file(ws):
    record = recorded(ws)
    path = ws / "data" / "demo" / "photos.yaml"
    text = path.read_text()
    doc = yaml.safe_load(text)
    doc["photos"] = doc["photos"][1:] + doc["photos"][:1]  # the images' order follows the file's
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert now(ws, record) == ["data/demo/photos.yaml: changed (view demo_photos)"]
    path.write_text("photos: [unclosed\n")
    assert now(ws, record) == ["data/demo/photos.yaml: unreadable (view demo_photos)"]
    path.unlink()
    assert now(ws, record) == ["data/demo/photos.yaml: removed (view demo_photos)"]
    path.write_text("# a comment\n" + text)  # back as it was, and a comment
    assert now(ws, record) == []


def test_the_inputs_digest_follows_the_view(ws):
    """The ``inputs`` stage's record of photos.yaml (what ``prepare`` depends on under both engines)."""
    from r2m import params as P
    from r2m.datasets.inputs import input_records

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["catalog"]["demo"]["source_dir"] = str(ws / "data" / "demo")
    entry = P.validate(raw).catalog["demo"]
    (ws / "data" / "demo" / "corpus.txt").write_text("a cat\n")

    def photos() -> dict:
        got = {Path(r["path"]).name: r for r in input_records(entry, "demo", ws)}
        assert set(got) == {"photos.yaml", "corpus.txt"}
        return got["photos.yaml"]

    first = photos()
    assert set(first) == {"path", "demo_photos_sha256"}
    edit(ws, 0, "description", "An astronaut.")
    assert photos() == first
    edit(ws, 0, "sha256", "1" * 64)
    assert photos() != first


def test_a_record_may_not_name_an_unknown_view_or_a_view_outside_its_folder(ws):
    def problem(path: str, kind: str = "view") -> str | None:
        record = {"format": 2, "reads": [{"path": path, "kind": kind, "sha256": "x"}], "params": []}
        return shape_problem(record, ws)

    assert problem(NAME) is None
    assert "no known view" in problem("view:nope:data/demo/photos.yaml")
    assert "leaves its folder" in problem("view:demo_photos:../photos.yaml")
    assert "system" in problem("view:demo_photos:/etc/passwd")
    assert "not a view entry" in problem("data/demo/photos.yaml")
    assert "a view entry's name" in problem(NAME, kind="file")


def test_the_strace_witness_counts_a_view_entry_as_its_file(ws):
    """tests/test_strace_witness.py compares the files a process opened with its record: the file a view read is
    named by the view's entry."""
    from test_strace_witness import covered

    record = {"reads": [{"path": NAME, "kind": "view", "sha256": "x"}]}
    assert covered(str(ws / "data" / "demo" / "photos.yaml"), record, ws) == NAME
    assert covered(str(ws / "data" / "demo" / "corpus.txt"), record, ws) is None


def test_the_view_is_the_recipes_fields_in_order(ws):
    from r2m.datasets.demo import PHOTO_FIELDS, photo_sources

    doc = photo_sources(ws / "data" / "demo" / "photos.yaml")
    said = yaml.safe_load((ws / "data" / "demo" / "photos.yaml").read_text())
    assert PHOTO_FIELDS == ("id", "package", "resource", "sha256")
    assert doc == {"photos": [{k: p[k] for k in PHOTO_FIELDS} for p in said["photos"]]}
    assert json.dumps(doc)  # JSON data

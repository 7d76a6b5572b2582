import json

import pytest

from r2m.utils.io import atomic_path, read_json, write_json
from r2m.utils.owner import OWNER_MARK


def test_atomic_file_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.json"
    write_json(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text('{"a": 2, "half')
            raise RuntimeError("crash mid-write")
    assert json.loads(target.read_text()) == {"a": 1}  # old complete output survives
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temp litter


def test_atomic_directory_replace(tmp_path):
    out = tmp_path / "stage_out"
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "a.txt").write_text("1")
    assert (out / "a.txt").read_text() == "1"
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "b.txt").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == [OWNER_MARK, "b.txt"]  # the marker: r2m made it
    with pytest.raises(ValueError):
        with atomic_path(out) as tmp:
            tmp.mkdir()
            (tmp / "c.txt").write_text("3")
            raise ValueError("boom")
    assert sorted(p.name for p in out.iterdir()) == [OWNER_MARK, "b.txt"]  # the marker: r2m made it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage_out"]


def test_read_json_names_file_and_line(tmp_path):
    f = tmp_path / "x.json"
    f.write_text('{\n "a": 1,\n oops\n}')
    with pytest.raises(ValueError, match=r"x\.json: line 3"):
        read_json(f)

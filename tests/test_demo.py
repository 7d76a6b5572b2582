"""The embedded `demo` dataset: photos from installed packages, hand-written references, corpus."""

from __future__ import annotations

import json
import logging
import shutil
import socket
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import copy_sources
from r2m.datasets.base import resolve_image_path
from r2m.datasets.recipes import build_references, recipe
from r2m.params import DatasetEntry

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"

pytest.importorskip("skimage")
pytest.importorskip("sklearn")


def _norm(s: str) -> str:
    return " ".join("".join(ch if ch.isalnum() else " " for ch in s.lower()).split())


def _recipe():
    return recipe("demo").prepare


def _source_copy(tmp_path: Path) -> tuple[Path, dict]:
    """A copy of data/demo to edit, and its photos.yaml."""
    src = tmp_path / "src"
    copy_sources(ROOT, tmp_path / "checkout", ["data/demo"])
    shutil.copytree(tmp_path / "checkout/data/demo", src)
    return src, yaml.safe_load((src / "photos.yaml").read_text())


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("demo") / "prepared"
    out.mkdir()
    # no network: any connection attempt fails the test
    real = socket.socket.connect

    def refuse(*a, **k):
        raise AssertionError("the demo recipe tried to use the network")

    socket.socket.connect = refuse
    try:
        manifest = _recipe()(DatasetEntry(kind="demo"), out, logging.getLogger("test"))
        build_references(DatasetEntry(kind="demo"), out, out, logging.getLogger("test"))  # the references stage
    finally:
        socket.socket.connect = real
    return out, manifest


def test_prepared_folder(prepared):
    out, manifest = prepared
    images = pd.read_parquet(out / "images.parquet")
    test = images[images.split == "test"]
    train = images[images.split == "train"]
    photos = yaml.safe_load((DEMO / "photos.yaml").read_text())["photos"]
    # every photo of photos.yaml is a test image (no val split) with one flipped train copy; at least the 64
    # test images the statistics guide plans for (docs/guide/statistics.md: Table 2's claims at 3 seeds)
    assert list(test.image_id) == [p["id"] for p in photos] and len(photos) >= 64
    assert sorted(train.image_id) == sorted(f"{p['id']}_train" for p in photos)
    assert set(images.split) == {"test", "train"}
    assert manifest["n_images"]["test"] == len(test)
    for p in images.path:
        f = resolve_image_path(out, p)
        assert f.is_file() and f.stat().st_size > 1000, p
        assert f.resolve().is_relative_to(out.resolve())
    refs = json.loads((out / "references.json").read_text())
    assert {i["id"] for i in refs["images"]} == set(test.image_id)
    per_image = pd.Series([a["image_id"] for a in refs["annotations"]]).value_counts()
    assert (per_image == 5).all() and len(per_image) == len(test)
    assert (out / "corpus.txt").read_text() == (DEMO / "corpus.txt").read_text()


def test_train_copies_are_flipped_and_cropped(prepared):
    from PIL import Image, ImageOps

    out, _ = prepared
    with Image.open(out / "images" / "chelsea.png") as a, Image.open(out / "images" / "chelsea_train.jpg") as b:
        assert b.size[0] < a.size[0] and b.size[1] < a.size[1]
        w, h = a.size
        dx, dy = round(w * 0.04), round(h * 0.04)
        expect = ImageOps.mirror(a.convert("RGB")).crop((dx, dy, w - dx, h - dy))
        import numpy as np

        diff = np.abs(np.asarray(expect, dtype=float) - np.asarray(b.convert("RGB"), dtype=float)).mean()
        assert diff < 8  # JPEG noise only


def test_tampered_checksum_names_the_photo(tmp_path):
    from r2m.datasets.demo import ChecksumError

    src, doc = _source_copy(tmp_path)
    doc["photos"][1]["sha256"] = "0" * 64
    (src / "photos.yaml").write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    out.mkdir()
    entry = DatasetEntry(kind="demo", source_dir=str(src))
    with pytest.raises(ChecksumError, match=doc["photos"][1]["id"]):
        _recipe()(entry, out, logging.getLogger("test"))


def test_missing_package_is_a_clear_error(tmp_path):
    src, doc = _source_copy(tmp_path)
    doc["photos"][0]["package"] = "no_such_package_r2m"
    (src / "photos.yaml").write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(FileNotFoundError, match="not installed"):
        _recipe()(DatasetEntry(kind="demo", source_dir=str(src)), out, logging.getLogger("test"))


def test_photo_packages_are_read_not_imported(tmp_path, monkeypatch):
    """A photo package whose import would fail (as the pinned ones installed without their dependencies
    would) still gives its photo: the recipe finds the package's folder and never imports it."""
    import sys

    site = tmp_path / "site"
    pkg = site / "r2m_photo_pkg_that_cannot_import" / "data"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("raise ImportError('a dependency is missing')\n")
    src, doc = _source_copy(tmp_path)
    first = doc["photos"][0]
    from r2m.datasets.demo import read_photo

    (pkg / "photo.png").write_bytes(read_photo(first))
    first["package"], first["resource"] = "r2m_photo_pkg_that_cannot_import", "data/photo.png"
    doc["photos"] = [first]
    (src / "photos.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.syspath_prepend(str(site))
    out = tmp_path / "out"
    out.mkdir()
    _recipe()(DatasetEntry(kind="demo", source_dir=str(src)), out, logging.getLogger("test"))
    assert (out / "images" / f"{first['id']}.png").read_bytes() == (pkg / "photo.png").read_bytes()
    assert "r2m_photo_pkg_that_cannot_import" not in sys.modules


def test_resource_outside_its_package_is_refused(tmp_path):
    src, doc = _source_copy(tmp_path)
    doc["photos"][2]["resource"] = "../../" + doc["photos"][2]["resource"]
    (src / "photos.yaml").write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match=f"{doc['photos'][2]['id']}.*inside package"):
        _recipe()(DatasetEntry(kind="demo", source_dir=str(src)), out, logging.getLogger("test"))


def test_every_photo_says_where_it_comes_from():
    """Each record names its package, resource, sha256, licence, description and concepts; ids and files
    are unique (no photo twice under two names)."""
    photos = yaml.safe_load((DEMO / "photos.yaml").read_text())["photos"]
    for p in photos:
        for key in ("package", "resource", "sha256", "licence", "description"):
            assert isinstance(p.get(key), str) and p[key].strip(), (p["id"], key)
        assert len(p["sha256"]) == 64 and int(p["sha256"], 16) >= 0, p["id"]
        assert p["concepts"] and all(isinstance(c, str) and c for c in p["concepts"]), p["id"]
    assert len({p["id"] for p in photos}) == len(photos)
    assert len({(p["package"], p["resource"]) for p in photos}) == len(photos)
    assert len({p["sha256"] for p in photos}) == len(photos)


def test_references_are_five_own_sentences_per_photo():
    photos = yaml.safe_load((DEMO / "photos.yaml").read_text())["photos"]
    refs = json.loads((DEMO / "references.json").read_text())
    assert set(refs) == {p["id"] for p in photos}
    for pid, caps in refs.items():
        assert len(caps) == 5 and len(set(caps)) == 5, pid
        for c in caps:
            assert 8 <= len(c.split()) <= 15, c


def test_corpus_is_disjoint_from_references_and_covers_concepts():
    lines = (DEMO / "corpus.txt").read_text(encoding="utf-8").splitlines()
    assert 6000 <= len(lines) <= 10000
    assert (DEMO / "corpus.txt").stat().st_size < 1_000_000
    assert len(set(lines)) == len(lines)
    assert all(6 <= len(s.split()) <= 16 for s in lines)
    refs = json.loads((DEMO / "references.json").read_text())
    ref_set = {_norm(c) for caps in refs.values() for c in caps}
    assert not ref_set & {_norm(s) for s in lines}

    words = {w for s in lines for w in s.split()}

    def forms(c: str) -> set[str]:
        return {c, c + "s", c + "es", c[:-1] + "ies", c[:-1] + "ves"}

    photos = yaml.safe_load((DEMO / "photos.yaml").read_text())["photos"]
    for p in photos:
        missing = [c for c in p["concepts"] if not forms(c) & words]
        assert not missing, f"corpus lacks concepts {missing} of photo {p['id']}"


def test_corpus_generator_does_not_read_the_references(tmp_path):
    """The generator alone in a checkout without references.json gives the committed corpus byte for byte:
    the corpus cannot depend on the reference captions."""
    import subprocess
    import sys

    script = tmp_path / "scripts" / "make_demo_corpus.py"
    script.parent.mkdir()
    shutil.copy2(ROOT / "scripts" / "make_demo_corpus.py", script)
    (tmp_path / "data" / "demo").mkdir(parents=True)
    r = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "corpus.txt")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "data" / "demo" / "references.json").exists()
    assert (tmp_path / "corpus.txt").read_bytes() == (DEMO / "corpus.txt").read_bytes()


def test_corpus_generator_is_reproducible():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_demo_corpus.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr

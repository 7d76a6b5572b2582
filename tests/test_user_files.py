"""Never destroy a user's files; trust nothing a model folder says (probes 1, 3, 4 and the
item-7 parts: batch size, disk full, encodings, ambiguous ids, ``r2m caption --help``).

Each test states what happened before the fix (run against the code before it: every one of them
failed there) and checks the behaviour after it: refused in one line naming the folder / file / key,
and the user's bytes unchanged (compared by SHA-256 with a copy taken before). In-process on tiny
fixtures; the tiny trained model and photos come from :mod:`test_caption_own_images`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from test_caption_own_images import checkpoint, photo_folder  # noqa: F401  (module fixtures: a tiny model, photos)
from test_hostile_inputs import cli, digest_tree, one_line


def _photo(path: Path, colour: tuple[int, int, int]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (48, 40), colour).save(path)
    return path


# --------------------------------------------------------------------------- probe 1: the gallery
def test_gallery_onto_the_folder_holding_the_photos_is_refused(checkpoint, tmp_path, capsys):  # noqa: F811
    """Probe 1 as the issue gives it: ``r2m caption proj/images --html proj``. Before: ``proj`` held
    only ``images/`` (a "gallery" by its names) and was replaced whole: ``proj/images`` then held
    ``0000.jpg 0001.jpg`` and the photos were gone. After: refused before anything is captioned."""
    proj = tmp_path / "proj"
    _photo(proj / "images/IMG_0001.jpg", (200, 30, 30))
    _photo(proj / "images/IMG_0002.jpg", (30, 200, 30))
    before = digest_tree(proj)
    assert cli("caption", proj / "images", "--model", checkpoint, "--html", proj) == 2
    one_line(capsys.readouterr().err, "--html", str(proj), "IMG_0001.jpg")
    assert digest_tree(proj) == before  # the photos, byte for byte, and nothing added


def test_gallery_onto_a_users_own_index_html_is_refused(checkpoint, photo_folder, tmp_path, capsys):  # noqa: F811
    """Probe 1, second half: ``site/`` holding only the user's own ``index.html``. Before: overwritten
    (the name made it a gallery). After: a folder r2m did not make is never replaced."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<h1>my home page</h1>\n")
    before = digest_tree(site)
    assert cli("caption", photo_folder / "chelsea.png", "--model", checkpoint, "--html", site) == 2
    one_line(capsys.readouterr().err, "--html", str(site))
    assert digest_tree(site) == before


def test_gallery_r2m_wrote_is_rewritten_but_not_once_the_user_changed_it(checkpoint, photo_folder, tmp_path,  # noqa: F811
                                                                         capsys):
    """r2m's own gallery is replaced by the next run; once the user adds a file to it or edits its
    page it is theirs, and refused (before: both were replaced, the added file deleted)."""
    out = tmp_path / "gallery"
    assert cli("caption", photo_folder / "chelsea.png", "--model", checkpoint, "--html", out) == 0
    assert cli("caption", photo_folder / "coffee.jpg", "--model", checkpoint, "--html", out) == 0
    assert "coffee.jpg" in (out / "index.html").read_text()  # the second run's page replaced the first
    capsys.readouterr()

    (out / "images" / "notes.txt").write_text("my notes\n")
    before = digest_tree(out)
    assert cli("caption", photo_folder / "chelsea.png", "--model", checkpoint, "--html", out) == 2
    one_line(capsys.readouterr().err, "--html", "images/notes.txt")
    assert digest_tree(out) == before

    (out / "images" / "notes.txt").unlink()
    with open(out / "index.html", "a", encoding="utf-8") as fh:
        fh.write("<!-- my edit -->\n")
    before = digest_tree(out)
    assert cli("caption", photo_folder / "chelsea.png", "--model", checkpoint, "--html", out) == 2
    one_line(capsys.readouterr().err, "--html", "index.html", "changed")
    assert digest_tree(out) == before


# --------------------------------------------------------------------------- probe 1, generalised
def _user_folder(path: Path) -> dict[str, str]:
    (path / "sub").mkdir(parents=True)
    (path / "thesis.tex").write_text("precious\n")
    (path / "sub" / "data.csv").write_text("1,2\n")
    return digest_tree(path)


def test_atomic_folder_write_never_replaces_a_folder_r2m_did_not_make(tmp_path):
    """Every stage writes its output folders through ``atomic_path``. Before: an existing folder at the
    target was deleted whatever it held. After: refused (one line naming it) before the work."""
    from r2m.utils.io import atomic_path

    target = tmp_path / "out"
    before = _user_folder(target)
    ran = []
    with pytest.raises(ValueError) as err:
        with atomic_path(target) as tmp:
            ran.append(1)
            tmp.mkdir()
    assert ran == [] and str(target) in str(err.value) and "\n" not in str(err.value)
    assert digest_tree(target) == before


def test_atomic_folder_write_keeps_its_output_when_the_target_appears_meanwhile(tmp_path):
    """A user folder that appears at the target while the stage works is not replaced either, and
    the finished output is not lost: it stays in the temporary folder the error names."""
    from r2m.utils.io import atomic_path

    target = tmp_path / "out"
    with pytest.raises(ValueError) as err:
        with atomic_path(target) as tmp:
            tmp.mkdir()
            (tmp / "result.txt").write_text("computed\n")
            before = _user_folder(target)
    assert digest_tree(target) == before
    kept = Path(str(err.value).rsplit("kept in ", 1)[1])
    assert (kept / "result.txt").read_text() == "computed\n"


def test_r2m_replaces_its_own_and_empty_folders(tmp_path):
    """The other side of the rule: an empty folder and a folder r2m wrote (unchanged) are replaced."""
    from r2m.utils.io import atomic_path

    target = tmp_path / "out"
    target.mkdir()
    for text in ("one", "two"):
        with atomic_path(target) as tmp:
            tmp.mkdir()
            (tmp / "a.txt").write_text(text)
        assert (target / "a.txt").read_text() == text
    (target / ".snakemake_timestamp").write_text("")  # Snakemake touches this in a folder output: still r2m's
    with atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "a.txt").write_text("three")
    (target / "a.txt").write_text("edited by hand")  # now the user's: refused
    with pytest.raises(ValueError, match="a.txt changed"):
        with atomic_path(target) as tmp:
            tmp.mkdir()


def test_stage_outputs_of_an_older_r2m_are_adopted_user_folders_are_not(tmp_path):
    """A workspace made before the marker: its stage output folders (each holds the ``params.yaml``
    every stage writes) are adopted when the stage runs again, so DVC's ``persist`` outputs, which
    r2m replaces itself, keep working; a folder without that file is not adopted, and stays refused."""
    from r2m.utils.io import atomic_path
    from r2m.utils.owner import adopt_stage_outputs

    old = tmp_path / "models/demo/r2m/s0/train_xe"
    old.mkdir(parents=True)
    for name in ("model.pt", "params.yaml", "inference.json"):
        (old / name).write_text(name)
    user = tmp_path / "mine"
    before = _user_folder(user)
    assert adopt_stage_outputs([old, user, tmp_path / "absent"]) == [old]
    with atomic_path(old) as tmp:
        tmp.mkdir()
        (tmp / "model.pt").write_text("new")
    assert (old / "model.pt").read_text() == "new" and not (old / "params.yaml").exists()
    with pytest.raises(ValueError, match="mine"):
        with atomic_path(user) as tmp:
            tmp.mkdir()
    assert digest_tree(user) == before


def test_shard_parts_dir_and_model_folder_reset_refuse_a_user_folder(tmp_path):
    """Two more commands that replace or empty a folder: ``r2m extract_features --parts-dir DIR``
    (publishes a shard's parts by replacing DIR whole) and the supervised trainers' model folder
    (written whole, replacing the folder). Before: both deleted DIR's contents. After: refused, DIR unchanged."""
    from r2m.utils.io import atomic_path
    from r2m.vision.feature_store import publish_parts

    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "config.json").write_text("{}")
    (parts / "shard-00000.h5").write_bytes(b"h5")
    user = tmp_path / "Documents"
    before = _user_folder(user)
    with pytest.raises(ValueError, match="Documents"):
        publish_parts(parts, user, [])
    with pytest.raises(ValueError, match="Documents"), atomic_path(user, kind="stage:train_sup"):
        pass  # the trainers write their model folder whole: refused before the work
    assert digest_tree(user) == before


# --------------------------------------------------------------------------- probe 3: folder datasets
def test_folder_dataset_listing_and_inputs_digest_follow_one_rule(tmp_path):
    """Probe 3. Before: ``prepare`` listed hidden files (``rglob``) while the ``inputs`` digest skipped
    them (and digested ``notes.txt``, which is no image), so adding ``images/.new.png`` reran nothing
    though a re-prepare would include it. After: one rule (README, "Bring your own dataset"): hidden
    entries skipped, extensions in any case, links to files followed, linked folders and broken
    links not. The expected list is the rule applied by hand to this folder."""
    from r2m.datasets.folder import list_images
    from r2m.datasets.inputs import declared_inputs
    from r2m.params import DatasetEntry
    from r2m.utils.digest import digest_files, expand

    images = tmp_path / "images"
    for rel in ("a.png", "B.JPG", "sub/c.jpeg", ".new.png", ".cache/d.png", "._e.jpg"):
        _photo(images / rel, (10, 20, 30))
    (images / "notes.txt").write_text("not an image\n")
    outside = _photo(tmp_path / "elsewhere/f.png", (1, 2, 3))
    (images / "link.png").symlink_to(outside)
    (images / "linkdir").symlink_to(outside.parent, target_is_directory=True)
    (images / "broken.png").symlink_to(tmp_path / "missing.png")
    (tmp_path / "corpus.txt").write_text("a dog\n")
    entry = DatasetEntry(kind="folder", images=str(images), corpus=str(tmp_path / "corpus.txt"))

    expected = ["B.JPG", "a.png", "link.png", "sub/c.jpeg"]
    listed = [p.as_posix() for p in list_images(images)]
    digested = [Path(p).relative_to(images).as_posix() for p in expand(declared_inputs(entry))
                if images in Path(p).parents]
    assert listed == expected
    assert digested == expected
    before = digest_files(expand(declared_inputs(entry)))
    _photo(images / ".new2.png", (5, 5, 5))  # hidden: in neither
    assert digest_files(expand(declared_inputs(entry))) == before and [p.as_posix() for p in list_images(images)] == expected
    _photo(images / "g.PNG", (5, 5, 5))  # visible: in both, so the inputs digest changes (prepare reruns)
    assert "g.PNG" in [p.as_posix() for p in list_images(images)]
    assert digest_files(expand(declared_inputs(entry))) != before


def test_a_photo_folder_means_the_same_files_to_caption_and_to_a_folder_dataset(tmp_path):
    """``r2m caption FOLDER`` and a ``folder`` dataset take the same files of a folder as photos. Before,
    each had its own list of suffixes: a ``.ppm`` or ``.pgm`` photo was captioned but left out of the
    dataset. Expected by hand: the five photos (PPM and PGM written by PIL, which opens every kind
    listed), not the text file or the PDF."""
    from r2m.caption_cli import expand as caption_expand
    from r2m.datasets.folder import list_images
    from r2m.vision.images import load_image

    images = tmp_path / "photos"
    for name in ("a.ppm", "c.jpg", "d.webp", "e.tiff"):
        _photo(images / name, (120, 80, 40))
    Image.new("L", (48, 40), 90).save(images / "b.PGM", format="PPM")  # PIL writes mode L as a PGM (P5)
    (images / "notes.txt").write_text("not an image\n")
    (images / "scan.pdf").write_bytes(b"%PDF-1.4\n")
    expected = ["a.ppm", "b.PGM", "c.jpg", "d.webp", "e.tiff"]
    captioned, missing = caption_expand([str(images)])
    assert [p.name for p in captioned] == expected and missing == []
    assert [p.as_posix() for p in list_images(images)] == expected
    assert [(im.mode, im.size) for im in map(load_image, (images / n for n in expected))] == [("RGB", (48, 40))] * 5


# --------------------------------------------------------------------------- probe 4: inference.json
EVIL_SETTINGS = {
    "tf_oid_remote_source": ({"detect_concepts": {"backend": "tf_oid", "options": {
        "source": "http://127.0.0.1:9/evil.tar.gz"}}}, "detect_concepts.options.source"),
    "tf_oid_savedmodel": ({"detect_concepts": {"backend": "tf_oid", "options": {"model": "evil/saved_model"}}},
                          "detect_concepts.options.model"),
    "unknown_backend": ({"detect_concepts": {"backend": "evil_backend", "options": {}}},
                        "detect_concepts.backend"),
    "owl_download": ({"detect_concepts": {"backend": "owl", "options": {"allow_download": True}}},
                     "detect_concepts.options.allow_download"),
    "offline_part": ({"detect_concepts": {"backend": "offline", "options": {"parts": ["regions", "evil"]}}},
                     "detect_concepts.options.evil.backend"),
    "cache_dir": ({"detect_concepts": {"backend": "tf_oid", "options": {"cache_dir": "/home"}}},
                  "detect_concepts.options.cache_dir"),
    "torchscript_features": ({"extract_features": {"backend": "inception_v3_fid", "options": {"weights": "evil.pt"}}},
                             "extract_features.options.weights"),
    "url_in_kinds_from": ({"extract_features": {"backend": "random_cnn", "options": {"kinds_from": {
        "grid": {"backend": "vgg19", "options": {"weights": "https://example.invalid/vgg.pth"}}}}}},
        "extract_features.options.kinds_from.grid.options.weights"),
}


@pytest.mark.parametrize("case", sorted(EVIL_SETTINGS))
def test_model_folder_names_no_code_or_download(case, checkpoint, photo_folder, tmp_path, capsys,  # noqa: F811
                                                monkeypatch):
    """Probe 4. Before: a model folder's ``inference.json`` could name a detector backend with a remote
    ``source`` (``r2m caption img.jpg --model evil`` set off to download it and would load it as a
    TensorFlow SavedModel), a SavedModel or TorchScript file to load, a download switch, or a name
    no registry has (a ``KeyError`` traceback). After: it may only select this project's backends
    and catalog sources; anything else is refused in one line naming the file and the key, before
    any detector is built or any connection is made."""
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    evil = tmp_path / "evil"
    shutil.copytree(checkpoint, evil)
    info = json.loads((evil / "inference.json").read_text())
    settings, key = EVIL_SETTINGS[case]
    for section, value in settings.items():
        info[section] = {**info.get(section, {}), **value}
    (evil / "inference.json").write_text(json.dumps(info))
    assert cli("caption", photo_folder / "chelsea.png", "--model", evil) != 0
    one_line(capsys.readouterr().err, str(evil / "inference.json"), key)


def test_model_folder_may_select_catalog_sources_and_plain_options(checkpoint, tmp_path, monkeypatch):  # noqa: F811
    """The rule selects, it does not forbid backends: the catalog's own ``source: zoo`` (its archive
    already in r2m's cache: no download) and plain values (thresholds, ``allow_download: false``) pass
    the check."""
    from r2m.captioning.settings import vet

    monkeypatch.setenv("R2M_CACHE", str(tmp_path))
    (tmp_path / "detectors").mkdir()
    (tmp_path / "detectors" / "faster_rcnn_inception_resnet_v2_atrous_oid_v4_2018_12_12.tar.gz").write_bytes(b"x")
    info = json.loads((checkpoint / "inference.json").read_text())
    info["detect_concepts"] = {"backend": "tf_oid", "options": {"source": "zoo", "floor": 0.1}}
    assert vet(info, checkpoint / "inference.json") is info
    info["detect_concepts"] = {"backend": "owl", "options": {"allow_download": False, "labels": ["cat"]}}
    assert vet(info, checkpoint / "inference.json") is info


# --------------------------------------------------------------------------- item 7
@pytest.mark.parametrize("value", [10**12, 1e12])
def test_absurd_batch_size_refused_by_params_validation(value):
    """Item 7: ``train_xe.batch_size: 1e12``. Before: accepted; the stage trained with the batch
    clamped to the corpus while its log said 1e12. After: refused up front, naming the key."""
    import yaml

    from r2m import params as P

    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    raw["train_xe"]["batch_size"] = value
    with pytest.raises(P.ParamsError) as err:
        P.validate(raw)
    assert "train_xe.batch_size" in str(err.value) and "\n" not in str(err.value).strip()


def test_training_log_says_the_batch_it_draws(tmp_path, caplog):
    """Item 7: a batch_size larger than the corpus (but not absurd) is clamped by the batcher; the log
    now says the batch drawn and why. The expected row count is read from the encoded corpus here."""
    import logging

    import pandas as pd
    import torch

    from test_training import make_params, make_synthetic, run_stage

    torch.set_num_threads(1)
    make_synthetic(tmp_path)
    rows = int((pd.read_parquet(tmp_path / "data/syn/vocab/encoded.parquet")["split"] == "train").sum())
    with caplog.at_level(logging.INFO, logger="r2m"):
        run_stage(tmp_path, "train_xe", make_params(train_xe={"steps": 2, "batch_size": 100_000}))
    line = next(r.getMessage() for r in caplog.records if "parameters" in r.getMessage())
    assert f"2 steps x batch {rows} (train_xe.batch_size 100000 > the {rows} training rows)" in line, line


def test_checkpoint_on_a_full_disk_names_the_file(tmp_path):
    """Item 7: a checkpoint written to a full disk. Before: ``RuntimeError: [enforce fail at
    inline_container.cc:672] . unexpected pos …`` (no file, no reason). After: an ``OSError`` with the
    disk-full errno naming the checkpoint, which ``r2m`` prints as one "disk full writing FILE" line;
    the older checkpoint is kept. The full disk is a file-size limit (``ulimit -f``: EFBIG, the same
    short write as ENOSPC), set in this process only around the save."""
    import resource
    import signal

    import torch

    from r2m.utils.checkpoint import save_torch
    from r2m.utils.guard import disk_full_message, is_disk_full

    target = tmp_path / "model.pt"
    save_torch(target, {"w": torch.zeros(4)})
    old_bytes = target.read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        with pytest.raises(OSError) as err:
            save_torch(target, {"w": torch.zeros(100_000)})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert is_disk_full(err.value) and err.value.errno in (errno.EFBIG, errno.ENOSPC)
    msg = disk_full_message(err.value)
    assert str(target) in msg and "disk full" in msg and "\n" not in msg
    assert target.read_bytes() == old_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]  # no temporary litter
    assert os.strerror(errno.ENOSPC) == "No space left on device"  # what the line says on a real full disk


def test_latin1_references_name_the_file_byte_and_offset(tmp_path):
    """Item 7: references saved as latin-1. Before: ``'utf-8' codec can't decode byte 0xe9 in position
    …`` without the file's name. After: one line naming the file, the byte and its offset (found here
    by searching the bytes)."""
    from r2m.utils.coco import read_coco_captions

    refs = tmp_path / "references.json"
    data = json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}],
                       "annotations": [{"id": 1, "image_id": 1, "caption": "un café au lait"}]},
                      ensure_ascii=False).encode("latin-1")
    refs.write_bytes(data)
    with pytest.raises(ValueError) as err:
        read_coco_captions(refs)
    msg, offset = str(err.value), data.index(b"\xe9")
    assert str(refs) in msg and "not UTF-8" in msg and "0xe9" in msg and f"offset {offset}" in msg
    assert "\n" not in msg


def test_image_ids_7_and_string_7_are_one_ambiguous_id(tmp_path):
    """Item 7: references giving one image id 7 and another "7". Before: the folder recipe said the
    id was "used by both … (ids are file stems)", blaming the file names. After: one line naming the
    references file and both records."""
    from r2m.datasets.folder import folder
    from r2m.params import DatasetEntry
    from test_datasets import LOG

    images = tmp_path / "photos"
    _photo(images / "a.png", (1, 1, 1))
    _photo(images / "b.png", (2, 2, 2))
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"images": [{"id": 7, "file_name": "a.png"}, {"id": "7", "file_name": "b.png"}],
                                "annotations": [{"id": 1, "image_id": 7, "caption": "a dark square"}]}))
    (tmp_path / "corpus.txt").write_text("a dog\n")
    entry = DatasetEntry(kind="folder", images=str(images), references=str(refs), corpus=str(tmp_path / "corpus.txt"))
    with pytest.raises(ValueError) as err:
        folder(entry, tmp_path / "out", LOG)
    msg = str(err.value)
    assert str(refs) in msg and "images[1]" in msg and "images[0]" in msg and "'7'" in msg and " 7" in msg
    assert "stem" not in msg and "\n" not in msg


def test_caption_help_documents_both_forms(capsys):
    """Item 7: ``r2m caption --help``. Before: only the stage form (``--dataset/--variant/--ckpt``),
    without IMAGES, ``--model`` or ``--html``. After: both forms and their options."""
    assert cli("caption", "--help") == 0
    out = capsys.readouterr().out
    for word in ("IMAGES", "--model", "--html", "--json", "--no-concepts", "--dataset", "--variant", "--ckpt"):
        assert word in out, word


def test_recorded_backend_that_cannot_load_here_is_one_line(checkpoint, photo_folder, tmp_path, capsys,  # noqa: F811
                                                            monkeypatch):
    """Probe 4's "the failure is a full traceback", for a model folder that passes the check: its
    recorded ``owl`` detector whose model is not on this machine (no download allowed). Before: a
    ``RuntimeError`` traceback. After: one line naming the model folder and the reason."""
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tmp_path / "owl_model"
    shutil.copytree(checkpoint, model)
    info = json.loads((model / "inference.json").read_text())
    info["detect_concepts"] = {"backend": "owl", "options": {}, "batch_size": 2, "min_side": 8}
    (model / "inference.json").write_text(json.dumps(info))
    assert cli("caption", photo_folder / "chelsea.png", "--model", model) == 1
    one_line(capsys.readouterr().err, f"--model {model}", "owl")

"""Dataset recipes: tiny (synthetic), folder (bring your own), paper benchmarks (converters on
format-faithful fixtures, downloads mocked, checksum errors)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from r2m.datasets import benchmarks as B
from r2m.datasets.base import resolve_image_path
from r2m.datasets.folder import folder
from r2m.datasets.recipes import build_references
from r2m.datasets.tiny import OBJECTS, tiny
from r2m.params import DatasetEntry
from r2m.text.dictionary import load_dictionary
from r2m.text.tokenize import tokenize

LOG = logging.getLogger("test")


def _tiny(out: Path, seed: int = 0, n_sentences: int = 300) -> dict:
    entry = DatasetEntry(kind="tiny", seed=seed, n_train_images=6, n_val_images=3, n_test_images=4,
                         n_sentences=n_sentences, image_size=64)
    manifest = tiny(entry, out, LOG)
    build_references(entry, out, out, LOG)  # the references stage's files beside the prepared ones
    return manifest


# --------------------------------------------------------------------------- tiny
def test_tiny_deterministic_by_seed(tmp_path):
    _tiny(tmp_path / "a")
    _tiny(tmp_path / "b")
    _tiny(tmp_path / "c", seed=1)
    for name in ("corpus.txt", "references.json", "detections.jsonl", "images/tiny000003.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert pd.read_parquet(tmp_path / "a/images.parquet").equals(pd.read_parquet(tmp_path / "b/images.parquet"))
    assert (tmp_path / "a/corpus.txt").read_text() != (tmp_path / "c/corpus.txt").read_text()
    assert (tmp_path / "a/detections.jsonl").read_text() != (tmp_path / "c/detections.jsonl").read_text()


def test_tiny_contents(tmp_path):
    m = _tiny(tmp_path, n_sentences=500)
    assert m["n_images"] == {"train": 6, "val": 3, "test": 4} and m["n_sentences"] == 500
    images = pd.read_parquet(tmp_path / "images.parquet")
    assert list(images.columns[:3]) == ["image_id", "path", "split"]
    for path in images["path"]:
        p = resolve_image_path(tmp_path, path)
        assert p.exists() and Image.open(p).size == (64, 64)

    refs = json.loads((tmp_path / "references.json").read_text())
    per_image = pd.Series([a["image_id"] for a in refs["annotations"]]).value_counts()
    eval_ids = set(images.loc[images["split"] != "train", "image_id"])
    assert set(per_image.index) == eval_ids and (per_image == 5).all()
    assert {i["id"] for i in refs["images"]} == eval_ids

    corpus = (tmp_path / "corpus.txt").read_text().splitlines()
    assert len(corpus) == 500
    assert not set(corpus) & {a["caption"] for a in refs["annotations"]}  # disjoint from the references
    d = load_dictionary("openimages")
    words = {o.word for o in OBJECTS}
    for s in corpus[:200]:
        concepts = set(d.sentence_concepts(tokenize(s)))
        assert concepts and concepts <= words, s

    dets = [json.loads(line) for line in (tmp_path / "detections.jsonl").read_text().splitlines()]
    assert {"image_id", "label", "score", "box"} <= set(dets[0])
    truth = dict(zip(images["image_id"], images["concepts"], strict=True))
    for image_id, gt in truth.items():
        found = {d.label_to_concept(x["label"]) for x in dets if x["image_id"] == image_id and x["score"] >= 0.3}
        assert found == set(gt.split())
    # references mention the image's concepts
    for a in refs["annotations"][:20]:
        assert set(d.sentence_concepts(tokenize(a["caption"]))) == set(truth[a["image_id"]].split())


def test_tiny_through_prepare_stage(tmp_path):
    """Paths stay valid after the prepare stage renames its temporary folder into place."""
    from r2m import params as P
    from r2m.datasets.stage import run
    from r2m.stage.context import StageContext
    from r2m.stage.registry import get

    raw = {"datasets": ["t"], "catalog": {"t": {"kind": "tiny", "n_train_images": 2, "n_val_images": 1,
                                                "n_test_images": 1, "n_sentences": 10, "image_size": 48}}}
    ctx = StageContext(stage=get("prepare"), params=P.validate(raw), dataset="t", root=tmp_path, log=LOG)
    run(ctx)
    prepared = tmp_path / "data/t/prepared"
    images = pd.read_parquet(prepared / "images.parquet")
    assert len(images) == 4
    assert all(resolve_image_path(prepared, p).exists() for p in images["path"])
    assert (prepared / "params.yaml").exists()


def test_tiny_rejects_bad_option(tmp_path):
    with pytest.raises(ValueError, match="n_sentences"):
        tiny(DatasetEntry(kind="tiny", n_sentences=-1), tmp_path, LOG)


# --------------------------------------------------------------------------- folder
def _png(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (40, 40), (10, 20, 30)).save(path)


def test_folder_recipe(tmp_path):
    imgs = tmp_path / "photos"
    for name in ("a.png", "b.jpg", "sub/c.png", "d.png"):
        _png(imgs / name)
    (imgs / "notes.txt").write_text("not an image")
    refs = {"images": [{"id": 7, "file_name": "b.jpg"}, {"id": 9, "file_name": "sub/c.png"}],
            "annotations": [{"id": 1, "image_id": 7, "caption": "a dark square"},
                            {"id": 2, "image_id": 9, "caption": "another dark square"}]}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "corpus.txt").write_text("a dog on the grass\n\na cat\n")
    entry = DatasetEntry(kind="folder", images=str(imgs), references=str(tmp_path / "refs.json"),
                         corpus=str(tmp_path / "corpus.txt"))
    out = tmp_path / "out"
    m = folder(entry, out, LOG)
    build_references(entry, out, out, LOG)
    df = pd.read_parquet(out / "images.parquet").set_index("image_id")
    assert sorted(df.index) == ["7", "9", "a", "d"]
    assert df.loc["7", "split"] == "test" and df.loc["a", "split"] == "train"
    assert Path(df.loc["9", "path"]) == imgs / "sub/c.png"
    got = json.loads((out / "references.json").read_text())
    assert {(a["image_id"], a["caption"]) for a in got["annotations"]} == {("7", "a dark square"),
                                                                           ("9", "another dark square")}
    assert (out / "corpus.txt").read_text().splitlines() == ["a dog on the grass", "a cat"]
    assert m["n_sentences"] == 2

    # val_fraction moves some referenced images to val, deterministically
    many = DatasetEntry(kind="folder", images=str(imgs), references=str(tmp_path / "refs.json"),
                        corpus=str(tmp_path / "corpus.txt"), val_fraction=0.99)
    folder(many, tmp_path / "out2", LOG)
    assert set(pd.read_parquet(tmp_path / "out2/images.parquet")["split"]) >= {"val"}


def test_folder_errors(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "corpus.txt").write_text("a dog\n")
    with pytest.raises(ValueError, match="'images'"):
        folder(DatasetEntry(kind="folder", corpus=str(tmp_path / "corpus.txt")), tmp_path / "o", LOG)
    with pytest.raises(FileNotFoundError, match="corpus: .*nope.txt does not exist"):
        folder(DatasetEntry(kind="folder", images=str(tmp_path / "photos"), corpus=str(tmp_path / "nope.txt")),
               tmp_path / "o", LOG)
    with pytest.raises(FileNotFoundError, match="no image files"):
        folder(DatasetEntry(kind="folder", images=str(tmp_path / "photos"), corpus=str(tmp_path / "corpus.txt")),
               tmp_path / "o", LOG)
    _png(tmp_path / "photos/a.png")
    (tmp_path / "refs.json").write_text(json.dumps({"images": [{"id": 1, "file_name": "zzz.png"}],
                                                    "annotations": []}))
    with pytest.raises(FileNotFoundError, match="refs.json: image '1': file_name 'zzz.png' not found"):
        folder(DatasetEntry(kind="folder", images=str(tmp_path / "photos"), corpus=str(tmp_path / "corpus.txt"),
                            references=str(tmp_path / "refs.json")), tmp_path / "o", LOG)
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xff\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: not valid UTF-8"):
        folder(DatasetEntry(kind="folder", images=str(tmp_path / "photos"), corpus=str(tmp_path / "bad.txt")),
               tmp_path / "o", LOG)


# --------------------------------------------------------------------------- benchmarks: fixtures
def _sent(raw: str, imgid: int, sentid: int) -> dict:
    return {"tokens": tokenize(raw), "raw": raw, "imgid": imgid, "sentid": sentid}


def karpathy_coco() -> dict:
    imgs = []
    for i, (cocoid, folder_, split) in enumerate([(391895, "val2014", "test"), (522418, "val2014", "val"),
                                                  (184613, "train2014", "train"), (318219, "val2014", "restval")]):
        sents = [_sent(f"A man riding a bike number {k}. ", i, 5 * i + k) for k in range(5)]
        prefix = "COCO_val2014_" if folder_ == "val2014" else "COCO_train2014_"
        imgs.append({"filepath": folder_, "sentids": [s["sentid"] for s in sents],
                     "filename": f"{prefix}{cocoid:012d}.jpg", "imgid": i, "split": split,
                     "sentences": sents, "cocoid": cocoid})
    return {"images": imgs, "dataset": "coco"}


def karpathy_flickr() -> dict:
    imgs = []
    for i, (stem, split) in enumerate([("1000092795", "train"), ("1007129816", "test"), ("1009434119", "val")]):
        sents = [_sent(f"Two young guys with shaggy hair {k} .", i, 5 * i + k) for k in range(5)]
        imgs.append({"sentids": [s["sentid"] for s in sents], "imgid": i, "sentences": sents,
                     "split": split, "filename": f"{stem}.jpg"})
    return {"images": imgs, "dataset": "flickr30k"}


def coco_captions() -> dict:
    return {"info": {"description": "COCO 2014 Dataset"}, "licenses": [{"id": 1, "name": "x", "url": "y"}],
            "images": [{"license": 5, "file_name": "COCO_train2014_000000057870.jpg", "height": 480,
                        "width": 640, "id": 57870}],
            "annotations": [{"image_id": 57870, "id": 1, "caption": "A restaurant has modern wooden tables and chairs."},
                            {"image_id": 57870, "id": 2, "caption": "A long restaurant table with\nrattan chairs"}]}


GCC = ("a very typical bus station\thttp://lh6.ggpht.com/x.jpg\n"
       "sierra looked stunning in this top and this skirt\thttp://example.com/y.jpg\n"
       "actor attends the premiere of the film\thttp://example.com/z.jpg\n"
       "a dog runs across a field with two frisbees\thttp://example.com/w.jpg\n")


@pytest.fixture
def raw(tmp_path) -> Path:
    r = tmp_path / "raw"
    (r / "karpathy").mkdir(parents=True)
    (r / "karpathy/dataset_coco.json").write_text(json.dumps(karpathy_coco()))
    (r / "karpathy/dataset_flickr30k.json").write_text(json.dumps(karpathy_flickr()))
    for f in ("coco/train2014", "coco/val2014", "flickr30k/flickr30k-images", "coco/annotations",
              "shutterstock", "gcc"):
        (r / f).mkdir(parents=True, exist_ok=True)
    (r / "coco/annotations/captions_train2014.json").write_text(json.dumps(coco_captions()))
    (r / "shutterstock/sentences.txt").write_text("a dog sitting on a sofa\n\nfresh apples on a table\n")
    (r / "gcc/Train_GCC-training.tsv").write_text(GCC)
    return r


def _bench(name: str, raw: Path, out: Path, **extra) -> dict:
    entry = DatasetEntry(kind=name, raw_dir=str(raw), **extra)
    manifest = B.prepare_benchmark(name, entry, out, LOG, fetcher=None)
    build_references(entry, out, out, LOG)
    return manifest


# --------------------------------------------------------------------------- benchmarks: converters
def test_coco_shutterstock(raw, tmp_path):
    m = _bench("coco_shutterstock", raw, tmp_path / "out")
    df = pd.read_parquet(tmp_path / "out/images.parquet").set_index("image_id")
    assert df.loc["391895", "split"] == "test" and df.loc["522418", "split"] == "val"
    assert df.loc["318219", "split"] == "train"  # restval -> train
    assert Path(df.loc["184613", "path"]) == raw / "coco/train2014/COCO_train2014_000000184613.jpg"
    refs = json.loads((tmp_path / "out/references.json").read_text())
    assert {i["id"] for i in refs["images"]} == {"391895", "522418"}
    assert len(refs["annotations"]) == 10 and refs["annotations"][0]["caption"] == "A man riding a bike number 0."
    assert (tmp_path / "out/corpus.txt").read_text().splitlines() == ["a dog sitting on a sofa", "fresh apples on a table"]
    assert m["sources"]["karpathy_coco"]["checked"] == "present"


def test_flickr30k_coco(raw, tmp_path):
    _bench("flickr30k_coco", raw, tmp_path / "out")
    df = pd.read_parquet(tmp_path / "out/images.parquet").set_index("image_id")
    assert list(df.index) == ["1000092795", "1007129816", "1009434119"]
    assert Path(df.loc["1007129816", "path"]) == raw / "flickr30k/flickr30k-images/1007129816.jpg"
    assert (tmp_path / "out/corpus.txt").read_text().splitlines() == [
        "A restaurant has modern wooden tables and chairs.", "A long restaurant table with rattan chairs"]


def test_coco_gcc_keeps_sentences_with_coco_classes(raw, tmp_path):
    _bench("coco_gcc", raw, tmp_path / "out")
    assert (tmp_path / "out/corpus.txt").read_text().splitlines() == [
        "a very typical bus station", "a dog runs across a field with two frisbees"]
    (raw / "gcc/Train_GCC-training.tsv").write_text("no tab on this line\n")
    with pytest.raises(ValueError, match=r"Train_GCC-training.tsv:1: expected 'caption<TAB>url'"):
        _bench("coco_gcc", raw, tmp_path / "out2")


def test_karpathy_bad_record(tmp_path):
    data = karpathy_coco()
    data["images"][2]["split"] = "holdout"
    (tmp_path / "k.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"k.json: images\[2\].*unknown split 'holdout'"):
        B.convert_karpathy(tmp_path / "k.json", tmp_path)
    del data["images"][1]["filename"]
    (tmp_path / "k.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"images\[1\] lacks"):
        B.convert_karpathy(tmp_path / "k.json", tmp_path)


def test_missing_data_message_lists_files(tmp_path):
    with pytest.raises(B.MissingDataError) as err:
        _bench("flickr30k_coco", tmp_path / "empty", tmp_path / "out")
    msg = str(err.value)
    for needed in ("karpathy/dataset_flickr30k.json", "flickr30k/flickr30k-images", "captions_train2014.json",
                   "caption_datasets.zip", "shannon.cs.illinois.edu"):
        assert needed in msg, needed


def test_paths_override(raw, tmp_path):
    elsewhere = tmp_path / "mine.txt"
    elsewhere.write_text("a cat on a mat\n")
    _bench("coco_shutterstock", raw, tmp_path / "out", paths={"shutterstock": str(elsewhere)})
    assert (tmp_path / "out/corpus.txt").read_text() == "a cat on a mat\n"
    with pytest.raises(ValueError, match="unknown source"):
        _bench("coco_shutterstock", raw, tmp_path / "o2", paths={"nope": "x"})


# --------------------------------------------------------------------------- downloads (mocked)
def _zip_bytes(members: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return buf.getvalue()


def test_download_extract_and_checksums(tmp_path):
    payload = _zip_bytes({"dataset_coco.json": json.dumps(karpathy_coco()), "dataset_flickr30k.json": "{}"})
    calls = []

    def fake_fetch(url: str, dest: Path, log) -> None:
        calls.append(url)
        dest.write_bytes(payload)

    good = B.Source("k", "karpathy/dataset_coco.json", "https://example.invalid/caption_datasets.zip",
                    "karpathy/caption_datasets.zip", "dataset_coco.json", md5=hashlib.md5(payload).hexdigest())
    path, checked = B.ensure_source(good, tmp_path, fake_fetch, LOG)
    assert checked == "md5" and json.loads(path.read_text())["dataset"] == "coco"
    assert (tmp_path / "karpathy/caption_datasets.zip").exists()
    assert B.ensure_source(good, tmp_path, fake_fetch, LOG)[1] == "present" and len(calls) == 1

    bad = B.Source("k2", "other/dataset_coco.json", "https://example.invalid/c.zip", "other/c.zip",
                   "dataset_coco.json", sha256="0" * 64)
    with pytest.raises(B.ChecksumError, match=r"c.zip.part: sha256 mismatch for k2: expected 0{64}, got [0-9a-f]{64}"):
        B.ensure_source(bad, tmp_path, fake_fetch, LOG)
    assert not (tmp_path / "other/c.zip").exists() and not (tmp_path / "other/c.zip.part").exists()
    # an archive placed by hand with the wrong checksum is rejected too
    (tmp_path / "other/c.zip").write_bytes(payload)
    with pytest.raises(B.ChecksumError, match="delete the file"):
        B.ensure_source(bad, tmp_path, fake_fetch, LOG)

    # folders are extracted from archives by prefix
    imgs = B.Source("imgs", "coco/val2014", "https://example.invalid/val2014.zip", "coco/val2014.zip", "val2014/")
    payload2 = _zip_bytes({"val2014/COCO_val2014_000000000042.jpg": "jpeg bytes", "val2014/x.jpg": "y"})
    path, _ = B.ensure_source(imgs, tmp_path, lambda u, d, log: d.write_bytes(payload2), LOG)
    assert sorted(p.name for p in path.iterdir()) == ["COCO_val2014_000000000042.jpg", "x.jpg"]


def test_download_failure_is_a_clear_missing_error(tmp_path):
    def offline(url, dest, log):
        raise OSError("network unreachable")

    with pytest.raises(B.MissingDataError, match="download of .* failed .*network unreachable"):
        B.ensure_source(B.SOURCES.get("karpathy_coco"), tmp_path, offline, LOG)


def test_fetch_url_resumes(tmp_path, monkeypatch):
    import urllib.request

    seen = {}

    class Resp(io.BytesIO):
        status = 206

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    def fake_urlopen(req, timeout):
        seen["range"] = req.get_header("Range")
        return Resp(b"world")

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    dest = tmp_path / "f.part"
    dest.write_bytes(b"hello ")
    B.fetch_url("https://example.invalid/f", dest, LOG)
    assert seen["range"] == "bytes=6-" and dest.read_bytes() == b"hello world"


def test_recipes_registered():
    from r2m.catalogs import RECIPES
    from r2m.datasets.recipes import recipe

    assert RECIPES.names() == ["coco_gcc", "coco_shutterstock", "demo", "flickr30k_coco", "folder", "rehearsal", "tiny"]
    for kind in RECIPES:  # each names an object with both steps; the benchmarks are their Benchmark
        made = recipe(kind)
        assert callable(made.prepare) and callable(made.references), kind
        assert getattr(made, "name", kind) == kind
    with pytest.raises(KeyError, match="unknown dataset kind 'nope'; known: coco_gcc, coco_shutterstock, demo"):
        recipe("nope")


# --------------------------------------------------------------------------- the references: a stage apart from prepare
def _folder_entry(tmp_path: Path) -> tuple[DatasetEntry, dict, Path]:
    imgs = tmp_path / "photos"
    for name in ("a.png", "b.jpg", "c.png"):
        _png(imgs / name)
    refs = {"images": [{"id": 7, "file_name": "b.jpg"}],
            "annotations": [{"id": 1, "image_id": 7, "caption": "a dark square"}]}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "corpus.txt").write_text("a dog on the grass\n")
    entry = DatasetEntry(kind="folder", images=str(imgs), references=str(tmp_path / "refs.json"),
                         corpus=str(tmp_path / "corpus.txt"))
    return entry, refs, tmp_path / "refs.json"


def test_a_caption_edit_changes_what_references_reads_not_what_prepare_reads(tmp_path):
    """A folder dataset's reference file defines its image ids and splits (its image list) and its captions:
    `prepare`'s digest records the first only, the `references` stage's the whole file."""
    from r2m.datasets.inputs import input_records, reference_records

    entry, refs, path = _folder_entry(tmp_path)
    before = input_records(entry, "f", tmp_path), reference_records(entry, "f", tmp_path)
    refs["annotations"][0]["caption"] = "a black square"  # one word of one caption
    refs["annotations"].append({"id": 2, "image_id": 7, "caption": "a square"})  # a caption more
    path.write_text(json.dumps(refs))
    assert input_records(entry, "f", tmp_path) == before[0]
    assert reference_records(entry, "f", tmp_path) != before[1]
    refs["images"].append({"id": 9, "file_name": "c.png"})  # another evaluation image: the index changes
    path.write_text(json.dumps(refs))
    assert input_records(entry, "f", tmp_path) != before[0]


def test_references_follow_their_file_and_refuse_a_stale_index(tmp_path):
    entry, refs, path = _folder_entry(tmp_path)
    out = tmp_path / "prepared"
    folder(entry, out, LOG)
    refs["annotations"][0]["caption"] = "a black square"
    path.write_text(json.dumps(refs))
    build_references(entry, out, tmp_path / "r1", LOG)  # no new prepare needed: the new words are there
    got = json.loads((tmp_path / "r1/references.json").read_text())
    assert [(a["image_id"], a["caption"]) for a in got["annotations"]] == [("7", "a black square")]
    assert not (out / "references.json").exists()
    refs["images"].append({"id": 9, "file_name": "c.png"})  # prepare not run again: c.png is a train image
    path.write_text(json.dumps(refs))
    with pytest.raises(ValueError, match=r"refs.json: image '9' .*run prepare again"):
        build_references(entry, out, tmp_path / "r2", LOG)

"""The paper's three benchmarks: ``coco_shutterstock``, ``flickr30k_coco`` and ``coco_gcc``.

Each recipe (1) makes sure its raw sources are present under the raw folder — downloading the
public ones (resumable, checksum-verified when a checksum is known) and extracting archives — and
(2) converts them into the prepared files:

* images + references: the Karpathy split file (``dataset_coco.json`` / ``dataset_flickr30k.json``;
  ``restval`` counts as ``train``), every ``val``/``test`` image with its raw sentences; the
  ``train`` + ``restval`` sentences become ``train_references.json`` (supervised baselines);
* corpus: Shutterstock sentences (text, one per line), MSCOCO ``captions_train2014.json`` captions,
  or Google Conceptual Captions (TSV ``caption<TAB>url``) kept only when a sentence mentions a
  COCO-80 class. Under the ``official`` profile (:class:`CorpusRules`) the converters follow the
  authors' preprocessing: Shutterstock sentences de-duplicated (UC-GAN keeps a set of the
  descriptions; the first occurrence is kept, in file order), and the GCC COCO-word filter applied
  to the raw tokens (the official tokeniser, no singularisation: "two dogs" does not mention ``dog``);
  the manifest's ``corpus_rules`` says which rules ran and what they dropped.

Catalog options: ``raw_dir`` (default ``data/raw``; each source lives in its own sub-folder, e.g.
``data/raw/coco``, so MSCOCO is shared by two benchmarks), ``download`` (default true) and
``paths`` (a mapping source key -> existing file/folder, to use data already on disk elsewhere).
When a source is missing and cannot be downloaded, the error lists every file to place and where.
Image paths in ``images.parquet`` are under ``raw_dir`` (repository-root relative unless absolute).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from r2m.datasets.base import option, references_json, write_prepared
from r2m.params import DatasetEntry, profile_of
from r2m.text.corpus import CorpusError, read_lines
from r2m.text.vocab import GLOVE_WORDS
from r2m.utils.coco import read_coco_captions
from r2m.utils.guard import inside
from r2m.utils.io import file_digest, read_json
from r2m.utils.registry import Registry

Fetcher = Callable[[str, Path, logging.Logger], None]


class MissingDataError(FileNotFoundError):
    """Raw data absent and not downloadable; the message says what to put where."""


class ChecksumError(ValueError):
    """A file's checksum differs from the declared one."""


# --------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class Source:
    key: str
    target: str  # file or folder (relative to raw_dir) the converters read
    url: str | None = None  # None: cannot be downloaded automatically
    archive: str | None = None  # downloaded file (relative to raw_dir) that holds ``target``
    member: str | None = None  # file name or folder prefix inside ``archive``
    md5: str | None = None  # of the downloaded file (archive, or target when no archive)
    sha256: str | None = None
    git_blob: str | None = None  # git's blob id (SHA-1 of "blob <size>\0" + content) in the tree it comes from
    how: str = ""  # how to obtain it by hand

    @property
    def download_file(self) -> str:
        return self.archive or self.target


SOURCES: Registry[Source] = Registry("raw source")
_UCGAN_RAW = ("https://raw.githubusercontent.com/fengyang0317/unsupervised_captioning/"
              "0e75b6aff4cc9e94249bc272fc5490e566ef5d7c")
_KARPATHY_URL = "https://cs.stanford.edu/people/karpathy/deepimagesent/caption_datasets.zip"
_KARPATHY_HOW = f"Karpathy split archive {_KARPATHY_URL} (checksum not published: not verified)"
for _src in (
    # checksum of caption_datasets.zip is not published anywhere we could check: left None (honest placeholder)
    Source("karpathy_coco", "karpathy/dataset_coco.json", _KARPATHY_URL, "karpathy/caption_datasets.zip",
           "dataset_coco.json", how=_KARPATHY_HOW),
    Source("karpathy_flickr30k", "karpathy/dataset_flickr30k.json", _KARPATHY_URL, "karpathy/caption_datasets.zip",
           "dataset_flickr30k.json", how=_KARPATHY_HOW),
    # MD5s of the official MSCOCO 2014 archives (as published and widely used by dataset loaders)
    Source("coco_train2014", "coco/train2014", "http://images.cocodataset.org/zips/train2014.zip",
           "coco/train2014.zip", "train2014/", md5="0da8c0bd3d6becc4dcb32757491aca88",
           how="MSCOCO 2014 train images (train2014.zip, 13 GB) from https://cocodataset.org"),
    Source("coco_val2014", "coco/val2014", "http://images.cocodataset.org/zips/val2014.zip",
           "coco/val2014.zip", "val2014/", md5="a3d79f5ed8d289b7a7554ce06a5782b3",
           how="MSCOCO 2014 val images (val2014.zip, 6 GB) from https://cocodataset.org"),
    Source("coco_captions", "coco/annotations/captions_train2014.json",
           "http://images.cocodataset.org/annotations/annotations_trainval2014.zip",
           "coco/annotations_trainval2014.zip", "annotations/captions_train2014.json",
           md5="0a379cfc70b0e71301e0f377548639bd",
           how="MSCOCO 2014 annotations (annotations_trainval2014.zip) from https://cocodataset.org"),
    Source("flickr30k_images", "flickr30k/flickr30k-images",
           how="Flickr30k images (flickr30k-images/*.jpg); request them via the form at "
               "https://shannon.cs.illinois.edu/DenotationGraph/ and unpack the folder here"),
    Source("shutterstock", "shutterstock/sentences.txt",
           how="the Shutterstock corpus released with UC-GAN (Feng et al., CVPR 2019; Google Drive link in "
               "github.com/fengyang0317/unsupervised_captioning, mirrors in its issues), converted to UTF-8 "
               "text with one sentence per line"),
    Source("gcc_train", "gcc/Train_GCC-training.tsv",
           how="Google Conceptual Captions training TSV (caption<TAB>url) from "
               "https://ai.google.com/research/ConceptualCaptions/download (checksum not published)"),
    # UC-GAN's GloVe word list (a pickled Python-2 list of words), which its and R2M's process_descriptions.py
    # filter the vocabulary by; pinned to the commit R2M builds on, checked by the blob id in that commit's tree
    Source("glove_vocab", "glove/glove_vocab.pkl", f"{_UCGAN_RAW}/data/glove_vocab.pkl",
           git_blob="6f376f9d9d354d792f9f10517b5eaf79c30b9bf4",
           how=f"UC-GAN's data/glove_vocab.pkl ({_UCGAN_RAW}/data/glove_vocab.pkl)"),
):
    SOURCES.register(_src.key)(_src)


def git_blob_id(path: Path) -> str:
    """git's id of a file's content: SHA-1 of ``blob <size>\0`` followed by the bytes."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())  # noqa: S324 - git's object id, not security
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, source: Source) -> str:
    """Check ``path`` against the source's checksums; returns ``'md5'``/``'sha256'``/``'git_blob'``/``'none'``
    (unknown)."""
    checked = "none"
    for algo in ("sha256", "md5", "git_blob"):
        expected = getattr(source, algo)
        if not expected:
            continue
        actual = git_blob_id(path) if algo == "git_blob" else file_digest(path, algo)
        if actual != expected.lower():
            raise ChecksumError(f"{path}: {algo} mismatch for {source.key}: expected {expected}, got {actual}; "
                                "delete the file and run again")
        checked = algo
    return checked


def fetch_url(url: str, dest: Path, log: logging.Logger, timeout: float = 60.0) -> None:
    """Download ``url`` into ``dest``, resuming a partial ``dest`` with an HTTP Range request."""
    import urllib.request

    have = dest.stat().st_size if dest.exists() else 0
    req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - declared https/http sources
        mode = "ab" if have and resp.status == 206 else "wb"
        log.info("downloading %s -> %s (%s)", url, dest, "resuming" if mode == "ab" else "from the start")
        with open(dest, mode) as fh:
            shutil.copyfileobj(resp, fh, 1 << 20)


def _extract(archive: Path, member: str, target: Path) -> None:
    """Extract one file, or every file under a folder prefix, from a zip into ``target`` atomically.

    A member whose path is absolute or climbs out with ``..`` is refused (one line naming the archive
    and the member): nothing is written, and nothing outside the temporary folder is ever moved."""
    try:
        zf = zipfile.ZipFile(archive)
    except zipfile.BadZipFile as err:
        raise ValueError(f"{archive}: not a readable zip archive ({err}); delete it and run again") from None
    with zf:
        names = zf.namelist()
        if member.endswith("/"):
            wanted = [n for n in names if n.startswith(member) and not n.endswith("/")]
        else:
            wanted = [n for n in names if n == member or n.endswith("/" + member)][:1]
        if not wanted:
            raise ValueError(f"{archive}: has no member {member!r}")
        for name in wanted:
            inside(target.parent, name, f"{archive}: member")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            extracted = [zf.extract(name, tmp) for name in wanted]
            found = tmp / member.rstrip("/") if member.endswith("/") else Path(extracted[0])
            os.replace(found, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def ensure_source(source: Source, raw: Path, fetcher: Fetcher | None, log: logging.Logger,
                  override: str | None = None) -> tuple[Path, str]:
    """Return ``(path, checked)`` for the source's target, downloading/extracting as needed.

    Raises :class:`MissingDataError` when it is absent and cannot be fetched."""
    if override:
        path = Path(override).expanduser()
        if not path.exists():
            raise MissingDataError(f"paths.{source.key}: {path} does not exist")
        return path, "user"
    target = raw / source.target
    if target.exists():
        return target, "present"
    dl = raw / source.download_file
    checked = "present"
    if not dl.exists():
        if source.url is None or fetcher is None:
            raise MissingDataError(_missing_message([source], raw))
        dl.parent.mkdir(parents=True, exist_ok=True)
        part = dl.with_name(dl.name + ".part")
        try:
            fetcher(source.url, part, log)
        except OSError as err:
            raise MissingDataError(f"download of {source.url} failed ({err}).\n" + _missing_message([source], raw)) from None
        try:
            checked = verify(part, source)
        except ChecksumError:
            part.unlink(missing_ok=True)
            raise
        os.replace(part, dl)
    else:
        checked = verify(dl, source)
    if source.archive:
        assert source.member is not None
        log.info("extracting %s from %s", source.member, dl)
        _extract(dl, source.member, target)
    return target, checked


def _missing_message(sources: list[Source], raw: Path) -> str:
    lines = ["raw data missing; place these files (or set the entry's `paths`), then run prepare again:"]
    for s in sources:
        alt = f" (or its archive {raw / s.archive})" if s.archive else ""
        lines.append(f"  - {raw / s.target}{alt}: {s.how or s.url}")
    return "\n".join(lines)


def ensure_sources(keys: list[str], raw: Path, fetcher: Fetcher | None, log: logging.Logger,
                   overrides: dict[str, str] | None = None) -> dict[str, tuple[Path, str]]:
    """Ensure every source; one :class:`MissingDataError` lists all that are missing."""
    got, missing = {}, []
    overrides = overrides or {}
    for key in keys:
        source = SOURCES.get(key)
        try:
            got[key] = ensure_source(source, raw, fetcher, log, overrides.get(key))
        except MissingDataError as err:
            if key in overrides:
                raise
            log.warning("%s", str(err).splitlines()[0])
            missing.append(source)
    if missing:
        raise MissingDataError(_missing_message(missing, raw))
    return got


# --------------------------------------------------------------------------- converters
KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


def convert_karpathy(split_file: Path, image_root: Path) -> tuple[Any, dict[str, Any]]:
    """Karpathy split JSON -> (images DataFrame, COCO references JSON for val/test images).

    Image ids: ``cocoid`` when present (MSCOCO), else the file stem (Flickr30k). Paths:
    ``image_root/filepath/filename`` (``filepath`` only in the MSCOCO file)."""
    images, refs, _ = convert_karpathy_pairs(split_file, image_root)
    return images, refs


def convert_karpathy_pairs(split_file: Path, image_root: Path) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """:func:`convert_karpathy` plus the paired training captions: COCO caption JSON of the
    ``train`` + ``restval`` images and their sentences (the supervised baselines' training set)."""
    import pandas as pd

    data = read_json(split_file)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise ValueError(f"{split_file}: expected a Karpathy split file with an 'images' list")
    rows, ref_images, captions = [], [], {}
    train_images, train_captions = [], {}
    for i, img in enumerate(data["images"]):
        try:
            filename, raw_split, sentences = img["filename"], img["split"], img["sentences"]
        except (KeyError, TypeError):
            raise ValueError(f"{split_file}: images[{i}] lacks 'filename', 'split' or 'sentences'") from None
        if raw_split not in KARPATHY_SPLITS:
            raise ValueError(f"{split_file}: images[{i}] ({filename}): unknown split {raw_split!r}")
        image_id = str(img["cocoid"]) if "cocoid" in img else Path(filename).stem
        split = KARPATHY_SPLITS[raw_split]
        rel = Path(img["filepath"]) / filename if img.get("filepath") else Path(filename)
        rows.append({"image_id": image_id, "path": str(image_root / rel), "split": split})
        try:
            caps = [s["raw"].strip() for s in sentences]
        except (KeyError, TypeError, AttributeError):
            raise ValueError(f"{split_file}: images[{i}] ({filename}): sentences need a 'raw' string") from None
        if split != "train":
            ref_images.append({"id": image_id, "file_name": filename, "split": split})
            captions[image_id] = caps
        else:
            train_images.append({"id": image_id, "file_name": filename, "split": split})
            train_captions[image_id] = caps
    df = pd.DataFrame(rows, columns=["image_id", "path", "split"])
    if df["image_id"].duplicated().any():
        dup = df.loc[df["image_id"].duplicated(), "image_id"].iloc[0]
        raise ValueError(f"{split_file}: image id {dup!r} appears twice")
    return df, references_json(ref_images, captions), references_json(train_images, train_captions)


@dataclass
class CorpusRules:
    """How a corpus converter reads its source: ``official`` = the authors' preprocessing (the
    dataset's profile). ``counts`` is filled while the corpus is read (lines dropped by each rule)."""

    official: bool = False
    counts: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"official": self.official, "dropped": self.counts}


def coco_caption_lines(path: Path, rules: CorpusRules | None = None) -> Iterator[str]:
    """Captions of a COCO caption-annotation file, in file order (blank ones skipped)."""
    for _, cap in read_coco_captions(path).annotations:
        if cap.strip():
            yield " ".join(cap.split())


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def text_lines(path: Path, rules: CorpusRules | None = None) -> Iterator[str]:
    """Non-empty lines of a UTF-8 text corpus (bad UTF-8 raises, naming file and line); under
    ``rules.official`` a line equal to an earlier one is dropped (UC-GAN de-duplicates the
    Shutterstock descriptions). Seen lines are kept as 64-bit digests (~70 bytes per distinct line)."""
    rules = rules or CorpusRules()
    seen: set[int] = set()
    for _, text in read_lines(path):
        if rules.official:
            key = _digest(text)
            if key in seen:
                rules.counts["duplicate"] = rules.counts.get("duplicate", 0) + 1
                continue
            seen.add(key)
        yield text


def gcc_lines(path: Path, rules: CorpusRules | None = None, dictionary: str = "coco80") -> Iterator[str]:
    """Captions of a GCC TSV (``caption<TAB>url``) that mention a class of ``dictionary``: ours
    singularises the tokens first ("two dogs" mentions ``dog``); ``rules.official`` matches the raw
    tokens of the official tokeniser against the class words (the authors' filter)."""
    from r2m.text.dictionary import load_dictionary
    from r2m.text.tokenize import tokenize
    from r2m.text.tokenize_official import tokenize_keep_punct

    rules = rules or CorpusRules()
    d = load_dictionary(dictionary)

    def mentions(caption: str) -> bool:
        if rules.official:
            return bool(d.raw_word_concepts(tokenize_keep_punct(caption)))
        return bool(d.sentence_concepts(tokenize(caption)))

    for lineno, text in read_lines(path):
        caption, tab, _url = text.partition("\t")
        if not tab:
            raise CorpusError(f"{path}:{lineno}: expected 'caption<TAB>url'")
        caption = caption.strip()
        if caption and mentions(caption):
            yield caption
        elif caption:
            rules.counts["no_coco_word"] = rules.counts.get("no_coco_word", 0) + 1


# a corpus converter: (path of its source, the profile's rules) -> lines
CORPUS_CONVERTERS: Registry[Callable[[Path, CorpusRules], Iterator[str]]] = Registry("corpus converter")
CORPUS_CONVERTERS.register("text")(text_lines)
CORPUS_CONVERTERS.register("coco_captions")(coco_caption_lines)
CORPUS_CONVERTERS.register("gcc")(gcc_lines)


@dataclass(frozen=True)
class Benchmark:
    name: str
    split_source: str  # Karpathy split file
    image_sources: tuple[str, ...]  # folders the split's images live in
    image_root: str  # folder (relative to raw_dir) the split's filepath/filename are under
    corpus_source: str
    corpus_converter: str

    @property
    def sources(self) -> list[str]:
        return [self.split_source, *self.image_sources, self.corpus_source]

    # the benchmark as a dataset kind's recipe (r2m.datasets.base.Recipe; named in r2m.catalogs.RECIPES)
    def prepare(self, entry: DatasetEntry, out: Path, log: logging.Logger) -> dict[str, Any]:
        return prepare_benchmark(self.name, entry, out, log, fetcher=fetch_url)

    def references(self, entry: DatasetEntry, prepared: Path, log: logging.Logger) -> tuple[dict[str, Any], Any]:
        return benchmark_references(self.name, entry, prepared, log)


COCO_SHUTTERSTOCK = Benchmark("coco_shutterstock", "karpathy_coco", ("coco_train2014", "coco_val2014"), "coco",
                              "shutterstock", "text")
FLICKR30K_COCO = Benchmark("flickr30k_coco", "karpathy_flickr30k", ("flickr30k_images",), "flickr30k/flickr30k-images",
                           "coco_captions", "coco_captions")
COCO_GCC = Benchmark("coco_gcc", "karpathy_coco", ("coco_train2014", "coco_val2014"), "coco", "gcc_train", "gcc")
BENCHMARK_DATASETS: Registry[Benchmark] = Registry("benchmark")
for _b in (COCO_SHUTTERSTOCK, FLICKR30K_COCO, COCO_GCC):
    BENCHMARK_DATASETS.register(_b.name)(_b)


def _sources(name: str, entry: DatasetEntry, log: logging.Logger, fetcher: Fetcher | None,
             keys: list[str] | None = None) -> tuple[Path, dict[str, tuple[Path, str]], Path]:
    """``(raw_dir, {source: (path, checked)}, image root)`` of the benchmark's sources ``keys`` (default:
    all), ensured (``fetcher`` None: never download)."""
    bench = BENCHMARK_DATASETS.get(name)
    raw = Path(str(option(entry, "raw_dir", "data/raw"))).expanduser()
    overrides = {str(k): str(v) for k, v in (option(entry, "paths", {}) or {}).items()}
    unknown = sorted(set(overrides) - set(bench.sources))
    if unknown:
        raise ValueError(f"catalog entry (kind {name}): paths: unknown source(s) {unknown}; known: {bench.sources}")
    if not option(entry, "download", True):
        fetcher = None
    got = ensure_sources(keys or bench.sources, raw, fetcher, log, overrides)
    image_root = raw / bench.image_root
    first = bench.image_sources[0]
    if first in overrides:
        # a user-supplied image folder: MSCOCO's split file names "train2014/…" (its parent is the
        # root); Flickr30k's names bare files (the folder itself is the root)
        folder = Path(overrides[first]).expanduser()
        image_root = folder.parent if bench.image_root == "coco" else folder
    return raw, got, image_root


def prepare_benchmark(name: str, entry: DatasetEntry, out: Path, log: logging.Logger,
                      fetcher: Fetcher | None = None) -> dict[str, Any]:
    """Ensure the raw sources (``fetcher`` None: never download) and write the prepared files."""
    bench = BENCHMARK_DATASETS.get(name)
    raw, got, image_root = _sources(name, entry, log, fetcher)
    images, _, _ = convert_karpathy_pairs(got[bench.split_source][0], image_root)
    rules = CorpusRules(official=profile_of(entry) == "official")
    lines = CORPUS_CONVERTERS.get(bench.corpus_converter)(got[bench.corpus_source][0], rules)
    manifest = {
        "recipe": name,
        "raw_dir": str(raw),
        "sources": {k: {"path": str(p), "checked": c, "url": SOURCES.get(k).url} for k, (p, c) in got.items()},
        "corpus_rules": rules.as_dict(),  # its counts are filled while write_prepared reads the lines
    }
    manifest = write_prepared(out, images, lines, manifest)
    glove = write_glove_words(name, entry, out, log, fetcher)
    if glove is not None:
        manifest["glove_words"] = glove
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    log.info("%s: %s images, %d sentences (corpus rules: %s)", name, manifest["n_images"],
             manifest["n_sentences"], rules.as_dict())
    return manifest


# --------------------------------------------------------------------------- the GloVe word list
class _NoGlobals(pickle.Unpickler):
    """An unpickler that builds lists, strings and numbers only: any class or function is refused, so a
    downloaded pickle can run nothing."""

    def find_class(self, module: str, name: str):  # noqa: ARG002
        raise pickle.UnpicklingError(f"refers to {module}.{name}: a word list holds strings only")


def read_glove_pickle(path: Path) -> list[str]:
    """The words of UC-GAN's ``glove_vocab.pkl`` (a Python-2 ``cPickle`` of a list of ``str``, any protocol;
    Python-2 strings are read as Latin-1). Anything but a list of strings: one line naming the file."""
    try:
        with open(path, "rb") as fh:
            data = _NoGlobals(fh, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError) as err:
        raise ValueError(f"{path}: not a pickled word list ({err})") from None
    if not isinstance(data, list) or not all(isinstance(w, (str, bytes)) for w in data):
        raise ValueError(f"{path}: not a pickled list of words (got {type(data).__name__})")
    return [w.decode("latin1") if isinstance(w, bytes) else w for w in data]


def write_glove_words(name: str, entry: DatasetEntry, out: Path, log: logging.Logger,
                      fetcher: Fetcher | None) -> dict[str, Any] | None:
    """Under the official profile: fetch (or find) UC-GAN's GloVe list and write its words, one per line, to
    ``out/glove_words.txt`` (the list ``fidelity.vocab_filter: glove`` reads). Absent and not fetchable:
    one warning line, no list (the vocabulary is then not filtered). Returns the manifest's entry."""
    if profile_of(entry) != "official":
        return None
    raw = Path(str(option(entry, "raw_dir", "data/raw"))).expanduser()
    if not option(entry, "download", True):
        fetcher = None
    try:
        path, checked = ensure_source(SOURCES.get("glove_vocab"), raw, fetcher, log)
    except MissingDataError as err:
        log.warning("%s: no GloVe word list, the vocabulary will not be filtered: %s", name,
                    str(err).splitlines()[-1].strip())
        return {"path": None}
    words = read_glove_pickle(path)
    with open(out / GLOVE_WORDS, "w", encoding="utf-8") as fh:
        fh.writelines(w + "\n" for w in words if w.strip() and not any(c.isspace() for c in w))
    return {"path": str(path), "checked": checked, "words": len(words)}


def benchmark_references(name: str, entry: DatasetEntry, prepared: Path,
                         log: logging.Logger) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Karpathy split file's ``val``/``test`` sentences and its ``train`` + ``restval`` ones (the file
    ``prepare`` made sure of; never downloaded here)."""
    bench = BENCHMARK_DATASETS.get(name)
    _, got, image_root = _sources(name, entry, log, None, [bench.split_source])
    _, refs, train_refs = convert_karpathy_pairs(got[bench.split_source][0], image_root)
    return refs, train_refs


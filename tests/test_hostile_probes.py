"""The further round of hostile and careless probes: each test here is a probe that was a
security hole, destroyed user files, was silently wrong or gave an unclear error (a traceback, a
message naming no file or record) before its fix. Beside :mod:`test_hostile_inputs` (what a user
types), :mod:`test_hostile_results` and :mod:`test_faults`; the probes that held are not repeated.

Kept fast: in-process calls on tiny hand-made fixtures; a subprocess only where the old behaviour
was a hang (the YAML alias bomb), so a regression fails on a timeout instead of blocking the suite.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from test_hostile_inputs import _env, base_params, cli, digest_tree, one_line

ROOT = Path(__file__).resolve().parents[1]
LOG = logging.getLogger("test_hostile_probes")


@pytest.fixture
def wd(tmp_path, monkeypatch) -> Path:
    """An empty working folder with a valid params.yaml (datasets: [tiny])."""
    folder = tmp_path / "wd"
    folder.mkdir()
    (folder / "params.yaml").write_text(yaml.safe_dump(base_params(), sort_keys=False))
    monkeypatch.chdir(folder)
    return folder


# --------------------------------------------------------------------------- security: archive members
@pytest.mark.parametrize("absolute", [False, True], ids=["dotdot_member", "absolute_member"])
def test_zip_member_leaving_the_raw_folder_is_refused_and_moves_nothing(absolute, tmp_path):
    """Before: ``_extract`` renamed ``tmp / member`` into place, so a member named ``/home/…`` or
    ``../../…`` MOVED a file from outside the archive (the user's) into the raw folder."""
    from r2m.datasets import benchmarks as B

    raw = tmp_path / "raw"
    (raw / "karpathy").mkdir(parents=True)
    # the file the crafted member points at: raw/<tmp>/../../home/… is raw/home/…
    user = (tmp_path / "home" if absolute else raw / "home") / "dataset_coco.json"
    user.parent.mkdir(parents=True)
    user.write_text("the user's own file")
    member = str(user) if absolute else "../../home/dataset_coco.json"
    archive = raw / "karpathy/caption_datasets.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(member, "{}")
    with pytest.raises(ValueError) as err:
        B.ensure_source(B.SOURCES.get("karpathy_coco"), raw, None, LOG)
    assert str(archive) in str(err.value) and member in str(err.value) and "\n" not in str(err.value)
    assert user.read_text() == "the user's own file"  # not moved
    assert sorted(p.name for p in (raw / "karpathy").iterdir()) == ["caption_datasets.zip"]  # nothing left


def test_corrupt_zip_names_the_archive(tmp_path):
    from r2m.datasets import benchmarks as B

    raw = tmp_path / "raw"
    (raw / "karpathy").mkdir(parents=True)
    archive = raw / "karpathy/caption_datasets.zip"
    archive.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ValueError, match="caption_datasets.zip"):
        B.ensure_source(B.SOURCES.get("karpathy_coco"), raw, None, LOG)


# --------------------------------------------------------------------------- demo dataset records
def _edit_photo(key: str, value):
    def edit(src: Path) -> None:
        doc = yaml.safe_load((src / "photos.yaml").read_text())
        doc["photos"][0][key] = value
        (src / "photos.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return edit


def _traversal_id(src: Path) -> None:
    _edit_photo("id", "../../../escaped")(src)
    refs = json.loads((src / "references.json").read_text())
    refs["../../../escaped"] = refs.pop("astronaut")  # so nothing else stops it
    (src / "references.json").write_text(json.dumps(refs))


def _photo_not_a_mapping(src: Path) -> None:
    doc = yaml.safe_load((src / "photos.yaml").read_text())
    doc["photos"][0] = "astronaut"
    (src / "photos.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def _refs(value):
    def edit(src: Path) -> None:
        if value == "list":
            (src / "references.json").write_text("[]")
            return
        refs = json.loads((src / "references.json").read_text())
        refs["astronaut"] = value
        (src / "references.json").write_text(json.dumps(refs))
    return edit


def _latin1_corpus(src: Path) -> None:
    (src / "corpus.txt").write_bytes("a caf\u00e9 on a table\n".encode("latin-1"))


DEMO_CASES = {  # id -> (edit of a copy of data/demo, words the one-line error names)
    "photo_id_escapes_the_folder": (_traversal_id, ["photos.yaml", "photo #1", "../../../escaped"]),
    "photo_not_a_mapping": (_photo_not_a_mapping, ["photos.yaml", "photo #1"]),
    "photo_package_not_a_package": (_edit_photo("package", "os"), ["astronaut", "'os'"]),
    "references_a_list": (_refs("list"), ["references.json", "list"]),
    "references_a_string_not_a_list": (_refs("a woman in a suit"), ["references.json", "astronaut"]),
    "references_not_strings": (_refs([1, None]), ["references.json", "astronaut"]),
    "corpus_latin1": (_latin1_corpus, ["corpus.txt:1", "UTF-8"]),
}


@pytest.mark.parametrize("case", sorted(DEMO_CASES))
def test_demo_records_are_checked_and_name_file_and_record(case, tmp_path):
    """Before: a photo id ``../../../escaped`` wrote ``escaped.png`` outside the prepared folder; a
    references string became one "caption" per character; the others were AttributeError,
    TypeError or UnicodeDecodeError lines naming no file or record."""
    import shutil

    from r2m.datasets.demo import prepare_demo
    from r2m.datasets.recipes import build_references
    from r2m.params import DatasetEntry

    edit, words = DEMO_CASES[case]
    src = tmp_path / "demo"
    shutil.copytree(ROOT / "data/demo", src)
    edit(src)
    out = tmp_path / "a" / "b" / "prepared"
    out.mkdir(parents=True)
    entry = DatasetEntry(kind="demo", source_dir=str(src))
    refs_only = case.startswith("references_")  # read by the references stage alone, after prepare
    if refs_only:
        prepare_demo(entry, out, LOG)
    with pytest.raises((ValueError, OSError)) as err:
        if refs_only:
            build_references(entry, out, tmp_path / "references", LOG)
        else:
            prepare_demo(entry, out, LOG)
    msg = str(err.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)
    assert not list(tmp_path.rglob("escaped*"))
    if refs_only:
        assert not (tmp_path / "references" / "references.json").exists()
    else:
        assert not (out / "images").exists() or not any((out / "images").iterdir())  # failed before copying photos


# --------------------------------------------------------------------------- evaluate --out
REFS = {"images": [{"id": 1}, {"id": 2}],
        "annotations": [{"image_id": 1, "caption": "a dog on a bench"}, {"image_id": 2, "caption": "a cat on a mat"}]}
RESULTS = [{"image_id": 1, "caption": "a dog"}, {"image_id": 2, "caption": "a cat"}]


@pytest.mark.parametrize("target", ["folder", "references", "results"])
def test_evaluate_out_never_replaces_a_folder_or_an_input(target, wd, capsys):
    """Before: ``--out photos`` deleted the folder ``photos`` (and every photo in it) to write the
    metrics there; ``--out refs.json`` overwrote the references with the metrics."""
    (wd / "refs.json").write_text(json.dumps(REFS))
    (wd / "res.json").write_text(json.dumps(RESULTS))
    (wd / "photos").mkdir()
    (wd / "photos/holiday.jpg").write_bytes(b"\xff\xd8 the user's photo")
    before = digest_tree(wd)
    out = {"folder": "photos", "references": "refs.json", "results": "res.json"}[target]
    assert cli("evaluate", "--results", "res.json", "--references", "refs.json", "--scorers", "bleu", "--out", out) == 2
    one_line(capsys.readouterr().err, "--out", out)
    assert digest_tree(wd) == before


# --------------------------------------------------------------------------- JSON inputs
JSON_CASES = {  # id -> (results text, references text, file and words the line names)
    "results_key_twice": ('[{"image_id": 1, "caption": "a cat", "caption": "a dog on a bench"},'
                          ' {"image_id": 2, "caption": "a cat on a mat"}]', json.dumps(REFS), ["res.json", "'caption'"]),
    "references_key_twice": (json.dumps(RESULTS), json.dumps(REFS)[:-1] + ', "annotations": []}',
                             ["refs.json", "'annotations'"]),
    "integer_id_of_5000_digits": ('[{"image_id": 1' + "0" * 5000 + ', "caption": "a"}]', json.dumps(REFS),
                                  ["res.json"]),
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_json_inputs_refuse_keys_given_twice_and_name_the_file(case, wd, capsys):
    """Before: ``json`` kept the last of a key given twice, silently (the first record above scored
    BLEU 1.0 on the caption the user did not mean; the references lost every annotation); an
    over-long integer was a line naming no file."""
    results, refs, words = JSON_CASES[case]
    (wd / "res.json").write_text(results)
    (wd / "refs.json").write_text(refs)
    assert cli("evaluate", "--results", "res.json", "--references", "refs.json", "--scorers", "bleu") == 2
    one_line(capsys.readouterr().err, *words)


# --------------------------------------------------------------------------- text corpora
@pytest.mark.parametrize("content, expected", [
    (b"\xef\xbb\xbfdog on a bench\na cat\n", [(1, "dog on a bench"), (2, "a cat")]),  # BOM (Windows editors)
    (b"a dog on a bench\ra cat on a mat\r", [(1, "a dog on a bench"), (2, "a cat on a mat")]),  # old Mac line ends
    (b"one\r\ntwo\rthree\n\nfour", [(1, "one"), (2, "two"), (3, "three"), (5, "four")]),  # mixed, a blank line
], ids=["bom", "lone_cr", "mixed"])
def test_corpus_line_ends_and_bom(content, expected, tmp_path):
    """Before: a BOM stuck to the first word (``'\\ufeffdog'``, a word no dictionary has) and a file
    with ``\\r`` line ends was ONE sentence."""
    from r2m.text.corpus import read_lines
    from r2m.text.tokenize import tokenize

    path = tmp_path / "c.txt"
    path.write_bytes(content)
    got = list(read_lines(path))
    assert got == expected
    assert tokenize(got[0][1])[0] == expected[0][1].split()[0]


@pytest.mark.parametrize("content", [b"", b"\n \n\t\n"], ids=["empty", "blank_lines"])
def test_folder_dataset_without_a_sentence_is_refused(content, tmp_path):
    """Before: prepared with 0 sentences; the later stages trained on nothing (a warning at most)."""
    from PIL import Image

    from r2m.datasets.folder import folder
    from r2m.params import DatasetEntry

    (tmp_path / "img").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "img/a.png")
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(content)
    entry = DatasetEntry(kind="folder", images=str(tmp_path / "img"), corpus=str(corpus))
    with pytest.raises(ValueError, match="corpus.txt has no sentence"):
        folder(entry, tmp_path / "out", LOG)


# --------------------------------------------------------------------------- precomputed detections
DETECTION_CASES = {  # id -> (a field's hostile value, words the error names)
    "score_in_percent": ({"score": 45}, ["score", "45"]),  # before: every box passed the 0.3 threshold
    "score_negative": ({"score": -0.5}, ["score"]),
    "score_a_bool": ({"score": True}, ["score", "True"]),  # before: read as 1.0
    "box_inverted": ({"box": [10, 10, 0, 0]}, ["box", "x2 < x1"]),  # before: a box of no area, silently
    "label_a_list": ({"label": ["Dog"]}, ["label", "['Dog']"]),  # before: the label "['Dog']", no concept
    "image_id_a_bool": ({"image_id": True}, ["image_id", "True"]),  # before: the image "True"
}


@pytest.mark.parametrize("case", sorted(DETECTION_CASES))
def test_precomputed_detections_refuse_values_that_would_be_misread(case, tmp_path):
    from r2m.vision.detectors.precomputed import read_precomputed

    change, words = DETECTION_CASES[case]
    good = {"image_id": "a", "label": "Dog", "score": 0.9, "box": [0, 0, 10, 10]}
    path = tmp_path / "detections.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, **change}) + "\n")
    with pytest.raises(ValueError) as err:
        read_precomputed(path)
    for w in [f"{path}:2", *words]:
        assert w in str(err.value), (w, str(err.value))
    path.write_text(json.dumps(good) + "\n")
    assert read_precomputed(path) == [("a", "Dog", 0.9, (0.0, 0.0, 10.0, 10.0))]


# --------------------------------------------------------------------------- params
def _bomb(levels: int = 9) -> str:
    lines = ["lol0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"lol{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused_at_once(wd):
    """Before: a 1 kB params file whose aliases expand to 10^9 values hung the command (> 60 s at
    full CPU, no message). A subprocess, so that a regression fails on the timeout."""
    path = wd / "bomb.yaml"
    path.write_text((wd / "params.yaml").read_text() + _bomb())
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "r2m.cli", "datasets", "--params", str(path)], cwd=wd,
                           env=_env(), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the alias bomb still hangs the params reader")
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(r.stderr, "bomb.yaml", "alias")
    assert time.perf_counter() - t0 < 60


def test_yaml_nested_too_deeply_is_one_line(wd, capsys):
    """Before: a RecursionError traceback (~3000 lines)."""
    path = wd / "deep.yaml"
    path.write_text((wd / "params.yaml").read_text() + "deep: " + "[" * 5000 + "]" * 5000 + "\n")
    assert cli("prepare", "--dataset", "tiny", "--params", path) == 2
    one_line(capsys.readouterr().err, "deep.yaml", "nested")


@pytest.mark.parametrize("key, value", [
    ("n_test_images", True),  # before: 1 test image, silently (a bool is an int in Python)
    ("n_train_images", 10**12),  # before: prepare drew images for ever
    ("image_size", 100_000),  # before: one 100000x100000 picture filled the memory (killed)
    ("n_val_images", "16"),  # before: refused only when prepare ran, after a Snakemake dry run said all is well
])
def test_tiny_sizes_are_checked_up_front(key, value, wd):
    from r2m.params import ParamsError
    from r2m.pipeline import validate as V

    raw = base_params()
    raw["catalog"]["tiny"][key] = value
    path = wd / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ParamsError) as err:
        V.load(path)
    assert "catalog.tiny" in str(err.value) and key in str(err.value) and repr(value) in str(err.value)


def test_corpus_min_tokens_above_max_tokens_is_refused(wd):
    """Before: accepted; ``corpus_concepts`` then dropped every sentence with a warning and the
    vocabulary and training went on with an empty corpus."""
    from r2m.params import ParamsError
    from r2m.pipeline import validate as V

    raw = base_params()
    raw["corpus_concepts"].update(min_tokens=50, max_tokens=40)
    path = wd / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ParamsError, match="corpus_concepts: min_tokens=50 is above max_tokens=40"):
        V.load(path)


# --------------------------------------------------------------------------- runtime environment
@pytest.mark.parametrize("name, value", [("R2M_BF16", "true"), ("R2M_GPU_DECODE", "off"), ("R2M_NO_PROGRESS", "yes")])
def test_switches_accept_only_0_or_1(name, value, monkeypatch):
    """Before: ``R2M_BF16=true`` ran in fp32, ``R2M_GPU_DECODE=off`` decoded on the GPU, and
    ``R2M_NO_PROGRESS=yes`` kept the bars: each the opposite of what was asked, silently."""
    from r2m.runtime import BadInput, Runtime

    monkeypatch.setenv(name, value)
    with pytest.raises(BadInput) as err:
        Runtime.from_env()
    assert name in str(err.value) and repr(value) in str(err.value)
    monkeypatch.setenv(name, "1")
    assert Runtime.from_env().bf16 is (name == "R2M_BF16")  # 1 still means on


@pytest.mark.parametrize("flags, env, words", [
    ({"threads": 99999999999999999999}, {}, ["--threads", "99999999999999999999"]),
    ({}, {"R2M_THREADS": "99999999999999999999"}, ["R2M_THREADS"]),
    ({}, {"R2M_WORKERS": "100000"}, ["R2M_WORKERS", "100000"]),
])
def test_thread_and_worker_counts_are_bounded(flags, env, words, monkeypatch):
    """Before: ``--threads 99999999999999999999`` reached ``torch.set_num_threads`` when the stage
    imported torch ("ValueError: Overflow when unpacking long long", naming no flag), and
    ``R2M_WORKERS=100000`` asked the data loader for 100000 processes."""
    from r2m.runtime import BadInput, Runtime

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(BadInput) as err:
        Runtime.from_env(**flags)
    for w in words:
        assert w in str(err.value)
    assert Runtime.from_env(threads=2, workers=1).threads == 2  # sane values still pass


def test_stage_with_a_bad_switch_is_one_line(wd, monkeypatch, capsys):
    monkeypatch.setenv("R2M_BF16", "yes")
    assert cli("prepare", "--dataset", "tiny") == 2
    one_line(capsys.readouterr().err, "R2M_BF16", "yes")
    assert not (wd / "data").exists()


def test_missing_gpu_lock_dir_is_one_line(tmp_path, monkeypatch):
    """Before: FileNotFoundError on ``…/r2m-gpu-0.lock`` (multi-GPU machines only), naming no setting."""
    from r2m.runtime import BadInput, claim_gpu

    monkeypatch.setenv("R2M_GPU_LOCK_DIR", str(tmp_path / "nope"))
    with pytest.raises(BadInput, match="R2M_GPU_LOCK_DIR"):
        claim_gpu(2)


# --------------------------------------------------------------------------- faults
@pytest.mark.parametrize("name, command", [("logs", ["prepare", "--dataset", "tiny"]), (".stamps", ["stamps"])])
def test_a_file_where_a_folder_is_expected_is_one_line_and_kept(name, command, wd, capsys):
    """Before: a NotADirectoryError traceback (the log set-up of a stage; ``r2m stamps``)."""
    (wd / name).write_text("the user's notes")
    assert cli(*command) == 1
    one_line(capsys.readouterr().err, name)
    assert (wd / name).read_text() == "the user's notes"


def test_dag_write_never_replaces_a_folder(wd, capsys):
    """Before: a folder in the way of a file output was deleted, files and all (``atomic_path``
    replaces folders, for folder outputs): here a folder named ``dvc.yaml``; ``evaluate --out`` above."""
    (wd / "dvc.yaml").mkdir()
    (wd / "dvc.yaml/notes.txt").write_text("mine")
    assert cli("dag", "--write") == 2  # refused by the writer check, before anything is written
    one_line(capsys.readouterr().err, "dvc.yaml", "folder")
    assert (wd / "dvc.yaml/notes.txt").read_text() == "mine"


# --------------------------------------------------------------------------- image ids are data
def test_sup_attention_figures_are_not_named_after_image_ids(tmp_path):
    """Before: ``inspect_sup`` saved ``attention_<image id>.png``: an id with a ``/`` (a folder
    dataset's references may use any string) crashed the stage after training (FileNotFoundError),
    and ``../`` in it pointed the figure outside the results folder."""
    import importlib

    import pandas as pd

    from r2m import params as P
    from r2m.stage import registry as S
    from r2m.stage.context import StageContext

    raw = {"datasets": ["syn"], "baselines": {"datasets": ["syn"], "models": ["sat"]},
           "catalog": {"syn": {"kind": "tiny", "seed": 3, "n_train_images": 8, "n_val_images": 2,
                               "n_test_images": 2, "n_sentences": 20, "image_size": 32}},
           "detect_concepts": {"backend": "precomputed"},
           "sup_features": {"backend": "random_cnn", "options": {"kinds": ["pooled", "grid"]}},
           "sup_vocab": {"min_count": 1},
           "train_sup": {"steps": 2, "batch_size": 4, "lr": 1e-3, "max_len": 8, "eval_every": 2, "checkpoint_every": 2},
           "sat": {"embed": 8, "hidden": 8, "att_dim": 8, "dropout": 0.0},
           "caption": {"beam": 1, "max_len": 4, "batch_size": 2, "split": "test"}, "report": {"figure_images": 2}}
    params = P.for_dataset(P.validate(raw), "syn")

    def run(stage: str, model: str | None = None) -> None:
        ctx = StageContext(stage=S.get(stage), params=params, dataset="syn", model=model, root=tmp_path)
        mod, fn = S.get(stage).impl.split(":")
        importlib.import_module(mod).__dict__[fn](ctx)

    run("prepare")
    run("references")  # the references keep the recipe's ids; only the index's test ids turn hostile
    prepared = tmp_path / "data/syn/prepared"
    images = pd.read_parquet(prepared / "images.parquet")
    test = images["split"] == "test"
    hostile = {old: new for old, new in zip(images.loc[test, "image_id"], ["a/b", "../../../escaped"], strict=True)}
    images["image_id"] = images["image_id"].replace(hostile)
    images.to_parquet(prepared / "images.parquet", index=False)
    for stage in ("extract_features_sup", "sup_vocab"):
        run(stage)
    run("train_sup", "sat")
    run("inspect_sup", "sat")
    folder = tmp_path / "results/syn/sat/s0/train_sup/inspect"
    ins = json.loads((folder / "inspect.json").read_text())
    assert sorted(f["image_id"] for f in ins["figures"]) == sorted(hostile.values())
    for f in ins["figures"]:
        assert "/" not in f["file"] and (folder / f["file"]).is_file()
    assert not list(tmp_path.rglob("*escaped*"))


@pytest.mark.parametrize("stage, axes", [("caption", {"variant": "r2m", "ckpt": "train_i"}),
                                         ("caption_sup", {"model": "mrnn"})])
def test_captioning_a_split_without_images_is_refused(stage, axes, tmp_path):
    """Before: ``caption.split: val`` on a dataset without val images (the demo has none) wrote an
    empty ``captions.json`` over the good one and exited 0 ("wrote 0 captions")."""
    import importlib

    import pandas as pd

    from r2m import params as P
    from r2m.stage import registry as S
    from r2m.stage.context import StageContext

    raw = {"datasets": ["syn"], "baselines": {"datasets": ["syn"], "models": ["mrnn"]},
           "catalog": {"syn": {"kind": "tiny", "n_train_images": 4, "n_val_images": 1, "n_test_images": 2,
                               "n_sentences": 10, "image_size": 32}},
           "caption": {"split": "val"}}
    params = P.for_dataset(P.validate(raw), "syn")
    ctx = StageContext(stage=S.get(stage), params=params, dataset="syn", root=tmp_path, **axes)
    prep = StageContext(stage=S.get("prepare"), params=params, dataset="syn", root=tmp_path)
    mod, fn = S.get("prepare").impl.split(":")
    importlib.import_module(mod).__dict__[fn](prep)
    path = tmp_path / "data/syn/prepared/images.parquet"
    images = pd.read_parquet(path)
    images[images["split"] != "val"].to_parquet(path, index=False)  # a dataset without val images
    (tmp_path / "data/syn/sup_vocab").mkdir(parents=True)
    (tmp_path / "data/syn/sup_vocab/stats.json").write_text('{"paired": true}')  # caption_sup's first read
    mod, fn = S.get(stage).impl.split(":")
    with pytest.raises(ValueError) as err:
        importlib.import_module(mod).__dict__[fn](ctx)
    assert str(path) in str(err.value) and "'val'" in str(err.value) and "'test': 2" in str(err.value)


# --------------------------------------------------------------------------- special files
def test_inputs_digest_skips_fifos_and_devices_in_a_folder(tmp_path):
    """Before: ``r2m inputs`` (run before ``prepare`` by both engines) hung for ever on a FIFO, or a
    link to /dev/zero, inside a folder dataset's images folder (the recipe itself skips them)."""
    from r2m.utils.digest import digest_files, expand

    images = tmp_path / "img"
    images.mkdir()
    (images / "a.png").write_bytes(b"png bytes")
    os.mkfifo(images / "pipe.jpg")
    (images / "zero.jpg").symlink_to("/dev/zero")
    (images / "gone.jpg").symlink_to(tmp_path / "nowhere")  # a broken link is still recorded (missing)
    files = expand([images])
    assert sorted(f.name for f in files) == ["a.png", "gone.jpg"]
    recs = {Path(r["path"]).name: r for r in digest_files(files)}
    assert recs["a.png"]["sha256"] == hashlib.sha256(b"png bytes").hexdigest() and recs["gone.jpg"]["missing"]


def test_inputs_digest_refuses_a_named_device(tmp_path):
    from r2m.utils.digest import digest_files
    from r2m.utils.guard import BadInput

    corpus = tmp_path / "corpus.txt"
    corpus.symlink_to("/dev/null")  # (a FIFO here would block the reader before the fix)
    with pytest.raises(BadInput, match="corpus.txt: not a regular file"):
        digest_files([corpus])


def test_folder_corpus_that_is_a_fifo_is_refused_up_front(tmp_path):
    """Before: accepted by the checks; ``r2m prepare`` then blocked for ever reading it."""
    from r2m.params import ParamsError
    from r2m.pipeline import validate as V

    (tmp_path / "img").mkdir()
    (tmp_path / "img/a.png").write_bytes(b"x")
    os.mkfifo(tmp_path / "corpus.txt")
    raw = base_params()
    raw["catalog"]["mine"] = {"kind": "folder", "images": str(tmp_path / "img"), "corpus": str(tmp_path / "corpus.txt")}
    raw["datasets"] = ["mine"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ParamsError, match="corpus.txt: not a regular file \\(a FIFO\\)"):
        V.load(path)

"""Ownership by kind, checked before the work (the guide's reliability page, "Folders r2m replaces").

Each probe states what happened on the code before the kinds (the markers then named no kind, a stage
checked its folder only when it replaced it, after the work, and Snakemake deleted a declared folder output
before the job) and checks the behaviour now: refused in one line naming the folder and the file, before
any work, the folder byte for byte as it was (SHA-256 of every file, taken before). The markers of the
probes are written here by hand (:func:`forge_marker`), as a user or an older r2m would leave them, so the
expectations do not come from the code under test. The tiny trained model and photos come from
:mod:`test_caption_own_images`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import BIN, ROOT, copy_sources
from test_caption_own_images import checkpoint, photo_folder  # noqa: F401  (module fixtures: a tiny model, photos)
from test_hostile_inputs import cli, digest_tree, one_line

MARK = ".r2m-owned.json"


def forge_marker(folder: Path, kind: str | None, files: str = "all") -> None:
    """An ownership marker in ``folder``: ``kind`` (None: none, as an older r2m wrote it) and every file
    below it with its size and SHA-256 (``files="null"``: ``"files": null``)."""
    record = None
    if files == "all":
        record = {p.relative_to(folder).as_posix(): [p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()]
                  for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MARK}
    doc = {"by": "r2m", "files": record, **({"kind": kind} if kind else {})}
    (folder / MARK).write_text(json.dumps(doc))


def fill(folder: Path, names: tuple[str, ...]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(f"{name} of the run\n".encode() * 50)
    return folder


def no_caption_printed(out: str) -> None:
    assert "\t" not in out, out  # no path<TAB>caption line: nothing was captioned


# --------------------------------------------------------------------------- item 1: a gallery onto another kind
OTHER_OUTPUTS = {  # folder -> (its kind as the stage runner marks it, the files the stage writes)
    "models/demo/r2m/s0/train_i": ("stage:train_i", ("model.pt", "inference.json", "params.yaml")),
    "data/demo/prepared": ("stage:prepare", ("images.parquet", "corpus.txt", "manifest.json", "params.yaml")),
    "reports/figures/demo": ("stage:figures", ("table3_curves.png", "params.yaml")),
}


@pytest.mark.parametrize("kinded", [True, False], ids=["marker-with-kind", "marker-of-an-older-r2m"])
@pytest.mark.parametrize("rel", sorted(OTHER_OUTPUTS))
def test_gallery_never_replaces_another_commands_output(rel, kinded, checkpoint, photo_folder, tmp_path,  # noqa: F811
                                                        capsys):
    """Item 1: ``r2m caption coffee.jpg --html models/demo/r2m/s0/train_i``. Before: exit 0, a gallery where
    model.pt, inference.json and params.yaml were (the folder was r2m's and unchanged). After: refused before
    anything is captioned, naming the folder and what made it; a marker without a kind (every marker of a
    workspace made before the kinds) is read as protecting its folder from every command but the stage that
    declares it, and the error says so."""
    kind, names = OTHER_OUTPUTS[rel]
    folder = fill(tmp_path / rel, names)
    forge_marker(folder, kind if kinded else None)
    before = digest_tree(folder)
    assert cli("caption", photo_folder / "coffee.jpg", "--model", checkpoint, "--html", folder) == 2
    out, err = capsys.readouterr()
    line = one_line(err, "--html", str(folder))
    assert (kind.removeprefix("stage:") if kinded else "names no kind") in line, line
    no_caption_printed(out)
    assert digest_tree(folder) == before


@pytest.mark.parametrize("kind", [None, "gallery"])
def test_a_marker_listing_no_files_protects_everything(kind, checkpoint, photo_folder, tmp_path, capsys):  # noqa: F811
    """Item 1, forged: ``{"by": "r2m", "files": null}`` beside the user's own file. Before: the folder was
    replaced (a marker without a file list counted as r2m's, whatever the folder held). After: a marker that
    does not list every file protects everything, of any kind."""
    folder = fill(tmp_path / "site", ("diary.txt",))
    forge_marker(folder, kind, files="null")
    before = digest_tree(folder)
    assert cli("caption", photo_folder / "coffee.jpg", "--model", checkpoint, "--html", folder) == 2
    out, err = capsys.readouterr()
    one_line(err, "--html", str(folder))
    no_caption_printed(out)
    assert digest_tree(folder) == before


def test_a_gallery_r2m_wrote_is_still_replaced_by_the_next_gallery(checkpoint, photo_folder, tmp_path, capsys):  # noqa: F811
    """The other side of the rule (held before, holds now): r2m's own gallery, unchanged, is rewritten."""
    out = tmp_path / "gallery"
    assert cli("caption", photo_folder / "chelsea.png", "--model", checkpoint, "--html", out) == 0
    assert json.loads((out / MARK).read_text())["kind"] == "gallery"
    assert cli("caption", photo_folder / "coffee.jpg", "--model", checkpoint, "--html", out) == 0
    assert "coffee.jpg" in (out / "index.html").read_text() and "chelsea.png" not in (out / "index.html").read_text()


# --------------------------------------------------------------------------- output paths, before the work
def test_html_empty_is_refused(checkpoint, photo_folder, capsys):  # noqa: F811
    """``--html ""``. Before: the images were captioned and no gallery written, without a word (exit 0)."""
    assert cli("caption", photo_folder / "coffee.jpg", "--model", checkpoint, "--html", "") == 2
    out, err = capsys.readouterr()
    one_line(err, "--html", "empty")
    no_caption_printed(out)


@pytest.mark.parametrize("below", ["gal", "gal/deeper"])
def test_html_below_a_file_is_refused_before_captioning(below, checkpoint, photo_folder, tmp_path, capsys):  # noqa: F811
    """``--html a/page.html/gal``. Before: every image captioned (a minute on 300 photos), then "File exists".
    After: refused first, in one line naming the file in the way."""
    page = tmp_path / "a" / "page.html"
    page.parent.mkdir()
    page.write_text("<p>mine</p>\n")
    assert cli("caption", photo_folder / "coffee.jpg", "--model", checkpoint, "--html", page / below) == 2
    out, err = capsys.readouterr()
    one_line(err, "--html", str(page), "is a file")
    no_caption_printed(out)
    assert page.read_text() == "<p>mine</p>\n"


# --------------------------------------------------------------------------- item 2: a stage run directly
TRAIN_I = "models/syn/r2m/s0/train_i"


@pytest.fixture
def stage_ws(tmp_path, monkeypatch):
    """A workspace for ``r2m train_i`` on a dataset of the catalog (nothing else in it), and the stage's work
    function replaced by one that records being called: a refusal must come before it."""
    import r2m.training.stages as training_stages

    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"datasets": ["syn"], "catalog": {"syn": {"kind": "tiny"}}}))
    called: list[str] = []

    def work(ctx):
        called.append(ctx.stage.name)
        raise RuntimeError("the work started")

    monkeypatch.setattr(training_stages, "run", work)
    return tmp_path, called


def run_train_i() -> int:
    return cli("train_i", "--dataset", "syn", "--variant", "r2m", "--seed", "0", "--params", "p.yaml",
               "--no-log-file")


def error_line(err: str, *names: str) -> str:
    """The one ERROR line of a stage run's log (the runner logs an INFO line before it)."""
    assert "Traceback" not in err, err[-2000:]
    errors = [ln for ln in err.splitlines() if " ERROR " in ln]
    assert len(errors) == 1, err[-2000:]
    for n in names:
        assert n in errors[0], (n, errors[0])
    return errors[0]


def _users_file(folder: Path) -> str:
    fill(folder, ("model.pt", "inference.json", "params.yaml"))
    forge_marker(folder, "stage:train_i")
    (folder / "notes.txt").write_text("my notes on this model\n")
    return "notes.txt"


def _a_gallery(folder: Path) -> str:
    fill(folder / "images", ("0000.jpg",))
    fill(folder, ("index.html",))
    forge_marker(folder, "gallery")
    return "gallery"


def _files_null(folder: Path) -> str:
    fill(folder, ("model.pt", "params.yaml"))
    forge_marker(folder, "stage:train_i", files="null")
    return "lists no files"


@pytest.mark.parametrize("make", [_users_file, _a_gallery, _files_null], ids=["users-file", "gallery", "files-null"])
def test_stage_refuses_its_output_folder_before_the_work(make, stage_ws, capsys):
    """Item 2: a user's ``notes.txt`` inside ``models/demo/r2m/s0/train_i``, ``r2m train_i`` run directly.
    Before: refused only when the model was written, after the training (75 s on the demo); a gallery there,
    or a marker listing no files, was replaced. After: refused in one line before the stage's work starts
    (its work function is never called), the folder unchanged."""
    root, called = stage_ws
    folder = root / TRAIN_I
    name = make(folder)
    before = digest_tree(folder)
    assert run_train_i() == 2
    error_line(capsys.readouterr().err, "train_i", TRAIN_I, name)
    assert called == [] and digest_tree(folder) == before


def test_stage_output_below_a_file_is_refused_before_the_work(stage_ws, capsys):
    """An output path whose parent is a file (``models/syn/r2m`` written by hand as a file). Before: the
    training ran, then the model could not be written (NotADirectoryError). After: refused first."""
    root, called = stage_ws
    (root / "models/syn").mkdir(parents=True)
    (root / "models/syn/r2m").write_text("not a folder\n")
    assert run_train_i() == 2
    error_line(capsys.readouterr().err, "models/syn/r2m", "is a file")
    assert called == [] and (root / "models/syn/r2m").read_text() == "not a folder\n"


def test_stage_file_output_where_a_folder_is_refused_before_the_work(stage_ws, capsys):
    """``results/syn/r2m/s0/train_i/train_metrics.json`` is a folder of the user's. Before: the training
    ran, then writing the metrics failed. After: refused first, the folder kept."""
    root, called = stage_ws
    folder = fill(root / "results/syn/r2m/s0/train_i/train_metrics.json", ("mine.txt",))
    before = digest_tree(folder)
    assert run_train_i() == 2
    error_line(capsys.readouterr().err, "train_metrics.json", "is a folder")
    assert called == [] and digest_tree(folder) == before


def test_stage_adopts_its_own_output_from_an_older_r2m(stage_ws, capsys):
    """Not a probe, the other side: the stage's own declared folder as an older r2m left it (a marker with no
    kind, every file listed, params.yaml among them) is the stage's: the work runs (here it fails on purpose)
    and the marker now names the stage."""
    root, called = stage_ws
    folder = fill(root / TRAIN_I, ("model.pt", "inference.json", "params.yaml"))
    forge_marker(folder, None)
    assert run_train_i() == 1 and called == ["train_i"]
    assert json.loads((folder / MARK).read_text())["kind"] == "stage:train_i"
    capsys.readouterr()


# --------------------------------------------------------------------------- item 2 under the engines
def test_snakemake_forcerun_refuses_a_job_whose_folder_holds_a_users_file(tmp_path):
    """Item 2 under Snakemake: ``snakemake --forcerun <stage>`` deletes the job's declared folder output before
    the job runs (and again when it fails). Before: the user's notes.txt in it was gone without a word. After:
    the Snakefile's ``onstart`` checks every planned job's folders before the first job starts: one line
    naming the job, the folder and the file; no job runs, the folder is as it was."""
    copy_sources(ROOT, tmp_path, ("Snakefile", "workflow", "params.yaml", "src", "data/demo", "data/dictionaries"))
    folder = fill(tmp_path / "data/demo/references", ("references.json", "params.yaml"))
    forge_marker(folder, "stage:references")
    (folder / "notes.txt").write_text("which captions I fixed by hand\n")
    before = digest_tree(folder)
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "R2M_THREADS": "1"}
    r = subprocess.run([str(BIN / "snakemake"), "--cores", "1", "data/demo/references/references.json",
                        "--forcerun", "references"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)  # the target first: --forcerun takes every name after it
    assert r.returncode != 0, r.stdout[-2000:] + r.stderr[-2000:]
    refusals = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("r2m: ")]
    assert len(refusals) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    for name in ("references", "data/demo/references", "notes.txt"):
        assert name in refusals[0], (name, refusals[0])
    assert digest_tree(folder) == before
    assert not (tmp_path / "data/demo/prepared").exists()  # no job started (inputs, prepare came first)
    assert not (tmp_path / ".snakemake/locks").exists() or not any((tmp_path / ".snakemake/locks").iterdir())
    (folder / "notes.txt").unlink()  # the folder r2m's again: the same command runs (inputs, prepare, references)
    r = subprocess.run(r.args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert json.loads((folder / MARK).read_text())["kind"] == "stage:references"
    assert "annotations" in json.loads((folder / "references.json").read_text())


def test_dvc_never_deletes_a_folder_output_before_its_command():
    """Item 2 under DVC: ``dvc repro`` deletes a stage's outputs before its command runs unless they are
    ``persist``. Before: the folders of prepare, references, detect_concepts, corpus_concepts, build_vocab,
    build_sup_vocab, figures, inspect_sup and report_baselines were not, so a user's file in one went with it.
    After: every folder output of dvc.yaml is persist (r2m replaces it itself, checked before the work)."""
    doc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    from r2m.stage.registry import STAGES

    folders = {o.path for s in STAGES for o in s.outs.values() if o.directory}
    assert len(folders) >= 15
    seen = set()
    for entry in doc["stages"].values():
        body = entry.get("do", entry)
        for item in body.get("outs", []):
            path, opts = (next(iter(item.items())) if isinstance(item, dict) else (item, {}))
            template = path.replace("${item.", "{")
            if template in folders:
                seen.add(template)
                assert (opts or {}).get("persist") is True, path
    assert seen == folders


# --------------------------------------------------------------------------- other output paths
@pytest.mark.parametrize("out", ["", "notes.txt/metrics.json"], ids=["empty", "below-a-file"])
def test_evaluate_out_empty_or_below_a_file_is_refused_before_scoring(out, tmp_path, monkeypatch, capsys):
    """``r2m evaluate --out ""`` / ``--out notes.txt/metrics.json``. Before: the captions were scored and
    printed, and the metrics written nowhere without a word (empty) or lost to NotADirectoryError (below a
    file). After: refused first, in one line, nothing printed on stdout."""
    monkeypatch.chdir(tmp_path)
    refs = {"images": [{"id": 1}, {"id": 2}], "annotations": [{"image_id": 1, "caption": "a dog on a bench"},
                                                              {"image_id": 2, "caption": "a cat on a mat"}]}
    Path("refs.json").write_text(json.dumps(refs))
    Path("res.json").write_text(json.dumps([{"image_id": 1, "caption": "a dog"}, {"image_id": 2, "caption": "a cat"}]))
    Path("notes.txt").write_text("mine\n")
    assert cli("evaluate", "--results", "res.json", "--references", "refs.json", "--scorers", "bleu",
               "--out", out) == 2
    stdout, err = capsys.readouterr()
    one_line(err, "--out", "empty" if not out else "notes.txt")
    assert stdout == "" and Path("notes.txt").read_text() == "mine\n"


def test_a_filling_marker_vouches_for_nothing(tmp_path):
    """An older r2m let a marker saying ``filling`` skip the file-list check for its own kind: a forged one
    emptied a user's folder. Now no command fills a folder in place (each is written whole beside it and
    renamed), and a marker vouches only for the files it lists with their digests: a file it does not list
    protects the folder from every command, the kind the marker names included."""
    from r2m.utils.owner import NotOwned, check_owned, mark_owned

    out = tmp_path / "features"
    out.mkdir()
    (out / "parts").mkdir()
    (out / "parts" / "shard-00000.h5").write_bytes(b"half a run")
    (out / MARK).write_text(json.dumps({"by": "r2m", "kind": "stage:extract_features", "filling": True, "files": {}}))
    for kind in ("stage:extract_features", "gallery", "stage:train_i"):
        with pytest.raises(NotOwned):
            check_owned(out, kind=kind)
    assert (out / "parts" / "shard-00000.h5").read_bytes() == b"half a run"
    mark_owned(out, "stage:extract_features")  # every file listed: its own stage may replace it, no other
    check_owned(out, kind="stage:extract_features")
    with pytest.raises(NotOwned):
        check_owned(out, kind="gallery")

"""Hostile and careless inputs, part A: names are data, params are strict, and every bad
command-line input gives ONE clear line naming the file, key or option: no traceback, exit non-zero,
nothing already computed damaged. Beside :mod:`test_faults` (kills, preemption, malformed stage
inputs), this suite covers what a new (or careless, or hostile) user types.

Kept fast: commands run in-process (``r2m.cli.main``) on tiny fixtures; a subprocess only where the
case is a process property (a signal, ``ulimit -f``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from test_caption_own_images import checkpoint, photo_folder  # noqa: F401  (module fixtures: a tiny model, photos)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "R2M_NO_PROGRESS": "1", "R2M_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.update(extra)
    return env


def one_line(err: str, *names: str) -> str:
    """The single non-empty stderr line (no traceback), which names each of ``names``."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err[-2000:]
    assert len(lines) == 1, err[-2000:]
    for n in names:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def digest_tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def cli(*args: object) -> int:
    from r2m.cli import main

    try:
        return main([str(a) for a in args])
    except SystemExit as stop:  # argparse: the console script exits with this code
        return int(stop.code or 0)


# --------------------------------------------------------------------------- params
def base_params() -> dict:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["datasets"] = ["tiny"]
    return raw


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A working folder (inside ``tmp_path``) with something already computed in it."""
    wd = tmp_path / "repo"
    (wd / "data/tiny/prepared").mkdir(parents=True)
    (wd / "data/tiny/prepared/manifest.json").write_text('{"done": true}\n')
    monkeypatch.chdir(wd)
    return wd


def _with_dataset(name: str, **entry) -> dict:
    raw = base_params()
    raw["catalog"][name] = {"kind": "tiny", **entry}
    raw["datasets"] = [name]
    return raw


def _yaml(raw: dict) -> str:
    return yaml.safe_dump(raw, sort_keys=False)


def _steps_true() -> dict:
    raw = base_params()
    raw["train_xe"]["steps"] = True
    return raw


def _lr_inf() -> dict:
    raw = base_params()
    raw["train_xe"]["lr"] = float("inf")
    return raw


def _string_number() -> dict:
    raw = base_params()
    raw["caption"]["batch_size"] = "64"
    return raw


def _misspelt(key: str) -> dict:
    raw = base_params()
    raw["catalog"]["tiny"][key] = 4
    return raw


def _prepare_section() -> dict:
    raw = base_params()
    raw["prepare"] = {"x": 1}  # a section no stage reads: refused, not silently ignored
    return raw


def _unknown_kind() -> dict:
    raw = base_params()
    raw["catalog"]["tiny"]["kind"] = "nope"
    return raw


# id -> (params file content (text, bytes or a mapping), command after `r2m`, dataset, words the line names)
PARAMS_CASES = {
    "name_shell_injection": (_with_dataset("x;touch PWNED;#"), "prepare", "x;touch PWNED;#", ["x;touch PWNED;#"]),
    "name_escapes_root": (_with_dataset("../escaped"), "prepare", "../escaped", ["../escaped"]),
    "name_parenthesis": (_with_dataset("my(photos"), "prepare", "my(photos", ["my(photos"]),
    "misspelt_catalog_key": (_misspelt("n_test_image"), "prepare", "tiny", ["catalog.tiny", "n_test_image"]),
    "duplicate_yaml_key": (_yaml(base_params()) + "datasets: [tiny]\n", "prepare", "tiny", ["datasets", "twice"]),
    "bool_as_number": (_steps_true(), "prepare", "tiny", ["train_xe.steps"]),
    "non_finite_number": (_lr_inf(), "prepare", "tiny", ["train_xe.lr", "finite"]),
    "string_as_number": (_string_number(), "prepare", "tiny", ["caption.batch_size"]),  # own probe
    "non_utf8_params": (_yaml(base_params()).encode() + b"# caf\xe9\n", "prepare", "tiny", ["UTF-8"]),
    "unread_prepare_section": (_prepare_section(), "prepare", "tiny", ["prepare"]),
    "datasets_on_invalid_params": (_unknown_kind(), "datasets", None, ["catalog.tiny.kind", "nope"]),
}


@pytest.mark.parametrize("case", sorted(PARAMS_CASES))
def test_bad_params_one_line(case, repo, capsys):
    content, command, dataset, names = PARAMS_CASES[case]
    path = repo / "bad.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else _yaml(content))
    before = digest_tree(repo / "data")
    args = [command, *(["--dataset", dataset] if dataset else []), "--params", path]
    assert cli(*args) == 2
    one_line(capsys.readouterr().err, str(path), *names)
    assert digest_tree(repo / "data") == before  # nothing computed or damaged
    assert not (repo.parent / "escaped").exists() and not (repo / "PWNED").exists()
    assert not (repo / "logs").exists() or not any((repo / "logs").rglob("*.log"))


def test_params_naming_a_folder(repo, capsys):
    assert cli("prepare", "--dataset", "tiny", "--params", repo / "data") == 2
    one_line(capsys.readouterr().err, "data", "folder")


def test_params_naming_a_fifo_does_not_block(repo, capsys):  # own probe: reading it would wait forever
    os.mkfifo(repo / "p.yaml")
    assert cli("datasets", "--params", repo / "p.yaml") == 2
    one_line(capsys.readouterr().err, "p.yaml", "FIFO")


def test_repo_params_stay_valid():
    from r2m import params as P

    p = P.load(ROOT / "params.yaml")
    assert p.train_xe.lr > 0 and all(P.NAME_PATTERN.fullmatch(n) for n in p.catalog)
    assert P.yaml_load("lr: 1e-4") == {"lr": 1e-4}  # YAML 1.2 exponent floats are numbers, not strings
    assert P.yaml_load("a: &x {b: 1}\nc: {<<: *x, b: 2}\n") == {"a": {"b": 1}, "c": {"b": 2}}  # merge keys


# --------------------------------------------------------------------------- runtime and options
def _valid_params(repo: Path) -> Path:
    path = repo / "params.yaml"
    path.write_text(_yaml(base_params()))
    return path


ENV_CASES = {  # id -> (env, command, words)
    "R2M_THREADS_abc": ({"R2M_THREADS": "abc"}, ["prepare", "--dataset", "tiny"], ["R2M_THREADS", "abc"]),
    "R2M_PROGRESS_SECONDS_abc": ({"R2M_PROGRESS_SECONDS": "abc"}, ["prepare", "--dataset", "tiny"],
                                 ["R2M_PROGRESS_SECONDS", "abc"]),
    "R2M_DEVICE_bogus": ({"R2M_DEVICE": "bogus"}, ["prepare", "--dataset", "tiny"], ["R2M_DEVICE", "bogus"]),  # own
    "stage_device_bogus": ({}, ["prepare", "--dataset", "tiny", "--device", "bogus"], ["--device", "bogus"]),
    "nproc_abc": ({}, ["train_xe", "--dataset", "tiny", "--variant", "r2m", "--nproc", "abc"], ["--nproc", "abc"]),
}


@pytest.mark.parametrize("case", sorted(ENV_CASES))
def test_bad_runtime_settings_one_line(case, repo, monkeypatch, capsys):
    env, command, names = ENV_CASES[case]
    params = _valid_params(repo)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = digest_tree(repo / "data")
    assert cli(*command, "--params", params) == 2
    one_line(capsys.readouterr().err, *names)
    assert digest_tree(repo / "data") == before


CAPTION_OPTION_CASES = {  # id -> (extra arguments, words); the model folder does not exist: checked first
    "device_bogus": (["--device", "bogus"], ["--device", "bogus"]),
    "beam_negative": (["--beam", "-1"], ["--beam", "-1"]),
    "batch_size_negative": (["--batch-size", "-1"], ["--batch-size", "-1"]),
    "max_len_zero": (["--max-len", "0"], ["--max-len"]),  # own probe
}


@pytest.mark.parametrize("case", sorted(CAPTION_OPTION_CASES))
def test_caption_bad_option_one_line(case, tmp_path, capsys):
    extra, names = CAPTION_OPTION_CASES[case]
    img = tmp_path / "a.png"
    Image.new("RGB", (40, 40)).save(img)
    assert cli("caption", img, "--model", tmp_path / "nowhere", *extra) == 2
    one_line(capsys.readouterr().err, *names)


@pytest.mark.parametrize("kind", ["file", "foreign_folder"])
def test_caption_html_onto_existing_refused_before_captioning(kind, tmp_path, capsys):
    img = tmp_path / "a.png"
    Image.new("RGB", (40, 40)).save(img)
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("precious\n")
    else:  # own probe: a folder that is not a gallery is never replaced
        out.mkdir()
        (out / "thesis.tex").write_text("precious\n")
    before = out.read_text() if kind == "file" else digest_tree(out)
    # the model folder does not exist: refused before any model is loaded or image captioned
    assert cli("caption", img, "--model", tmp_path / "nowhere", "--html", out) == 2
    one_line(capsys.readouterr().err, "--html", str(out))
    assert (out.read_text() if kind == "file" else digest_tree(out)) == before


@pytest.mark.parametrize("kind", ["fifo", "symlink_loop"])
def test_caption_fifo_or_link_loop_one_line(kind, tmp_path, capsys):
    p = tmp_path / "x.png"
    if kind == "fifo":
        os.mkfifo(p)
    else:
        os.symlink(tmp_path / "y.png", p)
        os.symlink(p, tmp_path / "y.png")
    assert cli("caption", p, "--model", tmp_path / "nowhere") == 1
    one_line(capsys.readouterr().err, str(p), "FIFO" if kind == "fifo" else "link loop")


def _model_copy(checkpoint: Path, tmp_path: Path) -> Path:  # noqa: F811
    folder = tmp_path / "model"
    shutil.copytree(checkpoint, folder)
    return folder


def test_caption_model_of_precomputed_dataset(checkpoint, photo_folder, tmp_path, capsys):  # noqa: F811
    model = _model_copy(checkpoint, tmp_path)
    info = json.loads((model / "inference.json").read_text())
    info["detect_concepts"] = {"backend": "precomputed", "options": {}, "batch_size": 2, "min_side": 8}
    (model / "inference.json").write_text(json.dumps(info))
    assert cli("caption", photo_folder / "chelsea.png", "--model", model) == 2
    one_line(capsys.readouterr().err, "--model", "precomputed")


@pytest.mark.parametrize("content", ["{not json", "[]", '{"itos": ["<pad>"]}'])
def test_caption_corrupt_inference_json(content, checkpoint, photo_folder, tmp_path, capsys):  # noqa: F811
    model = _model_copy(checkpoint, tmp_path)
    (model / "inference.json").write_text(content)
    assert cli("caption", photo_folder / "chelsea.png", "--model", model) == 1
    one_line(capsys.readouterr().err, "inference.json")


# --------------------------------------------------------------------------- caption output and gallery
def test_caption_default_output_unambiguous(checkpoint, photo_folder, tmp_path, capsys):  # noqa: F811
    names = ["plain.png", "tab\there.png", "new\nline.png", '"quoted.png', "sep\u2028line.png"]
    for n in names:
        shutil.copyfile(photo_folder / "chelsea.png", tmp_path / n)
    assert cli("caption", *(tmp_path / n for n in names), "--model", checkpoint) == 0
    out = capsys.readouterr().out
    lines = out.split("\n")[:-1]  # only "\n" ends a line: every other separator is escaped
    assert len(lines) == len(names), out
    got = []
    for ln in lines:
        field = ln.rsplit("\t", 1)[0] if not ln.startswith('"') else json.JSONDecoder().raw_decode(ln)[0]
        got.append(Path(field).name)
    assert got == names
    from r2m.caption_cli import path_field

    assert path_field("plain.png") == "plain.png" and json.loads(path_field('"q')) == '"q'
    assert cli("caption", tmp_path / "tab\there.png", "--model", checkpoint, "--json") == 0  # --json stays exact
    assert json.loads(capsys.readouterr().out)["captions"][0]["path"] == str(tmp_path / "tab\there.png")


def test_gallery_file_name_cannot_inject_markup(checkpoint, photo_folder, tmp_path, capsys):  # noqa: F811
    evil = tmp_path / 'e.png" onerror="alert(1)'
    shutil.copyfile(photo_folder / "chelsea.png", evil)
    out = tmp_path / "gallery"
    assert cli("caption", evil, "--model", checkpoint, "--html", out) == 0
    page = (out / "index.html").read_text()
    assert 'onerror="' not in page and "&#34; onerror=&#34;" in page
    assert sorted(p.name for p in (out / "images").iterdir()) == ["0000"]  # our own name, no suffix of theirs


def test_gallery_on_full_disk_keeps_the_old_one(checkpoint, photo_folder, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "gallery"
    assert cli("caption", photo_folder / "chelsea.png", "--model", checkpoint, "--html", out) == 0
    capsys.readouterr()
    before = digest_tree(out)
    big = tmp_path / "big.png"  # incompressible: a few MB, over the file-size limit below
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (900, 900, 3), dtype=np.uint8)).save(big)
    cmd = f"ulimit -f 1024; exec {BIN / 'r2m'} caption {big} --model {checkpoint} --html {out}"
    r = subprocess.run(["bash", "-c", cmd], env=_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-2000:]
    one_line(r.stderr, "disk full", str(out))
    assert digest_tree(out) == before  # the old gallery, whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".gallery")] == []  # no half-written copy


# --------------------------------------------------------------------------- files a stage reads
def test_last_pt_without_rng_state_says_fresh(tmp_path):
    import logging

    import torch

    from r2m.training.loop import restore_last
    from r2m.utils.checkpoint import CheckpointError

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.save({"model": {"state_dict": model.state_dict()}, "optimizer": opt.state_dict(), "step": 3,
                "rows": [], "rng": {}, "fingerprint": "fp"}, tmp_path / "last.pt")
    with pytest.raises(CheckpointError) as err:
        restore_last(logging.getLogger("t"), "train_xe", tmp_path, "fp", model, opt)
    msg = str(err.value)
    assert "\n" not in msg and "last.pt" in msg and "RNG" in msg and "--fresh" in msg


def test_truncated_features_h5(tmp_path):
    import h5py

    from r2m.vision.feature_store import load_features

    folder = tmp_path / "features"
    folder.mkdir()
    with h5py.File(folder / "features.h5", "w") as f:
        f.create_dataset("pooled", data=np.ones((64, 32), dtype=np.float16))
    import pandas as pd

    pd.DataFrame({"image_id": [str(i) for i in range(64)], "row": range(64)}).to_parquet(folder / "index.parquet")
    data = (folder / "features.h5").read_bytes()
    (folder / "features.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as err:
        load_features(folder)
    assert "\n" not in str(err.value) and "features.h5" in str(err.value) and "truncated" in str(err.value)


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage\x00\x81", b"id;file;why\n1;a;b\n"])
def test_garbage_bad_images_csv(content, tmp_path):
    from r2m.evaluation.stage import unreadable_images

    path = tmp_path / "bad_images.csv"
    path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        unreadable_images(path, ["1"])
    assert "\n" not in str(err.value) and "bad_images.csv" in str(err.value)


def test_disk_full_message_names_the_target():
    import errno

    from r2m.utils.guard import disk_full_message

    err = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "src.png", None, "out/images/0000.png")
    msg = disk_full_message(err)
    assert "disk full" in msg and "out/images/0000.png" in msg and "\n" not in msg


# --------------------------------------------------------------------------- processes and generated commands
def test_sigterm_to_evaluate_one_line(tmp_path):
    (tmp_path / "params.yaml").write_text(_yaml(base_params()))
    code = ("import os, signal, sys, r2m.evaluation.stage as st\n"
            "st.run = lambda ctx: os.kill(os.getpid(), signal.SIGTERM)\n"
            "from r2m.cli import main\n"
            "sys.exit(main(['evaluate', '--dataset', 'tiny', '--variant', 'r2m', '--ckpt', 'train_i']))\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 143, r.stderr[-2000:]
    one_line(r.stderr.split("r2m evaluate dataset=", 1)[-1].split("\n", 1)[-1], "SIGTERM", "evaluate")


def test_snakemake_jobs_exec_r2m_and_quote_paths():
    text = (ROOT / "workflow/rules/stages.smk").read_text()
    shells = [ln.strip() for ln in text.splitlines() if "{params.cmd}" in ln]
    assert shells and all("exec {R2M} {params.cmd}" in s and "> {log:q}" in s for s in shells), shells


def test_generated_commands_quote_names():
    from types import SimpleNamespace

    from r2m.pipeline.dag import render
    from r2m.pipeline.snake import stage_command, wildcard_constraints_for
    from r2m.stage.registry import BY_NAME

    wc = SimpleNamespace(dataset="x;touch PWNED;#")
    assert "'x;touch PWNED;#'" in stage_command("r2m", BY_NAME["prepare"], wc, "p.yaml")
    from r2m import params as P

    cmds = [ln for ln in render(P.validate(base_params())).splitlines() if ln.strip().startswith("cmd:")]
    assert cmds and all("${" not in c or "'${item." in c for c in cmds), cmds

    raw = base_params()
    raw["catalog"]["a.b"] = {"kind": "tiny"}
    assert r"a\.b" in wildcard_constraints_for(P.validate(raw))["dataset"]  # '.' matches only itself

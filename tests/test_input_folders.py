"""A stage's input folders checked on use: an incomplete folder (a key file missing, a file the ownership marker
lists changed) is refused in one line naming the file and the stage to rerun."""

from __future__ import annotations

from pathlib import Path

import yaml

from r2m.pipeline import validate as V

ROOT = Path(__file__).resolve().parents[1]


def small_raw() -> dict:
    """params.yaml on `tiny` with two variants and two baselines."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw.update(datasets=["tiny"], variants=["r2m", "no_fm"])
    raw["baselines"].update(datasets=["tiny", "demo"], models=["mrnn", "sat"])
    return raw


def test_a_stage_refuses_an_incomplete_input_folder_in_one_line(tmp_path, monkeypatch, capsys):
    """An incomplete input folder found when used: `evaluate` on a prepared folder without its images.parquet
    names the file in one line, no traceback."""
    from r2m.cli import main

    raw = small_raw()
    raw["baselines"]["datasets"] = ["tiny"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    prepared = tmp_path / "data/tiny/prepared"
    prepared.mkdir(parents=True)
    for name in ("references.json", "corpus.txt", "manifest.json"):
        (prepared / name).write_text("{}")
    monkeypatch.chdir(tmp_path)
    rc = main(["evaluate", "--dataset", "tiny", "--variant", "r2m", "--ckpt", "train_s", "--params", "params.yaml",
               "--no-log-file"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "Traceback" not in "\n".join(err)
    assert "data/tiny/prepared/images.parquet is missing" in err[-1] and "re-run prepare" in err[-1]
    assert len([ln for ln in err if "missing" in ln]) == 1


def test_a_checkpoint_dependency_names_the_folder_of_its_ckpt(tmp_path):
    """`caption`'s `models/{dataset}/{variant}/s{seed}/{ckpt}` at ckpt=train_s is train_s's folder: its model.pt is
    required (the issue's case: caption on a train_s folder whose model.pt was deleted)."""
    from r2m.stage.context import StageContext
    from r2m.stage.registry import get

    folder = tmp_path / "models/tiny/r2m/s0/train_s"
    folder.mkdir(parents=True)
    (folder / "params.yaml").write_text("{}\n")
    ctx = StageContext(stage=get("caption"), params=V.validate(small_raw(), "test"), dataset="tiny", variant="r2m",
                       ckpt="train_s", root=tmp_path)
    lines = ctx.incomplete_inputs()
    assert len(lines) == 1 and lines[0].startswith(f"{folder / 'model.pt'} is missing") and "re-run train_s" in lines[0]
    (folder / "model.pt").write_bytes(b"")
    assert ctx.incomplete_inputs() == []


def test_a_file_the_ownership_marker_lists_is_checked_on_use(tmp_path):
    """Beyond the key files: a file r2m wrote into a folder (its marker lists it) and that is gone, or of
    another size, makes the folder incomplete for every consumer."""
    from r2m.stage.context import StageContext
    from r2m.stage.registry import get
    from r2m.utils.owner import mark_owned

    folder = tmp_path / "data/tiny/corpus"
    folder.mkdir(parents=True)
    for name, text in (("corpus.parquet", "x"), ("stats.json", "{}"), ("params.yaml", "{}\n")):
        (folder / name).write_text(text)
    mark_owned(folder)
    ctx = StageContext(stage=get("build_vocab"), params=V.validate(small_raw(), "test"), dataset="tiny", root=tmp_path)
    assert ctx.incomplete_inputs() == []
    (folder / "params.yaml").write_text("{}\n# longer\n")
    assert ctx.incomplete_inputs() == [f"{folder / 'params.yaml'} changed size since it was written: {folder} "
                                       "(output of corpus_concepts) is incomplete; re-run corpus_concepts "
                                       "(snakemake and dvc repro rebuild it)"]
    (folder / "params.yaml").unlink()
    assert ctx.incomplete_inputs()[0].startswith(f"{folder / 'params.yaml'} is missing: ")

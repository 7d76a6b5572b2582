"""Input checks before the expensive part: every bad input is one line naming the file, option or
record, said before detection, training or decoding starts; and ``r2m caption`` shows its work as it
goes. Each probe failed on the code before these checks (what it did then: in its docstring).

Kept fast: in-process commands on tiny fixtures; subprocesses only for a signal (``r2m warm``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from r2m import params as P
from test_caption_own_images import checkpoint, photo_folder  # noqa: F401  (module fixtures: a tiny model, photos)
from test_hostile_inputs import one_line

ROOT = Path(__file__).resolve().parents[1]


def _raw(**top) -> dict:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw.update(top)
    return raw


def _caption(*args: object) -> int:
    from r2m.cli import main

    try:
        return main(["caption", *map(str, args)])
    except SystemExit as stop:
        return int(stop.code or 0)


_one_line = one_line  # the single stderr line naming each of the names (test_hostile_inputs)


# --------------------------------------------------------------------------- nesting depth
def test_a_deeply_nested_references_file_is_one_line_naming_it(tmp_path, capsys):
    """Before: 50,000 nested lists in the references file: a RecursionError traceback from `r2m compare`."""
    from r2m.evaluation.compare import main

    deep = tmp_path / "refs.json"
    deep.write_text('{"images": ' + "[" * 50_000 + "]" * 50_000 + ', "annotations": []}')
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps([{"image_id": 1, "caption": "a dog"}]))
    assert main(["--references", str(deep), str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    _one_line(capsys.readouterr().err, "refs.json", "nested 50001 deep")


def test_brackets_inside_strings_are_no_nesting(tmp_path):
    """The depth counts lists and objects, not the brackets of a caption: 300 '[' in one caption read fine."""
    from r2m.utils.io import read_json

    f = tmp_path / "refs.json"
    doc = {"images": [{"id": 1}], "annotations": [{"image_id": 1, "caption": "[" * 300}]}
    f.write_text(json.dumps(doc))
    assert read_json(f) == doc


# --------------------------------------------------------------------------- seeds
@pytest.mark.parametrize("seeds", [[2**64], ["18446744073709551616"], [-1], ["-1"], [2**32]])
def test_a_seed_outside_what_the_rngs_take_is_refused_with_the_range(seeds):
    """Before: 2**64 passed validation and failed in training (`Overflow when unpacking long long`);
    `--config 'seeds=[-1]'` (the string "-1") said "Input should be a valid integer"."""
    with pytest.raises(P.ParamsError) as err:
        P.validate(_raw(seeds=seeds))
    assert "seeds" in str(err.value) and f"at most {2**32 - 1}" in str(err.value)
    assert "valid integer" not in str(err.value)


def test_a_section_seed_is_bounded_too():
    """Before: `train_i.seed: 2**64` passed and failed in torch.manual_seed."""
    raw = _raw()
    raw["train_i"]["seed"] = 2**64
    with pytest.raises(P.ParamsError, match=r"train_i\.seed: .*4294967295"):
        P.validate(raw)


def test_the_largest_seeds_reach_every_rng():
    """The bound is what the RNGs take: the largest section seed plus the largest run seed seeds torch,
    numpy's SeedSequence and its legacy seeding (limits from their own documentation: torch up to
    2**64 - 1, numpy's legacy seed up to 2**32 - 1)."""
    raw = _raw(seeds=[P.MAX_SEED])
    raw["train_i"]["seed"] = P.MAX_SEED
    params = P.validate(raw)
    seeded = P.with_seed(params, params.seeds[0]).train_i.seed
    assert seeded == 2 * (2**32 - 1)
    torch.manual_seed(seeded)
    torch.Generator().manual_seed(seeded)
    np.random.default_rng([seeded, 10**6, 3])
    np.random.seed(P.MAX_SEED)
    with pytest.raises(ValueError):  # one more and numpy's legacy seeding refuses it: the bound is tight
        np.random.seed(P.MAX_SEED + 1)


def test_a_stage_seed_option_out_of_range_is_one_line(tmp_path, monkeypatch, capsys):
    """Before: `r2m train_xe --seed 18446744073709551616` passed the digit check and overflowed in training."""
    from r2m.cli import main

    monkeypatch.chdir(tmp_path)  # before, the stage started: its log and outputs land here, not in the tree
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())

    assert main(["train_xe", "--dataset", "demo", "--variant", "r2m", "--seed", str(2**64)]) == 2
    _one_line(capsys.readouterr().err, "--seed", "4294967295")


# --------------------------------------------------------------------------- beam width
def test_a_huge_beam_in_params_is_refused():
    """Before: `caption.beam: 100000` passed validation (an allocator error when decoding)."""
    raw = _raw()
    raw["caption"]["beam"] = 100_000
    with pytest.raises(P.ParamsError, match=r"caption\.beam: .*100"):
        P.validate(raw)


def _model_copy(source: Path, tmp_path: Path, edit) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    for f in source.iterdir():
        if f.is_file():
            (folder / f.name).write_bytes(f.read_bytes())
    info = json.loads((folder / "inference.json").read_text())
    edit(info)
    (folder / "inference.json").write_text(json.dumps(info))
    return folder


def _no_detection(monkeypatch) -> list:
    """Record every detector built (none may be: the checks come first)."""
    import r2m.vision.detectors.factory as D

    built: list = []
    real = D.build_detector
    monkeypatch.setattr(D, "build_detector", lambda *a, **k: built.append(a) or real(*a, **k))
    monkeypatch.setattr(D, "detect_images", lambda *a, **k: built.append(a) or pytest.fail("detected"))
    return built


def test_a_huge_beam_in_a_model_folder_is_one_line_before_detection(checkpoint, photo_folder, tmp_path,  # noqa: F811
                                                                    capsys, monkeypatch):
    """Before: a model folder's `caption.beam: 100000` was decoded (an allocator error on a real vocabulary)."""
    folder = _model_copy(checkpoint, tmp_path, lambda info: info.setdefault("caption", {}).update(beam=100_000))
    built = _no_detection(monkeypatch)
    assert _caption(photo_folder / "chelsea.png", "--model", folder) == 1
    _one_line(capsys.readouterr().err, "inference.json", "caption.beam", "100000")
    assert built == []
    assert _caption(photo_folder / "chelsea.png", "--model", checkpoint, "--beam", 100_000) == 2  # a usage error
    _one_line(capsys.readouterr().err, "beam", "100000", "at most 100")
    assert built == []


# --------------------------------------------------------------------------- dictionary paths
def test_a_dictionary_path_in_a_model_folder_is_refused_before_detection(checkpoint, photo_folder, tmp_path,  # noqa: F811
                                                                         capsys, monkeypatch):
    """Before: `concepts.dictionary: ../../../etc/passwd` gave a KeyError (after the model was loaded,
    as the detector was built)."""
    folder = _model_copy(checkpoint, tmp_path,
                         lambda info: info.setdefault("concepts", {}).update(dictionary="../../../etc/passwd"))
    built = _no_detection(monkeypatch)
    assert _caption(photo_folder / "chelsea.png", "--model", folder) == 1
    _one_line(capsys.readouterr().err, "inference.json", "concepts.dictionary", "../../../etc/passwd",
              "coco80", "openimages")
    assert built == []


@pytest.mark.parametrize("name", ["../../../etc/passwd", "/etc/passwd", "openimages_v4_boxable.names", ""])
def test_load_dictionary_takes_names_never_paths(name):
    """Before: a KeyError ("unknown dictionary"), not a one-line input error."""
    from r2m.text.dictionary import load_dictionary
    from r2m.utils.guard import BadInput

    with pytest.raises(BadInput, match="not one of this project's dictionaries"):
        load_dictionary(name)


# --------------------------------------------------------------------------- folder datasets
def _folder_params(tmp_path: Path, refs: dict | None, train_refs: dict | None = None) -> Path:
    (tmp_path / "img").mkdir(exist_ok=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "img" / "a.png")
    (tmp_path / "img" / "sub").mkdir(exist_ok=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "img" / "sub" / "b.png")
    (tmp_path / "corpus.txt").write_text("a dog runs\n")
    entry = {"kind": "folder", "images": str(tmp_path / "img"), "corpus": str(tmp_path / "corpus.txt")}
    if refs is not None:
        (tmp_path / "refs.json").write_text(json.dumps(refs))
        entry["references"] = str(tmp_path / "refs.json")
    if train_refs is not None:
        (tmp_path / "train.json").write_text(json.dumps(train_refs))
        entry["train_references"] = str(tmp_path / "train.json")
    raw = _raw(datasets=["mine"])
    raw["catalog"]["mine"] = entry
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _refs(*names: tuple[int, str]) -> dict:
    return {"images": [{"id": i, "file_name": n} for i, n in names],
            "annotations": [{"image_id": i, "caption": "a dog"} for i, _ in names]}


def test_a_folder_dataset_without_references_is_refused_when_the_params_are_read(tmp_path):
    """Before: detection, features and four trainings ran before "no 'test' image"."""
    from r2m.pipeline import validate as V

    with pytest.raises(P.ParamsError) as err:
        V.load(_folder_params(tmp_path, None))
    assert "catalog.mine" in str(err.value) and "references: not given" in str(err.value)
    assert "r2m caption" in str(err.value)


def test_a_references_entry_naming_a_missing_image_fails_at_dag_time(tmp_path):
    """Before: passed the params check (and `snakemake -n`), failed in `prepare`."""
    from r2m.pipeline import validate as V

    assert V.load(_folder_params(tmp_path, _refs((1, "a.png"), (2, "b.png")))).datasets == ["mine"]  # bare name
    with pytest.raises(P.ParamsError) as err:
        V.load(_folder_params(tmp_path, _refs((1, "a.png"), (7, "gone.jpg"))))
    assert all(w in str(err.value) for w in ("refs.json", "image '7'", "'gone.jpg'", "not found"))
    with pytest.raises(P.ParamsError) as err:  # the paired training captions' images too
        V.load(_folder_params(tmp_path, _refs((1, "a.png")), _refs((3, "sub/c.png"))))
    assert all(w in str(err.value) for w in ("train.json", "image '3'", "'sub/c.png'"))


def test_a_hidden_file_named_by_the_references_is_missing_as_prepare_sees_it(tmp_path):
    """The check finds images by prepare's own rule: a hidden file is no image of the dataset."""
    from r2m.pipeline import validate as V

    path = _folder_params(tmp_path, _refs((1, ".a.png")))
    Image.new("RGB", (8, 8)).save(tmp_path / "img" / ".a.png")
    with pytest.raises(P.ParamsError, match=r"file_name '\.a\.png' not found"):
        V.load(path)


# --------------------------------------------------------------------------- r2m warm
def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc to find the server's pid")
def test_the_warm_server_ends_when_r2m_warm_is_killed(tmp_path):
    """Before: `kill -9` of `r2m warm` left its server running for ever (444 MB) with its socket folder."""
    code = ("import sys, r2m.warm.server as s; s.preload = lambda *_: []; "  # the imports are not what is tested
            "sys.exit(s.main(['--', 'sleep', '120'], target=lambda argv: 1))")
    import r2m

    env = {**os.environ, "PYTHONPATH": str(Path(r2m.__file__).parents[1]), "TMPDIR": str(tmp_path)}
    front = subprocess.Popen([sys.executable, "-c", code], env=env)
    command = server = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (command is None or server is None):
            for pid in _children(front.pid):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if cmd[:1] == [b"sleep"]:
                    command = pid
                else:
                    server = pid
            time.sleep(0.1)
        assert command is not None and server is not None
        env_of = dict(x.split(b"=", 1) for x in Path(f"/proc/{command}/environ").read_bytes().split(b"\0") if b"=" in x)
        sock = Path(env_of[b"R2M_WARM"].decode())
        assert sock.exists() and sock.parent.parent == tmp_path
        front.send_signal(signal.SIGKILL)
        front.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (_alive(server) or sock.parent.exists()):
            time.sleep(0.1)
        assert not _alive(server), "the server outlived r2m warm"
        assert not sock.parent.exists(), "the socket folder was left behind"
    finally:
        for pid in (command, server):
            if pid is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if front.poll() is None:
            front.kill()


# --------------------------------------------------------------------------- r2m caption streams
class _Recorder:
    """stdout that records, at each write, how many images had been decoded, and each flush."""

    def __init__(self, decoded: list[str]):
        self.decoded, self.writes, self.flushes = decoded, [], 0

    def write(self, text: str) -> int:
        if text.strip():
            self.writes.append((len(self.decoded), text))
        return len(text)

    def flush(self) -> None:
        self.flushes += 1

    def isatty(self) -> bool:
        return False


def test_caption_prints_each_caption_as_it_is_made(checkpoint, photo_folder, monkeypatch):  # noqa: F811
    """Before: nothing was printed until the last image was captioned (300 photos: 15 minutes of silence)."""
    import r2m.captioning.photos as photos

    decoded: list[str] = []
    real = photos.caption_detections
    monkeypatch.setattr(photos, "caption_detections",
                        lambda model, ckpt, itos, ids, *a, **k: decoded.extend(ids) or real(model, ckpt, itos, ids, *a, **k))
    out = _Recorder(decoded)
    monkeypatch.setattr(sys, "stdout", out)
    images = [photo_folder / "chelsea.png", photo_folder / "coffee.jpg"]
    assert _caption(*images, "--model", checkpoint, "--batch-size", 1) == 0
    lines = [(n, t) for n, t in out.writes if "\t" in t]
    assert [Path(t.split("\t")[0]).name for _, t in lines] == ["chelsea.png", "coffee.jpg"]
    assert lines[0][0] == 1, "the first caption waited for the second image"
    assert lines[1][0] == 2 and out.flushes >= 2


def test_caption_shows_a_progress_bar_on_stderr(checkpoint, photo_folder, monkeypatch, capsys):  # noqa: F811
    """Before: no bar of its own (a detection bar at most, none for decoding); not a terminal here, so
    the bar writes a line per R2M_PROGRESS_SECONDS (0: each update)."""
    monkeypatch.delenv("R2M_NO_PROGRESS", raising=False)
    monkeypatch.setenv("R2M_PROGRESS_SECONDS", "0")
    assert _caption(photo_folder / "chelsea.png", photo_folder / "coffee.jpg", "--model", checkpoint,
                    "--batch-size", 1) == 0
    out, err = capsys.readouterr()
    assert "caption: " in err and "2/2" in err and "detect " not in err
    assert "\r" not in out and len(out.splitlines()) == 2  # the bar stays off stdout

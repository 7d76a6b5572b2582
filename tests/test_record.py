"""The record of what a stage instance read (r2m.stage.record, r2m.utils.reads) and ``r2m why``.

Expectations are written by hand from what each code path does: the demo's first stages on the committed
demo files (a real run each, in a subprocess), a probe stage whose by-name import and second params key
depend on the run's seed, and the METEOR helper started under a recorder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from r2m.stage import record as R
from r2m.stage.spec import Out, Stage
from r2m.utils.reads import Recorder

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def r2m(ws: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "R2M_NO_PROGRESS": "1", "R2M_RECORD": "1"}
    return subprocess.run([str(BIN / "r2m"), *argv], cwd=ws, env=env, capture_output=True, text=True)


def load(ws: Path, stage: str, key: str) -> dict:
    import json

    return json.loads((ws / ".r2m" / "records" / stage / f"{key}.json").read_text())


def paths(rec: dict, kind: str | None = None) -> set[str]:
    return {e["path"] for e in rec["reads"] if kind is None or e["kind"] == kind}


@pytest.fixture(scope="module")
def demo_ws(tmp_path_factory) -> Path:
    """The committed demo files, then ``inputs``, ``prepare`` and ``corpus_concepts`` run on them."""
    ws = tmp_path_factory.mktemp("demo")
    shutil.copy(ROOT / "params.yaml", ws / "params.yaml")
    (ws / "data" / "demo").mkdir(parents=True)
    for name in ("corpus.txt", "photos.yaml", "references.json", "README.md"):
        shutil.copy(ROOT / "data" / "demo" / name, ws / "data" / "demo" / name)
    for stage in ("inputs", "prepare", "corpus_concepts"):
        done = r2m(ws, stage, "--dataset", "demo", "--no-log-file")
        assert done.returncode == 0, done.stderr[-2000:]
    return ws


def test_inputs_records_its_entry_and_the_files_its_recipe_reads(demo_ws):
    rec = load(demo_ws, "inputs", "demo")
    assert rec["stage"] == "inputs" and rec["axes"] == {"dataset": "demo"}
    mods = {e["module"]: e for e in rec["reads"] if e["kind"] == "module"}
    # the entry (r2m.datasets.inputs:run), the demo's recipe loaded by name, the params; not the runner's own modules
    for name in ("r2m.datasets.inputs", "r2m.datasets.demo", "r2m.params"):
        assert name in mods, name
    assert not {"r2m.cli", "r2m.stage.record", "r2m.utils.reads", "r2m.warm.client"} & set(mods)
    assert mods["r2m.datasets.inputs"]["sha256"] == sha(ROOT / "src/r2m/datasets/inputs.py")
    # the demo entry names its photos list and its corpus: both opened, nothing else of data/; the photos list
    # through the view of what prepare reads of it (each photo's id, package, resource and sha256)
    assert paths(rec, "file") == {"data/demo/corpus.txt"}
    assert paths(rec, "view") == {"view:demo_photos:data/demo/photos.yaml"}
    by_path = {e["path"]: e for e in rec["reads"]}
    # the SHA-256 of the view's data as compact JSON, each photo's fields in that order (a comment, or a photo's
    # description, changes nothing)
    import json

    import yaml

    said = yaml.safe_load((demo_ws / "data/demo/photos.yaml").read_text())
    fields = {"photos": [{k: p[k] for k in ("id", "package", "resource", "sha256")} for p in said["photos"]]}
    canon = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
    assert by_path["view:demo_photos:data/demo/photos.yaml"]["sha256"] == hashlib.sha256(canon.encode()).hexdigest()
    assert by_path["data/demo/corpus.txt"]["sha256"] == sha(demo_ws / "data/demo/corpus.txt")  # any other: bytes
    # its own output and the params file are not inputs; the params it read are keys, not the file
    assert not any(p.startswith("data/demo/inputs.json") or p == "params.yaml" for p in paths(rec))
    # the kind, and the recipe's one option it looked up and the entry does not set (with the default it took)
    assert [p["key"] for p in rec["params"]] == ["catalog.demo.kind", "catalog.demo.source_dir"]
    assert rec["params"][1]["default"] == rec["params"][1]["value"] == "data/demo"


def test_corpus_concepts_records_the_dictionary_a_file_inside_its_input_folder_and_keys_read(demo_ws):
    rec = load(demo_ws, "corpus_concepts", "demo")
    assert "r2m.text.stages" in {e.get("module") for e in rec["reads"]}  # its entry
    assert "data/demo/prepared/corpus.txt" in paths(rec, "file")  # inside prepare's output folder
    assert str(ROOT / "data/dictionaries/openimages_v4_boxable.names") in paths(rec, "file")
    assert paths(rec, "dep") == {"data/demo/prepared"}  # its declared input folder
    assert not any(p.startswith("data/demo/corpus") for p in paths(rec))  # its own output folder
    keys = {p["key"] for p in rec["params"]}
    assert {"corpus_concepts.min_tokens", "corpus_concepts.max_tokens", "concepts.dictionary"} <= keys
    assert not any(k.startswith(("caption.", "train_xe.", "model.")) for k in keys)


def test_why_reports_exactly_the_edited_file_and_current_after_the_rerun(demo_ws, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(demo_ws, ws)
    done = r2m(ws, "why", "inputs", "--dataset", "demo")
    assert done.returncode == 0 and done.stdout.strip() == "inputs@demo: current", done.stdout + done.stderr
    photos = ws / "data/demo/photos.yaml"
    with photos.open("a") as fh:
        fh.write("# a comment changes nothing the file says\n")
    done = r2m(ws, "why", "inputs", "--dataset", "demo")
    assert done.returncode == 0, done.stdout
    # a photo's description: neither inputs nor prepare reads it
    photos.write_text(photos.read_text().replace("description: Eileen Collins", "description: Astronaut Collins", 1))
    for stage in ("inputs", "prepare"):
        done = r2m(ws, "why", stage, "--dataset", "demo")
        assert done.returncode == 0 and done.stdout.strip() == f"{stage}@demo: current", done.stdout + done.stderr
    # its id: both read it (prepare's input, inputs.json, is still as inputs wrote it)
    photos.write_text(photos.read_text().replace("  - id: astronaut", "  - id: astronaut2", 1))
    for stage in ("inputs", "prepare"):
        done = r2m(ws, "why", stage, "--dataset", "demo")
        assert done.returncode == 1 and done.stdout.splitlines() == ["data/demo/photos.yaml: changed (view demo_photos)"]
    # a file inside another stage's output folder: the file and the declared folder holding it
    with (ws / "data/demo/prepared/corpus.txt").open("a") as fh:
        fh.write("a new sentence\n")
    done = r2m(ws, "why", "corpus_concepts", "--dataset", "demo")
    assert sorted(done.stdout.splitlines()) == ["data/demo/prepared/corpus.txt: changed (file)",
                                                "data/demo/prepared: changed (dep)"]
    assert r2m(ws, "inputs", "--dataset", "demo", "--no-log-file").returncode == 0
    done = r2m(ws, "why", "inputs", "--dataset", "demo")
    assert done.returncode == 0, done.stdout
    done = r2m(ws, "why", "table1")
    assert done.returncode == 1 and done.stdout.startswith("no record (")


# --------------------------------------------------------------------------------------------- probe stage
PROBE = '''
import importlib
from pathlib import Path

READ_EXTRA = False


def run(ctx):
    out = ctx.outs["out"]
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "even"
    if ctx.params.caption.seed % 2 == 1:  # the run's seed shifts caption.seed: odd runs take this path
        text = importlib.import_module("probe_gated").VALUE + str(ctx.params.caption.beam)
    if READ_EXTRA:
        text += Path("data/extra.txt").read_text()
    out.write_text(text)
    assert out.read_text() == text  # its own output read back: not an input
'''

PROBE_STAGE = Stage(name="probe", impl="probe:run", help="a test stage", axes=("seed",),
                    outs={"out": Out("results/probe/s{seed}/out.txt")})


@pytest.fixture
def probe_ws(tmp_path, monkeypatch):
    ws = tmp_path / "probe"
    (ws / "data").mkdir(parents=True)
    shutil.copy(ROOT / "params.yaml", ws / "params.yaml")
    (ws / "probe.py").write_text(PROBE)
    (ws / "probe_gated.py").write_text('VALUE = "odd"\n')
    (ws / "data" / "extra.txt").write_text("extra\n")
    monkeypatch.chdir(ws)
    monkeypatch.syspath_prepend(str(ws))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.delenv("R2M_RECORD", raising=False)
    return ws


def run_probe(monkeypatch, seed: str) -> None:
    from r2m import cli

    for name in ("probe", "probe_gated"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert cli.run_stage(PROBE_STAGE, ["--seed", seed, "--no-log-file"]) == 0


def stale(ws: Path, seed: str) -> list[str]:
    from r2m import params as P

    return R.stale(PROBE_STAGE, {"seed": seed}, P.load(ws / "params.yaml"), ws)


def test_a_param_gated_load_and_key_are_recorded_only_on_the_path_taken(probe_ws, monkeypatch):
    run_probe(monkeypatch, "0")
    run_probe(monkeypatch, "1")
    even, odd = load(probe_ws, "probe", "0"), load(probe_ws, "probe", "1")
    assert "probe.py" in paths(even, "module") and "probe.py" in paths(odd, "module")
    assert "probe_gated.py" not in paths(even) and "probe_gated.py" in paths(odd, "module")
    assert [p["key"] for p in even["params"]] == ["caption.seed"]
    assert [p["key"] for p in odd["params"]] == ["caption.beam", "caption.seed"]
    assert not any(p.startswith("results/") for p in paths(even) | paths(odd))  # written, read back
    # caption.beam: only the odd instance read it
    (probe_ws / "params.yaml").write_text((probe_ws / "params.yaml").read_text().replace(
        "\n  beam: 3", "\n  beam: 4", 1))
    assert stale(probe_ws, "0") == []
    assert stale(probe_ws, "1") == ["params caption.beam: changed"]
    (probe_ws / "probe_gated.py").write_text('VALUE = "odd!"\n')
    assert stale(probe_ws, "0") == []
    assert stale(probe_ws, "1") == ["probe_gated.py: changed (module)", "params caption.beam: changed"]


def test_a_rerun_that_reads_a_new_file_is_current_afterwards(probe_ws, monkeypatch):
    run_probe(monkeypatch, "0")
    assert stale(probe_ws, "0") == []
    (probe_ws / "probe.py").write_text(PROBE.replace("READ_EXTRA = False", "READ_EXTRA = True"))
    assert stale(probe_ws, "0") == ["probe.py: changed (module)"]
    run_probe(monkeypatch, "0")
    assert "data/extra.txt" in paths(load(probe_ws, "probe", "0"), "file")
    assert stale(probe_ws, "0") == []  # the new file is in the new record: not reported again
    (probe_ws / "data" / "extra.txt").write_text("changed\n")
    assert stale(probe_ws, "0") == ["data/extra.txt: changed (file)"]
    (probe_ws / "data" / "extra.txt").unlink()
    assert stale(probe_ws, "0") == ["data/extra.txt: removed (file)"]


def test_a_failed_run_leaves_no_record(probe_ws, monkeypatch):
    from r2m import cli

    run_probe(monkeypatch, "0")
    (probe_ws / "probe.py").write_text(PROBE.replace("READ_EXTRA = False", "READ_EXTRA = True"))
    (probe_ws / "data" / "extra.txt").unlink()
    monkeypatch.delitem(sys.modules, "probe", raising=False)
    assert cli.run_stage(PROBE_STAGE, ["--seed", "0", "--no-log-file"]) == 1
    assert stale(probe_ws, "0")[0].startswith("no record (")


# --------------------------------------------------------------------------------------------- METEOR
@pytest.mark.skipif(shutil.which("javac") is None, reason="the threaded METEOR helper needs a JDK")
def test_the_meteor_helper_source_is_recorded_when_meteor_runs(tmp_path):
    pytest.importorskip("pycocoevalcap")
    from r2m.evaluation.meteor import HELPER, MeteorPool
    from r2m.evaluation.paraphrase import filtered_table

    hyps = ["a dog runs on the grass", "a man rides a horse"]
    refs = [["a dog is running on grass", "the dog runs"], ["a man is riding a horse", "a person on a horse"]]
    rec = Recorder(ROOT).start()
    try:
        table = filtered_table(hyps, refs, tmp_path / "paraphrase.gz")
        with MeteorPool(1, 2, table, quick=True) as pool:  # two threads: our helper, run from source
            score, _, _ = pool.compute_stats(hyps, refs)
    finally:
        body = rec.finish(tmp_path / "cache.json")
    assert 0 < score <= 1
    helper = {e["path"]: e for e in body["reads"]}["src/r2m/evaluation/java/R2mMeteorThreads.java"]
    assert helper["kind"] == "exec" and helper["sha256"] == sha(HELPER)


# --------------------------------------------------------------------------------------------- the listener
def test_written_and_hidden_files_are_not_inputs_outside_files_and_program_arguments_are(tmp_path):
    ws = tmp_path / "ws"
    (ws / "lib").mkdir(parents=True)
    for name in ("read.txt", "written.txt", ".hidden", "arg.txt", "lib/x.class"):
        (ws / name).write_text(name)
    outside = tmp_path / "outside.txt"
    outside.write_text("o")
    rec = Recorder(ws).start()
    try:
        (ws / "written.txt").write_text("new")  # written, then read back: the run's own
        assert (ws / "written.txt").read_text() == "new"
        for name in ("read.txt", ".hidden"):
            (ws / name).read_text()
        outside.read_text()
        fd = os.open(ws / "read.txt", os.O_RDONLY)
        os.close(fd)
        # a path argument and a class path naming a folder (and a file that does not exist)
        subprocess.run([sys.executable, "-c", "pass", str(ws / "arg.txt"), f"{ws / 'lib'}{os.pathsep}{ws / 'gone'}"],
                       check=True)
    finally:
        body = rec.finish()
    kinds = {e["path"]: e["kind"] for e in body["reads"] if e["kind"] not in ("module", "dist", "python")}
    assert kinds == {"read.txt": "file", "arg.txt": "exec", "lib": "exec", os.path.realpath(outside): "file"}
    digests = {e["path"]: e["sha256"] for e in body["reads"]}
    assert digests["read.txt"] == hashlib.sha256(b"read.txt").hexdigest()
    assert digests["lib"].startswith("tree:")


def test_what_a_stage_module_reads_as_it_is_imported_is_recorded(tmp_path):
    """The runner imports a stage's module before its record starts; a library reading its data as it is imported
    (matplotlib its matplotlibrc) is kept (``import_reads``) and recorded by the recorder started next, a file
    written then is not an input."""
    from r2m.utils.reads import import_reads

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "rc.txt").write_text("rc")
    with import_reads():
        (ws / "rc.txt").read_text()
        (ws / "cache.txt").write_text("written")
    (ws / "after.txt").write_text("not read")
    (ws / "after.txt").read_text()  # between the import and the start: the runner's own business
    rec = Recorder(ws).start()
    body = rec.finish()
    assert {e["path"] for e in body["reads"] if e["kind"] == "file"} == {"rc.txt"}


def test_a_baselines_schedule_records_its_own_per_model_entry_only():
    """``train_sup.for_model("sat")`` reads each ``train_sup`` field and sat's ``per_model`` entry (``{}`` when it has
    none), not the other models' entries: an edit of mrnn's override leaves sat's record current, one of sat's
    (or a new sat entry) does not."""
    from r2m import params as P
    from r2m.utils.reads import Digests, ParamValues, changes

    raw = {"datasets": ["demo"], "catalog": {"demo": {"kind": "demo"}},
           "train_sup": {"per_model": {"mrnn": {"lr": 0.002}}}}
    params = P.validate(raw)
    rec = Recorder(Path("."))
    rec.start(params)
    try:
        params.train_sup.for_model("sat")
    finally:
        rec.stop()
    keys = {".".join(k) for k in rec.params}
    assert "train_sup.per_model.sat" in keys and "train_sup.lr" in keys
    assert not any(k in ("train_sup.per_model", "train_sup.per_model.mrnn") for k in keys)
    record = {"reads": [], "params": rec.finish()["params"]}

    def after(per_model: dict) -> list[str]:
        edited = P.validate({**raw, "train_sup": {"per_model": per_model}})
        return changes(record, ParamValues(edited), Digests(Path(".")))

    assert after({"mrnn": {"lr": 0.003}}) == []  # another model's override
    assert after({"mrnn": {"lr": 0.002}, "sat": {"lr": 0.003}}) == ["params train_sup.per_model.sat: changed"]
    assert after({}) == []  # sat had none, still none


def test_an_old_params_folder_is_removed_only_while_it_holds_nothing_but_stamps(tmp_path):
    """A workspace made before the stamps moved to ``.stamps/``: its ``.params/`` is no engine's input any more;
    the engines' planning removes it, unless something there is not a stamp (a user's file: all of it kept)."""
    old = tmp_path / ".params"
    (old / "prepare").mkdir(parents=True)
    (old / "prepare/demo.json").write_text(R.stamp_text({("prepare", "x"): 1}, []))
    (old / "train_xe").mkdir()
    (old / "train_xe/demo-r2m-0.json").write_text(R.stamp_text({}, ["src/r2m/x.py: changed (module)"]))
    (old / "train_xe/notes.txt").write_text("mine")
    assert not R.remove_old_stamps(tmp_path) and (old / "train_xe/notes.txt").read_text() == "mine"
    (old / "train_xe/notes.txt").unlink()
    (old / "train_xe/odd.json").write_text('{"mine": true}')  # JSON, but not a stamp
    assert not R.remove_old_stamps(tmp_path) and (old / "prepare/demo.json").is_file()
    (old / "train_xe/odd.json").unlink()
    assert R.remove_old_stamps(tmp_path) and not old.exists()
    assert not R.remove_old_stamps(tmp_path)  # nothing there
    (tmp_path / ".params").write_text("a user's file of that name")
    assert not R.remove_old_stamps(tmp_path) and (tmp_path / ".params").is_file()

"""A round of hostile and careless probes of the commands that write, the markers, the runtime config keys,
the network guard's children and the argument checks. Each expectation was written down before the probe
first ran; :data:`PROBES` names the class a probe falls in when it fails (``damage``: a user's file destroyed
or a workspace rewritten; ``security``; ``silent``: a wrong result without a word; ``unclear``: a traceback,
or an error after the work or naming nothing) and ``held`` for behaviour that must stay as it is.

Kept fast: commands run in-process (``r2m.cli.main``) on tiny hand-made folders; a subprocess only for
Snakemake and where a probe needs a second process (a held lock, a spawned child).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import BIN, ROOT, copy_workflow, tiny_dag_env
from test_caption_own_images import checkpoint, photo_folder  # noqa: F401  (module fixtures: a tiny model, photos)
from test_hostile_inputs import base_params, cli, digest_tree, one_line

# probe -> what its failure would be (the classes of the closing table); "held": must keep working as it does
PROBES = {
    "test_bench_plan_out_onto_a_finished_table": "damage",
    "test_bench_plan_out_onto_a_stage_output_path": "damage",
    "test_bench_plan_out_onto_params_yaml": "damage",
    "test_bench_plan_out_onto_a_users_file": "damage",
    "test_bench_plan_out_into_r2m_state": "damage",
    "test_bench_plan_root_that_is_no_workspace": "unclear",
    "test_bench_scale_workspace_the_project_itself": "damage",
    "test_bench_scale_workspace_with_a_forged_marker": "damage",
    "test_bench_scale_out_params_yaml_before_any_stage": "unclear",
    "test_bench_scale_out_a_users_folder": "damage",
    "test_bench_scale_merge_a_file_that_is_no_table": "unclear",
    "test_bench_scale_workdir_inside_a_model_folder": "damage",
    "test_bench_concepts_json_onto_params_yaml": "damage",
    "test_evaluate_out_onto_params_yaml": "damage",
    "test_evaluate_out_onto_a_finished_table": "damage",
    "test_evaluate_out_onto_a_users_json": "damage",
    "test_evaluate_out_rerun_replaces_its_own_file": "held",
    "test_evaluate_out_edited_by_the_user_is_kept": "damage",
    "test_gallery_inside_a_model_folder": "damage",
    "test_gallery_over_photos_with_a_forged_filling_marker": "damage",
    "test_stage_output_with_a_forged_filling_marker": "damage",
    "test_stage_output_whose_marker_lists_a_changed_file": "held",
    "test_dag_write_onto_params_yaml": "damage",
    "test_dag_write_onto_a_users_yaml": "damage",
    "test_dag_write_replaces_its_own_dvc_yaml": "held",
    "test_stamps_root_missing": "unclear",
    "test_stamps_root_empty_folder": "unclear",
    "test_features_of_a_photo_replaced_under_the_same_name": "silent",
    "test_refused_second_run_leaves_the_running_jobs_log": "damage",
    "test_log_path_that_is_a_folder": "held",
    "test_r2m_command_in_params_yaml_runs_nothing": "security",
    "test_r2m_command_on_the_command_line_is_no_shell_line": "security",
    "test_r2m_command_naming_an_executable_is_quoted": "held",
    "test_snakemake_delete_all_output_keeps_a_users_file": "damage",
    "test_snakemake_delete_temp_output_keeps_a_users_file": "held",
    "test_spawned_child_of_a_guarded_stage_cannot_connect": "security",
    "test_spawned_child_without_the_guard_is_not_refused": "held",
    "test_record_of_the_wrong_shape_in_r2m_why": "unclear",
    "test_record_naming_a_path_outside_the_workspace": "unclear",
    "test_record_of_the_wrong_shape_under_snakemake_n": "unclear",
    "test_why_with_a_dataset_not_in_the_catalog": "unclear",
    "test_why_with_a_seed_that_is_no_seed": "unclear",
    "test_significance_scorer_nope_before_any_scoring": "unclear",
    "test_significance_pairs_zero": "unclear",
    "test_randomization_trials_negative": "unclear",
    "test_randomization_images_zero": "unclear",
    "test_power_deltas_nan": "unclear",
    "test_bench_features_backend_nope": "unclear",
    "test_bench_train_variant_nope": "unclear",
    "test_compare_seed_negative": "unclear",
    "test_build_vocab_of_a_single_ten_megabyte_line": "unclear",
}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Path:
    """A workspace (params.yaml for ``tiny``) with a finished table and a user's notes, the working folder."""
    folder = tmp_path / "ws"
    (folder / "reports").mkdir(parents=True)
    (folder / "params.yaml").write_text("# my comments\n" + yaml.safe_dump(base_params(), sort_keys=False))
    (folder / "reports/table1.csv").write_text("method,CIDEr\nR2M,29.0\n")
    (folder / "notes.txt").write_text("my notes\n")
    monkeypatch.chdir(folder)
    return folder


def refused(capsys, *names: str) -> str:
    """The command's single stderr line, which names each of ``names``."""
    return one_line(capsys.readouterr().err, *names)


def stage_refused(capsys, *names: str) -> str:
    """A stage's one error line (its log's INFO lines aside), which names each of ``names``; no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-2000:]
    errors = [ln for ln in err.splitlines() if " ERROR " in ln]
    assert len(errors) == 1, err[-2000:]
    assert all(n in errors[0] for n in names), (names, errors[0])
    return errors[0]


# --------------------------------------------------------------------------- r2m bench plan --out
def _plan_out_refused(ws: Path, capsys, out: str) -> None:
    before = digest_tree(ws)
    assert cli("bench", "plan", "--runs", "1", "--out", out) == 2
    refused(capsys, "--out", out)
    assert digest_tree(ws) == before


def test_bench_plan_out_onto_a_finished_table(ws, capsys):
    _plan_out_refused(ws, capsys, "reports/table1.csv")


def test_bench_plan_out_onto_a_stage_output_path(ws, capsys):
    (ws / "reports/table1.csv").unlink()
    _plan_out_refused(ws, capsys, "reports/table2.csv")


def test_bench_plan_out_onto_params_yaml(ws, capsys):
    _plan_out_refused(ws, capsys, "params.yaml")


def test_bench_plan_out_onto_a_users_file(ws, capsys):
    _plan_out_refused(ws, capsys, "notes.txt")


def test_bench_plan_out_into_r2m_state(ws, capsys):
    assert cli("bench", "plan", "--runs", "1", "--out", ".r2m/records/plan.json") == 2
    refused(capsys, "--out", ".r2m")
    assert not (ws / ".r2m").exists()


def test_bench_plan_root_that_is_no_workspace(ws, tmp_path, capsys):
    t0 = time.perf_counter()
    assert cli("bench", "plan", "--runs", "1", "--root", str(tmp_path / "nope")) == 2
    refused(capsys, "--root")
    assert time.perf_counter() - t0 < 10 and not (tmp_path / "nope").exists()


# --------------------------------------------------------------------------- r2m bench scale
def _scale(*args: str) -> int:
    return cli("bench", "scale", "--sizes", "0.0001", "--stages", "prepare", "--params", "params.yaml", *args)


def test_bench_scale_workspace_the_project_itself(ws, capsys):
    before = digest_tree(ws)
    assert _scale("--workspace", str(ws), "--out", str(ws.parent / "out")) == 2
    refused(capsys, "--workspace")
    assert digest_tree(ws) == before and not (ws.parent / "out").exists()


def test_bench_scale_workspace_with_a_forged_marker(ws, capsys):
    (ws / ".r2m-workspace.json").write_text(json.dumps({"by": "r2m", "kind": "bench:scale", "params_sha256": "0" * 64}))
    before = digest_tree(ws)
    assert _scale("--workspace", str(ws), "--out", str(ws.parent / "out")) == 2
    refused(capsys, "--workspace", "params.yaml")
    assert digest_tree(ws) == before


def test_bench_scale_out_params_yaml_before_any_stage(ws, capsys):
    before = digest_tree(ws)
    t0 = time.perf_counter()
    assert _scale("--out", "params.yaml", "--workdir", str(ws.parent / "scratch")) == 2
    refused(capsys, "--out", "params.yaml")
    assert digest_tree(ws) == before and not (ws.parent / "scratch").exists()
    assert time.perf_counter() - t0 < 10  # refused before the first stage ran


def test_bench_scale_out_a_users_folder(ws, capsys):
    (ws / "mine").mkdir()
    (ws / "mine/scale.csv").write_text("my own table\n")
    before = digest_tree(ws)
    assert _scale("--out", "mine", "--workdir", str(ws.parent / "scratch")) == 2
    refused(capsys, "--out", "mine")
    assert digest_tree(ws) == before and not (ws.parent / "scratch").exists()


def test_bench_scale_merge_a_file_that_is_no_table(ws, capsys):
    assert _scale("--merge", "/etc/passwd", "--workdir", str(ws.parent / "scratch"),
                  "--out", str(ws.parent / "out")) == 2
    refused(capsys, "--merge", "/etc/passwd")
    assert not (ws.parent / "scratch").exists() and not (ws.parent / "out").exists()


def test_bench_scale_workdir_inside_a_model_folder(ws, capsys):
    model = ws / "models/tiny/r2m/s0/train_xe"
    model.mkdir(parents=True)
    (model / "model.pt").write_bytes(b"weights")
    files = {"model.pt": [7, hashlib.sha256(b"weights").hexdigest()]}
    (model / ".r2m-owned.json").write_text(json.dumps({"by": "r2m", "kind": "stage:train_xe", "files": files}))
    before = digest_tree(ws)
    assert _scale("--workdir", str(model / "scratch"), "--out", str(ws.parent / "out")) == 2
    refused(capsys, "--workdir")
    assert digest_tree(ws) == before


# --------------------------------------------------------------------------- r2m bench concepts --json
def test_bench_concepts_json_onto_params_yaml(ws, capsys):
    before = digest_tree(ws)
    t0 = time.perf_counter()
    assert cli("bench", "concepts", "--settings", "classifier+faces", "--json", "params.yaml") == 2
    refused(capsys, "--json", "params.yaml")
    assert digest_tree(ws) == before and time.perf_counter() - t0 < 15  # before any photo is read


# --------------------------------------------------------------------------- r2m evaluate --out
REFS = {"images": [{"id": 1}, {"id": 2}],
        "annotations": [{"image_id": 1, "caption": "a dog on a bench"}, {"image_id": 2, "caption": "a cat on a mat"}]}
RESULTS = [{"image_id": 1, "caption": "a dog"}, {"image_id": 2, "caption": "a cat"}]


def _evaluate(ws: Path, out: str) -> int:
    (ws / "refs.json").write_text(json.dumps(REFS))
    (ws / "res.json").write_text(json.dumps(RESULTS))
    return cli("evaluate", "--results", "res.json", "--references", "refs.json", "--scorers", "bleu",
               "--tokenizer", "none", "--out", out)


def test_evaluate_out_onto_params_yaml(ws, capsys):
    params = sha(ws / "params.yaml")
    assert _evaluate(ws, "params.yaml") == 2
    refused(capsys, "--out", "params.yaml")
    assert sha(ws / "params.yaml") == params


def test_evaluate_out_onto_a_finished_table(ws, capsys):
    table = sha(ws / "reports/table1.csv")
    assert _evaluate(ws, "reports/table1.csv") == 2
    refused(capsys, "--out", "reports/table1.csv")
    assert sha(ws / "reports/table1.csv") == table


def test_evaluate_out_onto_a_users_json(ws, capsys):
    (ws / "mine.json").write_text('{"my": "numbers"}\n')
    assert _evaluate(ws, "mine.json") == 2
    refused(capsys, "--out", "mine.json")
    assert (ws / "mine.json").read_text() == '{"my": "numbers"}\n'


def test_evaluate_out_rerun_replaces_its_own_file(ws, capsys):
    assert _evaluate(ws, "metrics.json") == 0
    first = json.loads((ws / "metrics.json").read_text())
    RESULTS[1]["caption"] = "a cat on a mat"
    try:
        assert _evaluate(ws, "metrics.json") == 0
    finally:
        RESULTS[1]["caption"] = "a cat"
    second = json.loads((ws / "metrics.json").read_text())
    assert second["metrics"]["Bleu_1"] > first["metrics"]["Bleu_1"]


def test_evaluate_out_edited_by_the_user_is_kept(ws, capsys):
    assert _evaluate(ws, "metrics.json") == 0
    (ws / "metrics.json").write_text('{"edited": "by hand"}\n')
    capsys.readouterr()
    assert _evaluate(ws, "metrics.json") == 2
    refused(capsys, "--out", "metrics.json")
    assert (ws / "metrics.json").read_text() == '{"edited": "by hand"}\n'


# --------------------------------------------------------------------------- galleries and stage folders
def test_gallery_inside_a_model_folder(checkpoint, photo_folder, capsys):  # noqa: F811
    before = digest_tree(checkpoint)
    assert cli("caption", photo_folder / "coffee.jpg", "--model", checkpoint, "--html", checkpoint / "gallery") == 2
    refused(capsys, "--html", str(checkpoint))
    assert digest_tree(checkpoint) == before


def test_gallery_over_photos_with_a_forged_filling_marker(checkpoint, photo_folder, tmp_path, capsys):  # noqa: F811
    mine = tmp_path / "holiday"
    mine.mkdir()
    (mine / "beach.jpg").write_bytes(b"\xff\xd8 my photo")
    (mine / "notes.txt").write_text("where we went\n")
    (mine / ".r2m-owned.json").write_text(json.dumps({"by": "r2m", "kind": "gallery", "filling": True, "files": {}}))
    before = digest_tree(mine)
    assert cli("caption", photo_folder / "coffee.jpg", "--model", checkpoint, "--html", mine) == 2
    refused(capsys, "--html", str(mine))
    assert digest_tree(mine) == before


def _prepared_with(ws: Path, marker: dict) -> Path:
    out = ws / "data/tiny/prepared"
    out.mkdir(parents=True)
    (out / "thesis.txt").write_text("chapter one\n")
    (out / ".r2m-owned.json").write_text(json.dumps({"by": "r2m", **marker}))
    return out


def test_stage_output_with_a_forged_filling_marker(ws, capsys):
    out = _prepared_with(ws, {"kind": "stage:prepare", "filling": True, "files": {}})
    before = digest_tree(out)
    assert cli("prepare", "--dataset", "tiny", "--no-log-file") == 2
    stage_refused(capsys, "data/tiny/prepared", "thesis.txt")
    assert digest_tree(out) == before


def test_stage_output_whose_marker_lists_a_changed_file(ws, capsys):
    out = _prepared_with(ws, {"kind": "stage:prepare", "files": {"thesis.txt": [12, "0" * 64]}})
    before = digest_tree(out)
    assert cli("prepare", "--dataset", "tiny", "--no-log-file") == 2
    stage_refused(capsys, "data/tiny/prepared", "thesis.txt")
    assert digest_tree(out) == before


# --------------------------------------------------------------------------- r2m dag --write, stamps
def test_dag_write_onto_params_yaml(ws, capsys):
    params = sha(ws / "params.yaml")
    assert cli("dag", "--write", "--file", "params.yaml") == 2
    refused(capsys, "--file", "params.yaml")
    assert sha(ws / "params.yaml") == params


def test_dag_write_onto_a_users_yaml(ws, capsys):
    (ws / "mine.yaml").write_text("my: settings\n")
    assert cli("dag", "--write", "--file", "mine.yaml") == 2
    refused(capsys, "--file", "mine.yaml")
    assert (ws / "mine.yaml").read_text() == "my: settings\n"


def test_dag_write_replaces_its_own_dvc_yaml(ws):
    assert cli("dag", "--write") == 0
    first = (ws / "dvc.yaml").read_text()
    assert first.startswith("# GENERATED by `r2m dag --write`")
    assert cli("dag", "--write") == 0 and cli("dag", "--check") == 0


def test_stamps_root_missing(ws, tmp_path, capsys):
    from r2m.pipeline.stamps_cmd import main

    with pytest.raises(SystemExit) as stop:
        main(["--root", str(tmp_path / "nowhere")])
    assert "--root" in str(stop.value) and "\n" not in str(stop.value).strip()
    assert not (tmp_path / "nowhere").exists()


def test_stamps_root_empty_folder(ws, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    from r2m.pipeline.stamps_cmd import main

    with pytest.raises(SystemExit) as stop:
        main(["--root", str(empty)])
    assert "--root" in str(stop.value)
    assert list(empty.iterdir()) == []


# --------------------------------------------------------------------------- the features' "up to date" check
def test_features_of_a_photo_replaced_under_the_same_name(tmp_path, caplog):
    import numpy as np
    from PIL import Image

    from r2m.vision import features as F
    from r2m.vision.feature_store import load_features

    rng = np.random.default_rng(0)
    files = []
    for i in range(3):
        f = tmp_path / f"im{i}.png"
        Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(f)
        files.append(str(f))
    ids = ["a", "b", "c"]
    options = {"size": 16, "dim": 8, "kinds": ["pooled"]}
    out = tmp_path / "features"
    F.extract_dataset(ids, files, out, "random_cnn", options, batch_size=2)
    old, _ = load_features(out)
    Image.fromarray(255 - np.asarray(Image.open(files[1]))).save(files[1])  # the same name, another photo
    caplog.clear()
    F.extract_dataset(ids, files, out, "random_cnn", options, batch_size=2)
    new, _ = load_features(out)
    assert "up to date" not in caplog.text
    assert not np.array_equal(old[1], new[1]) and np.array_equal(old[0], new[0])


# --------------------------------------------------------------------------- logs and locks
def test_refused_second_run_leaves_the_running_jobs_log(ws, capsys):
    from r2m.utils.resume import StageLock

    log = ws / "logs/prepare/tiny.log"
    log.parent.mkdir(parents=True)
    log.write_text("12:00:00 INFO r2m prepare dataset=tiny\n")  # the running job's start
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from r2m.utils.resume import StageLock;"
        "l = StageLock('.', 'prepare', {'dataset': 'tiny'}).acquire(); print('held', flush=True); time.sleep(60)"),
        str(ROOT / "src")], cwd=ws, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert cli("prepare", "--dataset", "tiny") == 75
        assert "already being written" in capsys.readouterr().err
        assert log.read_text() == "12:00:00 INFO r2m prepare dataset=tiny\n"
    finally:
        holder.kill()
        holder.wait()
    assert StageLock  # imported where the holder imports it


def test_log_path_that_is_a_folder(ws, capsys):
    (ws / "logs/prepare/tiny.log").mkdir(parents=True)
    assert cli("prepare", "--dataset", "tiny") in (1, 2)
    err = capsys.readouterr().err
    assert "Traceback" not in err and [ln for ln in err.splitlines() if "logs/prepare/tiny.log" in ln], err


# --------------------------------------------------------------------------- Snakemake: r2m_command, deleting flags
@pytest.fixture
def flow(tmp_path) -> Path:
    wd = tmp_path / "flow"
    copy_workflow(ROOT, wd)
    raw = base_params()
    raw["baselines"]["datasets"] = ["tiny"]
    (wd / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return wd


def snakemake(wd: Path, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "snakemake"), *args], cwd=wd, env=tiny_dag_env(wd), capture_output=True,
                          text=True, timeout=timeout)


def test_r2m_command_in_params_yaml_runs_nothing(flow):
    raw = yaml.safe_load((flow / "params.yaml").read_text())
    raw["r2m_command"] = f"sh -c 'touch PWNED; exec \"$0\" \"$@\"' {BIN / 'r2m'}"
    (flow / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    r = snakemake(flow, "--cores", "1", "data/tiny/inputs.json")
    assert not (flow / "PWNED").exists()  # the foreign command never ran
    assert r.returncode != 0 and "r2m_command" in r.stderr, r.stderr[-3000:]


def test_r2m_command_on_the_command_line_is_no_shell_line(flow):
    r = snakemake(flow, "--cores", "1", "data/tiny/inputs.json", "--config",
                  f"r2m_command=sh -c 'touch PWNED; exec \"$0\" \"$@\"' {BIN / 'r2m'}")
    assert not (flow / "PWNED").exists()  # the foreign command never ran
    assert r.returncode != 0 and "r2m_command" in r.stderr, r.stderr[-3000:]


def test_r2m_command_naming_an_executable_is_quoted(flow):
    r = snakemake(flow, "-n", "-p", "data/tiny/inputs.json", "--config", f"r2m_command={BIN / 'r2m'}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"exec {BIN / 'r2m'} inputs --dataset tiny" in r.stdout + r.stderr


def _users_notes_in_prepared(flow: Path) -> Path:
    out = flow / "data/tiny/prepared"
    out.mkdir(parents=True)
    (out / "my_notes.txt").write_text("mine\n")
    return out / "my_notes.txt"


def test_snakemake_delete_all_output_keeps_a_users_file(flow):
    notes = _users_notes_in_prepared(flow)
    r = snakemake(flow, "--delete-all-output", "data/tiny/prepared/images.parquet")
    assert notes.read_text() == "mine\n"
    assert r.returncode != 0 and "--delete-all-output" in r.stderr, r.stderr[-3000:]


def test_snakemake_delete_temp_output_keeps_a_users_file(flow):
    notes = _users_notes_in_prepared(flow)
    snakemake(flow, "--delete-temp-output", "data/tiny/prepared/images.parquet")
    assert notes.read_text() == "mine\n"


# --------------------------------------------------------------------------- the network guard in spawned children
def connect_once(port: int) -> str:
    """In a child: one TCP connection to this machine (a closed port); what happened, by exception name."""
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return "connected"
    except BaseException as err:  # noqa: BLE001 - the probe reports what stopped it
        return type(err).__name__


def _spawn_pool_connect() -> str:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(connect_once, 9).result()


def test_spawned_child_of_a_guarded_stage_cannot_connect():
    from r2m.utils.netguard import NetworkGuard

    with NetworkGuard():
        got = _spawn_pool_connect()
    assert got == "NetworkRefused", got


def test_spawned_child_without_the_guard_is_not_refused():
    from r2m.utils.netguard import NetworkGuard

    with NetworkGuard():
        pass  # a guard that ended leaves nothing behind for later children
    assert _spawn_pool_connect() in ("ConnectionRefusedError", "TimeoutError", "OSError", "connected")


# --------------------------------------------------------------------------- records
def _record(ws: Path, body: dict) -> Path:
    path = ws / ".r2m/records/prepare/tiny.json"
    path.parent.mkdir(parents=True)
    from r2m.utils.reads import FORMAT

    path.write_text(json.dumps({"format": FORMAT, "stage": "prepare", "axes": {"dataset": "tiny"}, **body}))
    return path


def test_record_of_the_wrong_shape_in_r2m_why(ws, capsys):
    path = _record(ws, {"reads": {"src/x.py": "abc"}, "params": []})
    assert cli("why", "prepare", "--dataset", "tiny") == 1
    out = capsys.readouterr()
    assert "Traceback" not in out.err and str(path.relative_to(ws)) in out.out and len(out.out.splitlines()) == 1


def test_record_naming_a_path_outside_the_workspace(ws, capsys):
    outside = ws.parent / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"x" * 1000)
    _record(ws, {"reads": [{"path": "../outside", "kind": "dep", "sha256": "tree:0"}], "params": []})
    assert cli("why", "prepare", "--dataset", "tiny") == 1
    out = capsys.readouterr().out
    assert "'../outside', which leaves its folder" in out and len(out.splitlines()) == 1


def test_record_of_the_wrong_shape_under_snakemake_n(flow):
    _record(flow, {"reads": [{"kind": "file", "sha256": "x"}], "params": []})
    r = snakemake(flow, "-n", "data/tiny/prepared/images.parquet")
    assert r.returncode == 0 and "KeyError" not in r.stderr + r.stdout, (r.stdout + r.stderr)[-3000:]
    stamp = json.loads((flow / ".stamps/prepare/tiny.json").read_text())
    assert stamp["state"] == "stale" and "reads[0]" in stamp["why"][0]


def test_why_with_a_dataset_not_in_the_catalog(ws, capsys):
    assert cli("why", "prepare", "--dataset", "nope") == 2
    refused(capsys, "--dataset", "nope")


def test_why_with_a_seed_that_is_no_seed(ws, capsys):
    assert cli("why", "train_xe", "--dataset", "tiny", "--variant", "r2m", "--seed", "x") == 2
    refused(capsys, "--seed")


# --------------------------------------------------------------------------- arguments checked before the work
def test_significance_scorer_nope_before_any_scoring(capsys):
    t0 = time.process_time()
    assert cli("bench", "significance", "--scorers", "nope") == 2
    refused(capsys, "--scorers", "nope")
    assert time.process_time() - t0 < 5


def test_significance_pairs_zero(capsys):
    assert cli("bench", "significance", "--pairs", "0") == 2
    refused(capsys, "--pairs")


def test_randomization_trials_negative(capsys):
    assert cli("bench", "randomization", "--trials", "-1") == 2
    refused(capsys, "--trials")


def test_randomization_images_zero(capsys):
    assert cli("bench", "randomization", "--images", "0") == 2
    refused(capsys, "--images")


def test_power_deltas_nan(tmp_path, capsys):
    assert cli("power", tmp_path, "--deltas", "nan") == 2
    refused(capsys, "--deltas")


def test_bench_features_backend_nope(capsys):
    assert cli("bench", "features", "--backends", "nope") == 2
    refused(capsys, "--backends", "nope")


def test_bench_train_variant_nope(capsys):
    assert cli("bench", "train", "--variant", "nope") == 2
    refused(capsys, "--variant", "nope")


def test_compare_seed_negative(tmp_path, capsys):
    (tmp_path / "a.json").write_text(json.dumps(RESULTS))
    (tmp_path / "refs.json").write_text(json.dumps(REFS))
    assert cli("compare", tmp_path / "a.json", tmp_path / "a.json", "--references", tmp_path / "refs.json",
               "--scorers", "bleu", "--seed", "-1") == 2
    refused(capsys, "--seed")


# --------------------------------------------------------------------------- a corpus of one huge line
def test_build_vocab_of_a_single_ten_megabyte_line(ws, capsys):
    (ws / "photos").mkdir()
    from PIL import Image

    for i in range(4):
        Image.new("RGB", (16, 16), (60 * i, 0, 0)).save(ws / "photos" / f"p{i}.png")
    (ws / "corpus.txt").write_text("a dog on a bench " * (10_000_000 // 17) + "\n")
    raw = base_params()
    refs = {"images": [{"id": i, "file_name": f"p{i}.png"} for i in (2, 3)],
            "annotations": [{"id": i, "image_id": i, "caption": "a red square"} for i in (2, 3)]}
    (ws / "refs.json").write_text(json.dumps(refs))
    raw["catalog"]["mine"] = {"kind": "folder", "images": "photos", "corpus": "corpus.txt", "references": "refs.json"}
    raw["datasets"] = ["mine"]
    (ws / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    for stage in ("inputs", "prepare", "corpus_concepts"):
        assert cli(stage, "--dataset", "mine", "--no-log-file") == 0, capsys.readouterr().err[-2000:]
    capsys.readouterr()
    assert cli("build_vocab", "--dataset", "mine", "--no-log-file") == 2
    stage_refused(capsys, "build_vocab", "data/mine/corpus/corpus.parquet")
    assert not (ws / "data/mine/vocab").exists()

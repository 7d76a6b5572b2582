"""The fault suite: kill, preempt, lock and feed malformed inputs to the real stages on a minimal
``tiny`` dataset, and check that nothing finished is lost and nothing wrong passes silently.

- kill -9 of ``train_xe`` and ``extract_features`` under Snakemake (after their first checkpoint)
  → plain rerun → resumed; final weights / features identical to an uninterrupted run;
- the whole Snakemake process group killed → ``--unlock`` + ``--rerun-incomplete`` → resumed;
- kill -9 under ``dvc repro`` → rerun → resumed;
- SIGINT / SIGTERM → checkpoint + one-line message + non-zero exit → resume;
- a second run on the same outputs is refused, naming the holder;
- ≥ 20 malformed inputs → one clear line naming the file and key/record, no traceback, and every
  finished output byte-identical afterwards.

Faults are injected with ``R2M_FAULT`` (:func:`r2m.utils.resume.inject`) at a step chosen by a seeded
random draw. Figures are printed at the end (``pytest -s``).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import copy_workflow, write_params

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
STEPS, CKPT_EVERY = 12, 4
RNG = random.Random(8)
FIGURES = {"faults": 0, "resumed": 0, "steps_lost_max": 0, "malformed": 0, "clear_errors": 0,
           "tracebacks": 0, "outputs_damaged": 0}


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{BIN}:{os.environ['PATH']}", "R2M_NO_PROGRESS": "1",
           "R2M_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    env.pop("R2M_FAULT", None)
    env.update(extra)
    return env


def _params() -> dict:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["datasets"] = ["tiny"]
    raw["variants"] = ["r2m", "no_fm", "d_lstm", "r_lstm"]
    t = raw["catalog"]["tiny"]
    t.update(n_train_images=10, n_val_images=4, n_test_images=6, n_sentences=160, image_size=32)
    t["overrides"].update(
        extract_features={"backend": "random_cnn", "shard_size": 5, "batch_size": 5,
                          "options": {"size": 32, "dim": 16}},
        model={"d": 16, "d_k": 8},
        train_xe={"steps": STEPS, "batch_size": 16, "lr": 0.003, "eval_every": 4, "checkpoint_every": CKPT_EVERY},
        caption={"beam": 2, "max_len": 6},
    )
    raw["evaluate"] = {"scorers": ["bleu", "cider"]}
    return raw


@pytest.fixture(scope="module")
def wd(tmp_path_factory) -> Path:
    wd = tmp_path_factory.mktemp("faults")
    copy_workflow(ROOT, wd)
    write_params(wd, _params())
    return wd


def snake(wd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "snakemake"), "--cores", "2", *args], cwd=wd, env=_env(**env),
                          capture_output=True, text=True, timeout=900, start_new_session=True)


def _last_step(wd: Path, stage: str, key: str) -> int:
    return int(torch.load(wd / f".r2m/resume/{stage}/{key}/last.pt", weights_only=True)["step"])


def _resumed_at(log: Path) -> int:
    m = re.search(r"resuming from \S+ at step (\d+)", log.read_text())
    assert m, log.read_text()[-3000:]
    return int(m.group(1))


def _reference_model(wd: Path, variant: str, tmp: Path) -> dict:
    """An uninterrupted train_xe on the same vocabulary, in this process."""
    from r2m import params as P
    from r2m.stage import registry as S
    from r2m.stage.context import StageContext
    from r2m.training.stages import train

    ref = tmp / f"ref-{variant}"
    if not (ref / "data/tiny/vocab").exists():
        shutil.copytree(wd / "data/tiny/vocab", ref / "data/tiny/vocab")
    params = P.for_dataset(P.validate(_params()), "tiny")
    torch.set_num_threads(1)
    train(StageContext(stage=S.get("train_xe"), params=params, dataset="tiny", variant=variant, root=ref))
    return torch.load(ref / f"models/tiny/{variant}/s0/train_xe/model.pt", weights_only=True)["state_dict"]


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _record_resume(killed_at: int, resumed_at: int) -> None:
    FIGURES["faults"] += 1
    FIGURES["resumed"] += 1
    FIGURES["steps_lost_max"] = max(FIGURES["steps_lost_max"], killed_at - resumed_at)


# --------------------------------------------------------------------------- kill -9 under Snakemake
@pytest.fixture(scope="module")
def killed_and_rerun(wd: Path) -> dict:
    k = RNG.randint(CKPT_EVERY + 1, STEPS - 1)  # a random step after the first checkpoint
    target = "results/tiny/r2m/s0/train_xe/eval.json"
    # the first run: train_xe killed at step k, extract_features killed after its 2nd of 4 shards
    r1 = snake(wd, "--keep-going", target, R2M_FAULT=f"train_xe@{k}:KILL,extract_features@2:KILL")
    state = {
        "k": k, "r1": r1,
        "model_dir_after_kill": (wd / "models/tiny/r2m/s0/train_xe").exists(),
        "features_after_kill": (wd / "data/tiny/features").exists(),
        "last_step": _last_step(wd, "train_xe", "tiny-r2m-0") if (wd / ".r2m/resume/train_xe/tiny-r2m-0/last.pt").exists() else None,
        "parts": sorted(p.name for p in (wd / ".r2m/resume/extract_features/tiny/parts").glob("shard-*.h5")),
    }
    state["r2"] = snake(wd, target)  # plain rerun
    return state


def test_kill9_under_snakemake_resumes_training_bit_identically(wd: Path, killed_and_rerun: dict, tmp_path) -> None:
    s = killed_and_rerun
    assert s["r1"].returncode != 0
    assert not s["model_dir_after_kill"]  # a failed stage leaves no (empty) model folder
    assert s["last_step"] == (s["k"] // CKPT_EVERY) * CKPT_EVERY  # the resume state survived Snakemake's cleanup
    assert s["r2"].returncode == 0, s["r2"].stderr[-3000:]
    at = _resumed_at(wd / "logs/train_xe/tiny-r2m-0.log")
    assert at == s["last_step"] and s["k"] - at < CKPT_EVERY
    _record_resume(s["k"], at)
    assert not (wd / ".r2m/resume/train_xe/tiny-r2m-0").exists()  # cleaned on completion
    final = torch.load(wd / "models/tiny/r2m/s0/train_xe/model.pt", weights_only=True)["state_dict"]
    assert _same_weights(final, _reference_model(wd, "r2m", tmp_path))


def test_kill9_under_snakemake_resumes_feature_extraction(wd: Path, killed_and_rerun: dict, tmp_path) -> None:
    import h5py
    import pandas as pd

    from r2m.vision.features import extract_dataset
    from r2m.vision.images import read_image_index

    s = killed_and_rerun
    assert not s["features_after_kill"]
    assert s["parts"] == ["shard-00000.h5", "shard-00001.h5"]
    log = (wd / "logs/extract_features/tiny.log").read_text()
    assert "shard 1/" not in log and "shard 3/" in log  # the finished shards were not recomputed
    _record_resume(2, 2)
    assert not (wd / ".r2m/resume/extract_features/tiny").exists()
    images = read_image_index(wd / "data/tiny/prepared", wd)
    p = _params()["catalog"]["tiny"]["overrides"]["extract_features"]
    ref = tmp_path / "features"
    extract_dataset(list(images["image_id"]), list(images["file"]), ref, "random_cnn", p["options"],
                    p["batch_size"], p["shard_size"], work=tmp_path / "parts")
    with h5py.File(ref / "features.h5") as a, h5py.File(wd / "data/tiny/features/features.h5") as b:
        assert (a["pooled"][:] == b["pooled"][:]).all()
    assert pd.read_parquet(ref / "index.parquet").equals(pd.read_parquet(wd / "data/tiny/features/index.parquet"))


def test_sigterm_during_feature_extraction_exits_143_then_resumes_identically(wd, killed_and_rerun, capsys,
                                                                             monkeypatch) -> None:
    import h5py
    import pandas as pd

    feats = wd / "data/tiny/features"
    with h5py.File(feats / "features.h5") as f:
        before = f["pooled"][:]
    index = pd.read_parquet(feats / "index.parquet")
    kept = wd / "data/tiny/features.kept"  # put back afterwards: later tests see the same files and mtimes
    feats.rename(kept)
    try:
        monkeypatch.chdir(wd)
        monkeypatch.setenv("R2M_THREADS", "1")
        monkeypatch.setenv("R2M_FAULT", "extract_features@2:TERM")
        argv = ["extract_features", "--dataset", "tiny"]
        rc, err = _r2m(argv, capsys)
        lines = [x for x in err.splitlines() if "ERROR" in x]
        assert rc == 143 and "Traceback" not in err, err[-2000:]
        assert len(lines) == 1 and "SIGTERM" in lines[0] and "shard 2 of 4" in lines[0], err[-2000:]
        parts = wd / ".r2m/resume/extract_features/tiny/parts"
        assert sorted(p.name for p in parts.glob("shard-*.h5")) == ["shard-00000.h5", "shard-00001.h5"]
        assert not feats.exists()
        FIGURES["faults"] += 1
        monkeypatch.delenv("R2M_FAULT")
        rc, err = _r2m(argv, capsys)
        assert rc == 0, err[-2000:]
        assert "shard 1/" not in err and "shard 3/" in err  # resumed: the finished shards were not recomputed
        assert not (wd / ".r2m/resume/extract_features/tiny").exists()
        with h5py.File(feats / "features.h5") as f:
            assert (f["pooled"][:] == before).all()
        assert pd.read_parquet(feats / "index.parquet").equals(index)
    finally:
        shutil.rmtree(feats, ignore_errors=True)
        kept.rename(feats)
    _record_resume(2, 2)


def test_evaluation_after_resume_is_complete(wd: Path, killed_and_rerun: dict) -> None:
    m = json.loads((wd / "results/tiny/r2m/s0/train_xe/eval.json").read_text())
    assert m["n_images"] == 6 and m["unreadable_images"] == 0 and m["CIDEr"] is not None


def test_snakemake_killed_whole_then_rerun_incomplete_resumes(wd: Path, killed_and_rerun: dict, tmp_path) -> None:
    k = RNG.randint(CKPT_EVERY + 1, STEPS - 1)
    r = snake(wd, "models/tiny/no_fm/s0/train_xe", R2M_FAULT=f"train_xe@{k}:KILLGROUP")
    assert r.returncode == -9  # Snakemake itself was killed with its job
    assert _last_step(wd, "train_xe", "tiny-no_fm-0") == (k // CKPT_EVERY) * CKPT_EVERY
    assert snake(wd, "--unlock").returncode == 0
    r = snake(wd, "--rerun-incomplete", "models/tiny/no_fm/s0/train_xe")
    assert r.returncode == 0, r.stderr[-3000:]
    at = _resumed_at(wd / "logs/train_xe/tiny-no_fm-0.log")
    _record_resume(k, at)
    final = torch.load(wd / "models/tiny/no_fm/s0/train_xe/model.pt", weights_only=True)["state_dict"]
    assert _same_weights(final, _reference_model(wd, "no_fm", tmp_path))


def test_kill9_under_dvc_repro_resumes(wd: Path, killed_and_rerun: dict, tmp_path) -> None:
    env = _env()
    subprocess.run(["git", "init", "-q"], cwd=wd, check=True)
    subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=wd, check=True, env=env)
    # a single stage (-s) needs its resolved-params file: the resolver stage writes it
    subprocess.run([str(BIN / "dvc"), "repro", "-s", "stamps"], cwd=wd, check=True, env=env,
                   capture_output=True)
    k = RNG.randint(CKPT_EVERY + 1, STEPS - 1)
    cmd = [str(BIN / "dvc"), "repro", "-s", "train_xe@tiny-d_lstm-0"]
    r = subprocess.run(cmd, cwd=wd, env=_env(R2M_FAULT=f"train_xe@{k}:KILL"), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode != 0
    assert _last_step(wd, "train_xe", "tiny-d_lstm-0") == (k // CKPT_EVERY) * CKPT_EVERY
    r = subprocess.run(cmd, cwd=wd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    at = _resumed_at(wd / "logs/train_xe/tiny-d_lstm-0.log")
    _record_resume(k, at)
    final = torch.load(wd / "models/tiny/d_lstm/s0/train_xe/model.pt", weights_only=True)["state_dict"]
    assert _same_weights(final, _reference_model(wd, "d_lstm", tmp_path))


# --------------------------------------------------------------------------- preemption, locks (in process)
def _r2m(argv: list[str], capsys) -> tuple[int, str]:
    from r2m.cli import main

    capsys.readouterr()
    rc = main(argv)
    return rc, capsys.readouterr().err


def test_sigint_and_sigterm_checkpoint_and_exit_cleanly_then_resume(wd, killed_and_rerun, tmp_path, capsys,
                                                                    monkeypatch) -> None:
    monkeypatch.chdir(wd)
    monkeypatch.setenv("R2M_THREADS", "1")
    argv = ["train_xe", "--dataset", "tiny", "--variant", "r_lstm"]
    for step, sig, code in ((3, "INT", 130), (9, "TERM", 143)):  # off the checkpoint interval on purpose
        monkeypatch.setenv("R2M_FAULT", f"train_xe@{step}:{sig}")
        rc, err = _r2m(argv, capsys)
        lines = [x for x in err.splitlines() if "ERROR" in x]
        assert rc == code and "Traceback" not in err
        assert len(lines) == 1 and f"stopped by SIG{sig} at step {step} of {STEPS}" in lines[0] and "last.pt" in lines[0]
        assert _last_step(wd, "train_xe", "tiny-r_lstm-0") == step  # saved at the step boundary: nothing lost
        assert not (wd / "models/tiny/r_lstm/s0/train_xe").exists()
        _record_resume(step, step)
    monkeypatch.delenv("R2M_FAULT")
    rc, err = _r2m(argv, capsys)
    assert rc == 0 and "resuming from" in err and "at step 9" in err
    final = torch.load(wd / "models/tiny/r_lstm/s0/train_xe/model.pt", weights_only=True)["state_dict"]
    assert _same_weights(final, _reference_model(wd, "r_lstm", tmp_path))


def _snapshot(wd: Path) -> dict[str, str]:
    out = {}
    for top in ("data/tiny", "models", "results", "reports"):
        for p in sorted((wd / top).rglob("*")):
            if p.is_file():
                out[str(p.relative_to(wd))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_second_run_on_the_same_outputs_is_refused(wd, killed_and_rerun, capsys, monkeypatch) -> None:
    monkeypatch.chdir(wd)
    before = _snapshot(wd)
    holder = subprocess.Popen(
        [sys.executable, "-c", "from r2m.utils.resume import StageLock; import sys, time\n"
         "l = StageLock('.', 'train_xe', {'dataset': 'tiny', 'variant': 'r2m', 'seed': '0'}).acquire()\n"
         "print('held', flush=True); time.sleep(120)"],
        cwd=wd, env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.perf_counter()
        rc, err = _r2m(["train_xe", "--dataset", "tiny", "--variant", "r2m"], capsys)
        assert rc == 75 and time.perf_counter() - t0 < 30  # refused at once, not after training
        assert f"pid {holder.pid}" in err and "models/tiny/r2m/s0/train_xe" in err and "Traceback" not in err
    finally:
        holder.kill()
        holder.wait()
    FIGURES["faults"] += 1
    assert _snapshot(wd) == before
    # the kernel dropped the dead holder's lock: the next run may take it
    from r2m.utils.resume import StageLock

    with StageLock(wd, "train_xe", {"dataset": "tiny", "variant": "r2m", "seed": "0"}):
        pass


# --------------------------------------------------------------------------- malformed inputs
def _write_params(path: Path, edit) -> str:
    raw = _params()
    edit(raw)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def _tiny_over(raw: dict) -> dict:
    return raw["catalog"]["tiny"]["overrides"]


def _torch_save(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)


def _malformed_cases(wd: Path, tmp: Path) -> list[tuple[str, object, list[str], list[str]]]:
    """(name, setup() -> cleanup, argv, substrings the error line must hold)."""
    T, R = ["--dataset", "tiny"], ["--dataset", "tiny", "--variant", "r2m"]
    caps = wd / "results/tiny/r2m/s0/train_xe/captions.json"
    n_test = len(json.loads(caps.read_text()))
    image_id = json.loads(caps.read_text())[0]["image_id"]  # a test image
    refs = wd / "data/tiny/references/references.json"
    corpus = wd / "data/tiny/prepared/corpus.txt"
    last = wd / ".r2m/resume/train_xe/tiny-r2m-0/last.pt"
    init = wd / "models/tiny/r_lstm/s0/train_xe/model.pt"

    def params_case(name, edit, stage, argv, want):
        path = tmp / f"{name}.yaml"
        return (name, lambda: _write_params(path, edit), [stage, *argv, "--params", str(path)], want)

    def file_case(name, path: Path, content, stage, argv, want):
        def setup():
            saved = path.read_bytes() if path.exists() else None
            if isinstance(content, bytes):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
            elif callable(content):
                content(path)
            else:
                path.write_text(json.dumps(content) if not isinstance(content, str) else content)
            return saved
        return (name, setup, [stage, *argv], want, path)

    def det_case(name, lines: str, want):
        f = tmp / f"{name}.jsonl"
        f.write_text(lines)

        def edit(raw):
            _tiny_over(raw)["detect_concepts"] = {"backend": "precomputed", "options": {"path": str(f)}}
        return params_case(name, edit, "detect_concepts", T, [str(f), *want])

    ok_det = json.dumps({"image_id": image_id, "label": "Dog", "score": 0.9, "box": [0, 0, 1, 1]})
    truncated = (wd / "models/tiny/r2m/s0/train_xe/model.pt").read_bytes()[:2000]

    cases = [
        # params (each on a stage whose finished output must survive)
        params_case("feature_backend_typo", lambda r: _tiny_over(r)["extract_features"].update(backend="random_cnnn"),
                    "extract_features", T, ["extract_features.backend", "random_cnnn"]),
        params_case("detector_backend_typo", lambda r: _tiny_over(r).update(detect_concepts={"backend": "precomputd"}),
                    "detect_concepts", T, ["detect_concepts.backend", "precomputd"]),
        params_case("dataset_kind_typo", lambda r: r["catalog"]["tiny"].update(kind="tinny"),
                    "prepare", T, ["catalog.tiny.kind", "tinny"]),
        params_case("d_not_divisible_by_heads", lambda r: _tiny_over(r)["model"].update(heads=3),
                    "train_xe", R, ["model", "divisible by heads"]),
        params_case("unknown_key", lambda r: _tiny_over(r)["train_xe"].update(stepz=3), "train_xe", R, ["stepz"]),
        params_case("missing_weights_file", lambda r: _tiny_over(r)["extract_features"]["options"].update(
            weights="/no/such/weights.pt"), "extract_features", T, ["extract_features.options.weights", "/no/such"]),
        params_case("negative_lr", lambda r: _tiny_over(r)["train_xe"].update(lr=-1), "train_xe", R, ["train_xe.lr"]),
        ("params_not_yaml", lambda: (tmp / "bad.yaml").write_text("datasets: [tiny\n"),
         ["train_xe", *R, "--params", str(tmp / "bad.yaml")], ["bad.yaml", "not valid YAML"]),
        # corpus
        file_case("corpus_not_utf8", corpus, b"a dog on grass\n\xff\xfe broken\n", "corpus_concepts", T,
                  ["corpus.txt:2", "UTF-8"]),
        # references
        file_case("references_not_json", refs, '{"images": [', "evaluate", [*R, "--ckpt", "train_xe"],
                  ["references.json", "line 1", "not valid JSON"]),
        file_case("reference_without_caption", refs, lambda p: p.write_text(json.dumps(
            {**json.loads(p.read_text()), "annotations": [{"id": 0, "image_id": image_id}]})),
            "evaluate", [*R, "--ckpt", "train_xe"], ["references.json", "annotations[0]", "caption"]),
        # detections (precomputed import)
        det_case("detection_nan_score", ok_det + "\n" + ok_det.replace("0.9", "NaN") + "\n", [":2", "score must be a finite number"]),
        det_case("detection_bad_json", ok_det + "\n{oops\n", [":2", "not valid JSON"]),
        det_case("detection_missing_label", json.dumps({"image_id": image_id, "score": 0.5}) + "\n",
                 [":1", "label"]),
        det_case("detection_inf_box", ok_det.replace("[0, 0, 1, 1]", "[0, 0, Infinity, 1]") + "\n", [":1", "box"]),
        det_case("detections_match_no_image", ok_det.replace(image_id, "not-an-image") + "\n",
                 ["none of its", "not-an-image"]),
        # results (captions)
        file_case("captions_partial", caps, [{"image_id": image_id, "caption": "a dog"}], "evaluate",
                  [*R, "--ckpt", "train_xe"],
                  ["captions.json", f"cover 1 of {n_test}", f"{n_test - 1} image id(s) missing", "--allow-partial"]),
        file_case("captions_not_a_list", caps, {"image_id": image_id, "caption": "x"}, "evaluate",
                  [*R, "--ckpt", "train_xe"], ["captions.json", "must be a JSON list"]),
        file_case("caption_missing", caps, [{"image_id": image_id}], "evaluate", [*R, "--ckpt", "train_xe"],
                  ["captions.json", "record 0", "caption"]),
        file_case("caption_duplicate", caps, [{"image_id": image_id, "caption": "a"}] * 2, "evaluate",
                  [*R, "--ckpt", "train_xe"], ["captions.json", "record 1", "duplicate"]),
        # checkpoints: the resume state, an init checkpoint, a captioning checkpoint
        file_case("last_truncated", last, truncated, "train_xe", R, ["last.pt", "truncated or corrupt", "--fresh"]),
        file_case("last_not_a_dict", last, lambda p: _torch_save(p, [1, 2]), "train_xe", R,
                  ["last.pt", "not a checkpoint dict", "--fresh"]),
        file_case("last_wrong_keys", last, lambda p: _torch_save(p, {"step": 3}), "train_xe", R,
                  ["last.pt", "missing key", "--fresh"]),
        file_case("last_foreign_pickle", last, lambda p: p.write_bytes(pickle.dumps({"x": datetime.date(2020, 1, 1)}, protocol=2)), "train_xe", R,
                  ["last.pt", "--fresh"]),
        file_case("init_truncated", init, truncated, "train_s", ["--dataset", "tiny", "--variant", "r_lstm"],
                  ["train_xe/model.pt", "truncated or corrupt", "--fresh"]),
        file_case("init_wrong_keys", init, lambda p: _torch_save(p, {"config": {}}), "train_s",
                  ["--dataset", "tiny", "--variant", "r_lstm"], ["train_xe/model.pt", "state_dict", "--fresh"]),
        file_case("caption_model_not_a_dict", init, lambda p: _torch_save(p, "weights"), "caption",
                  ["--dataset", "tiny", "--variant", "r_lstm", "--ckpt", "train_xe"],
                  ["train_xe/model.pt", "not a checkpoint dict", "--fresh"]),
    ]
    return cases


def test_malformed_inputs_fail_clearly_and_damage_nothing(wd, killed_and_rerun, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(wd)
    monkeypatch.setenv("R2M_THREADS", "1")
    monkeypatch.delenv("R2M_FAULT", raising=False)
    monkeypatch.setenv("R2M_FORCE", "1")  # each case runs its stage (an instance whose record is current is cut off)
    assert (wd / "models/tiny/r_lstm/s0/train_xe/model.pt").exists()  # made by the preemption test
    keep = wd / "models/tiny/r_lstm/s0/train_xe/model.pt"
    keep_bytes = keep.read_bytes()
    before = _snapshot(wd)
    failures = []
    cases = _malformed_cases(wd, tmp_path)
    for case in cases:
        name, setup, argv, want = case[:4]
        saved = setup()
        try:
            rc, err = _r2m(argv, capsys)
        finally:
            if len(case) > 4:  # a file case: put the original back (or remove what we added)
                path = case[4]
                if saved is None:
                    path.unlink(missing_ok=True)
                else:
                    path.write_bytes(saved)
        FIGURES["malformed"] += 1
        errors = [x for x in err.splitlines() if "ERROR" in x or x.startswith("r2m ")]
        tb = "Traceback" in err
        FIGURES["tracebacks"] += tb
        # a tampered output of r2m's is now refused before it is parsed (its ownership marker records each file's
        # size): that one line names the file too
        marker_line = bool(errors) and "changed size since it was written" in errors[0] \
            and want[0].split(":")[0] in errors[0]
        clear = rc != 0 and len(errors) == 1 and (marker_line or all(w in errors[0] for w in want)) and not tb
        FIGURES["clear_errors"] += clear
        if not clear:
            failures.append(f"{name}: rc={rc} want {want} in one line; got:\n{err[-1500:]}")
    assert keep.read_bytes() == keep_bytes
    after = _snapshot(wd)
    damaged = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    FIGURES["outputs_damaged"] = len(damaged)
    assert len(cases) >= 20
    assert not failures, "\n\n".join(failures)
    assert not damaged, damaged


def test_snakemake_dry_run_checks_registry_names_up_front(wd, killed_and_rerun) -> None:
    r = snake(wd, "-n", "all", "--config", "extract_features={'backend': 'random_cnnn'}")
    assert r.returncode != 0
    assert "extract_features.backend: unknown feature backend 'random_cnnn'" in r.stdout + r.stderr


def test_unreadable_test_images_are_counted_and_named(wd, killed_and_rerun, tmp_path, monkeypatch, capsys) -> None:
    """Evaluation in a copy of the finished workdir with one test image listed as unreadable."""
    from r2m.reports.tables import eval_notes, read_eval

    work = tmp_path / "w"
    for top in ("data/tiny/prepared", "data/tiny/references", "results/tiny/r2m/s0/train_xe"):
        shutil.copytree(wd / top, work / top)
    shutil.copy2(wd / "params.yaml", work / "params.yaml")
    shutil.copytree(wd / "data/dictionaries", work / "data/dictionaries")
    image_id = json.loads((wd / "results/tiny/r2m/s0/train_xe/captions.json").read_text())[0]["image_id"]
    (work / "data/tiny/bad_images.csv").write_text(f"image_id,path,reason\n{image_id},x.png,cannot identify image\n")
    monkeypatch.chdir(work)
    rc, err = _r2m(["evaluate", "--dataset", "tiny", "--variant", "r2m", "--ckpt", "train_xe"], capsys)
    assert rc == 0 and "1 of 6 scored image(s) were unreadable" in err
    m = read_eval(work / "results/tiny/r2m/s0/train_xe/eval.json", "test")
    assert m["unreadable_images"] == 1 and m["unreadable_image_ids"] == [image_id]
    assert image_id in eval_notes({("tiny", "r2m"): m})[0]


@pytest.fixture(scope="module", autouse=True)
def fault_suite_figures():
    """The figures, printed once the module's tests have run (``pytest -s``). A report, not a test: each
    test above asserts its own fault directly (a test reading other tests' counters passes when run alone)."""
    yield
    print("\nfault suite:", json.dumps(FIGURES))

"""The DAG: one registry, Snakemake and DVC built from it, no drift."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from r2m.pipeline import dag
from r2m.stage import registry as S
from r2m.stage.registry import STAGES, Gather

BIN = Path(sys.executable).parent
REQUIRED = {
    "prepare", "references", "detect_concepts", "extract_features", "corpus_concepts", "build_vocab",
    "train_xe", "train_s", "train_m", "train_i", "caption", "evaluate", "table1", "table2", "table3", "claims",
}


def run(cmd, cwd, **kw):
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{BIN}:{os.environ['PATH']}"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, **kw)


SAMPLE = {"dataset": "tiny", "variant": "r2m", "ckpt": "train_s", "model": "mrnn", "seed": "0"}


def test_registry_has_the_required_stages_with_logs_and_sources(repo_root):
    names = {s.name for s in STAGES}
    assert REQUIRED <= names
    for s in STAGES:
        assert s.log.startswith(f"logs/{s.name}/")
        module, _, func = s.impl.partition(":")
        assert (repo_root / "src" / (module.replace(".", "/") + ".py")).exists(), f"{s.name}: {s.impl} has no file"


def _regex(template):
    return re.compile("^" + re.sub(r"\\{\w+\\}", "[^/]+", re.escape(template)) + "$")


def test_every_dep_is_produced_by_a_stage():
    produced = [_regex(o.path) for s in STAGES for o in s.outs.values()]
    sample = {"dataset": "tiny", "variant": "r2m", "ckpt": "train_s", "model": "mrnn", "seed": "1"}
    for s in STAGES:
        for dep in s.deps.values():
            path = (dep.pattern if isinstance(dep, Gather) else dep).format(**sample)
            assert any(r.match(path) for r in produced), f"{s.name}: nothing produces {path}"


def test_committed_dvc_yaml_matches_registry(repo_root):
    r = run([str(BIN / "r2m"), "dag", "--check"], cwd=repo_root)
    assert r.returncode == 0, r.stdout + r.stderr


def _repo_params(repo_root):
    from r2m import params as P

    return P.load(repo_root / "params.yaml")


def test_dag_check_detects_drift(tmp_path, repo_root):
    f = tmp_path / "dvc.yaml"
    params = str(repo_root / "params.yaml")
    f.write_text(dag.render(_repo_params(repo_root)).replace("r2m train_xe", "r2m train_xx"))
    assert dag.main(["--check", "--file", str(f), "--params", params]) == 1
    f.write_text(dag.render(_repo_params(repo_root)))
    assert dag.main(["--check", "--file", str(f), "--params", params]) == 0


def test_a_stale_instance_list_is_refused_in_one_line(tmp_path, repo_root, capsys):
    """Editing `seeds` without `r2m dag --write`: `r2m dag --check` and the resolver (the first stage of every
    `dvc repro`) both refuse, naming an instance dvc.yaml lacks; written again, both pass."""
    from r2m.pipeline import stamps_cmd

    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["seeds"] = [0, 1]  # the baselines gain seed 1 (the demo's R2M and ablations keep their own [0, 1, 2])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    shutil.copy(repo_root / "dvc.yaml", tmp_path / "dvc.yaml")
    args = ["--file", str(tmp_path / "dvc.yaml"), "--params", str(tmp_path / "params.yaml")]
    assert dag.main(["--check", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "r2m dag --write" in err and "@demo-mrnn-1" in err, err
    with pytest.raises(SystemExit, match="@demo-mrnn-1"):
        stamps_cmd.main(["--params", str(tmp_path / "params.yaml"), "--root", str(tmp_path)])
    assert not (tmp_path / ".stamps").exists()  # refused before writing anything
    assert dag.main(["--write", *args]) == 0
    assert dag.main(["--check", *args]) == 0
    assert stamps_cmd.main(["--params", str(tmp_path / "params.yaml"), "--root", str(tmp_path)]) == 0
    assert (tmp_path / ".stamps/train_sup/demo-mrnn-1.json").exists()


def test_a_dvc_file_from_before_the_stamps_moved_is_refused_and_the_old_stamps_removed(tmp_path, repo_root):
    """A workspace made while the stamps were kept in ``.params/``: its old ``dvc.yaml`` would have DVC compare
    stamps nothing writes, so ``r2m stamps`` (the first stage of every repro) refuses it in one line; written
    again, it runs, and removes the old ``.params/`` (nothing but stamps)."""
    from r2m.pipeline import stamps_cmd
    from r2m.stage.record import stamp_text

    shutil.copy(repo_root / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "dvc.yaml").write_text((repo_root / "dvc.yaml").read_text().replace(".stamps", ".params"))
    (tmp_path / ".params/prepare").mkdir(parents=True)
    (tmp_path / ".params/prepare/demo.json").write_text(stamp_text({}, []))
    args = ["--params", str(tmp_path / "params.yaml"), "--root", str(tmp_path)]
    with pytest.raises(SystemExit, match=r"^r2m stamps: .*stamps from \.params/, r2m writes them to \.stamps/: "
                                         r"run `r2m dag --write`$"):
        stamps_cmd.main(args)
    assert (tmp_path / ".params/prepare/demo.json").is_file() and not (tmp_path / ".stamps").exists()
    assert dag.main(["--write", "--file", str(tmp_path / "dvc.yaml"), *args[:2]]) == 0
    assert stamps_cmd.main(args) == 0
    assert not (tmp_path / ".params").exists() and (tmp_path / ".stamps/prepare/demo.json").is_file()


def test_dvc_yaml_runs_each_stage_over_its_listed_instances(repo_root):
    doc = yaml.safe_load((repo_root / "dvc.yaml").read_text())
    lists, stages = doc["vars"][0]["instances"], doc["stages"]
    assert stages["train_xe"]["foreach"] == stages["train_i"]["foreach"] == "${instances.dataset_variant_seeds}"
    # params.yaml: the demo's r2m and each ablation at seeds 0-2 (its catalog entry), paired seed by seed
    ablations = ("no_fm", "d_lstm", "r_lstm", "dr_lstm")
    assert lists["dataset_variant_seeds"] == {f"demo-{v}-{s}": {"dataset": "demo", "variant": v, "seed": str(s)}
                                 for v in ("r2m", *ablations) for s in (0, 1, 2)}
    # Table 3 reads r2m at every checkpoint, Table 2 each ablation's final one: nothing else is captioned
    assert stages["evaluate"]["foreach"] == "${instances.dataset_variant_ckpt_seeds}"
    assert sorted(lists["dataset_variant_ckpt_seeds"]) == sorted(
        [f"demo-r2m-{c}-{s}" for c in ("train_xe", "train_s", "train_m", "train_i") for s in (0, 1, 2)]
        + [f"demo-{v}-train_i-{s}" for v in ablations for s in (0, 1, 2)])
    assert stages["claims"]["cmd"] == "r2m claims" and "reports/claims.csv" in stages["report"]["deps"]
    assert sorted(lists["all_datasets"]) == ["demo", "tiny_paired"] and sorted(lists["datasets"]) == ["demo"]
    assert stages["inputs"]["foreach"] == "${instances.all_datasets}"
    assert stages["detect_concepts"]["foreach"] == "${instances.datasets}"
    train_xe = stages["train_xe"]["do"]
    assert not any(d.startswith("src/") or d.startswith(".stamps") for d in train_xe["deps"])  # code: its stamp
    # what the instance read reaches DVC through its stamp, rewritten at every repro (r2m.stage.record)
    assert stages["stamps"]["always_changed"] is True and "deps" not in stages["stamps"]
    assert {"models/${item.dataset}/${item.variant}/s${item.seed}/train_xe": {"persist": True}} in train_xe["outs"]
    train_s = stages["train_s"]["do"]
    assert train_s["params"] == [{".stamps/train_s/${item.dataset}-${item.variant}-${item.seed}.json": None}]


def test_snakemake_plans_default_and_tiny(repo_root, tmp_path):
    # plan in an empty working directory so existing outputs in the checkout do not matter
    shutil.copy(repo_root / "params.yaml", tmp_path / "params.yaml")
    sm = [str(BIN / "snakemake"), "-s", str(repo_root / "Snakefile"), "-d", str(tmp_path)]
    t0 = time.perf_counter()
    r = run([*sm, "-n", "--cores", "1", "reports/table1.csv"], cwd=tmp_path)
    elapsed = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "train_i" in out and ".r2m/done/prepare/demo" in out  # Snakemake knows an instance by its done file
    print(f"snakemake -n: {elapsed:.2f} s")
    r = run([*sm, "-n", "--cores", "1", "all", "--config", 'datasets=["tiny"]', 'baselines={"datasets": ["tiny"]}'],
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    for variant in ("r2m", "no_fm", "d_lstm", "r_lstm", "dr_lstm"):
        assert f".r2m/done/train_i/tiny-{variant}-0" in out
    assert ".r2m/done/train_sup/tiny-mrnn-0" in out and ".r2m/done/retrieval_r2m/tiny-0" in out
    assert "data/demo" not in out


def test_snakemake_fans_feature_extraction_out_into_shard_jobs(repo_root, tmp_path):
    shutil.copy(repo_root / "params.yaml", tmp_path / "params.yaml")
    sm = [str(BIN / "snakemake"), "-s", str(repo_root / "Snakefile"), "-d", str(tmp_path)]
    r = run([*sm, "-n", "-p", "--cores", "1", "data/tiny/features/features.h5", "--config", 'datasets=["tiny"]',
             'shards={"extract_features": 3}'], cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    for i in range(3):
        assert f"--shard {i} --num-shards 3 --parts-dir data/tiny/feature_shards/{i}" in out
    assert "--merge --parts-from data/tiny/feature_shards" in out
    r = run([*sm, "-n", "--cores", "1", "--config", 'shards={"train_xe": 2}'], cwd=tmp_path)
    assert r.returncode != 0 and "shards.train_xe: not a stage that can be sharded" in r.stdout + r.stderr


def test_gpu_stages_declare_snakemake_resources(repo_root, tmp_path, monkeypatch):
    """The rules Snakemake builds carry the registry's resources: gpu=1 (+ memory) on the stages
    that use CUDA, no gpu on the others (so `--resources gpu=N` and SLURM's --gpus see them)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings

    shutil.copy(repo_root / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    with SnakemakeApi(OutputSettings(quiet=True)) as api:
        wf = api.workflow(resource_settings=ResourceSettings(cores=1), config_settings=ConfigSettings(),
                          storage_settings=StorageSettings(), snakefile=repo_root / "Snakefile", workdir=tmp_path)
        rules = {r.name: {k: v.value for k, v in r.resources.items() if k in ("gpu", "mem_mb")}
                 for r in wf._workflow.rules}
        priority = {r.name: r.priority for r in wf._workflow.rules if r.name in S.BY_NAME}  # not the file rules
    gpu_stages = {"detect_concepts", "extract_features", "extract_features_sup", "train_xe", "train_s", "train_m",
                  "train_i", "train_e2e", "caption", "train_sup", "caption_sup"}
    for name in gpu_stages:
        assert rules[name]["gpu"] == 1 and rules[name]["mem_mb"] >= 8000, name
    for name in set(S.BY_NAME) - gpu_stages:
        assert "gpu" not in rules[name] and rules[name]["mem_mb"] > 0, name
    # the registry's priorities reach the rules; the demo's longest chain (measured: train_xe ~56 s, then
    # train_s ~43 s, train_m and train_i ~4 s each) outranks, link by link, the work that is ready beside it
    assert priority == {s.name: s.priority for s in S.STAGES}
    assert priority["build_vocab"] > priority["train_xe"] > priority["train_s"] > priority["train_m"] > 0
    assert priority["train_xe"] > max(priority[n] for n in ("train_sup", "retrieval_sup", "detect_concepts"))
    assert priority["evaluate"] == priority["caption"] == 0


def test_snakemake_rejects_invalid_config(repo_root):
    r = run([str(BIN / "snakemake"), "-n", "--cores", "1", "--config", "datasets=[nope]"], cwd=repo_root)
    assert r.returncode != 0
    assert "nope" in r.stdout + r.stderr


@pytest.mark.parametrize("argv", [["train_xe", "--dataset", "tiny", "--variant", "zzz"]])
def test_cli_rejects_bad_axis(argv, repo_root):
    r = run([str(BIN / "r2m"), *argv], cwd=repo_root)
    assert r.returncode == 2 and "zzz" in r.stderr


def test_stage_failure_is_one_clear_message_with_traceback_in_log(repo_root, tmp_path):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    (tmp_path / "photos").mkdir()  # exists and holds the referenced image (checked with the params)
    (tmp_path / "photos" / "a.png").write_bytes(b"png")
    (tmp_path / "refs.json").write_text('{"images": [{"id": 1, "file_name": "a.png"}], "annotations": []}')
    (tmp_path / "c.txt").write_text("\n\n")  # no sentence: fails when run
    raw["catalog"]["mine"] = {"kind": "folder", "images": str(tmp_path / "photos"), "corpus": "c.txt",
                              "references": "refs.json"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    r = run([str(BIN / "r2m"), "prepare", "--dataset", "mine"], cwd=tmp_path)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "r2m prepare failed" in r.stderr and "c.txt has no sentence" in r.stderr
    log = (tmp_path / "logs/prepare/mine.log").read_text()
    assert "Traceback" in log and "c.txt" in log
    assert not (tmp_path / "data/mine/prepared").exists()  # nothing half-written


# --------------------------------------------------------------------------- dvc repro can finish
def _lookup(params: dict, key: str):
    for part in key.split("."):
        params = params[part]
    return params


def _dvc_instances(doc: dict) -> list[tuple[str, list[str], list[str]]]:
    """(name, deps, outs) of every stage instance of a dvc.yaml, its ``foreach`` lists expanded from its vars."""
    lists = doc["vars"][0]["instances"]

    def outs_of(entry):
        return [next(iter(o)) if isinstance(o, dict) else o
                for kind in ("outs", "metrics", "plots") for o in entry.get(kind, [])]

    out = []
    for name, entry in doc["stages"].items():
        if "foreach" not in entry:
            out.append((name, entry.get("deps", []), outs_of(entry)))
            continue
        body = entry["do"]
        for key, item in lists[entry["foreach"][len("${instances."):-1]].items():

            def sub(text, item=item):
                return re.sub(r"\$\{item\.(\w+)\}", lambda m: str(item[m.group(1)]), text)

            out.append((f"{name}@{key}", [sub(d) for d in body.get("deps", [])], [sub(o) for o in outs_of(body)]))
    return out


def _tracked(repo_root: Path) -> set[str]:
    r = run(["git", "ls-files"], cwd=repo_root)
    assert r.returncode == 0, r.stderr
    files = set(r.stdout.split())
    return files | {str(Path(f).parent) for f in files} | {str(p) for f in files for p in Path(f).parents}


def _unproduced(doc: dict, tracked: set[str]) -> list[str]:
    instances = _dvc_instances(doc)
    outs = [(name, o) for name, _, os_ in instances for o in os_]
    missing = []
    for name, deps, _ in instances:
        for dep in deps:
            made = any(o == dep or dep.startswith(o + "/") or o.startswith(dep + "/")  # a Gather's parent folder
                       for other, o in outs if other != name)
            if not made and dep not in tracked:
                missing.append(f"{name}: {dep}")
    return missing


def test_every_dvc_dependency_is_produced_or_in_git(repo_root):
    """With the default params, every stage instance's dependencies are produced by another stage
    instance or tracked in git, so `dvc repro` can finish (the supervised stages run over
    baselines.datasets: the data stages run over both lists)."""
    doc = yaml.safe_load((repo_root / "dvc.yaml").read_text())
    tracked = _tracked(repo_root)
    assert _unproduced(doc, tracked) == []
    names = {n for n, _, _ in _dvc_instances(doc)}
    assert {"prepare@tiny_paired", "extract_features_sup@tiny_paired", "train_sup@tiny_paired-sat-0"} <= names
    # the check can fail: without tiny_paired in the data stages' list, nothing prepares it
    del doc["vars"][0]["instances"]["all_datasets"]["tiny_paired"]
    assert "pretrain_sup@tiny_paired-mrnn-0: data/tiny_paired/prepared/images.parquet" in _unproduced(doc, tracked)


def test_the_retired_derived_lists_are_refused_by_name(repo_root):
    from r2m import params as P

    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    for key in ("all_datasets", "all_seeds"):
        with pytest.raises(P.ParamsError, match=f"{key}: no longer a params key.*r2m dag --write"):
            P.validate({**raw, key: [0]})


def test_dvc_lists_the_data_stages_of_every_needed_dataset(repo_root):
    r = run([str(BIN / "dvc"), "stage", "list"], cwd=repo_root)
    assert r.returncode == 0, r.stderr
    names = {line.split()[0] for line in r.stdout.splitlines() if line.strip()}
    assert {"prepare@demo", "prepare@tiny_paired", "extract_features_sup@tiny_paired"} <= names

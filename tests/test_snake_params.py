"""The params file each Snakemake invocation hands its jobs (:func:`r2m.pipeline.snake.write_merged_params`): named
by its content and never rewritten, so a job reads the params of the invocation that started it, whatever a later
invocation (a dry run with other ``--config``) writes; and the repository's DAG as Snakemake and DVC list it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from conftest import tiny_workflow
from r2m.pipeline import validate as V
from r2m.pipeline.resolved import dag_instances
from r2m.pipeline.snake import write_merged_params
from test_plans import parse_plan

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_merged_params_are_named_by_their_content_and_never_rewritten(tmp_path):
    one = write_merged_params({"seeds": [0], "caption": {"beam": 3}}, str(tmp_path))
    again = write_merged_params({"seeds": [0], "caption": {"beam": 3}}, str(tmp_path))
    other = write_merged_params({"seeds": [0], "caption": {"beam": 2}}, str(tmp_path))
    assert one == again and one != other
    assert yaml.safe_load(Path(one).read_text()) == {"seeds": [0], "caption": {"beam": 3}}
    assert yaml.safe_load(Path(other).read_text())["caption"]["beam"] == 2
    Path(one).write_text("seeds: [0]\n# a job's copy, as it was\n")  # an existing file is left as it is
    assert write_merged_params({"seeds": [0], "caption": {"beam": 3}}, str(tmp_path)) == one
    assert Path(one).read_text() == "seeds: [0]\n# a job's copy, as it was\n"
    assert Path(one).parent == tmp_path and Path(one).suffix == ".yaml"


def _params_file(plan: str, stage: str) -> Path:
    """The ``--params`` file of ``stage``'s job in a ``snakemake -n -p`` plan."""
    line = next(ln for ln in plan.splitlines() if f" {stage} --dataset" in ln and "--params" in ln)
    return Path(line.split("--params", 1)[1].split()[0].strip("'"))


def test_a_dry_run_with_other_params_never_changes_a_planned_jobs_params(tmp_path):
    """Two dry runs of the tiny workflow, the second with another ``--config``: each plans its jobs with its own
    params file; the first one's is left as it was."""
    tiny_workflow(ROOT, tmp_path)

    def plan(*config: str) -> str:
        cmd = [str(BIN / "snakemake"), "--cores", "1", "-n", "-p", "all", *(("--config", *config) if config else ())]
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout + r.stderr

    running = plan()
    mine = tmp_path / _params_file(running, "train_s")
    before = mine.read_text()
    other = plan('fidelity={"rec_loss": "mse_raw"}')
    theirs = tmp_path / _params_file(other, "train_s")
    assert theirs != mine
    assert mine.read_text() == before, "a dry run rewrote the params file a running job reads"
    assert yaml.safe_load(theirs.read_text())["fidelity"]["rec_loss"] == "mse_raw"
    assert yaml.safe_load(before)["fidelity"].get("rec_loss") != "mse_raw"


def test_the_repository_dag_has_one_instance_per_job(tmp_path):
    """The repository's params: the demo's R2M and its four ablations at seeds 0-2; the baselines on demo and
    tiny_paired. Counted by hand: 3 data stages x 2 datasets, 4 per-dataset stages and `figures` on demo,
    4 training stages x 15 runs, caption and evaluate x (3 seeds x 4 checkpoints + 4 ablations x 3 seeds),
    `retrieval_r2m` at R2M's 3 seeds, 2 per-dataset baseline stages and `mostfreq` x 2, 6 baseline stages x 4
    models x 2 datasets, and the 7 gathering stages: 6 + 5 + 60 + 48 + 3 + 6 + 48 + 7 = 183. The committed
    dvc.yaml lists exactly the jobs Snakemake's own dry run of `all` plans on those params (in an empty folder)."""
    params = V.load(ROOT / "params.yaml")
    assert len(dag_instances(params)) == 183
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    r = subprocess.run([str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path), "-n", "-p",
                        "--cores", "1", "all"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    lists = doc["vars"][0]["instances"]
    listed = {(name, key) for name, entry in doc["stages"].items() if "foreach" in entry
              for key in lists[entry["foreach"][len("${instances."):-1]]}
    listed |= {(name, "all") for name, entry in doc["stages"].items() if "foreach" not in entry}
    assert listed - {("stamps", "all")} == parse_plan(r.stdout + r.stderr)
    guide = " ".join((ROOT / "docs/guide/running.md").read_text().split())
    assert "the same 183 stage instances" in guide and "216 more instances" not in guide

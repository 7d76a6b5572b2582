"""How Snakemake sees an instance: by its done file (r2m.pipeline.snake), never by the outputs r2m writes.

Expectations from what the mapping must be: every output path of every instance of the repository's DAG (and of
tiny's) leads back to that same instance; a file outside the DAG leads to none; a job's inputs are the done
files of the instances that wrote what it reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from r2m import params as P
from r2m.pipeline.resolved import dag_instances
from r2m.pipeline.snake import Producers, done_file, input_files, rule_outputs, target_files
from r2m.stage import registry as S

ROOT = Path(__file__).resolve().parents[1]


def _params(datasets: list[str]) -> P.Params:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["datasets"] = datasets
    raw["baselines"]["datasets"] = datasets
    return P.validate(raw)


@pytest.mark.parametrize("datasets", [["demo"], ["tiny"]])
def test_every_output_of_every_instance_leads_back_to_it(datasets):
    params = _params(datasets)
    producers = Producers(params)
    instances = dag_instances(params)
    assert len(instances) > 50
    for stage, bound in instances:
        for out in stage.outs.values():
            path = out.path.format(**bound)
            assert producers(path) == (stage, dict(bound)), path
            for member in out.members:  # a file inside a folder output: the folder's writer
                assert producers(f"{path}/{member}") == (stage, dict(bound))


def test_a_file_outside_the_dag_leads_to_no_instance_and_stays_an_input():
    producers = Producers(_params(["demo"]))
    for path in ("data/demo/photos.yaml", "data/demo/corpus.txt", "data/dictionaries/coco80.names"):
        assert producers(path) is None
    assert input_files(["data/demo/photos.yaml", "data/demo/vocab", "data/demo/vocab/vocab.json"], producers) == \
        ["data/demo/photos.yaml", ".r2m/done/build_vocab/demo"]


def test_a_rule_declares_its_done_file_and_only_a_summary_its_report_files():
    assert rule_outputs(S.BY_NAME["build_vocab"]) == {"done": ".r2m/done/build_vocab/{dataset}"}
    assert rule_outputs(S.BY_NAME["train_xe"]) == {"done": ".r2m/done/train_xe/{dataset}-{variant}-{seed}"}
    assert rule_outputs(S.BY_NAME["table1"]) == {"done": ".r2m/done/table1/all", "csv": "reports/table1.csv",
                                                 "md": "reports/table1.md"}
    assert done_file(S.BY_NAME["evaluate"], {"dataset": "demo", "variant": "r2m", "ckpt": "train_i", "seed": "2"}) \
        == ".r2m/done/evaluate/demo-r2m-train_i-2"


def test_the_files_a_user_may_name_are_file_outputs_and_key_files():
    assert target_files(S.BY_NAME["build_vocab"]) == [f"data/{{dataset}}/vocab/{m}" for m in
                                                      ("vocab.json", "encoded.parquet", "stats.json")]
    assert target_files(S.BY_NAME["evaluate"])[0] == "results/{dataset}/{variant}/s{seed}/{ckpt}/eval.json"
    assert target_files(S.BY_NAME["table1"]) == []  # declared by its own rule
    assert target_files(S.BY_NAME["figures"]) == []  # a folder without key files: named by its done file


def test_a_job_named_by_forcerun_forgets_its_record_even_when_its_upstream_also_reruns(tmp_path):
    """``snakemake --forcerun train_xe`` while build_vocab is stale: Snakemake gives train_xe's job the reason
    "input updated by another job", not "forced"; its record is still forgotten, so it recomputes instead of
    finding its (byte-identical) inputs current. A job nobody named keeps its record."""
    from types import SimpleNamespace

    from r2m.pipeline.snake import forget_forced
    from r2m.stage.record import record_path

    stages = {"train_xe": {"dataset": "tiny", "variant": "r2m", "seed": "0"}, "build_vocab": {"dataset": "tiny"}}
    class Thing:  # Snakemake's rules and jobs are hashed by identity
        def __init__(self, **kw):
            self.__dict__.update(kw)

    rules = {name: Thing(name=name) for name in stages}
    jobs = [Thing(rule=rules[name], wildcards_dict=axes, output=[done_file(S.BY_NAME[name], axes)])
            for name, axes in stages.items()]
    for name, axes in stages.items():
        path = record_path(tmp_path, S.BY_NAME[name], axes)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    dag = SimpleNamespace(needrun_jobs=lambda: jobs, reason=lambda job: SimpleNamespace(forced=False),
                          forcerules={rules["train_xe"]}, forcefiles=set(), omitforce=set())
    assert forget_forced(dag, tmp_path) == [str(record_path(tmp_path, S.BY_NAME["train_xe"], stages["train_xe"]))]
    assert record_path(tmp_path, S.BY_NAME["build_vocab"], stages["build_vocab"]).exists()
    dag.forcerules = set()
    assert forget_forced(dag, tmp_path) == []  # nothing named: no record forgotten

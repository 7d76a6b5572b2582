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

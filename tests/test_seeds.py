"""Seeds as a DAG axis: a run's seed drives its random choices, seed 0 is the single-seed run of
before, the resolved params of one seed never change when another is added, the tables gather every seed
of a row, and bad seed lists are one line."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import statistics
from pathlib import Path

import pytest
import torch
import yaml

from r2m import params as P
from r2m.pipeline.resolved import dag_instances, instances
from r2m.stage import registry as S
from r2m.stage.context import StageContext
from test_training import make_params, make_synthetic

ROOT = Path(__file__).resolve().parents[1]
GATHERERS = {"table1", "table2", "table3", "claims", "figures", "baselines", "retrieval"}  # hand-listed: the seed Gathers


# --------------------------------------------------------------------------- a run's seed drives its draws
def _train(root: Path, params: P.Params, seed: str) -> dict[str, torch.Tensor]:
    from r2m.training.stages import train

    ctx = StageContext(stage=S.get("train_xe"), params=params, dataset="syn", variant="r2m", seed=seed, root=root)
    train(ctx)
    return torch.load(root / f"models/syn/r2m/s{seed}/train_xe/model.pt", weights_only=True)["state_dict"]


def _synthetic(root: Path) -> Path:
    torch.set_num_threads(1)
    make_synthetic(root, n_sent=200, n_img=12)
    return root


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_two_seeds_differ_and_each_is_reproducible(tmp_path: Path) -> None:
    syn = _synthetic(tmp_path)
    p = make_params(train_xe={"steps": 4}, model={"dropout": 0.2})  # dropout: one more draw the seed makes
    first = _train(syn, p, "0")
    loss0 = (syn / "results/syn/r2m/s0/train_xe/loss.tsv").read_text()
    other = _train(syn, p, "1")
    assert (syn / "results/syn/r2m/s0/train_xe/loss.tsv").read_text() == loss0  # seed 1 leaves seed 0's run alone
    again = _train(syn, p, "0")
    assert _same(first, again)  # same seed twice: bit-identical weights
    assert not _same(first, other)  # another seed: another initialisation and batch order
    assert (syn / "results/syn/r2m/s1/train_xe/loss.tsv").read_text() != loss0


def test_a_run_seed_is_the_stage_seed_shifted(tmp_path: Path) -> None:
    """Seed 1 of a stage whose own ``seed`` is 0 draws exactly what the single-seed code path (seed axis 0, so
    nothing shifted) draws with the stage's ``seed: 1`` — every random source reads that one number."""
    syn = _synthetic(tmp_path)
    shifted = _train(syn, make_params(train_xe={"steps": 4}), "1")
    plain = _train(syn, make_params(train_xe={"steps": 4, "seed": 1}), "0")
    assert _same(shifted, plain)


def test_seed_zero_is_the_single_seed_view() -> None:
    p = make_params()
    assert P.with_seed(p, 0) is p  # seeds: [0] computes what the code computed before the axis
    q = P.with_seed(p.model_copy(update={"train_sup": p.train_sup.model_copy(
        update={"per_model": {"sat": {"seed": 7}}})}), 2)
    assert [getattr(q, s).seed for s in P.SEEDED_SECTIONS] == [getattr(p, s).seed + 2 for s in P.SEEDED_SECTIONS]
    assert q.train_sup.for_model("sat").seed == 9 and q.train_sup.for_model("mrnn").seed == p.train_sup.seed + 2


# --------------------------------------------------------------------------- resolved params per seed
def _raw(**top) -> dict:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw.update(datasets=["tiny"], variants=["r2m", "no_fm"], **top)
    raw["baselines"].update(datasets=["tiny", "demo"], models=["mrnn", "sat"])
    return raw


def test_seed_zero_resolves_as_before_and_adding_a_seed_changes_none_of_its_files() -> None:
    one = P.validate(_raw(seeds=[0]))
    two = P.validate(_raw(seeds=[0, 1]))
    for stage, bound in instances(one):  # the stage without its seed axis: the instance the pre-axis DAG resolved
        if "seed" in bound:
            old = dataclasses.replace(stage, axes=tuple(a for a in stage.axes if a != "seed"))
            unseeded = {k: v for k, v in bound.items() if k != "seed"}
            assert stage.resolved(one, bound) == old.resolved(one, unseeded), (stage.name, bound)
    a, b = all_instance_params(one), all_instance_params(two)
    changed = {f.split("/")[1] for f, text in a.items() if b[f] != text}
    assert changed == GATHERERS  # only the stages gathering every seed (they declare `seeds`)
    new = set(b) - set(a)
    assert new and all(f.endswith("-1.json") for f in new)
    # seed 1's training params differ from seed 0's exactly in the seed (the file names another instance)
    s0, s1 = (json.loads(b[f".stamps/train_xe/tiny-r2m-{k}.json"]) for k in (0, 1))
    assert s1["train_xe"].pop("seed") == s0["train_xe"].pop("seed") + 1 and s0 == s1


def test_a_catalog_entry_gives_its_own_seeds_per_variant() -> None:
    raw = _raw(seeds=[0])
    raw["catalog"]["tiny"]["seeds"] = {"r2m": [0, 1, 2]}
    params = P.validate(raw)
    assert P.seeds_for(params, "tiny", "r2m") == [0, 1, 2] and P.seeds_for(params, "tiny", "no_fm") == [0]
    assert P.seeds_for(params, "demo", "mrnn") == [0]
    raw["catalog"]["tiny"]["seeds"] = [3, 4]
    params = P.validate(raw)
    assert P.seeds_for(params, "tiny", "sat") == [3, 4] and P.seeds_for(params, "demo", "sat") == [0]


def test_prepare_does_not_depend_on_the_entry_seeds() -> None:
    raw = _raw()
    before = all_instance_params(P.validate(raw))
    raw["catalog"]["tiny"]["seeds"] = [0, 1]
    after = all_instance_params(P.validate(raw))
    assert {f.split("/")[1] for f in before if before[f] != after.get(f)} == GATHERERS  # and new seed-1 files


def all_instance_params(params: P.Params) -> dict[str, str]:
    """``.stamps/<stage>/<key>.json`` -> the instance's resolved sections (``Stage.resolved``) as JSON text."""
    views = P.Views(params)  # each dataset/seed view made once for the whole DAG
    return {f".stamps/{stage.name}/{stage.key(bound)}.json": json.dumps(stage.resolved(views, bound), sort_keys=True)
            for stage, bound in dag_instances(params)}


@pytest.mark.parametrize("where,value,message", [
    ("seeds", [], "give at least one seed"),
    ("seeds", [0, -1], "non-negative"),
    ("seeds", [1, 1], "listed twice"),
    ("entry", {"r2m": [0], "nope": [1]}, "seeds.nope: not a variant or baseline"),
    ("entry", {"r2m": [2, 2]}, "seeds.r2m: a seed is listed twice"),
])
def test_bad_seed_lists_are_one_line(where, value, message) -> None:
    raw = _raw()
    if where == "seeds":
        raw["seeds"] = value
    else:
        raw["catalog"]["tiny"]["seeds"] = value
    with pytest.raises(P.ParamsError, match=message) as err:
        P.validate(raw, "params.yaml")
    assert "\n" not in str(err.value) and "params.yaml" in str(err.value)


def test_a_bad_seed_argument_is_one_line(capsys) -> None:
    from r2m.cli import main

    assert main(["train_xe", "--dataset", "tiny", "--variant", "r2m", "--seed", "x1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "r2m train_xe: --seed 'x1': a run's seed is a non-negative integer, at most 4294967295"


# --------------------------------------------------------------------------- the tables gather every seed
def test_table1_row_is_the_mean_over_its_seeds(tmp_path: Path) -> None:
    from r2m.reports import tables
    from test_reports import fake_metrics, random_stats, write_stats

    raw = _raw(seeds=[0])
    raw["catalog"]["tiny"]["seeds"] = {"r2m": [0, 1, 2]}
    params = P.validate(raw)
    from r2m.evaluation.bootstrap import corpus_metrics

    stats = {s: random_stats(8, seed=int(s)) for s in ("0", "1", "2")}
    # each seed's eval.json holds the corpus CIDEr its per-image statistics give (as evaluate writes them)
    cider = {s: float(corpus_metrics(st, metrics=["CIDEr"])["CIDEr"]) for s, st in stats.items()}
    assert len(set(cider.values())) == 3
    for seed, c in cider.items():
        folder = tmp_path / f"results/tiny/r2m/s{seed}/train_i"
        folder.mkdir(parents=True)
        metrics = {**fake_metrics(0.0), "CIDEr": c}
        (folder / "eval.json").write_text(json.dumps(metrics))
        write_stats(folder / "per_image.parquet", stats[seed], metrics)
    tables.table1(StageContext(stage=S.get("table1"), params=params, root=tmp_path))
    rows = [r for r in csv.DictReader((tmp_path / "reports/table1.csv").open()) if r["source"] == "this run"]
    assert len(rows) == 1 and rows[0]["seeds"] == "3" and rows[0]["interval"] in ("t over seeds", "t over seeds and images")
    assert float(rows[0]["C"]) == pytest.approx(100 * statistics.mean(cider.values()), abs=0.051)
    assert float(rows[0]["C_lo"]) < float(rows[0]["C"]) < float(rows[0]["C_hi"])


def test_seeds_from_the_snakemake_command_line() -> None:
    """`--config 'seeds=[0,1,2]'` reaches the params as strings (Snakemake reads lists with YAML's base loader)."""
    from snakemake.cli import parse_config

    given = parse_config(["seeds=[0,1,2]"])["seeds"]
    assert given == ["0", "1", "2"]  # what the schema receives
    assert P.validate(_raw(seeds=given)).seeds == [0, 1, 2]
    with pytest.raises(P.ParamsError, match="seeds"):
        P.validate(_raw(seeds=["one"]))


def test_by_hand_a_stage_runs_seed_zero() -> None:
    """The engines always pass `--seed`; `r2m train_xe --dataset D --variant V` by hand is the single-seed run."""
    from r2m.cli import _stage_parser

    args = _stage_parser(S.get("train_xe")).parse_args(["--dataset", "tiny", "--variant", "r2m"])
    assert args.seed == "0"
    assert S.get("train_xe").log.format(dataset="tiny", variant="r2m", seed=args.seed) == "logs/train_xe/tiny-r2m-0.log"


# --------------------------------------------------------------------------- same machine: bit-identical
def test_two_runs_of_a_training_stage_on_tiny_are_bit_identical(tmp_path: Path, monkeypatch) -> None:
    """The same seed on the same machine gives the same bits: `tiny`'s data stages once, then `r2m train_xe` in two
    copies of that workspace, each in its own process (one thread, CPU, as the DAG runs it). The weights file, the
    loss curve and every recorded number but the timings are byte-identical. (On another CPU the floats differ:
    the docs say so; that is not testable on one machine.)"""
    import shutil
    import subprocess
    import sys

    from r2m.cli import main

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["datasets"], raw["baselines"]["datasets"] = ["tiny"], ["tiny"]
    first = tmp_path / "a"
    first.mkdir()
    shutil.copytree(ROOT / "data/dictionaries", first / "data/dictionaries")
    (first / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.chdir(first)
    for stage in ("inputs", "prepare", "corpus_concepts", "build_vocab"):
        assert main([stage, "--dataset", "tiny", "--params", "params.yaml", "--no-log-file"]) == 0, stage
    second = tmp_path / "b"
    shutil.copytree(first, second)
    env = {**os.environ, "R2M_THREADS": "1", "R2M_DEVICE": "cpu", "R2M_NO_PROGRESS": "1"}
    for wd in (first, second):
        r = subprocess.run([str(Path(sys.executable).parent / "r2m"), "train_xe", "--dataset", "tiny", "--variant",
                            "r2m", "--seed", "1", "--params", "params.yaml", "--no-log-file"], cwd=wd, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    model, results = "models/tiny/r2m/s1/train_xe/model.pt", "results/tiny/r2m/s1/train_xe"
    assert (first / model).read_bytes() == (second / model).read_bytes()
    assert (first / results / "loss.tsv").read_bytes() == (second / results / "loss.tsv").read_bytes()
    # no timings in an output: the metrics file is the same bytes too (a reader's record digests it)
    assert (first / results / "train_metrics.json").read_bytes() == (second / results / "train_metrics.json").read_bytes()
    assert len((first / results / "loss.tsv").read_text().splitlines()) > 10  # a run that trained, not an empty one

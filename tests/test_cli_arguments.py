"""Every numeric option of every subcommand, at 0, -1, nan, a huge value and a word: a value outside the
option's range is refused in one line naming the option, before any work (exit 2), never a traceback or a
run that fails later. The table below is the options' ranges as their help and the paper's sizes say (the
smallest value that makes sense), written apart from the parsers; the values a range admits (0 for
``--threads``) are not run here, since they would start the work.
"""

from __future__ import annotations

import time

import pytest
import yaml

from test_hostile_inputs import base_params, cli, one_line

HUGE = "1000000000000000"  # 10**15: more images, steps, threads, trials... than any machine runs
PROBE_VALUES = ("0", "-1", "nan", HUGE, "abc")

# (command words, option, the smallest value it admits; None: a float range whose lower end is open at 0)
OPTIONS: list[tuple[tuple[str, ...], str, int | None]] = [
    *[(("bench", b), "--threads", 0) for b in ("train", "schedule", "sup", "features", "concepts")],
    (("bench", "train"), "--steps", 1), (("bench", "train"), "--warmup", 0), (("bench", "train"), "--batch", 1),
    (("bench", "train"), "--length", 2), (("bench", "train"), "--vocab", 8), (("bench", "train"), "--d", 1),
    (("bench", "train"), "--heads", 1), (("bench", "train"), "--d-k", 1),
    (("bench", "schedule"), "--scale", None), (("bench", "schedule"), "--batch", 1),
    (("bench", "schedule"), "--vocab", 8), (("bench", "schedule"), "--d", 1), (("bench", "schedule"), "--heads", 1),
    (("bench", "schedule"), "--d-k", 1), (("bench", "schedule"), "--check-every", 0),
    (("bench", "sup"), "--steps", 1), (("bench", "sup"), "--warmup", 0), (("bench", "sup"), "--batch", 1),
    (("bench", "sup"), "--length", 2), (("bench", "sup"), "--vocab", 8), (("bench", "sup"), "--feat-dim", 1),
    (("bench", "sup"), "--grid", 1),
    (("bench", "features"), "--images", 1), (("bench", "features"), "--batch", 1),
    (("bench", "features"), "--size", 16), (("bench", "features"), "--workers", 0),
    (("bench", "concepts"), "--threshold", 0), (("bench", "concepts"), "--max-per-image", 1),
    (("bench", "concepts"), "--batch-size", 1),
    (("bench", "evaluate"), "--images", 1), (("bench", "evaluate"), "--refs", 1),
    (("bench", "evaluate"), "--workers", 1), (("bench", "evaluate"), "--repeat", 1),
    (("bench", "evaluate"), "--seed", 0),
    (("bench", "bootstrap"), "--images", 1), (("bench", "bootstrap"), "--refs", 1),
    (("bench", "bootstrap"), "--resamples", 1), (("bench", "bootstrap"), "--scored", 0),
    (("bench", "bootstrap"), "--seed", 0),
    (("bench", "randomization"), "--images", 1), (("bench", "randomization"), "--refs", 1),
    (("bench", "randomization"), "--trials", 1), (("bench", "randomization"), "--scored", 0),
    (("bench", "randomization"), "--seed", 0),
    (("bench", "significance"), "--sizes", 2), (("bench", "significance"), "--pairs", 1),
    (("bench", "significance"), "--trials", 0), (("bench", "significance"), "--resamples", 1),
    (("bench", "significance"), "--images", 2), (("bench", "significance"), "--seed", 0),
    (("bench", "significance"), "--seed-sizes", 2), (("bench", "significance"), "--seeds", 2),
    (("bench", "significance"), "--pool", 4), (("bench", "significance"), "--seed-spreads", 0),
    (("bench", "scale"), "--sizes", None), (("bench", "scale"), "--budget", None),
    (("bench", "scale"), "--threads", 0),
    (("bench", "plan"), "--runs", 1), (("bench", "plan"), "--jobs", 0),
    (("compare", "a.json", "b.json", "--references", "r.json"), "--resamples", 1),
    (("compare", "a.json", "b.json", "--references", "r.json"), "--seed", 0),
    (("compare", "a.json", "b.json", "--references", "r.json"), "--level", None),
    (("power", "results"), "--deltas", None),
    (("caption", "x.png"), "--batch-size", 1), (("caption", "x.png"), "--beam", 1), (("caption", "x.png"), "--max-len", 1),
    (("extract_features", "--dataset", "tiny"), "--shard", 0),
    (("extract_features", "--dataset", "tiny"), "--num-shards", 1),
    (("train_xe", "--dataset", "tiny", "--variant", "r2m"), "--nproc", 1),
    (("prepare", "--dataset", "tiny"), "--threads", 0), (("prepare", "--dataset", "tiny"), "--workers", 0),
]


def _cases():
    for words, option, lowest in OPTIONS:
        for value in PROBE_VALUES:
            if value == "0" and lowest is not None and lowest <= 0:
                continue  # admitted: it would start the work
            yield pytest.param(words, option, value, id=f"{'-'.join(words[:2])}{option}={value}")


@pytest.fixture
def wd(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(base_params(), sort_keys=False))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("words", "option", "value"), list(_cases()))
def test_an_option_out_of_range_is_one_line_before_any_work(words, option, value, wd, capsys):
    t0 = time.process_time()
    assert cli(*words, option, value) == 2
    line = one_line(capsys.readouterr().err, option)
    assert value in line or value.lower() in line.lower(), line
    assert time.process_time() - t0 < 20  # refused before the work (imports aside)


NAMES = [  # options naming things: an unknown name is refused the same way
    (("bench", "train"), "--variant"), (("bench", "sup"), "--model"), (("bench", "features"), "--backends"),
    (("bench", "schedule"), "--stages"), (("bench", "evaluate"), "--scorers"), (("bench", "bootstrap"), "--scorers"),
    (("bench", "randomization"), "--scorers"), (("bench", "significance"), "--scorers"),
    (("bench", "significance"), "--seed-scorers"), (("bench", "scale"), "--stages"),
    (("bench", "concepts"), "--settings"), (("bench", "concepts"), "--dictionary"), (("bench", "train"), "--device"),
]


@pytest.mark.parametrize(("words", "option"), NAMES, ids=[f"{w[1]}{o}" for w, o in NAMES])
def test_an_unknown_name_is_one_line_before_any_work(words, option, wd, capsys):
    assert cli(*words, option, "nope") == 2
    one_line(capsys.readouterr().err, option, "nope")


@pytest.mark.parametrize(("old", "new"), [("resolve-params", "stamps")])
def test_a_renamed_command_is_one_line_naming_the_new_one(old, new, capsys):
    assert cli(old, "--root", ".") == 2
    one_line(capsys.readouterr().err, f"r2m {old}", f"r2m {new}")

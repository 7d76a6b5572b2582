"""METEOR with the paraphrase table cut to the scored segments (``r2m.evaluation.paraphrase``).

The cut must not change a number: the segment and corpus scores equal those of pycocoevalcap's own
``Meteor`` (the jar with its full 5.3-million-entry table) on captions built around entries of that
table, so that the paraphrase module really matches (its statistics are checked to be non-zero).
The index and the filter are checked on a hand-made table.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from r2m.evaluation import paraphrase as P
from r2m.evaluation.coco import _need_java
from r2m.evaluation.meteor import MeteorPool, SegmentMeteor, threads_available

# hypotheses and references around paraphrase pairs of METEOR's English table ("and rocks" /
# "and stones", "a day or two" / "a day or so", …), with the characters the cut accepts: capitals,
# digits, ' - . , /. The paraphrase module matches in the first segment (an entry of "a"/"the"
# words: a cut without the entries holding "a" or "the" gives another corpus score, 0.40308 for
# 0.40705, so the equality below is sensitive to a cut that drops a usable entry).
HYPS = ["a man walks on the beach and rocks near the sea",
        "we stayed there a day or two with 2 dogs.",
        "the plant died of a lack of water, sadly",
        "A Field of yellow flowers under a blue sky",
        "a boy's t-shirt hangs on a line 10/10"]
REFS = [["a man walking on a beach and stones by the sea", "a person on the shore"],
        ["they stayed a day or so with two dogs", "people staying with their dogs."],
        ["a plant that died of the lack of water", "a dead plant in a pot"],
        ["the field of yellow flowers below the sky", "flowers in a field"],
        ["the t-shirt of a boy hanging on a line", "a shirt on a washing line"]]
PARAPHRASE_CONTENT = 16  # METEOR 1.5 statistics: test-side content matches of module 4 (paraphrase)


@pytest.fixture(scope="module")
def full_table_scores():
    """pycocoevalcap's METEOR (the jar, the full table) on HYPS/REFS: (corpus, per segment)."""
    if _need_java("METEOR"):
        pytest.skip("no java")
    from pycocoevalcap.meteor.meteor import Meteor

    meteor = Meteor()
    try:
        ids = [str(k) for k in range(len(HYPS))]
        score, scores = meteor.compute_score({i: REFS[k] for k, i in enumerate(ids)},
                                             {i: [HYPS[k]] for k, i in enumerate(ids)})
    finally:
        del meteor
    return float(score), [float(s) for s in scores]


def test_cut_table_scores_as_the_full_table(full_table_scores, tmp_path):
    score, scores, stats = SegmentMeteor(1, 1).compute_stats(HYPS, REFS)
    assert (score, scores) == full_table_scores
    assert sum(float(s.split()[PARAPHRASE_CONTENT]) for s in stats) > 0  # the paraphrase module matched
    table = P.filtered_table(HYPS, REFS, tmp_path / "p.gz")
    kept = gzip.decompress(table.read_bytes()).count(b"\n") // 3
    assert 0 < kept < 100_000  # a cut of the 5.3 million entries, not the table itself


@pytest.mark.skipif(not threads_available(), reason="the threaded helper needs a JDK")
def test_threaded_helper_reads_the_cut_table(full_table_scores, tmp_path):
    table = P.filtered_table(HYPS, REFS, tmp_path / "p.gz")
    with MeteorPool(1, 2, table) as pool:
        score, scores, _ = pool.compute_stats(HYPS, REFS)
    assert (score, scores) == full_table_scores


@pytest.mark.skipif(not threads_available(), reason="the threaded helper needs a JDK")
def test_compiled_helper_answers_as_the_source_launch(full_table_scores, tmp_path, monkeypatch):
    """The helper compiled once into the cache and the helper run from its source by the launcher
    give the same statistics and scores (pycocoevalcap's)."""
    from r2m.evaluation import meteor as M

    table = P.filtered_table(HYPS, REFS, tmp_path / "p.gz")  # from the machine's index, before the cache moves
    monkeypatch.setenv("R2M_CACHE", str(tmp_path / "cache"))  # a fresh compile
    assert (M.compiled_helper() / "R2mMeteorThreads.class").is_file()
    assert M.compiled_helper().is_relative_to(tmp_path / "cache")
    answers = []
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(M, "compiled_helper", lambda: None)
        _, cmd = M._jar_dir_and_cmd(2, table, quick=True)
        assert (str(M.HELPER) in cmd) != compiled  # the source as the program, or the class by name
        with MeteorPool(1, 2, table, quick=True) as pool:
            answers.append(pool.compute_stats(HYPS, REFS))
    assert answers[0] == answers[1]
    assert answers[0][:2] == full_table_scores


def test_words_superset_holds_every_split_and_refuses_other_characters():
    words = P.words_superset(["A b-c", "d's"])
    for w in ("A", "a", "b-c", "b", "-", "c", "d's", "'s", "d", "'", "s", '"', "--"):
        assert w.encode() in words
    assert b"A b" not in words and b"bc" not in words  # no token across a space, no joined pieces
    assert P.words_superset(["a &quot; b"]) is None
    assert P.words_superset(['he said "hi"']) is None
    assert P.words_superset(["caf\u00e9"]) is None
    assert P.filtered_table(["a caf\u00e9"], [["a cafe"]], Path("/nonexistent/p.gz")) is None


def test_index_keeps_the_entries_made_of_known_words_in_table_order(tmp_path, monkeypatch):
    monkeypatch.setenv("R2M_CACHE", str(tmp_path / "cache"))
    table = tmp_path / "paraphrase-en.gz"
    entries = [("0.5", "a b", "c"), ("0.25", "x y", "a"), ("0.125", "c", "b  a"), ("0.1", "\ta ", "a\tb c"),
               ("0.3", "b", "z")]
    table.write_bytes(gzip.compress("".join(f"{p}\n{one}\n{two}\n" for p, one, two in entries).encode()))
    out = tmp_path / "cut.gz"
    assert P.write_filtered({b"a", b"b", b"c"}, out, table) == 3
    # the kept entries in order, words re-joined by one space (Java's StringTokenizer reads the same)
    assert gzip.decompress(out.read_bytes()) == b"0.5\na b\nc\n0.125\nc\nb a\n0.1\na\na b c\n"
    assert P.write_filtered({b"z", b"b"}, out, table) == 1
    assert gzip.decompress(out.read_bytes()) == b"0.3\nb\nz\n"
    assert len(list((tmp_path / "cache" / "meteor-paraphrase").glob("v*"))) == 1  # built once, reused


def _small_table(tmp_path: Path) -> Path:
    table = tmp_path / "paraphrase-en.gz"
    table.write_bytes(gzip.compress(b"0.5\na b\nc\n0.25\nx\ny\n"))
    return table


def test_concurrent_jobs_build_the_index_once(tmp_path, monkeypatch):
    import threading

    monkeypatch.setenv("R2M_CACHE", str(tmp_path / "cache"))
    table, real, calls = _small_table(tmp_path), P._build, []

    def slow_build(src: Path, folder: Path) -> None:
        calls.append(folder)
        threading.Event().wait(0.3)  # the other job arrives while this one builds
        real(src, folder)

    monkeypatch.setattr(P, "_build", slow_build)
    jobs = [threading.Thread(target=P.write_filtered, args=({b"x", b"y"}, tmp_path / f"{k}.gz", table))
            for k in range(2)]
    for j in jobs:
        j.start()
    for j in jobs:
        j.join()
    assert len(calls) == 1
    for k in range(2):
        assert gzip.decompress((tmp_path / f"{k}.gz").read_bytes()) == b"0.25\nx\ny\n"


def test_a_damaged_index_falls_back_to_the_full_table(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("R2M_CACHE", str(tmp_path / "cache"))
    table = _small_table(tmp_path)
    monkeypatch.setattr(P, "table_path", lambda: table)
    assert P.filtered_table(["x"], [["y"]], tmp_path / "cut.gz") == tmp_path / "cut.gz"
    (P.index() / "tokens.npy").write_bytes(b"\x93NUMPY truncated")
    assert P.filtered_table(["x"], [["y"]], tmp_path / "cut2.gz") is None
    assert "full paraphrase table" in caplog.text

"""Bootstrap intervals from each metric's corpus form: the identity resample is what
``r2m evaluate`` reports, a resample's BLEU/METEOR is the corpus metric of that resample, intervals
narrow with more images, the paired test finds a uniformly better system and keeps its rate on a
planted null, ``r2m compare`` (A A: exactly 0; one-line errors), the t interval against t tables."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from r2m.bench.evaluate import WORDS
from r2m.evaluation import bootstrap as B
from r2m.evaluation import coco, per_image
from r2m.stage import registry as S
from r2m.stage.context import StageContext
from test_evaluation import _params, _refs_json, _write, no_spice, refs_dir, shared_meteor_pool  # noqa: F401

SCORERS = ["bleu", "meteor", "rouge", "cider"]


def _rows(results, references, tokenizer="none"):
    metrics, per, stats = coco.evaluate_stats(results, references, SCORERS, tokenizer=tokenizer, parallel="serial")
    return per_image.from_evaluation(list(results), per, stats), metrics


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12)))


@pytest.fixture(scope="module")
def corpus(shared_meteor_pool):  # noqa: F811
    """400 images × 5 references; two independent caption runs and their per-image statistics."""
    rng = random.Random(7)
    refs = {f"i{k}": [_sentence(rng) for _ in range(5)] for k in range(400)}
    runs = []
    for _ in range(2):
        res = {}
        for i in refs:  # half the words from a reference: scores vary from image to image
            words = rng.choice(refs[i]).split()
            res[i] = " ".join(w if rng.random() < 0.5 else rng.choice(WORDS) for w in words)
        runs.append(res)
    return refs, runs, [_rows(r, refs)[0] for r in runs]


# --------------------------------------------------------------------------- corpus forms
def test_identity_and_any_multiset_equal_the_corpus_metric_scored_directly(no_spice, shared_meteor_pool):  # noqa: F811
    """PTB-tokenised captions: the identity resample gives what evaluate reports; a multiset with a
    repeated image (scored directly as a corpus holding a renamed copy) gives BLEU and METEOR as
    pycocoevalcap's BLEU and METEOR's jar compute them on that corpus."""
    from test_evaluation import PTB_REFS, PTB_RES

    rows, metrics = _rows(PTB_RES, PTB_REFS, tokenizer="ptb")
    ident = B.corpus_metrics(rows)
    assert set(ident) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr"}
    for m, v in ident.items():
        assert float(v) == pytest.approx(metrics[m], abs=1e-9, rel=0), m
        assert f"{float(v):.4f}" == f"{metrics[m]:.4f}"
    # the multiset {10, 10, 12}: score a corpus with image 10 twice (as 10 and 10b)
    res = {"10": PTB_RES["10"], "10b": PTB_RES["10"], "12": PTB_RES["12"]}
    refs = {"10": PTB_REFS["10"], "10b": PTB_REFS["10"], "12": PTB_REFS["12"]}
    direct = coco.evaluate(res, refs, ["bleu", "meteor"], parallel="serial")[0]
    again = B.corpus_metrics(rows, [0, 0, 2], ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR"])
    for m, v in again.items():
        assert float(v) == pytest.approx(direct[m], abs=1e-9, rel=0), m
    assert float(again["Bleu_4"]) != pytest.approx(float(ident["Bleu_4"]), abs=1e-6)  # the multiset matters


def test_meteor_aggregate_reproduces_the_jars_eval():
    """Four segments' statistics and the corpus score METEOR 1.5's jar answered to their EVAL line
    (run once by hand; the second segment is a perfect one-chunk match, whose chunk EVAL leaves out)."""
    lines = ["8.0 10.0 4.0 5.0 4.0 4.0 4.0 4.0 " + "0.0 " * 12 + "2.0 8.0 8.0",
             "6.0 6.0 3.0 3.0 3.0 3.0 3.0 3.0 " + "0.0 " * 12 + "1.0 6.0 6.0",
             "2.0 6.0 1.0 3.0 0.0 0.0 1.0 1.0 " + "0.0 " * 12 + "1.0 1.0 1.0",
             "3.0 2.0 3.0 1.0 " + "0.0 " * 16 + "0.0 0.0 0.0"]
    cols = np.array([[float(x) for x in ln.split()] for ln in lines])
    rows = B.PerImage(("a", "b", "c", "d"), {c: cols[:, k] for k, c in enumerate(B.METEOR_COLUMNS)})
    assert float(B.corpus_metrics(rows)["METEOR"]) == pytest.approx(0.3558921574811747, abs=1e-12)
    segs = B.meteor_from_sums(cols)  # one segment = its own sums
    assert segs == pytest.approx([0.4497196124097984, 1.0, 0.037037037037037035, 0.0], abs=1e-12)


def test_demo_identity_resample_equals_eval_json(tmp_path, repo_root, no_spice, shared_meteor_pool,  # noqa: F811
                                                monkeypatch):
    """The evaluate stage on the demo's committed references (captions written here, concepts for
    concept recall): per_image.parquet's identity resample is every number eval.json reports."""
    from r2m.datasets.base import references_json
    from r2m.evaluation.stage import run

    demo = json.loads((repo_root / "data/demo/references.json").read_text())
    rng = random.Random(3)
    R = tmp_path / "results/demo/r2m/s0/train_i"
    prepared = tmp_path / "data/demo/prepared"
    R.mkdir(parents=True)
    prepared.mkdir(parents=True)
    refs_path = refs_dir(prepared) / "references.json"  # the references stage's
    _write(refs_path, references_json([{"id": i} for i in demo], demo))
    caps, info = [], []
    for i, refs in demo.items():
        words = rng.choice(refs).split()
        caps.append({"image_id": i, "caption": " ".join(w for w in words if rng.random() < 0.7).capitalize() + "."})
        info.append({"image_id": i, "concepts": rng.sample(sorted(set(" ".join(refs).split())), rng.randint(0, 3))})
    _write(R / "captions.json", caps)
    _write(R / "caption_info.json", {"counts": {}, "images": info})
    params = _params(repo_root, scorers=["bleu", "meteor", "rouge", "cider", "spice"])
    run(StageContext(stage=S.get("evaluate"), params=params, dataset="demo", variant="r2m", ckpt="train_i",
                     root=tmp_path))
    reported = json.loads((R / "eval.json").read_text())
    rows, meta = per_image.read(R / "per_image.parquet")
    assert rows.n == len(demo) and meta["metrics"]["CIDEr"] == reported["CIDEr"]
    ident = B.corpus_metrics(rows)
    assert set(ident) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr",
                          "concept_recall", "concept_any"}  # SPICE is missing here: not resampled
    for m, v in ident.items():
        assert float(v) == pytest.approx(reported[m], abs=1e-9, rel=0), m
    # r2m compare reuses the folder's statistics while they are those of its captions and references
    from r2m.evaluation import compare, stage

    def no_scoring(*a, **k):
        raise AssertionError("scored again")

    monkeypatch.setattr(stage, "evaluate_files", no_scoring)
    got = compare.compare([[str(R)], [str(R)]], refs_path, resamples=50)
    assert got["systems"][1]["metrics"]["CIDEr"]["value"] == pytest.approx(reported["CIDEr"], abs=1e-9)
    _write(R / "captions.json", caps[::-1])  # same captions, another file: its digest no longer matches
    with pytest.raises(AssertionError, match="scored again"):
        compare.compare([[str(R)], [str(R)]], refs_path, resamples=50)


# --------------------------------------------------------------------------- intervals
def test_interval_narrows_as_test_images_are_added(corpus):
    _, _, (rows, _) = corpus
    widths = {}
    for n in (25, 100, 400):
        ci = B.bootstrap_ci(rows.take(range(n)), resamples=500, seed=1)
        widths[n] = {m: iv.high - iv.low for m, iv in ci.items()}
        for m, iv in ci.items():
            assert iv.low <= iv.value <= iv.high, (n, m)
    for m in widths[25]:
        if m == "Bleu_4" and widths[25][m] == 0:
            continue
        assert widths[25][m] > widths[100][m] > widths[400][m] > 0, m
        # ~1/sqrt(n): 16x the images, about a quarter of the width
        assert 0.1 < widths[400][m] / widths[25][m] < 0.5, m


def test_uniformly_better_system_is_significant(corpus):
    """B captions each image with one of its references: better than A on every image and metric."""
    refs, runs, (a, _) = corpus
    b, _ = _rows({i: refs[i][0] for i in refs}, refs)
    worse = np.flatnonzero(a.columns["ROUGE_L"] < 1)  # leave out A's captions that are a reference already
    a, b = a.take(worse), b.take(worse)
    assert a.n > 350
    for m in ("ROUGE_L", "CIDEr"):
        assert (b.columns[m] > a.columns[m]).all()
    diffs = B.paired_bootstrap(a, b, resamples=1000, seed=0)
    assert set(diffs) == set(a.metrics())
    for m, d in diffs.items():
        assert d.significant and d.low > 0 and d.delta > 0 and d.p < 0.01, m
    back = B.paired_bootstrap(b, a, resamples=1000, seed=0)
    assert all(d.significant and d.high < 0 for d in back.values())


def test_planted_null_is_not_marked_more_often_than_the_level(corpus):
    """Two files each take every image's caption at random from the same two runs: they differ by
    chance alone. Over 400 such pairs the paired 95 % interval excludes 0 at about the 5 % rate."""
    refs, runs, (r1, r2) = corpus
    n = 300
    r1, r2 = r1.take(range(n)), r2.take(range(n))
    rng = np.random.default_rng(11)
    # the rows of a mixed file are the rows of the runs it took: check once against scoring it
    pick = rng.random(n) < 0.5
    ids = list(r1.ids)
    mixed, _ = _rows({i: runs[1][i] if p else runs[0][i] for i, p in zip(ids, pick, strict=True)},
                     {i: refs[i] for i in ids})
    for c in mixed.columns:
        if c != "CIDEr":  # CIDEr-D's df comes from the 400 images' references in the runs
            assert np.array_equal(mixed.columns[c], np.where(pick, r2.columns[c], r1.columns[c])), c

    def draw() -> B.PerImage:
        p = rng.random(n) < 0.5
        return B.PerImage(r1.ids, {c: np.where(p, r2.columns[c], r1.columns[c]) for c in r1.columns})

    draws = 400
    hits = {m: 0 for m in r1.metrics()}
    for k in range(draws):
        for m, d in B.paired_bootstrap(draw(), draw(), resamples=1000, seed=k).items():
            hits[m] += d.significant
    rates = {m: h / draws for m, h in hits.items()}
    print("planted-null rate of '*' over", draws, "pairs:", rates)
    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / draws)  # the level plus 3 binomial standard errors
    assert all(r <= bound for r in rates.values()), rates
    assert sum(hits.values()) > 0  # the test can mark a null (a constant "n.s." would pass otherwise)


# --------------------------------------------------------------------------- t over seeds
@pytest.mark.parametrize(("df", "table"), [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (29, 2.045)])
def test_t_quantile_matches_the_t_table(df, table):
    from r2m.evaluation import tdist

    assert tdist.t_two_sided(0.95, df) == pytest.approx(table, abs=5e-4)


def test_t_interval_hand_worked():
    iv = B.t_interval([1, 2, 3, 4, 5])  # mean 3, s = sqrt(2.5), t(4) = 2.7764
    half = 2.776445 * math.sqrt(2.5) / math.sqrt(5)
    assert (iv.value, iv.low, iv.high) == pytest.approx((3, 3 - half, 3 + half), abs=1e-5)
    with pytest.raises(ValueError, match="at least two"):
        B.t_interval([1.0])


# --------------------------------------------------------------------------- r2m compare
def _compare_files(tmp_path):
    from test_evaluation import NLG_HYP, NLG_REFS

    refs = _write(tmp_path / "refs.json", _refs_json(NLG_REFS))
    a = _write(tmp_path / "a.json", [{"image_id": k, "caption": v} for k, v in NLG_HYP.items()])
    return refs, a


def test_compare_a_with_itself_is_exactly_zero(tmp_path, capsys, no_spice, shared_meteor_pool):  # noqa: F811
    from r2m.cli import main

    refs, a = _compare_files(tmp_path)
    assert main(["compare", "--references", str(refs), str(a), str(a), "--json", "--resamples", "200"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["images"] == 2 and [s["name"] for s in out["systems"]] == ["A", "B"]
    diffs = out["differences"][0]["metrics"]
    assert set(diffs) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr"}
    for m, d in diffs.items():
        assert (d["delta"], d["low"], d["high"], d["significant"], d["p"]) == (0.0, 0.0, 0.0, False, 1.0), m
    assert out["systems"][0]["metrics"]["Bleu_1"]["value"] == pytest.approx(0.55)  # nlg-eval's published value


def test_compare_errors_are_one_line(tmp_path, capsys):
    from r2m.cli import main

    refs, a = _compare_files(tmp_path)
    other = _write(tmp_path / "other.json", [{"image_id": "1", "caption": "a dog"}, {"image_id": "9", "caption": "x"}])
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    unknown = _write(tmp_path / "unknown.json", [{"image_id": "1", "caption": "a"}, {"image_id": "7", "caption": "b"}])
    cases = [([str(unknown), str(unknown)], r"unknown\.json: 1 image id\(s\) have no reference captions in .*refs\.json: '7'"),([str(a), str(other)], r"other\.json: image ids differ from .*a\.json: 1 only in B, 1 only in A"),
             ([str(a), str(bad)], r"bad\.json: line 1: not valid JSON"),
             ([str(a), str(tmp_path / "gone.json")], r"gone\.json: no such results file or folder")]
    for systems, pattern in cases:
        assert main(["compare", "--references", str(refs), *systems]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("r2m compare: "), err
        assert __import__("re").search(pattern, err), err
    assert main(["compare", "--references", str(tmp_path / "none.json"), str(a), str(a)]) == 2
    assert capsys.readouterr().err == f"r2m compare: {tmp_path / 'none.json'}: references file not found\n"


def test_per_image_file_round_trip_and_foreign_file(tmp_path):
    rows = B.PerImage(("1", "2"), {"CIDEr": np.array([0.5, 1.5]), "ROUGE_L": np.array([0.2, 0.4])})
    per_image.write(tmp_path / "p.parquet", rows, {"metrics": {"CIDEr": 1.0}})
    back, meta = per_image.read(tmp_path / "p.parquet")
    assert back.ids == rows.ids and meta["metrics"] == {"CIDEr": 1.0} and "held fixed" in meta["cider_df"]
    assert float(B.corpus_metrics(back)["CIDEr"]) == 1.0
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), tmp_path / "foreign.parquet")
    with pytest.raises(per_image.PerImageError, match=r"foreign\.parquet: not an r2m per-image file"):
        per_image.read(tmp_path / "foreign.parquet")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(per_image.PerImageError, match=r"junk\.parquet: unreadable per-image file"):
        per_image.read(tmp_path / "junk.parquet")


def test_corpus_metrics_rejects_bad_indices():
    rows = B.PerImage(("1",), {"CIDEr": np.array([1.0])})
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        B.corpus_metrics(rows, [3])
    with pytest.raises(ValueError, match="different images"):
        B.paired_bootstrap(rows, B.PerImage(("2",), {"CIDEr": np.array([1.0])}))


def test_bench_prints_the_bootstrap_time(capsys):
    from r2m.bench.bootstrap import main

    assert main(["--images", "60", "--refs", "3", "--resamples", "100", "--scorers", "bleu,rouge,cider"]) == 0
    out = capsys.readouterr().out
    assert "bootstrap_ci, one system, all metrics:" in out and "max |diff| = " in out
    worst = float(out.split("max |diff| = ")[1].split()[0])
    assert worst < 1e-9


def test_skipped_baseline_writes_an_empty_per_image_file(tmp_path, repo_root):
    from r2m.supervised.scores import evaluate

    vocab = tmp_path / "data/demo/sup_vocab"
    vocab.mkdir(parents=True)
    _write(vocab / "stats.json", {"paired": False, "reason": "no train_references.json"})
    ctx = StageContext(stage=S.get("evaluate_sup"), params=_params(repo_root), dataset="demo", model="mrnn",
                       root=tmp_path)
    evaluate(ctx)
    rows, meta = per_image.read(ctx.outs["stats"])
    assert rows.n == 0 and meta["skipped"] == "no train_references.json"

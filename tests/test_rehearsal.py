"""The ``rehearsal`` recipe (benchmark-shaped synthetic inputs) and ``r2m bench scale`` on tiny sizes."""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from r2m.bench import scale as B
from r2m.datasets import rehearsal as R
from r2m.datasets.recipes import recipe
from r2m.params import DatasetEntry

ROOT = Path(__file__).resolve().parents[1]
SCALE = 2e-4  # MSCOCO: 23 / 1 / 1 images; Shutterstock: 465 sentences


def _prepare(out: Path, **options) -> dict:
    entry = DatasetEntry.model_validate({"kind": "rehearsal", "scale": SCALE, **options})
    return recipe("rehearsal").prepare(entry, out, logging.getLogger("test"))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rehearsal") / "prepared"
    _prepare(out)
    return out


def test_shapes_and_splits_follow_the_benchmark(prepared):
    # the Karpathy MSCOCO split and the Shutterstock corpus size, times the scale, rounded, at least 1
    want = {"train": round(113_287 * SCALE), "val": max(1, round(5_000 * SCALE)), "test": max(1, round(5_000 * SCALE))}
    assert want == {"train": 23, "val": 1, "test": 1}
    images = pd.read_parquet(prepared / "images.parquet")
    assert images["split"].value_counts().to_dict() == want
    lines = (prepared / "corpus.txt").read_text().splitlines()
    assert len(lines) == round(2_322_635 * SCALE) == 465
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["n_images"] == want and manifest["n_sentences"] == 465
    # every image is a small PNG of image_size (default 32) with its detections
    from PIL import Image

    for p in images["path"]:
        with Image.open(prepared / p) as im:
            assert im.size == (32, 32) and im.format == "PNG"
    det = [json.loads(ln) for ln in (prepared / "detections.jsonl").read_text().splitlines()]
    assert set(images["image_id"]) == {d["image_id"] for d in det if d["score"] >= 0.3}
    from r2m.text.dictionary import load_dictionary

    d = load_dictionary("openimages")
    assert all(d.label_to_concept(x["label"]) for x in det)
    # 5 references per val/test image and per train image, each naming one of the image's concepts
    gen = json.loads((prepared / R.GENERATED).read_text())
    concepts = {}
    for x in det:
        if x["score"] >= 0.3:
            concepts.setdefault(x["image_id"], set()).add(d.label_to_concept(x["label"]))
    for key, n in (("references", 2), ("train_references", 23)):
        anns = gen[key]["annotations"]
        assert len(gen[key]["images"]) == n and len(anns) == 5 * n
        for a in anns:
            assert concepts[a["image_id"]] & set(a["caption"].split())
    # every corpus sentence names at least one dictionary word; lengths within the corpus' bounds
    lo, hi = R.CORPORA["shutterstock"]["length"][2:]
    for s in lines:
        toks = s.split()
        assert lo <= len(toks) <= hi and any(t in d.words for t in toks)


def test_same_seed_same_files_other_seed_other_files_and_prefixes(tmp_path, prepared):
    again = tmp_path / "again"
    _prepare(again)
    for name in ("corpus.txt", "detections.jsonl", R.GENERATED):
        assert (again / name).read_bytes() == (prepared / name).read_bytes(), name
    pd.testing.assert_frame_equal(pd.read_parquet(again / "images.parquet"), pd.read_parquet(prepared / "images.parquet"))
    other = tmp_path / "other"
    _prepare(other, seed=1)
    assert (other / "corpus.txt").read_bytes() != (prepared / "corpus.txt").read_bytes()
    # a larger scale extends the smaller one: the corpus and each split's images are prefixes
    big = tmp_path / "big"
    entry = DatasetEntry.model_validate({"kind": "rehearsal", "scale": 2 * SCALE})
    recipe("rehearsal").prepare(entry, big, logging.getLogger("test"))
    assert (big / "corpus.txt").read_text().startswith((prepared / "corpus.txt").read_text())
    small = pd.read_parquet(prepared / "images.parquet")
    assert (big / "images" / "tr000022.png").read_bytes() == (prepared / "images" / "tr000022.png").read_bytes()
    assert len(pd.read_parquet(big / "images.parquet")) > len(small)


def test_bad_options_are_one_line_errors(tmp_path):
    for opts, key in (({"scale": 0}, "scale"), ({"scale": 2.0}, "scale"), ({"shape": "imagenet"}, "shape"),
                      ({"corpus": "wiki"}, "corpus"), ({"image_size": 4}, "image_size")):
        with pytest.raises(ValueError, match=key):
            _prepare(tmp_path / key, **opts)


def _dictionary_words() -> tuple[list[str], list[str], frozenset[str]]:
    from r2m.text.dictionary import load_dictionary

    d = load_dictionary("openimages")
    labels = [lab for lab in d.labels if d.label_to_concept(lab)]
    return labels, [d.label_to_concept(lab) for lab in labels], d.words


def _zipf_tokens_by_hand(length: tuple) -> float:
    """Expected non-concept tokens per corpus sentence, worked out apart from the recipe: the length is a
    log-normal rounded and clipped to [lo, hi]; 1, 2 or 3 concept words (probabilities .4, .3, .15 over .85)
    each overwrite a uniform position, so with length L they cover 1, 2 - 1/L or 3 - 3/L + 1/L^2 positions."""
    from statistics import NormalDist

    median, sigma, lo, hi = length
    z = NormalDist(math.log(median), sigma)
    p1, p2, p3 = 0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85
    total = 0.0
    for L in range(lo, hi + 1):
        top = 1.0 if L == hi else z.cdf(math.log(L + 0.5))
        bottom = 0.0 if L == lo else z.cdf(math.log(L - 0.5))
        covered = p1 + p2 * (2 - 1 / L) + p3 * (3 - 3 / L + 1 / L ** 2)
        total += (top - bottom) * (L - covered)
    return total


def _frequent_by_hand(tokens: float, min_count: int, size: int, s: float) -> tuple[float, float]:
    """Mean and variance of the number of Zipf ranks drawn >= min_count times: each rank's count is
    Poisson(tokens * r^-s / H), P(count >= m) is the regularised lower incomplete gamma P(m, lambda)."""
    import torch

    r = torch.arange(1, size + 1, dtype=torch.float64) ** -s
    q = torch.special.gammainc(torch.tensor(float(min_count), dtype=torch.float64), tokens * r / r.sum())
    return float(q.sum()), float((q * (1 - q)).sum())


@pytest.mark.parametrize("corpus", ["shutterstock", "gcc", "coco"])
def test_full_size_vocabulary_is_the_papers_within_1_percent(corpus):
    # build_vocab's vocabulary = 4 specials + every dictionary word + the words counted >= min_count in
    # the train split (99 %: corpus_concepts.holdout 0.01); its expectation at scale 1.0 under the recipe's
    # Zipf law, computed here apart from the recipe's own code, is the paper's figure within 1 %
    labels, concept_words, dictionary = _dictionary_words()
    words = R.Words(corpus, labels, concept_words, 0)
    spec = R.CORPORA[corpus]
    paper, min_count = spec["vocab"]
    assert (paper, min_count) == {"shutterstock": (18_679, 40), "gcc": (10_652, 15), "coco": (11_335, 40)}[corpus]
    assert not set(words.words) & dictionary  # the Zipf words and the concept words are apart
    tokens = spec["sentences"] * 0.99 * _zipf_tokens_by_hand(spec["length"])
    mean, _ = _frequent_by_hand(tokens, min_count, len(words.words), words.exponent)
    assert 4 + len(dictionary) + mean == pytest.approx(paper, rel=0.01)


def test_one_percent_corpus_follows_the_zipf_law():
    # the 1 % Shutterstock corpus as generated: its non-concept tokens per sentence and the number of its
    # words seen >= 40 times are those the Zipf law predicts (worked out here, not by the recipe)
    from collections import Counter

    from r2m.text.vocab import build_vocab

    labels, concept_words, dictionary = _dictionary_words()
    words = R.Words("shutterstock", labels, concept_words, 0)
    n = R.counts("coco", "shutterstock", 0.01)["sentences"]
    counts: Counter[str] = Counter()
    for line in R.corpus_lines(words, "shutterstock", n, 0):
        counts.update(line.split())
    zipf = {w: c for w, c in counts.items() if w not in dictionary}
    per_sentence = _zipf_tokens_by_hand(R.CORPORA["shutterstock"]["length"])
    assert sum(zipf.values()) / n == pytest.approx(per_sentence, rel=0.01)
    mean, var = _frequent_by_hand(n * per_sentence, 40, len(words.words), words.exponent)
    frequent = sum(1 for c in zipf.values() if c >= 40)
    assert abs(frequent - mean) < 4 * math.sqrt(var), (frequent, mean, var)
    # the pipeline's vocabulary of these counts: specials, the dictionary, the frequent Zipf words
    assert len(build_vocab(counts, 40, dictionary)) == 4 + len(dictionary) + frequent


def test_full_size_counts():
    assert R.counts("coco", "shutterstock", 1.0) == {"train": 113_287, "val": 5_000, "test": 5_000,
                                                     "sentences": 2_322_635}
    assert R.counts("flickr30k", "gcc", 0.1) == {"train": 2_900, "val": 101, "test": 100, "sentences": 331_833}


def test_random_cnn_gives_the_benchmarks_widths():
    import torch

    from r2m.vision.extractors.factory import build_extractor

    pooled = build_extractor("random_cnn", {"size": 32, "dim": 1536})
    grid = build_extractor("random_cnn", {"size": 32, "dim": 512, "grid_side": 14, "kinds": ["pooled", "grid"]})
    assert pooled.kinds == {"pooled": (1536,)} and grid.kinds["grid"] == (14, 14, 512)
    x = torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8)
    out = grid.model(x)
    assert tuple(out["grid"].shape) == (2, 14, 14, 512) and tuple(out["pooled"].shape) == (2, 512)
    # nearest resampling of the native 2x2 map: each 7x7 block repeats one cell
    assert torch.equal(out["grid"][:, :7, :7], out["grid"][:, :1, :1].expand(-1, 7, 7, -1))


def test_fit_exponent_on_constructed_points():
    # value = 3 * size^1.5 exactly: b = 1.5, the prediction at 1.0 is 3
    sizes = [0.01, 0.1, 0.5]
    b, pred = B.fit_exponent(sizes, [3 * s ** 1.5 for s in sizes])
    assert b == pytest.approx(1.5) and pred == pytest.approx(3.0)
    # hand-worked least squares on log10: x = -2, -1, 0; y = 0, 1, 1.5 (means -1, 5/6): slope 1.5 / 2 = 0.75,
    # intercept 5/6 + 0.75 = 19/12
    b, pred = B.fit_exponent([0.01, 0.1, 1.0], [1.0, 10.0, 10 ** 1.5])
    assert b == pytest.approx(0.75) and pred == pytest.approx(10 ** (19 / 12))
    # one size: linear extrapolation
    b, pred = B.fit_exponent([0.1], [7.0])
    assert b == 1.0 and pred == pytest.approx(70.0)
    assert all(math.isnan(v) for v in B.fit_exponent([], []))


def test_bench_scale_end_to_end_on_a_tiny_size(tmp_path, capsys):
    out = tmp_path / "out"
    stages = "prepare,references,corpus_concepts,build_vocab"
    rc = B.main(["--sizes", "0.0001,0.0002", "--stages", stages, "--params", str(ROOT / "params.yaml"),
                 "--workdir", str(tmp_path / "ws"), "--out", str(out), "--budget", "300"])
    assert rc == 0
    rows = list(csv.DictReader(open(out / "scale.csv")))
    assert [(r["stage"], r["size"]) for r in rows] == [(s, z) for z in ("0.0001", "0.0002") for s in stages.split(",")]
    assert all(r["status"] == "ok" and float(r["wall_s"]) > 0 and float(r["peak_rss_mb"]) > 10 for r in rows)
    # bytes: the prepared folder grows with the size
    prep = [int(r["out_bytes"]) for r in rows if r["stage"] == "prepare"]
    assert 0 < prep[0] < prep[1]
    md = (out / "scale.md").read_text()
    assert "| prepare |" in md and "time exponent" in md
    assert (out / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "predicted s at 1.0" in capsys.readouterr().out


def test_bench_scale_caps_a_stage_past_its_budget(tmp_path):
    # a budget no child can meet (an r2m process alone takes longer to start): prepare is stopped, and
    # references, which reads its output, is not run
    rows = B.bench([0.0001], ["prepare", "references"], ROOT / "params.yaml", tmp_path, 0.2, dict(B.ENTRY),
                   echo=lambda *_: None)
    assert [r.status for r in rows] == ["capped", "capped"]
    assert "budget" in rows[0].note and "prepared" in rows[1].note


def test_load_rows_reads_the_same_values_as_the_whole_array(tmp_path):
    # captioning's v^I source reads the rows it needs (not the whole folder): same float16 values
    from r2m.vision import feature_store as FS

    ids = [f"im{i}" for i in range(10)]
    x = np.random.default_rng(0).normal(size=(10, 6)).astype(np.float16)
    parts = tmp_path / "parts"
    parts.mkdir()
    FS.write_part(FS.part_path(parts, 0), 0, {"pooled": x[:6]}, list(range(6)), [])
    FS.write_part(FS.part_path(parts, 1), 6, {"pooled": x[[6, 8, 9]]}, [0, 2, 3], [(1, "unreadable")])
    FS.assemble(tmp_path / "features", ids, ids, 2, {"backend": "test"}, parts)
    whole, index = FS.load_features(tmp_path / "features", "pooled")
    row = dict(zip(index["image_id"], index["row"], strict=True))
    asked = ["im9", "im7", "im2", "nope", "im2"]
    got = FS.load_rows(tmp_path / "features", asked, "pooled")
    assert sorted(got) == ["im2", "im9"]  # im7 was a bad image, "nope" is unknown
    for i in got:
        assert got[i].dtype == np.float16 and got[i].tobytes() == whole[row[i]].tobytes()
        assert got[i].tobytes() == x[int(i[2:])].tobytes()


def test_built_in_entry_counts_the_vocabulary_at_the_papers_min_count():
    import argparse

    # the paper's thresholds: count >= 40 for Shutterstock and the MSCOCO captions, >= 15 for GCC
    for corpus, want in (("shutterstock", 40), ("gcc", 15), ("coco", 40)):
        a = argparse.Namespace(dataset="rehearsal", shape=None, corpus=corpus)
        entry = B._entry(ROOT / "params.yaml", a)
        assert entry["corpus"] == corpus and entry["overrides"]["build_vocab"] == {"min_count": want}
        assert entry["overrides"]["detect_concepts"] == {"backend": "precomputed"}  # the rest kept
    assert "build_vocab" not in B.ENTRY["overrides"]  # the module's entry is not changed

"""The authors' text rules under ``official``: one plural per class word mapped
back, GCC's length rule and raw-token COCO-word filter, Shutterstock de-duplication."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

from r2m import params as P
from r2m.text.corpus import FilterConfig
from r2m.text.dictionary import load_dictionary
from r2m.text.singular import OfficialPlurals, official_plural, regular_plural
from r2m.text.stages import encode_batch, process_chunk, singular_targets
from r2m.text.vocab import build_vocab


# --------------------------------------------------------------------------- item 2: plurals
@pytest.mark.parametrize(("word", "plural"), [
    ("person", "persons"), ("mouse", "mouses"), ("dog", "dogs"), ("stairs", "stairs"), ("fries", "fries"),
    ("box", "boxes"), ("bench", "benches"), ("strawberry", "strawberries"), ("monkey", "monkeys"),
    ("man", "men"), ("woman", "women"), ("foot", "feet"), ("knife", "knives"), ("bus", "buses"),
    ("sheep", "sheep"), ("tomato", "tomatoes"),
])
def test_one_plural_per_class_word(word: str, plural: str) -> None:
    assert official_plural(word) == plural


def test_regular_plural_spelling() -> None:
    assert [regular_plural(w) for w in ("cat", "fox", "brush", "lily", "toy", "goods")] == \
        ["cats", "foxes", "brushes", "lilies", "toys", "goods"]


def test_the_issue_examples_on_the_openimages_dictionary() -> None:
    d = load_dictionary("openimages")
    toks = ["persons", "people", "mouses", "mice", "stairs", "fries", "goods", "dogs", "men"]
    assert d.singular_targets(toks, "official") == ["person", "people", "mouse", "mice", "stairs", "fries",
                                                    "goods", "dog", "man"]
    # ours (the lemma table) differs exactly where the issue says
    assert d.singular_targets(["people", "mice"], "lemma") == ["person", "mouse"]


def test_a_shared_plural_goes_to_the_last_class_word_in_sorted_order() -> None:
    op = OfficialPlurals(["butterfly", "butterflies", "glass", "glasses"])
    assert op.singularise(["butterflies", "glasses"]) == ["butterfly", "glasses"]


def test_official_sentence_concepts_are_dictionary_words() -> None:
    d = load_dictionary("openimages")
    assert d.sentence_concepts(["two", "persons", "on", "stairs"], "official") == ["person", "stair"]
    assert d.sentence_concepts(["people", "and", "mice"], "official") == []
    assert d.sentence_concepts(["people", "and", "mice"], "lemma") == ["mouse", "person"]
    with pytest.raises(ValueError, match="plurals"):
        d.sentence_concepts(["a"], "nope")


def test_official_targets_in_encoding() -> None:
    d = load_dictionary("openimages")
    toks = ["two", "people", "and", "persons", "near", "mice", "."]
    vocab = build_vocab(Counter(toks), 1, ["person", "mouse"])
    batch = pa.RecordBatch.from_pydict({"tokens": [" ".join(toks)], "concepts": ["person"], "split": ["train"]})
    ids = encode_batch(batch, vocab, 1.0, Counter(), d, plurals="official").column("ids").to_pylist()[0]
    assert [vocab.itos[i] for i in ids] == ["two", "people", "and", "person", "near", "mice", "."]
    ids = encode_batch(batch, vocab, 1.0, Counter(), d, plurals="lemma").column("ids").to_pylist()[0]
    assert [vocab.itos[i] for i in ids] == ["two", "person", "and", "person", "near", "mouse", "."]
    assert singular_targets(toks, d, "official") == d.singular_targets(toks, "official")


def test_corpus_concepts_use_the_plural_rule() -> None:
    d = load_dictionary("openimages")
    lines = [(1, "Two people on a bench."), (2, "Two persons on a bench.")]
    official = process_chunk(lines, d, FilterConfig(), 0.0, 0, Counter(), "official", plurals="official")
    assert official["concepts"] == ["bench", "bench person"]
    ours = process_chunk(lines, d, FilterConfig(), 0.0, 0, Counter(), "official", plurals="lemma")
    assert ours["concepts"] == ["bench person", "bench person"]


def test_profiles_resolve_the_plural_rule() -> None:
    raw = {"datasets": ["a", "b"], "catalog": {"a": {"kind": "tiny", "fidelity": "official"},
                                               "b": {"kind": "tiny", "fidelity": "paper"}}}
    p = P.validate(raw)
    assert P.for_dataset(p, "a").fidelity.plurals == "official"
    assert P.for_dataset(p, "b").fidelity.plurals == "lemma"


# --------------------------------------------------------------------------- items 3, 4: GCC and Shutterstock
def _corpus(tmp_path, name: str, fidelity: str, raw_text: str) -> tuple[list[str], dict]:
    import json
    import logging

    from r2m.datasets import benchmarks as B
    from r2m.params import DatasetEntry
    from test_datasets import karpathy_coco

    raw = tmp_path / f"raw-{fidelity}"
    (raw / "karpathy").mkdir(parents=True)
    (raw / "karpathy/dataset_coco.json").write_text(json.dumps(karpathy_coco()))
    for f in ("coco/train2014", "coco/val2014", "shutterstock", "gcc"):
        (raw / f).mkdir(parents=True, exist_ok=True)
    src = "shutterstock/sentences.txt" if name == "coco_shutterstock" else "gcc/Train_GCC-training.tsv"
    (raw / src).write_text(raw_text)
    out = tmp_path / f"out-{name}-{fidelity}"
    entry = DatasetEntry(kind=name, raw_dir=str(raw), fidelity=fidelity)
    m = B.prepare_benchmark(name, entry, out, logging.getLogger("t"), fetcher=None)
    return (out / "corpus.txt").read_text().splitlines(), m


GCC_TSV = ("two dogs playing in the snow\thttp://x/1.jpg\n"       # plural only: ours keeps, official drops
           "a dog playing in the snow\thttp://x/2.jpg\n"          # kept by both
           "portrait of an actor at the premiere\thttp://x/3.jpg\n")  # no COCO word: dropped by both


def test_gcc_official_filters_coco_words_on_raw_tokens(tmp_path) -> None:
    ours, m = _corpus(tmp_path, "coco_gcc", "paper", GCC_TSV)
    assert ours == ["two dogs playing in the snow", "a dog playing in the snow"]
    official, m = _corpus(tmp_path, "coco_gcc", "official", GCC_TSV)
    assert official == ["a dog playing in the snow"]
    assert m["corpus_rules"] == {"official": True, "dropped": {"no_coco_word": 2}}


def test_gcc_official_length_rule_counts_start_and_end() -> None:
    from pathlib import Path

    raw = P.load(Path(__file__).resolve().parents[1] / "params.yaml")
    gcc = P.for_dataset(raw, "coco_gcc")
    assert gcc.corpus_concepts.min_tokens == 10 and gcc.fidelity.count_specials is True
    cfg = FilterConfig(gcc.corpus_concepts.min_tokens, gcc.corpus_concepts.max_tokens, True, True)
    d = load_dictionary("openimages")
    lines = [(1, "a dog playing in the snow ."),            # 7 tokens + <S>, </S> = 9: too short
             (2, "a dog playing in the deep snow ."),       # 8 + 2 = 10: kept
             (3, "a dog playing in the snow")]              # 6 + 2 = 8: too short
    dropped: Counter[str] = Counter()
    cols = process_chunk(lines, d, cfg, 0.0, 0, dropped, "official", plurals="official")
    assert cols["line"] == [2] and dropped == {"too_short": 2}


def test_shutterstock_official_drops_duplicate_sentences(tmp_path) -> None:
    text = "a dog on a sofa\na cat on a mat\na dog on a sofa\n  a cat on a mat  \nA dog on a sofa\n"
    ours, _ = _corpus(tmp_path, "coco_shutterstock", "paper", text)
    assert len(ours) == 5
    official, m = _corpus(tmp_path, "coco_shutterstock", "official", text)
    assert official == ["a dog on a sofa", "a cat on a mat", "A dog on a sofa"]
    assert m["corpus_rules"] == {"official": True, "dropped": {"duplicate": 2}}


def test_datasets_check_warns_once_when_official_has_no_word_list(tmp_path, monkeypatch, capsys) -> None:
    import json

    import yaml

    from r2m.datasets.check import vocab_filter_warning
    from r2m.pipeline.datasets_cmd import check

    assert vocab_filter_warning("d", "coco_gcc", "paper", None) is None
    assert vocab_filter_warning("d", "coco_gcc", "official", "glove.txt") is None
    before = vocab_filter_warning("d", "coco_gcc", "official", None, tmp_path / "none")
    assert "expect more than the paper's 10652 words" in before and "\n" not in before

    monkeypatch.chdir(tmp_path)
    raw = {"datasets": ["g"], "catalog": {"g": {"kind": "tiny", "fidelity": "official"},
                                          "w": {"kind": "tiny", "fidelity": "official",
                                                "overrides": {"fidelity": {"vocab_filter": "words.txt"}}}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "words.txt").write_text("a\n")
    for name in ("g", "w"):
        for sub, stats in (("corpus", {"read": {"lines": 10}, "sentences_in": 10, "dropped": {}, "length_ok": 10}),
                           ("vocab", {"vocab_size": 1201, "frequent_words": 1150, "min_count": 15,
                                      "sentences_out": 10})):
            (tmp_path / f"data/{name}/{sub}").mkdir(parents=True)
            (tmp_path / f"data/{name}/{sub}/stats.json").write_text(json.dumps(stats))
    assert check("g") == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "without fidelity.vocab_filter" in err[0] and "here 1200 words" in err[0]
    assert "1150 frequent ones unchecked" in err[0]
    assert check("w") == 0
    assert capsys.readouterr().err == ""

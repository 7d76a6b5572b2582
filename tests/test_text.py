"""Text side: tokeniser, singulariser, dictionary, corpus reading/filters/split, vocabulary, stages."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from r2m.text.corpus import (
    CorpusError,
    FilterConfig,
    ReadStats,
    drop_reason,
    holdout_mask,
    read_lines,
    split_of,
)
from r2m.text.dictionary import image_concepts, load_dictionary
from r2m.text.singular import Singulariser
from r2m.text.tokenize import tokenize
from r2m.text.vocab import END_WORD, PAD_WORD, SPECIALS, START_WORD, UNK_WORD, Vocab, build_vocab, unk_ratio


# --------------------------------------------------------------------------- tokenise
def test_tokenize_lowercases_and_strips_ptb_punctuation():
    assert tokenize("A Dog, running; on the GRASS!") == ["a", "dog", "running", "on", "the", "grass"]
    assert tokenize('He said "hello" (twice)... -- ok?') == ["he", "said", "hello", "twice", "ok"]
    assert tokenize("A man's t-shirt costs 3.5 dollars.") == ["a", "man", "'s", "t-shirt", "costs", "3.5", "dollars"]
    assert tokenize("don't") == ["do", "n't"]
    assert tokenize("   ") == [] and tokenize("... ! ?") == []


# --------------------------------------------------------------------------- singular
@pytest.fixture(scope="module")
def sing() -> Singulariser:
    return Singulariser()


@pytest.mark.parametrize("plural,single", [
    ("dogs", "dog"), ("women", "woman"), ("men", "man"), ("children", "child"), ("people", "person"),
    ("buses", "bus"), ("knives", "knife"), ("mice", "mouse"), ("geese", "goose"), ("teeth", "tooth"),
    ("boxes", "box"), ("skis", "ski"), ("glasses", "glasses"), ("shorts", "shorts"), ("bus", "bus"),
    # part-of-speech-blind table entries that must NOT apply
    ("is", "is"), ("was", "was"), ("building", "building"), ("running", "running"), ("dog", "dog"),
])
def test_singular(sing, plural, single):
    assert sing.singular(plural) == single


def test_singularise_batch_and_cache(sing):
    assert sing.singularise(["two", "dogs", "and", "three", "cats"]) == ["two", "dog", "and", "three", "cat"]
    n = len(sing)
    sing.singularise(["dogs", "cats"])
    assert len(sing) == n  # cached per word type


# --------------------------------------------------------------------------- dictionary
def test_dictionary_last_word_singular_lowercase():
    d = load_dictionary("openimages")
    assert len(d.labels) == 601
    assert "wheel" in d.words and "bicycle wheel" not in d.words
    assert "butterfly" in d.words  # "Moths and butterflies"
    assert all(w == w.lower() and " " not in w for w in d.words)
    assert d.label_to_concept("Bicycle wheel") == "wheel"
    assert d.label_to_concept("DOG") == "dog"
    assert d.label_to_concept("Person") == "person"
    assert d.label_to_concept("zebra crossing sign thing") is None
    c = load_dictionary("coco80")
    assert len(c.labels) == 80 and "ski" in c.words and "hydrant" in c.words and "light" in c.words


def test_sentence_concepts_singularises_and_sorts():
    d = load_dictionary("openimages")
    toks = tokenize("Two dogs and a woman sit near some bicycle wheels; people watch.")
    # "bicycle" and "watch" are dictionary words too ("Bicycle", "Watch")
    assert d.sentence_concepts(toks) == ["bicycle", "dog", "person", "watch", "wheel", "woman"]
    assert d.sentence_concepts(tokenize("nothing visual happens here")) == []


def test_image_concepts_threshold_dedup_and_max():
    rows = [("a", "dog", 0.9), ("a", "dog", 0.95), ("a", "cat", 0.29), ("a", "car", 0.3),
            ("b", "tree", 0.1)]
    rows += [("c", w, s) for w, s in [("dog", .9), ("cat", .8), ("car", .7), ("ball", .6), ("tree", .5),
                                     ("bird", .4), ("boat", .35), ("dog", .31)]]
    df = pd.DataFrame(rows, columns=["image_id", "concept", "score"])
    got = image_concepts(df, threshold=0.3, max_per_image=5)
    assert got["a"] == [("dog", 0.95), ("car", 0.3)]  # max score kept; 0.29 dropped; 0.3 kept (>=)
    assert "b" not in got  # nothing above the threshold
    assert got["c"] == [("dog", .9), ("cat", .8), ("car", .7), ("ball", .6), ("tree", .5)]  # 5 most confident
    assert image_concepts(df, threshold=0.3, max_per_image=2)["c"] == [("dog", .9), ("cat", .8)]


def test_image_concepts_from_labels():
    df = pd.DataFrame({"image_id": [1, 1, 1], "label": ["Dog", "Bicycle wheel", "Unknown Thing"],
                       "score": [0.5, 0.6, 0.9]})
    assert image_concepts(df) == {"1": [("wheel", 0.6), ("dog", 0.5)]}


# --------------------------------------------------------------------------- corpus
def test_read_lines_skips_empty_and_counts(tmp_path):
    p = tmp_path / "c.txt"
    p.write_bytes(b"a dog\n\n   \nTwo cats\n")
    stats = ReadStats()
    assert list(read_lines(p, stats)) == [(1, "a dog"), (4, "Two cats")]
    assert stats.empty == 2 and stats.lines == 4


def test_read_lines_bad_utf8_names_file_and_line(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"fine line\nalso fine\nbroken \xff\xfe here\n")
    with pytest.raises(CorpusError, match=r"bad\.txt:3: not valid UTF-8"):
        list(read_lines(p))
    stats = ReadStats()
    assert [n for n, _ in read_lines(p, stats, errors="skip")] == [1, 2]
    assert stats.bad_utf8 == 1 and stats.bad_lines == [3]
    with pytest.raises(FileNotFoundError, match="missing"):
        list(read_lines(tmp_path / "missing.txt"))


def test_filters():
    cfg = FilterConfig(min_tokens=3, max_tokens=5, require_concept=True)
    assert drop_reason(["a", "dog"], ["dog"], cfg) == "too_short"
    assert drop_reason(["a"] * 6, ["dog"], cfg) == "too_long"
    assert drop_reason(["a", "b", "c"], [], cfg) == "no_concept"
    assert drop_reason(["a", "dog", "runs"], ["dog"], cfg) is None
    assert drop_reason(["a", "b", "c"], [], FilterConfig(3, 5, require_concept=False)) is None


def test_holdout_split_deterministic_and_fraction():
    idx = np.arange(1, 200_001)
    m1 = holdout_mask(idx, 0.01, seed=0)
    assert np.array_equal(m1, holdout_mask(idx, 0.01, seed=0))
    assert 0.008 < m1.mean() < 0.012
    m2 = holdout_mask(idx, 0.01, seed=1)
    assert not np.array_equal(m1, m2)
    # chunking does not matter: the split of a sentence depends on its index only
    assert np.array_equal(np.concatenate([holdout_mask(idx[:777], .01), holdout_mask(idx[777:], .01)]), m1)
    assert split_of(int(idx[m1][0]), 0.01) == "val"
    assert not holdout_mask(idx, 0.0).any()


# --------------------------------------------------------------------------- vocab
def test_vocab_build_encode_decode(tmp_path):
    counts = {"a": 10, "dog": 5, "runs": 2, "rare": 1}
    v = build_vocab(counts, min_count=2, dictionary_words={"dog", "zebra"})
    assert v.itos[:4] == list(SPECIALS) and v.stoi[PAD_WORD] == 0 and v.stoi[START_WORD] == 1
    assert v.stoi[END_WORD] == 2 and v.stoi[UNK_WORD] == 3
    assert v.itos[4:] == ["a", "dog", "runs", "zebra"]  # frequent by count, then dictionary-only
    assert "rare" not in v
    ids = v.encode(["a", "rare", "dog"])
    assert ids == [4, 3, 5]
    assert v.decode([1, 4, 5, 2, 6, 6]) == "a dog"
    assert v.decode([0, 4, 0, 7]) == "a zebra"
    assert unk_ratio(ids) == pytest.approx(1 / 3) and unk_ratio([]) == 0.0
    v.save(tmp_path / "vocab.json")
    assert Vocab.load(tmp_path / "vocab.json").itos == v.itos
    assert json.loads((tmp_path / "vocab.json").read_text())["specials"]["unk"] == 3
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="broken.json"):
        Vocab.load(tmp_path / "broken.json")
    with pytest.raises(ValueError, match="must start"):
        Vocab(["a", "b"])


# --------------------------------------------------------------------------- stages
def _ctx(tmp_path: Path, stage: str, **params):
    from r2m import params as P
    from r2m.stage.context import StageContext
    from r2m.stage.registry import get

    raw = {"datasets": ["t"], "catalog": {"t": {"kind": "tiny"}}, **params}
    return StageContext(stage=get(stage), params=P.validate(raw), dataset="t", root=tmp_path,
                        log=logging.getLogger("test"))


def test_stages_end_to_end(tmp_path):
    from r2m.text import stages

    prepared = tmp_path / "data/t/prepared"
    prepared.mkdir(parents=True)
    lines = ["A dog runs on the grass.", "", "Two cats sleep.", "nothing to see here",
             "A woman rides a xylophonezz bicycle", "dogs"] * 50
    (prepared / "corpus.txt").write_text("\n".join(lines) + "\n")
    ctx = _ctx(tmp_path, "corpus_concepts", corpus_concepts={"min_tokens": 2, "holdout": 0.1})
    stages.corpus_concepts(ctx)
    out = tmp_path / "data/t/corpus"
    df = pd.read_parquet(out / "corpus.parquet")
    assert list(df.columns[:3]) == ["tokens", "concepts", "split"]
    assert len(df) == 150  # the 'nothing' line (no concept) and 'dogs' (too short) are dropped
    assert set(df["concepts"]) == {"dog", "cat", "bicycle woman"}
    assert set(df["split"]) == {"train", "val"}
    stats = json.loads((out / "stats.json").read_text())
    assert stats["dropped"] == {"no_concept": 50, "too_short": 50} and stats["read"]["empty"] == 50
    assert (out / "params.yaml").exists()

    ctx = _ctx(tmp_path, "build_vocab", build_vocab={"min_count": 2, "max_unk_ratio": 0.1})
    stages.build_vocab(ctx)
    vdir = tmp_path / "data/t/vocab"
    v = Vocab.load(vdir / "vocab.json")
    assert "xylophonezz" in v  # counted enough times
    enc = pq.read_table(vdir / "encoded.parquet")
    assert str(enc.schema.field("ids").type) == "list<element: int32>"
    assert str(enc.schema.field("concept_ids").type) == "list<element: int32>"
    first = enc.slice(0, 1).to_pylist()[0]
    assert v.decode(first["ids"]) == "a dog runs on the grass"
    assert [v.itos[i] for i in first["concept_ids"]] == ["dog"]
    # with a higher min_count the made-up word becomes UNK and its sentences (1/6 UNK) are dropped
    ctx = _ctx(tmp_path, "build_vocab", build_vocab={"min_count": 1000, "max_unk_ratio": 0.1})
    stages.build_vocab(ctx)
    s = json.loads((vdir / "stats.json").read_text())
    assert s["sentences_in"] == 150 and s["sentences_out"] < 150
    assert s["dropped_unk_train"] + s.get("dropped_unk_val", 0) == 150 - s["sentences_out"]


def test_direct_table_matches_spacy_lookup_lemmatizer():
    """The fast path reads the same table spaCy's lookup lemmatiser (spacy.blank('en')) uses."""
    from r2m.text.singular import lookups_table, spacy_table

    direct, via_spacy = lookups_table(), spacy_table()
    assert len(direct) > 40_000
    words = list(direct)[::97] + ["dogs", "women", "mice", "glasses", "buses"]
    assert all(via_spacy.get(w) == direct.get(w) for w in words)
    assert Singulariser(table=via_spacy).singularise(["dogs", "women", "people"]) == ["dog", "woman", "person"]


def test_each_tokenizer_the_params_allow_is_registered_and_imports_only_its_own_module():
    """``fidelity.tokenizer``'s values (the params schema) each name a tokeniser; asking for ``caption`` leaves the
    official one unimported, so the records of instances that tokenise captions never name its module."""
    import subprocess
    import sys
    from typing import get_args

    from r2m.params import FidelityParams
    from r2m.text.tokenize import CORPUS_TOKENIZERS, corpus_tokenizer

    allowed = {a for a in get_args(FidelityParams.model_fields["tokenizer"].annotation) for a in get_args(a)}
    assert set(CORPUS_TOKENIZERS) == allowed == {"caption", "official"}
    assert corpus_tokenizer("official")("A dog, running.") == ["a", "dog", ",", "running", "."]
    assert corpus_tokenizer("caption")("A dog, running.") == ["a", "dog", "running"]
    probe = ("import sys; from r2m.text.tokenize import corpus_tokenizer; corpus_tokenizer('caption'); "
             "print('r2m.text.tokenize_official' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout == "False\n"

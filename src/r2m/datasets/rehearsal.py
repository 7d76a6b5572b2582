"""``rehearsal``: a seeded synthetic dataset with a benchmark's shapes and sizes, for the scale benchmark.

The inputs have the sizes of a paper benchmark (``r2m bench scale`` runs every stage on them), scaled by
the ``scale`` option (1.0 = the benchmark's own counts; 0.01 = 1 %). Nothing is downloaded.

* **Images** (``shape``): the Karpathy splits of MSCOCO (113,287 / 5,000 / 5,000) or Flickr30k
  (29,000 / 1,014 / 1,000), each a small PNG (``image_size``, default 32 pixels) of a plain background
  with one coloured block per concept, and its concepts as ground-truth detections (``detections.jsonl``,
  the ``precomputed`` detector's input): 1-5 OpenImages-v4 classes per image, drawn from a Zipfian
  distribution over the classes, plus a low-score false positive on some images.
* **References**: 5 captions per image (val/test: ``references.json``; train: ``train_references.json``
  for the supervised baselines), each a sentence of the corpus model below naming up to 3 of the
  image's concepts.
* **Corpus** (``corpus``): Shutterstock (2,322,635 sentences), Conceptual Captions (3,318,333) or the
  MSCOCO training captions (566,747). Words are drawn from a Zipfian distribution over a closed word list
  (the commonest ranks are English function words, the rest made-up words that are not English and end
  in a vowel, so no lemmatiser changes them). Its exponent is solved so that the full-size corpus's
  expected vocabulary at the paper's ``min_count`` is the paper's (18,679 words at 40; 10,652 at 15;
  11,335 at 40): ``build_vocab`` keeps the 4 specials, every dictionary word, and the words counted at
  least ``min_count`` times in the train split (:data:`HOLDOUT`), so the Zipfian words seen that often
  (each word's count Poisson, over the tokens the concept words leave) make up the rest. A smaller
  ``scale`` keeps fewer, as a real subset would. Sentence lengths follow a
  log-normal distribution (median about 11 words for Shutterstock, 9 for the others), and every sentence
  names 1-3 dictionary words (Zipfian too). The corpus is streamed to disk in blocks of
  :data:`BLOCK` sentences, each from its own random stream: a smaller ``scale`` writes a prefix of a larger
  one's corpus, and the images of each split are a prefix as well.

Features are not part of the recipe: the catalog entry's ``extract_features``/``sup_features`` use the
``random_cnn`` backend at the benchmarks' widths (Inception-V4's 1,536-d pooled vector; a 14x14x512 grid
as VGG conv5 gives Show, Attend and Tell), so the feature stage and the feature store run at full size
with a forward pass that costs little.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from r2m.datasets.base import (
    GENERATED,
    SPLITS,
    Recipe,
    generated_references,
    option,
    references_json,
    write_prepared,
)
from r2m.params import CorpusParams, DatasetEntry
from r2m.text.vocab import SPECIALS
from r2m.utils.progress import progress

BLOCK = 50_000  # corpus sentences per random stream

# image counts per split (Karpathy splits)
SHAPES: dict[str, dict[str, int]] = {
    "coco": {"train": 113_287, "val": 5_000, "test": 5_000},
    "flickr30k": {"train": 29_000, "val": 1_014, "test": 1_000},
}


# sentences, (kept vocabulary, its min_count) in the paper, (median words, log-normal sigma, min, max)
CORPORA: dict[str, dict[str, Any]] = {
    "shutterstock": {"sentences": 2_322_635, "vocab": (18_679, 40), "length": (11.0, 0.35, 5, 30)},
    "gcc": {"sentences": 3_318_333, "vocab": (10_652, 15), "length": (9.0, 0.4, 3, 30)},
    "coco": {"sentences": 566_747, "vocab": (11_335, 40), "length": (9.0, 0.25, 6, 30)},
}
CAPTION_LENGTH = (9.0, 0.25, 6, 20)  # reference captions (MSCOCO-like)
FUNCTION_WORDS = ("a", "the", "of", "on", "in", "with", "and", "is", "to", "at", "an", "two", "near", "for",
                  "from", "by", "are", "his", "her", "this", "its", "one", "over", "while", "some", "their")
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "t", "v", "z", "br", "dr", "kl", "tr", "gl")
_VOWELS = ("a", "e", "i", "o", "u")
CONCEPTS = np.array([0.4, 0.3, 0.15, 0.1, 0.05])  # how many concepts (1-5), before truncation to the most allowed
HOLDOUT = CorpusParams.model_fields["holdout"].default  # build_vocab counts the other sentences (its train split)
TAIL = 4  # the word list is TAIL times the kept vocabulary (the rare words)
LIMITS = {"scale": (0.01, 1e-5, 1.0), "seed": (0, 0, None), "image_size": (32, 8, 256)}


def _number(entry: DatasetEntry, key: str) -> Any:
    default, lo, hi = LIMITS[key]
    value = option(entry, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (key != "scale" and not isinstance(value, int)):
        raise ValueError(f"catalog entry (kind rehearsal): {key} must be a number, got {value!r}")
    if value < lo or (hi is not None and value > hi) or (key == "scale" and value <= 0):
        raise ValueError(f"catalog entry (kind rehearsal): {key} must be in [{lo}, {hi}], got {value!r}")
    return value


def _choice(entry: DatasetEntry, key: str, table: dict[str, Any], default: str) -> str:
    value = option(entry, key, default)
    if value not in table:
        raise ValueError(f"catalog entry (kind rehearsal): {key} must be one of {sorted(table)}, got {value!r}")
    return value


def check(entry: DatasetEntry) -> None:
    """Every option in range, up front."""
    for key in LIMITS:
        _number(entry, key)
    _choice(entry, "shape", SHAPES, "coco")
    _choice(entry, "corpus", CORPORA, "shutterstock")


def scaled(full: int, scale: float) -> int:
    """``full * scale`` rounded, at least 1."""
    return max(1, int(round(full * scale)))


def counts(shape: str, corpus: str, scale: float) -> dict[str, int]:
    """Images per split and corpus sentences at ``scale``."""
    out = {s: scaled(n, scale) for s, n in SHAPES[shape].items()}
    out["sentences"] = scaled(CORPORA[corpus]["sentences"], scale)
    return out


# --------------------------------------------------------------------------- word model
def _pseudo_word(i: int) -> str:
    """A made-up word for index ``i`` (distinct for distinct ``i``): consonant-vowel syllables."""
    sylls = []
    n = len(_ONSETS) * len(_VOWELS)
    i += n  # at least two syllables
    while i:
        i, r = divmod(i, n)
        sylls.append(_ONSETS[r // len(_VOWELS)] + _VOWELS[r % len(_VOWELS)])
    return "".join(sylls)


def length_pmf(length: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The lengths ``lo..hi`` and their probabilities under ``length`` = (median, sigma, lo, hi): a
    log-normal draw rounded to the nearest integer and clipped to ``[lo, hi]``, as :meth:`Words.sentences`
    draws it."""
    median, sigma, lo, hi = length
    lens = np.arange(lo, hi + 1)
    z = (np.log(np.arange(lo, hi + 2) - 0.5) - math.log(median)) / (sigma * math.sqrt(2))
    cdf = 0.5 * (1 + np.array([math.erf(float(x)) for x in z]))  # at lo - 1/2 ... hi + 1/2
    p = np.diff(cdf)
    p[0] += cdf[0]  # below lo: clipped up
    p[-1] += 1 - cdf[-1]  # above hi: clipped down
    return lens, p


def zipf_tokens(length: tuple, most: int = 3) -> float:
    """Expected Zipfian (not concept) tokens in a corpus sentence: its length less the positions its
    1-``most`` concept words overwrite (each at a uniform position, so two may hit the same one)."""
    lens, p_len = length_pmf(length)
    p_k = CONCEPTS[:most] / CONCEPTS[:most].sum()
    k = np.arange(1, most + 1)
    hit = lens[:, None] * (1 - (1 - 1 / lens[:, None]) ** k[None, :])  # distinct positions overwritten
    return float(p_len @ ((lens[:, None] - hit) @ p_k))


def expected_frequent(tokens: float, min_count: int, size: int, s: float) -> float:
    """Expected number of ranks of a Zipf law (exponent ``s``, ``size`` ranks) drawn at least ``min_count``
    times in ``tokens`` draws (each rank's count Poisson with mean ``tokens * p_rank``). Ranks whose mean
    is over ``4 * min_count + 40`` count as 1 and those under ``min_count / 50`` as 0 (the terms left out
    are below 1e-12 each)."""
    p = np.arange(1, size + 1, dtype=np.float64) ** -s
    lam = tokens * p / p.sum()
    sure = int(np.sum(lam > 4 * min_count + 40))
    lam = lam[(lam <= 4 * min_count + 40) & (lam >= min_count / 50)]
    j = np.arange(min_count, dtype=np.float64)[:, None]
    log_fact = np.array([math.lgamma(x + 1) for x in range(min_count)])[:, None]
    below = np.exp(j * np.log(lam)[None, :] - lam[None, :] - log_fact).sum(axis=0)  # P(count < min_count)
    return sure + float(np.sum(1 - np.minimum(below, 1.0)))


def zipf_exponent(tokens: float, words: int, min_count: int, size: int) -> float:
    """The exponent ``s`` of a Zipf law over ``size`` ranks under which ``words`` ranks are expected to be
    drawn at least ``min_count`` times in ``tokens`` draws (bisection; ``s`` in [0.5, 3], where the
    expectation falls as ``s`` grows)."""
    lo, hi = 0.5, 3.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if expected_frequent(tokens, min_count, size, mid) > words:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class Words:
    """The word list and the Zipfian cumulative distributions of the words and the concepts."""

    def __init__(self, corpus: str, labels: list[str], concept_words: list[str], seed: int) -> None:
        spec = CORPORA[corpus]
        kept, min_count = spec["vocab"]
        size = TAIL * kept
        taken = set(FUNCTION_WORDS) | set(concept_words)
        words = list(FUNCTION_WORDS)
        i = 0
        while len(words) < size:
            w = _pseudo_word(i)
            i += 1
            if w not in taken:
                words.append(w)
        self.words = np.array(words, dtype=object)
        # build_vocab keeps the specials, every dictionary word and the words counted >= min_count in the
        # train split: the Zipfian words must make up the rest of the paper's figure
        tokens = spec["sentences"] * (1 - HOLDOUT) * zipf_tokens(spec["length"])
        self.exponent = zipf_exponent(tokens, kept - len(SPECIALS) - len(set(concept_words)), min_count, size)
        p = np.arange(1, size + 1, dtype=np.float64) ** -self.exponent
        self.cdf = np.cumsum(p / p.sum())
        order = np.random.default_rng([seed, 7]).permutation(len(labels))  # which classes are common
        self.labels = [labels[j] for j in order]
        self.label_words = [concept_words[j] for j in order]
        q = np.arange(1, len(labels) + 1, dtype=np.float64) ** -1.0
        self.concept_cdf = np.cumsum(q / q.sum())

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.minimum(np.searchsorted(self.cdf, rng.random(n)), len(self.cdf) - 1)

    def concepts(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.minimum(np.searchsorted(self.concept_cdf, rng.random(n)), len(self.concept_cdf) - 1)

    def sentences(self, rng: np.random.Generator, concept_ids: list[np.ndarray], length: tuple) -> list[str]:
        """One sentence per entry of ``concept_ids`` (the concepts it names), lengths from ``length``."""
        median, sigma, lo, hi = length
        n = len(concept_ids)
        lens = np.clip(np.rint(rng.lognormal(math.log(median), sigma, n)), lo, hi).astype(np.int64)
        flat = self.words[self.draw(rng, int(lens.sum()))]
        ends = np.cumsum(lens)
        u = rng.random(int(sum(len(c) for c in concept_ids)))
        out, k = [], 0
        for j in range(n):
            toks = list(flat[ends[j] - lens[j]:ends[j]])
            for c in concept_ids[j]:  # each concept word over a token at a random position
                toks[int(u[k] * len(toks))] = self.label_words[c]
                k += 1
            out.append(" ".join(toks))
        return out


def n_concepts(rng: np.random.Generator, n: int, most: int) -> np.ndarray:
    """How many concepts: 1-``most`` with falling probabilities (:data:`CONCEPTS`)."""
    p = CONCEPTS[:most]
    return rng.choice(np.arange(1, most + 1), size=n, p=p / p.sum())


def corpus_lines(words: Words, corpus: str, n: int, seed: int) -> Iterator[str]:
    """``n`` corpus sentences, block by block (block ``b`` from its own stream)."""
    length = CORPORA[corpus]["length"]
    for b, start in enumerate(range(0, n, BLOCK)):
        rng = np.random.default_rng([seed, 2, b])  # a whole block always (the draws are vectorised)
        k = n_concepts(rng, BLOCK, 3)
        ids = words.concepts(rng, int(k.sum()))
        ends = np.cumsum(k)
        yield from words.sentences(rng, [ids[e - c:e] for e, c in zip(ends, k, strict=True)], length)[: n - start]


def _png(path: Path, size: int, colours: list[tuple[int, int, int]], rng: np.random.Generator) -> list[list[int]]:
    from PIL import Image

    img = np.empty((size, size, 3), np.uint8)
    img[:] = rng.integers(170, 236, 3)
    boxes = []
    for colour in colours:
        w, h = (int(v) for v in rng.integers(size // 4, size // 2 + 1, 2))
        x, y = int(rng.integers(0, size - w + 1)), int(rng.integers(0, size - h + 1))
        img[y:y + h, x:x + w] = colour
        boxes.append([x, y, x + w, y + h])
    Image.fromarray(img).save(path, format="PNG", compress_level=1)
    return boxes


def _colour(label: str) -> tuple[int, int, int]:
    h = sum((i + 1) * ord(c) for i, c in enumerate(label))
    return (h * 37) % 256, (h * 91) % 256, (h * 53) % 256


def rehearsal(entry: DatasetEntry, out: Path, log: logging.Logger) -> dict[str, Any]:
    import pandas as pd

    from r2m.text.dictionary import load_dictionary

    check(entry)
    shape, corpus = option(entry, "shape", "coco"), option(entry, "corpus", "shutterstock")
    scale, seed, size = float(_number(entry, "scale")), _number(entry, "seed"), _number(entry, "image_size")
    n = counts(shape, corpus, scale)
    dictionary = load_dictionary("openimages")
    labels = [lab for lab in dictionary.labels if dictionary.label_to_concept(lab)]
    words = Words(corpus, labels, [dictionary.label_to_concept(lab) for lab in labels], seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, str]] = []
    refs: dict[str, tuple[list[dict[str, str]], dict[str, list[str]]]] = {"eval": ([], {}), "train": ([], {})}
    with open(out / "detections.jsonl", "w", encoding="utf-8") as det, \
            progress(total=sum(n[s] for s in SPLITS), desc="rehearsal images", unit="img") as bar:
        for s_i, split in enumerate(SPLITS):
            rng = np.random.default_rng([seed, 1, s_i])  # per split: a smaller scale draws a prefix
            for j in range(n[split]):
                image_id = f"{split[:2]}{j:06d}"
                k = int(n_concepts(rng, 1, 5)[0])
                cids = list(dict.fromkeys(int(c) for c in words.concepts(rng, k)))
                name = f"{image_id}.png"
                boxes = _png(out / "images" / name, size, [_colour(words.labels[c]) for c in cids], rng)
                scores = rng.uniform(0.5, 0.99, len(cids))
                for c, box, score in zip(cids, boxes, scores, strict=True):
                    det.write(json.dumps({"image_id": image_id, "label": words.labels[c],
                                          "score": round(float(score), 3), "box": box}) + "\n")
                if rng.random() < 0.3:  # a false positive below the 0.3 threshold
                    c = int(words.concepts(rng, 1)[0])
                    det.write(json.dumps({"image_id": image_id, "label": words.labels[c],
                                          "score": round(float(rng.uniform(0.05, 0.25)), 3),
                                          "box": [0, 0, size // 4, size // 4]}) + "\n")
                picks = [rng.permutation(cids)[: int(rng.integers(1, min(3, len(cids)) + 1))] for _ in range(5)]
                caps = words.sentences(rng, picks, CAPTION_LENGTH)
                rows.append({"image_id": image_id, "path": f"images/{name}", "split": split})
                images, captions = refs["train" if split == "train" else "eval"]
                images.append({"id": image_id, "file_name": name, "split": split})
                captions[image_id] = caps
                bar.update(1)
    manifest = {"recipe": "rehearsal", "shape": shape, "corpus": corpus, "scale": scale, "seed": seed,
                "image_size": size, "zipf_exponent": round(words.exponent, 6), "word_list": len(words.words),
                "paths": "relative to the prepared folder"}
    manifest = write_prepared(out, pd.DataFrame(rows), corpus_lines(words, corpus, n["sentences"], seed), manifest)
    generated = {"references": references_json(*refs["eval"]), "train_references": references_json(*refs["train"])}
    (out / GENERATED).write_text(json.dumps(generated))
    log.info("rehearsal (%s, %s corpus, scale %g): %s images, %d sentences", shape, corpus, scale,
             manifest["n_images"], manifest["n_sentences"])
    return manifest


RECIPE = Recipe(prepare=rehearsal, references=generated_references)  # the kind 'rehearsal' (r2m.catalogs.RECIPES)

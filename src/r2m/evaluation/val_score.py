"""Validation scores for checkpoint selection, computed exactly as ``r2m evaluate`` computes them.

Checkpoint selection (:mod:`r2m.training.selection`, :mod:`r2m.supervised.select`) scores the
``val`` captions every ``eval_every`` steps. To select by the number the evaluation reports, the
captions go through the evaluation's own path: coco-caption's PTB tokenisation
(:func:`r2m.evaluation.coco.tokenize_ptb`, punctuation tokens dropped, so "," and "." kept by the
official tokeniser never count against the references) and the evaluation's registered scorers
(:func:`r2m.evaluation.coco.run_scorer`: our CIDEr-D, pycocoevalcap's BLEU).

Cost: the references are tokenised once, when the scorer is made; each call sends only caption
strings never seen before to the tokeniser (one Java start per call at most, none when every
caption was seen). PTB tokenisation is line-independent, so caching per string changes nothing.
Without Java the project's PTB-like tokeniser (:func:`r2m.text.tokenize.tokenize`) stands in, with
one warning (``r2m evaluate`` itself needs Java for PTB).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from r2m.evaluation.coco import TOKENIZERS, run_scorer
from r2m.evaluation.inputs import load_references

# selection metric -> (evaluation scorer, metric it yields)
METRICS: dict[str, tuple[str, str]] = {"cider": ("cider", "CIDEr"), "bleu4": ("bleu", "Bleu_4")}


def val_references(prepared: Path, references: Path, split: str = "val") -> dict[str, list[str]]:
    """Raw reference captions (``references/references.json``) of the ``val`` images
    (``prepared/images.parquet``) that have references."""
    import pyarrow.parquet as pq

    images = pq.read_table(prepared / "images.parquet", columns=["image_id", "split"]).to_pandas()
    val_ids = {str(i) for i in images.loc[images["split"] == split, "image_id"]}
    return {iid: caps for iid, caps in load_references(references / "references.json").items() if iid in val_ids}


def _project_tokens(sentences: list[str]) -> list[str]:
    from r2m.text.tokenize import tokenize

    return [" ".join(tokenize(s)) for s in sentences]


def default_tokenizer(log: logging.Logger | None = None) -> Callable[[list[str]], list[str]]:
    """coco-caption's PTB tokeniser when Java is present, else the project's stand-in (warned once)."""
    if shutil.which("java"):
        return TOKENIZERS.get("ptb")
    (log or logging.getLogger(__name__)).warning(
        "checkpoint selection: Java not found, tokenising with r2m's PTB-like tokeniser instead of "
        "coco-caption's PTBTokenizer (scores may differ slightly from `r2m evaluate`)")
    return _project_tokens


class ValScorer:
    """``ValScorer(refs).score({image_id: caption}, "cider")`` equals ``r2m evaluate``'s CIDEr of
    those captions against ``refs`` (``{image_id: [raw reference captions]}``)."""

    def __init__(self, references: Mapping[str, list[str]],
                 tokenizer: Callable[[list[str]], list[str]] | None = None,
                 log: logging.Logger | None = None):
        self._tokenize = tokenizer or default_tokenizer(log)
        self.ids = sorted(references)
        flat = [c for i in self.ids for c in references[i]]
        toks = iter(self._tokenize(flat))
        self.references = {i: [next(toks) for _ in references[i]] for i in self.ids}
        self._cache: dict[str, str] = {}

    def tokenized(self, captions: list[str]) -> list[str]:
        """``captions`` PTB-tokenised (new strings in one tokeniser call)."""
        new = list(dict.fromkeys(c for c in captions if c not in self._cache))
        if new:
            self._cache.update(zip(new, self._tokenize(new), strict=True))
        return [self._cache[c] for c in captions]

    def score(self, results: Mapping[str, str], metric: str = "cider") -> float:
        """The evaluation's ``metric`` (``cider`` | ``bleu4``) of one caption per reference image."""
        if metric not in METRICS:
            raise ValueError(f"selection metric {metric!r}: choose from {sorted(METRICS)}")
        missing = [i for i in self.ids if i not in results]
        if missing:
            raise ValueError(f"no caption for val image(s) {missing[:5]}")
        hyps = self.tokenized([results[i] for i in self.ids])
        scorer, name = METRICS[metric]
        scored = run_scorer(scorer, self.references, {i: [h] for i, h in zip(self.ids, hyps, strict=True)})
        return float(scored[name][0])

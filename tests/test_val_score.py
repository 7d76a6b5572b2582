"""Checkpoint selection scores exactly as ``r2m evaluate`` scores: same PTB
tokenisation, same CIDEr-D / BLEU-4, so "," and "." in captions never count against references."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from r2m.evaluation import coco
from r2m.evaluation.val_score import ValScorer
from test_training import ITOS, ctx_for, make_params, make_synthetic, refs_file

pytestmark = pytest.mark.skipif(coco._need_java("PTB") is not None, reason="needs Java (PTB tokeniser)")

REFS = {
    "a": ["A dog runs near the cat.", "The dog is on the grass."],
    "b": ["A man sits near a red car.", "Man with a big ball, on the road."],
    "c": ["A cat sits on the tree.", "The cat is near a tree!"],
}
# the official tokeniser keeps punctuation tokens: captions like these come out of its vocabulary
RESULTS = {"a": "a dog runs near the cat .", "b": "a man , with a ball , sits near the car .", "c": ""}


@pytest.mark.parametrize(("metric", "name", "scorer"), [("cider", "CIDEr", "cider"), ("bleu4", "Bleu_4", "bleu")])
def test_val_score_equals_the_evaluation_score(metric: str, name: str, scorer: str) -> None:
    expected, _ = coco.evaluate(RESULTS, REFS, [scorer], parallel="serial")
    vs = ValScorer(REFS)
    assert vs.score(RESULTS, metric) == pytest.approx(expected[name], abs=1e-12)
    assert vs.score(RESULTS, metric) == pytest.approx(expected[name], abs=1e-12)  # cached strings: the same


def test_val_score_tokenises_each_string_once() -> None:
    calls: list[list[str]] = []

    def tok(sentences: list[str]) -> list[str]:
        calls.append(list(sentences))
        return coco.tokenize_ptb(sentences)

    vs = ValScorer(REFS, tokenizer=tok)
    vs.score(RESULTS)
    vs.score({**RESULTS, "c": "a cat ."})
    assert calls[1:] == [list(dict.fromkeys(RESULTS[i] for i in sorted(RESULTS))), ["a cat ."]]


def test_r2m_selector_score_equals_evaluate_cider_on_its_captions(tmp_path: Path, monkeypatch) -> None:
    """The selector's score is `r2m evaluate`'s CIDEr of the captions it made (punctuation included)."""
    from r2m.training import selection

    torch.set_num_threads(1)
    make_synthetic(tmp_path)
    val = ["img16", "img17", "img18", "img19"]
    caps = {"img16": ["A dog runs near the cat.", "A dog, near a cat."], "img17": ["The man sits on the grass."],
            "img18": ["A red car on the road!"], "img19": ["A big ball near the tree."]}
    refs = {"images": [{"id": i} for i in val],
            "annotations": [{"id": f"{i}-{k}", "image_id": i, "caption": c}
                            for i in val for k, c in enumerate(caps[i])]}
    refs_file(tmp_path / "data/syn").write_text(json.dumps(refs))
    itos = [*ITOS, ",", "."]
    s = {w: i for i, w in enumerate(itos)}
    made = {"img16": "a dog runs near the cat .", "img17": "a man , sits on the grass .",
            "img18": "a red car , on the road", "img19": ""}
    monkeypatch.setattr(selection, "caption_ids",
                        lambda model, concepts, *a, **kw: [[s[w] for w in made[i].split()] for i in val])
    select = selection.cider_selector(ctx_for(tmp_path, "train_m", make_params()), "cpu", itos)
    score = select(torch.nn.Linear(1, 1), 0)
    expected, _ = coco.evaluate(made, {i: caps[i] for i in val}, ["cider"], parallel="serial")
    assert score == pytest.approx(expected["CIDEr"], abs=1e-12)

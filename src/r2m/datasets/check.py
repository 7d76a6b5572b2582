"""``r2m datasets check``: does a prepared dataset's text preprocessing match the paper's?

(The command itself, which finds the stage outputs, is :mod:`r2m.pipeline.datasets_cmd`.)

Prints, from the ``corpus_concepts`` and ``build_vocab`` outputs (their ``stats.json``), the sentence
count after each filter and the vocabulary size beside the size the paper reports for the benchmark
(R²M §4: 18,679 / 11,335 / 10,652 words *including* <#start>, <#end> and <UNK>; our vocabulary also
holds <pad>, so the comparable figure is our size − 1). Under the ``official`` profile without a word
list (``fidelity.vocab_filter``) it first warns in one line (:func:`vocab_filter_warning`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# recipe kind -> vocabulary size in the paper (incl. <#start>, <#end>, <UNK>)
PAPER_VOCAB = {"coco_shutterstock": 18_679, "flickr30k_coco": 11_335, "coco_gcc": 10_652}
# sentences of >= 10 tokens in the official MSCOCO<->Shutterstock corpus (R2M's config.py NUM_DESCRIPTIONS,
# also the <S> count in UC-GAN's released word_counts.txt): the figure after the length filters
PAPER_SENTENCES = {"coco_shutterstock": 2_322_635}


def _stats(path: Path, stage: str, dataset: str) -> dict[str, Any]:
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: run `snakemake --cores 2 {path.parent}` "
                                f"(or `r2m {stage} --dataset {dataset}`) first")
    return json.loads(path.read_text(encoding="utf-8"))


def vocab_filter_warning(dataset: str, kind: str, profile: str, vocab_filter: str | None,
                         vocab_dir: Path | None = None) -> str | None:
    """One line when ``official`` runs without a word list (no ``fidelity.vocab_filter``, or ``glove`` where
    ``build_vocab`` found no fetched list): the authors kept only words
    also in GloVe's vocabulary, so without a word list the vocabulary keeps every word counted
    ``>= min_count`` and comes out larger than theirs; says by how much when ``build_vocab`` has run."""
    stats = vocab_dir / "stats.json" if vocab_dir is not None else None
    if vocab_filter == "glove" and stats is not None and stats.exists():  # the fetched list: was there one?
        vocab_filter = json.loads(stats.read_text(encoding="utf-8")).get("vocab_filter_file")
    if profile != "official" or vocab_filter:
        return None
    paper = PAPER_VOCAB.get(kind)
    size = ""
    if stats is not None and stats.exists():
        v = json.loads(stats.read_text(encoding="utf-8"))
        here = int(v["vocab_size"]) - 1
        size = (f"; here {here} words, of which {v.get('frequent_words', '?')} frequent ones unchecked"
                + (f" ({here - paper:+d} against the paper's {paper})" if paper else ""))
    elif paper:
        size = f"; expect more than the paper's {paper} words"
    return (f"warning: dataset {dataset} runs the official profile without fidelity.vocab_filter: the authors "
            f"kept only words also in GloVe's vocabulary, so this vocabulary misses that filter (frequent "
            f"typos, joined and non-English words stay in){size}; set fidelity.vocab_filter to a word list "
            f"(GloVe's words, one per line)")


def report(dataset: str, kind: str, corpus_dir: Path, vocab_dir: Path) -> list[str]:
    c = _stats(corpus_dir / "stats.json", "corpus_concepts", dataset)
    v = _stats(vocab_dir / "stats.json", "build_vocab", dataset)
    read = c.get("read", {})
    rows: list[tuple[str, Any, Any]] = [
        ("lines read", read.get("lines"), None),
        ("non-empty, valid UTF-8", c.get("sentences_in"), None),
        ("passing the length filters (any concepts)", c.get("length_ok"), PAPER_SENTENCES.get(kind)),
    ]
    left = int(c.get("sentences_in") or 0)
    dropped = c.get("dropped", {})
    from r2m.text.corpus import FILTERS

    order = list(FILTERS.names())  # a sentence counts under the first filter that drops it
    reasons = sorted(dropped, key=lambda r: order.index(r) if r in order else len(order))
    for reason in reasons:
        n = int(dropped[reason])
        left -= n
        rows.append((f"after filter {reason} (-{n})", left, None))
    kept_unk = v.get("sentences_out")
    n_unk = sum(int(x) for k, x in v.items() if k.startswith("dropped_unk_"))
    rows.append((f"after the <UNK> ratio filter (-{n_unk})", kept_unk, None))
    rows.append(("  of which train / val", f"{v.get('out_train', 0)} / {v.get('out_val', 0)}", None))
    size = int(v["vocab_size"])
    rows.append(("vocabulary (words + <#start> <#end> <UNK>)", size - 1, PAPER_VOCAB.get(kind)))
    out = [f"dataset {dataset} (kind {kind}): tokenizer {c.get('tokenizer', 'caption')}, lengths count <S>/</S>: "
           f"{c.get('count_specials', False)}, min_count {v.get('min_count')} over {v.get('vocab_counts', 'train')} "
           f"sentences, word list {v.get('vocab_filter') or 'none'}, plurals singularised in targets: "
           f"{v.get('singularise_targets', False)}",
           f"{'':<46} {'here':>12} {'paper':>12}"]
    for label, here, paper in rows:
        mark = ""
        if isinstance(here, int) and isinstance(paper, int):
            mark = f"  ({100.0 * (here - paper) / paper:+.1f}%)"
        out.append(f"{label:<46} {here if here is not None else '-':>12} "
                   f"{paper if paper is not None else '-':>12}{mark}")
    if kind not in PAPER_VOCAB:
        out.append("(not a paper benchmark: no published figures to compare with)")
    return out

"""The text stages: ``corpus_concepts`` (tokens + sentence concepts + split) and ``build_vocab``.

Both stream: the corpus is processed in chunks of :data:`CHUNK` sentences and written as Parquet
row groups, so memory stays flat in the corpus size (the vocabulary counts are the only state that
grows, with the number of distinct words).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from r2m.stage.context import StageContext
from r2m.text.corpus import FilterConfig, ReadStats, drop_reason, holdout_mask, read_lines
from r2m.text.dictionary import Dictionary, load_dictionary
from r2m.text.tokenize import corpus_tokenizer
from r2m.text.vocab import GLOVE, GLOVE_WORDS, Vocab, read_word_list, unk_ratio, vocab_filter_file
from r2m.text.vocab import build_vocab as make_vocab
from r2m.utils.guard import BadInput
from r2m.utils.io import atomic_path, read_json, write_json
from r2m.utils.progress import progress

CHUNK = 50_000
NO_LIMIT = 1 << 30  # corpus_concepts.max_tokens under fidelity.long_sentences crop
CORPUS_SCHEMA = pa.schema([("tokens", pa.string()), ("concepts", pa.string()), ("split", pa.string()),
                           ("line", pa.int64())])
ENCODED_SCHEMA = pa.schema([("ids", pa.list_(pa.int32())), ("concept_ids", pa.list_(pa.int32())),
                            ("split", pa.string())])


def _chunks(it: Iterator[Any], size: int) -> Iterator[list[Any]]:
    while chunk := list(islice(it, size)):
        yield chunk


# --------------------------------------------------------------------------- corpus_concepts
# split value of sentences kept only for the vocabulary counts (``fidelity.vocab_counts: all``)
COUNT_ONLY = "count_only"


def process_chunk(
    lines: list[tuple[int, str]], dictionary: Dictionary, cfg: FilterConfig, holdout: float, seed: int,
    dropped: Counter[str], tokenizer: str = "caption", keep_no_concept: bool = False,
    passed: Counter[str] | None = None, plurals: str = "lemma",
) -> dict[str, list[Any]]:
    """Tokenise (``fidelity.tokenizer``), find concepts, filter and split one chunk of
    ``(line_number, sentence)``. Tokens are stored as written (plurals included). With
    ``keep_no_concept``, sentences dropped *only* for having no concept are kept with split
    :data:`COUNT_ONLY` (the official vocabulary counts them; build_vocab never trains on them)."""
    tokenize = corpus_tokenizer(tokenizer)
    cols: dict[str, list[Any]] = {"tokens": [], "concepts": [], "line": []}
    count_only: list[bool] = []
    for lineno, text in lines:
        tokens = tokenize(text)
        concepts = dictionary.sentence_concepts(tokens, plurals)
        reason = drop_reason(tokens, concepts, cfg)
        length_ok = cfg.min_tokens <= cfg.length(tokens) <= cfg.max_tokens
        if passed is not None and length_ok:
            passed["length"] += 1  # passes the length filters, whatever its concepts
        if reason is not None:
            dropped[reason] += 1
            if not (keep_no_concept and reason == "no_concept" and length_ok):
                continue
        count_only.append(reason is not None)
        cols["tokens"].append(" ".join(tokens))
        cols["concepts"].append(" ".join(concepts))
        cols["line"].append(lineno)
    val = holdout_mask(np.asarray(cols["line"], dtype=np.int64), holdout, seed)
    cols["split"] = [COUNT_ONLY if c else ("val" if h else "train") for c, h in zip(count_only, val, strict=True)]
    return cols


def filter_config(p: Any, fid: Any) -> FilterConfig:
    """The sentence filters of ``corpus_concepts`` params ``p`` and the ``fidelity`` section: with
    ``long_sentences: crop`` (the released code) no sentence is dropped for its length, training crops each at
    its stage's ``max_len``; with ``drop`` (ours) those over ``max_tokens`` are dropped."""
    max_tokens = p.max_tokens if fid.long_sentences == "drop" else NO_LIMIT
    return FilterConfig(p.min_tokens, max_tokens, p.require_concept, fid.count_specials)


def corpus_concepts(ctx: StageContext) -> None:
    src = ctx.deps["prepared"] / "corpus.txt"
    out = ctx.outs["corpus"]
    p, fid = ctx.params.corpus_concepts, ctx.params.fidelity
    cfg = filter_config(p, fid)
    dictionary = load_dictionary(ctx.params.concepts.dictionary)
    read, dropped, concept_counts, passed = ReadStats(), Counter(), Counter(), Counter()
    n_split: Counter[str] = Counter()
    t0 = time.perf_counter()
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        with pq.ParquetWriter(tmp / "corpus.parquet", CORPUS_SCHEMA) as writer, \
                progress(desc="corpus_concepts", unit="sent") as bar:
            for chunk in _chunks(read_lines(src, read), CHUNK):
                cols = process_chunk(chunk, dictionary, cfg, p.holdout, p.seed, dropped, fid.tokenizer,
                                     keep_no_concept=fid.vocab_counts == "all", passed=passed,
                                     plurals=fid.plurals)
                writer.write_table(pa.table(cols, schema=CORPUS_SCHEMA))
                n_split.update(x for x in cols["split"] if x != COUNT_ONLY)
                for c in cols["concepts"]:
                    concept_counts.update(c.split())
                bar.update(len(chunk))
        seconds = time.perf_counter() - t0
        n_in = read.lines - read.empty - read.bad_utf8
        stats = {
            "source": str(src), "dictionary": dictionary.name, "tokenizer": fid.tokenizer,
            "count_specials": fid.count_specials, "plurals": fid.plurals, "read": read.as_dict(),
            "sentences_in": n_in, "dropped": dict(dropped), "length_ok": passed["length"],
            "kept": sum(n_split.values()),
            "split": dict(n_split), "distinct_concepts": len(concept_counts),
            "top_concepts": dict(concept_counts.most_common(50)),
        }  # no timings in an output folder (its readers' records digest it): they go to the log
        write_json(tmp / "stats.json", stats)
        ctx.save_params(tmp)
    if stats["kept"] == 0:
        ctx.log.warning("corpus_concepts: no sentence kept from %s (dropped: %s)", src, dict(dropped))
    ctx.log.info("corpus_concepts: %d of %d sentences kept (%s) in %.1f s, %.0f sentences/s",
                 stats["kept"], n_in, dict(n_split), seconds, n_in / max(seconds, 1e-9))


# --------------------------------------------------------------------------- build_vocab
def _parquet(path: Path) -> pq.ParquetFile:
    """A Parquet file read block by block through a 1 MiB buffer (unbuffered reads kept ~75 MB more in
    memory on a 2.3 M-sentence corpus, growing with the file)."""
    return pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)


def count_words(corpus: Path, split: str | None = "train") -> tuple[Counter[str], int]:
    """Word counts over the ``tokens`` column (only ``split`` rows unless None), streaming."""
    counts: Counter[str] = Counter()
    n = 0
    for batch in _parquet(corpus).iter_batches(batch_size=CHUNK, columns=["tokens", "split"]):
        tokens, splits = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        for t, s in zip(tokens, splits, strict=True):
            if split is None or s == split:
                counts.update(t.split())
                n += 1
    return counts, n


def singular_targets(tokens: list[str], dictionary: Dictionary, plurals: str = "lemma") -> list[str]:
    """Plural dictionary words replaced by their singular inside the sentence, by ``plurals``
    (``fidelity.plurals``; see :meth:`Dictionary.singular_targets`)."""
    return dictionary.singular_targets(tokens, plurals)


def encode_batch(batch: pa.RecordBatch, vocab: Vocab, max_unk: float, stats: Counter[str],
                 dictionary: Dictionary | None = None, unk_extra: int = 0, plurals: str = "lemma") -> pa.Table:
    """Encode sentences; with ``dictionary``, plural dictionary words are singularised first (by the
    ``plurals`` rule); ``unk_extra`` tokens (2 = <S>, </S>) count in the <UNK>-ratio denominator."""
    ids_col, cids_col, split_col = [], [], []
    for tokens, concepts, split in zip(*(batch.column(i).to_pylist() for i in range(3)), strict=True):
        words = tokens.split()
        if dictionary is not None:
            words = singular_targets(words, dictionary, plurals)
        if split == COUNT_ONLY:  # counted for the vocabulary only
            stats["count_only"] += 1
            continue
        ids = vocab.encode(words)
        stats[f"in_{split}"] += 1
        if unk_ratio(ids, vocab.unk_id, unk_extra) > max_unk:
            stats[f"dropped_unk_{split}"] += 1
            continue
        cids = [i for i in vocab.encode(concepts.split()) if i != vocab.unk_id]
        ids_col.append(ids)
        cids_col.append(cids)
        split_col.append(split)
        stats[f"out_{split}"] += 1
        stats["tokens"] += len(ids)
        stats["unk_tokens"] += ids.count(vocab.unk_id)
    return pa.table({"ids": ids_col, "concept_ids": cids_col, "split": split_col}, schema=ENCODED_SCHEMA)


def _dropped(corpus: Path) -> str:
    """What corpus_concepts dropped and why, from its ``stats.json`` beside ``corpus``."""
    try:
        stats = read_json(corpus.parent / "stats.json")
        return f"corpus_concepts read {stats['sentences_in']} sentence(s) and dropped {stats['dropped']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "corpus_concepts left none"


def build_vocab(ctx: StageContext) -> None:
    corpus = ctx.deps["corpus"] / "corpus.parquet"
    if not corpus.exists():
        raise FileNotFoundError(f"missing input file: {corpus} (run `r2m corpus_concepts --dataset {ctx.dataset}`)")
    out = ctx.outs["vocab"]
    p, fid = ctx.params.build_vocab, ctx.params.fidelity
    dictionary = load_dictionary(ctx.params.concepts.dictionary)
    word_list = vocab_filter_file(fid.vocab_filter, ctx.deps.get("prepared"))
    if fid.vocab_filter == GLOVE and word_list is None:
        ctx.log.warning("build_vocab: fidelity.vocab_filter 'glove' but the prepared folder holds no %s (only a "
                        "paper benchmark's prepare fetches it): no word-list filter", GLOVE_WORDS)
    allowed = read_word_list(word_list) if word_list else None
    t0 = time.perf_counter()
    # counted before any singularisation, as the official preprocessing does
    counts, n_counted = count_words(corpus, None if fid.vocab_counts == "all" else "train")
    vocab = make_vocab(counts, p.min_count, dictionary.words, allowed)
    n_frequent = sum(1 for w, c in counts.items() if c >= p.min_count and (allowed is None or w in allowed))
    stats: Counter[str] = Counter()
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        vocab.save(tmp / "vocab.json")
        pf = _parquet(corpus)
        with pq.ParquetWriter(tmp / "encoded.parquet", ENCODED_SCHEMA) as writer, \
                progress(desc="build_vocab", unit="sent", total=pf.metadata.num_rows) as bar:
            for batch in pf.iter_batches(batch_size=CHUNK, columns=["tokens", "concepts", "split"]):
                writer.write_table(encode_batch(batch, vocab, p.max_unk_ratio, stats,
                                                dictionary if fid.singularise_targets else None,
                                                2 if fid.count_specials else 0, fid.plurals))
                bar.update(batch.num_rows)
        seconds = time.perf_counter() - t0
        n_in = int(pf.metadata.num_rows)
        if not stats["in_train"]:  # no sentence to train on: one line now, not a vocabulary of no sentence
            raise BadInput(f"build_vocab: no training sentence in {corpus} ({n_in} rows; {_dropped(corpus)}); "
                           "check the dataset's corpus and the corpus_concepts filters")
        summary = {
            "vocab_size": len(vocab), "min_count": p.min_count, "max_unk_ratio": p.max_unk_ratio,
            "vocab_filter": fid.vocab_filter, "vocab_filter_file": str(word_list) if word_list else None,
            "vocab_filter_words": len(allowed) if allowed is not None else None,
            "vocab_counts": fid.vocab_counts, "singularise_targets": fid.singularise_targets,
            "plurals": fid.plurals,
            "dictionary": dictionary.name, "counted_sentences": n_counted, "distinct_words": len(counts),
            "frequent_words": n_frequent, "dictionary_words": len(dictionary.words),
            "dictionary_only_words": len(vocab) - 4 - n_frequent,
            "sentences_in": n_in, "sentences_out": sum(v for k, v in stats.items() if k.startswith("out_")),
            **{k: v for k, v in sorted(stats.items())},
            "unk_token_ratio": round(stats["unk_tokens"] / max(stats["tokens"], 1), 5),
        }  # (timings: the log)
        write_json(tmp / "stats.json", summary)
        ctx.save_params(tmp)
    ctx.log.info("build_vocab: %d words, %d of %d sentences kept in %.1f s, %.0f sentences/s",
                 len(vocab), summary["sentences_out"], n_in, seconds, n_in / max(seconds, 1e-9))

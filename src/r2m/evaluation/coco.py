"""coco-caption metrics (BLEU-1..4, METEOR, ROUGE-L, CIDEr, SPICE) with pycocoevalcap's scorers.

The scorers are called one by one (``COCOEvalCap.evaluate()`` aborts when SPICE's CoreNLP jars are
missing) after the same PTB tokenisation coco-caption applies (Stanford PTBTokenizer, lower-cased,
punctuation tokens removed). Independent scorers run concurrently: METEOR and SPICE are Java
subprocesses, BLEU/ROUGE/CIDEr pure Python.

Four scorers are our own implementations of the same computation, tested equal to pycocoevalcap's
to the last bit on the nlg-eval case and on random corpora: METEOR (:mod:`r2m.evaluation.meteor`,
the same jar, segments pipelined to one or more Java processes, the corpus score from the jar's own
EVAL of all segment statistics), BLEU (:mod:`r2m.evaluation.bleu`) and CIDEr-D
(:mod:`r2m.evaluation.cider`), both counting n-grams with array sorts and summing in coco-caption's
order, and ROUGE-L (:mod:`r2m.evaluation.rouge`, a bit-parallel LCS). SPICE and the tokeniser are
pycocoevalcap's.

SPICE needs Stanford CoreNLP 3.6.0 jars that pycocoevalcap downloads on first use; offline they are
absent, so SPICE is then reported as missing (``None``) with one warning, never as 0 and never by
attempting a download.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r2m.evaluation.inputs import one_line
from r2m.evaluation.stats import BLEU_STATS, METEOR_N_STATS, METEOR_STATS
from r2m.utils.registry import Registry

METRIC_NAMES = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE")
DEFAULT_SCORERS = ("bleu", "meteor", "rouge", "cider", "spice")

Gts = dict[str, list[str]]
Res = dict[str, list[str]]
# metric -> (aggregate, per-image in gts order). A scorer may add its per-image sufficient statistics
# as further keys (``BLEU_STATS``, ``METEOR_STATS``) with aggregate ``None``: :func:`evaluate_stats`
# returns them, from which :mod:`r2m.evaluation.bootstrap` recomputes the corpus metric of any
# multiset of images.
Scored = dict[str, tuple[float | None, list[float]]]



class MetricUnavailableWarning(UserWarning):
    """A requested metric cannot be computed on this machine (reported as missing, not 0)."""


def _pycocoevalcap_dir() -> Path:
    import pycocoevalcap

    return Path(next(iter(pycocoevalcap.__path__)))


# Where SPICE looks for CoreNLP (tests point this at an empty folder to simulate absence).
SPICE_LIB_DIR: Path | None = None
SPICE_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")


def spice_lib_dir() -> Path:
    return SPICE_LIB_DIR if SPICE_LIB_DIR is not None else _pycocoevalcap_dir() / "spice" / "lib"


def _need_java(what: str) -> str | None:
    return None if shutil.which("java") else f"{what} needs Java ('java' is not on PATH)"


def spice_unavailable() -> str | None:
    """Why SPICE cannot run here, or None when it can."""
    lib = spice_lib_dir()
    missing = [j for j in SPICE_JARS if not (lib / j).is_file()]
    if missing:
        return (
            f"SPICE is unavailable: Stanford CoreNLP jars {', '.join(missing)} are not in {lib} "
            "(pycocoevalcap downloads them on first use; r2m never downloads). Copy them there from "
            "stanford-corenlp-full-2015-12-09.zip to enable SPICE; reporting SPICE as missing (null)."
        )
    return _need_java("SPICE")


# --------------------------------------------------------------------------- tokenisers
TOKENIZERS: Registry[Callable[[list[str]], list[str]]] = Registry("tokenizer")


@TOKENIZERS.register("none")
def tokenize_none(sentences: list[str]) -> list[str]:
    """No tokenisation (nlg-eval's convention: surrounding whitespace stripped), each sentence made
    one line (:func:`r2m.evaluation.inputs.one_line`: METEOR's jar reads one line per segment; whitespace runs collapse,
    which no whitespace-splitting scorer sees)."""
    return [one_line(s) for s in sentences]


@TOKENIZERS.register("ptb")
def tokenize_ptb(sentences: list[str]) -> list[str]:
    """coco-caption's tokenisation: Stanford PTBTokenizer ``-preserveLines -lowerCase``, then the
    punctuation tokens of ``pycocoevalcap.tokenizer.ptbtokenizer.PUNCTUATIONS`` dropped.

    All sentences go through one Java call (the tokeniser is line-independent, so this equals
    tokenising references and results separately as ``COCOEvalCap`` does).
    """
    from pycocoevalcap.tokenizer import ptbtokenizer as ptb

    from r2m.evaluation.meteor import QUICK_JVM  # text out: the same under any JIT, half the CPU

    if not sentences:
        return []
    problem = _need_java("PTB tokenisation")
    if problem:
        raise RuntimeError(problem)
    jar = _pycocoevalcap_dir() / "tokenizer" / ptb.STANFORD_CORENLP_3_4_1_JAR
    clean = [one_line(s) for s in sentences]
    todo = [k for k, s in enumerate(clean) if s]  # an empty line is never sent: nothing to tokenise
    if not todo:
        return ["" for _ in sentences]
    text = "\n".join(clean[k] for k in todo)
    with tempfile.TemporaryDirectory(prefix="r2m-ptb-") as tmp:
        src = Path(tmp) / "sentences.txt"
        src.write_bytes(text.encode())
        cmd = ["java", *QUICK_JVM, "-cp", str(jar), "edu.stanford.nlp.process.PTBTokenizer",
               "-preserveLines", "-lowerCase", str(src)]
        proc = subprocess.run(cmd, capture_output=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"PTBTokenizer failed (exit {proc.returncode}): {proc.stderr.decode(errors='replace')[-2000:]}")
    lines = proc.stdout.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline after the last line
    if len(lines) != len(todo):  # a line split or merged: every later sentence would shift
        raise RuntimeError(f"PTBTokenizer returned {len(lines)} lines for {len(todo)} sentences")
    punct = set(ptb.PUNCTUATIONS)
    out = ["" for _ in sentences]
    for k, line in zip(todo, lines, strict=True):
        out[k] = " ".join(w for w in line.rstrip().split(" ") if w and w not in punct)
    return out


def tokenize(gts: Gts, res: Res, method: str = "ptb") -> tuple[Gts, Res]:
    """Tokenise references and hypotheses together with one tokeniser call."""
    fn = TOKENIZERS.get(method)
    flat = [c for caps in gts.values() for c in caps] + [c for caps in res.values() for c in caps]
    toks = iter(fn(flat))
    gts_t = {k: [next(toks) for _ in caps] for k, caps in gts.items()}
    res_t = {k: [next(toks) for _ in caps] for k, caps in res.items()}
    return gts_t, res_t


# --------------------------------------------------------------------------- scorers
@dataclass(frozen=True)
class ScorerSpec:
    """A scorer: the metrics it yields and how to compute them from tokenised captions.

    ``start(workers)`` (optional) makes the scorer's handle before tokenisation (METEOR's:
    :class:`r2m.evaluation.meteor.SegmentMeteor`, whose JVMs start with the segments);
    ``compute`` then receives the handle, and closes it. ``java`` scorers wait on a subprocess and run in threads; the others are
    CPU-bound Python and run in a process pool in ``hybrid`` mode.
    """

    name: str
    metrics: tuple[str, ...]
    compute: Callable[[Gts, Res, Any], Scored]
    unavailable: Callable[[], str | None] = lambda: None
    start: Callable[[int], Any] | None = None
    java: bool = False


SCORERS: Registry[ScorerSpec] = Registry("scorer")


def _register(spec: ScorerSpec) -> ScorerSpec:
    return SCORERS.register(spec.name)(spec)


def _floats(xs: Iterable[Any]) -> list[float]:
    return [float(x) for x in xs]


def _bleu(gts: Gts, res: Res, handle: Any = None) -> Scored:
    """BLEU-1..4 as pycocoevalcap's ``Bleu(4).compute_score`` (``closest`` reference length;
    :mod:`r2m.evaluation.bleu`, equal to the last bit), plus each image's statistics."""
    from r2m.evaluation.bleu import bleu

    ids = list(gts)
    score, scores, stats = bleu([_one(res, i) for i in ids], [gts[i] for i in ids])
    out: Scored = {f"Bleu_{n + 1}": (score[n], scores[n]) for n in range(4)}
    out.update({c: (None, [float(v) for v in col]) for c, col in zip(BLEU_STATS, stats.T.tolist(), strict=True)})
    return out


def meteor_procs(workers: int) -> tuple[int, int]:
    """(Java processes, threads each) for METEOR on ``workers`` cores.

    One JVM spends ~5-10 CPU-seconds loading the full paraphrase table (~0.6 s the table cut to
    the segments, :mod:`r2m.evaluation.paraphrase`); scoring 5,000 segments costs ~5 s. With a JDK, one JVM loads the table once and scores on ``workers``
    threads (:class:`r2m.evaluation.meteor.MeteorPool`); without one (a JRE only), one jar
    process per two cores (more start-ups only pay where cores are idle).
    """
    from r2m.evaluation.meteor import threads_available

    if threads_available():
        return 1, max(1, min(workers, 16))
    return max(1, min(workers // 2, 8)), 1


def _meteor_start(workers: int = 1) -> Any:
    from r2m.evaluation.meteor import SegmentMeteor

    procs, threads = meteor_procs(workers)
    return SegmentMeteor(procs, threads)  # the JVMs start with the segments' own paraphrase table


def _meteor(gts: Gts, res: Res, handle: Any = None) -> Scored:
    pool = handle if handle is not None else _meteor_start()
    try:
        ids = list(gts)
        score, scores, stats = pool.compute_stats([_one(res, i) for i in ids], [gts[i] for i in ids])
    finally:
        _close_meteor(pool)
    rows = [line.split() for line in stats]
    if any(len(r) != METEOR_N_STATS for r in rows):
        raise RuntimeError(f"METEOR returned segment statistics of {sorted({len(r) for r in rows})} numbers; "
                           f"expected {METEOR_N_STATS} (METEOR 1.5)")
    out: Scored = {"METEOR": (score, scores)}
    out.update({c: (None, [float(r[k]) for r in rows]) for k, c in enumerate(METEOR_STATS)})
    return out


def _close_meteor(handle: Any) -> None:
    handle.close()


def _one(res: Res, i: str) -> str:
    if len(res[i]) != 1:
        raise ValueError(f"image {i!r}: expected exactly one hypothesis, got {len(res[i])}")
    return res[i][0]


def _rouge(gts: Gts, res: Res, handle: Any = None) -> Scored:
    """pycocoevalcap's ROUGE-L (:mod:`r2m.evaluation.rouge`, equal to the last bit)."""
    from r2m.evaluation.rouge import rouge_l

    ids = list(gts)
    score, scores = rouge_l([_one(res, i) for i in ids], [gts[i] for i in ids])
    return {"ROUGE_L": (score, scores)}


def _cider(gts: Gts, res: Res, handle: Any = None) -> Scored:
    from r2m.evaluation.cider import cider_d

    ids = list(gts)
    score, scores = cider_d([_one(res, i) for i in ids], [gts[i] for i in ids])
    return {"CIDEr": (score, scores)}


def _spice(gts: Gts, res: Res, handle: Any = None) -> Scored:
    from pycocoevalcap.spice.spice import Spice

    reason = spice_unavailable()
    if reason:  # guard: Spice() would try to download the jars
        raise RuntimeError(reason)
    score, scores = Spice().compute_score(gts, res)
    # Spice sorts the image ids; map back to gts order
    by_id = dict(zip(sorted(gts), scores, strict=True))
    return {"SPICE": (float(score), [float(by_id[k]["All"]["f"]) for k in gts])}


_register(ScorerSpec("bleu", ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"), _bleu))
_register(ScorerSpec("meteor", ("METEOR",), _meteor, lambda: _need_java("METEOR"), _meteor_start, java=True))
_register(ScorerSpec("rouge", ("ROUGE_L",), _rouge))
_register(ScorerSpec("cider", ("CIDEr",), _cider))
_register(ScorerSpec("spice", ("SPICE",), _spice, spice_unavailable, java=True))


def run_scorer(name: str, gts: Gts, res: Res, handle: Any = None) -> Scored:
    """Compute one registered scorer (a top-level function so process pools can pickle it)."""
    return SCORERS.get(name).compute(gts, res, handle)


# --------------------------------------------------------------------------- scheduling
# Measured on 2 cores, 5,000 images x 5 refs (see `r2m bench evaluate`): METEOR dominates (~3 CPU-s
# in its JVM: a cut paraphrase table, the quick JIT); BLEU, CIDEr-D and ROUGE-L together ~1 CPU-s in
# Python. "threads" runs every scorer in a thread of this process (the Java scorers' work is in the
# JVM; the Python scorers run one after another beside it); "hybrid" moves BLEU/ROUGE/CIDEr to a
# worker process from HYBRID_MIN_IMAGES images on, below which the worker's start-up and the
# pickling cost more CPU than the GIL it frees (5,000 images: 6.1 vs 5.7 CPU-s; 20,000: 21.4 vs 18.3).
PARALLEL_MODES = ("hybrid", "threads", "serial")
_COST_ORDER = ("spice", "meteor", "rouge", "cider", "bleu")  # slowest first
HYBRID_MIN_IMAGES = 50_000


def _by_cost(names: Iterable[str]) -> list[str]:
    return sorted(names, key=lambda n: _COST_ORDER.index(n) if n in _COST_ORDER else len(_COST_ORDER))


def _score_all(names: Sequence[str], gts: Gts, res: Res, tokenizer: str, parallel: str,
               workers: int) -> dict[str, Scored]:
    """Tokenise, then run the scorers as ``parallel`` says; returns ``{scorer: Scored}``."""
    if parallel not in PARALLEL_MODES:
        raise ValueError(f"unknown parallel mode {parallel!r}; choose from {', '.join(PARALLEL_MODES)}")
    names = _by_cost(names)
    handles = {} if parallel == "serial" else {
        n: SCORERS.get(n).start(workers) for n in names if SCORERS.get(n).start is not None
    }
    try:
        gts, res = tokenize(gts, res, tokenizer)
        if parallel == "serial" or len(names) < 2:
            return {n: run_scorer(n, gts, res, handles.pop(n, None)) for n in names}
        if parallel == "threads" or (parallel == "hybrid" and len(res) < HYBRID_MIN_IMAGES):
            with ThreadPoolExecutor(max_workers=max(1, min(workers, len(names)))) as pool:
                futs = {n: pool.submit(run_scorer, n, gts, res, handles.pop(n, None)) for n in names}
                return {n: f.result() for n, f in futs.items()}
        java = [n for n in names if SCORERS.get(n).java]
        python = [n for n in names if not SCORERS.get(n).java]
        out: dict[str, Scored] = {}
        n_proc = max(1, min(workers - 1 if java else workers, len(python)))
        procs = (ProcessPoolExecutor(max_workers=n_proc, mp_context=multiprocessing.get_context("spawn"))
                 if python else None)
        try:
            pfuts = {n: procs.submit(run_scorer, n, gts, res) for n in python} if procs else {}
            if java:
                with ThreadPoolExecutor(max_workers=len(java)) as threads:
                    tfuts = {n: threads.submit(run_scorer, n, gts, res, handles.pop(n, None)) for n in java}
                    out.update({n: f.result() for n, f in tfuts.items()})
            out.update({n: f.result() for n, f in pfuts.items()})
        finally:
            if procs:
                procs.shutdown(cancel_futures=True)
        return out
    finally:
        for h in handles.values():  # started but never used (an error happened first)
            _close_meteor(h)


def default_workers() -> int:
    return max(2, min(4, os.cpu_count() or 1))


# --------------------------------------------------------------------------- the evaluation
def evaluate(results: dict[str, str], references: dict[str, list[str]], scorers: Sequence[str] = DEFAULT_SCORERS,
             **options: Any) -> tuple[dict[str, float | None], dict[str, dict[str, float | None]]]:
    """Score ``results`` (``{image_id: caption}``) against ``references`` (``{image_id: [caption…]}``).

    Returns ``(metrics, per_image)``: aggregate metrics named as coco-caption names them, and
    ``{image_id: {metric: score}}``. A requested metric that cannot run here (SPICE without its
    jars) is ``None`` in both, announced by one :class:`MetricUnavailableWarning`. ``options``:
    ``tokenizer`` (default ``ptb``), ``parallel`` (``hybrid``), ``workers`` (:func:`evaluate_stats`).
    """
    metrics, per_image, _ = evaluate_stats(results, references, scorers, **options)
    return metrics, per_image


def evaluate_stats(
    results: dict[str, str],
    references: dict[str, list[str]],
    scorers: Sequence[str] = DEFAULT_SCORERS,
    *,
    tokenizer: str = "ptb",
    parallel: str = "hybrid",
    workers: int | None = None,
) -> tuple[dict[str, float | None], dict[str, dict[str, float | None]], dict[str, list[float]]]:
    """:func:`evaluate` plus the per-image sufficient statistics the scorers gave
    (``{column: values in results order}``: :data:`BLEU_STATS`, :data:`METEOR_STATS`)."""
    names = list(dict.fromkeys(scorers))
    if not names:
        raise ValueError(f"no scorers to run; name at least one of {', '.join(SCORERS.names())}")
    for n in names:
        SCORERS.get(n)  # unknown names fail early, listing the known ones
    missing_refs = [i for i in results if not references.get(i)]
    if missing_refs:
        raise ValueError(f"no reference captions for image id(s) {missing_refs[:5]}")
    runnable, skipped = [], {}
    for n in names:
        reason = SCORERS.get(n).unavailable()
        if reason:
            skipped[n] = reason
        else:
            runnable.append(n)
    if skipped:
        warnings.warn(" ".join(skipped.values()), MetricUnavailableWarning, stacklevel=2)

    ids = list(results)
    gts = {i: list(references[i]) for i in ids}
    res = {i: [results[i]] for i in ids}
    scored = _score_all(runnable, gts, res, tokenizer, parallel, workers or default_workers())

    metrics: dict[str, float | None] = {}
    per_image: dict[str, dict[str, float | None]] = {i: {} for i in ids}
    stats: dict[str, list[float]] = {}
    for n in names:
        if n not in skipped:
            extra = set(scored[n]) - set(SCORERS.get(n).metrics)
            stats.update({c: v for c, (_, v) in scored[n].items() if c in extra})
        for metric in SCORERS.get(n).metrics:
            if n in skipped:
                metrics[metric] = None
                for i in ids:
                    per_image[i][metric] = None
                continue
            agg, each = scored[n][metric]
            metrics[metric] = agg
            for i, s in zip(ids, each, strict=True):
                per_image[i][metric] = s
    order = {m: k for k, m in enumerate(METRIC_NAMES)}
    metrics = dict(sorted(metrics.items(), key=lambda kv: order.get(kv[0], len(order))))
    return metrics, per_image, stats

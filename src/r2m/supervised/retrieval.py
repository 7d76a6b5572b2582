"""Image↔sentence retrieval on a split (every image × its reference sentences), as in the m-RNN
papers: R@1, R@5, R@10 (percent of queries with a ground truth among the top K) and Med r (median
rank of the first ground truth).

* **Sentence retrieval** (image → sentences): for an image query I, sentences D are ranked by
  ``P(D | I) / P(D)`` with ``P(D) = Σ_{I'} P(D | I') · P(I')`` over sampled images I′, ``P(I′)``
  uniform (m-RNN, seed 003) — without it, generic, short sentences would top every list. I′ are
  ``retrieval.prior_images`` images drawn without replacement with ``retrieval.seed`` from the
  **training** images (:func:`prior_image_ids`): the split the model was fitted to stands for the
  image distribution, it is disjoint from the queries (so a query's own P(D | I) never enters the
  normaliser of its ground truth, and the normaliser does not change with the candidate set), and
  it is the largest pool. ``prior_images: 0`` is the former estimate over the queried split's own
  images, kept as an explicit option. The sampled ids are written into ``retrieval.json``.
* **Image retrieval** (sentence → images): for a sentence query Q, images are ranked by ``P(Q | I)``.

A supervised model scores all pairs with one teacher-forced pass per block of
``retrieval.image_block`` images against all sentences (``score_block``); R²M scores pairs in its
joint space: ``v̂^I · ṽ`` (image projection against the reconstructed vector of the sentence,
teacher-forced from the sentence's own concepts), with no normalisation.

The two stages are :func:`run_sup` (``retrieval_sup``: one supervised model, ``log P(sentence | image)``) and
:func:`run_r2m` (``retrieval_r2m``: R²M's final checkpoint through its joint space, :func:`r2m_similarity`);
each imports its own side (pyarrow, torch, R²M's checkpoint loader, the baselines' skip rule) when it runs.

**Ties** are counted against the query: a non-matching candidate that scores exactly as high as
the best match ranks ahead of it (rank = 1 + #non-matching candidates scoring ≥ the best match).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from r2m.stage.context import StageContext
from r2m.utils.io import write_json
from r2m.utils.lazy import no_grad

# pyarrow and torch are imported by the functions that score: a skipped baseline starts without them
if TYPE_CHECKING:
    import pyarrow as pa
    import torch

KS = (1, 5, 10)


# --------------------------------------------------------------------------- metrics
def first_match_ranks(scores: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    """1-based rank of each query's best-scoring relevant candidate ([Q, C] scores and mask);
    ties with non-relevant candidates count against the query."""
    scores = np.asarray(scores, dtype=np.float64)
    relevant = np.asarray(relevant, dtype=bool)
    if not relevant.any(axis=1).all():
        raise ValueError("every query needs at least one relevant candidate")
    best = np.where(relevant, scores, -np.inf).max(axis=1, keepdims=True)
    return 1 + ((scores >= best) & ~relevant).sum(axis=1)


def recall_metrics(ranks: np.ndarray, ks: tuple[int, ...] = KS) -> dict[str, float]:
    out = {f"R@{k}": float(100.0 * np.mean(ranks <= k)) for k in ks}
    out["Med r"] = float(np.median(ranks))
    return out


def chance_metrics(n_candidates: int, n_relevant: int, ks: tuple[int, ...] = KS) -> dict[str, float]:
    """R@K of a random ranking: P(at least one of n_relevant among the top K of n_candidates)."""
    out = {}
    for key in ks:
        k = min(key, n_candidates)  # fewer candidates than K: every one is in the top K (keyed R@K all the same)
        miss = math.comb(n_candidates - n_relevant, k) / math.comb(n_candidates, k) if n_candidates - n_relevant >= k else 0.0
        out[f"R@{key}"] = 100.0 * (1.0 - miss)
    # median of the first-match rank of a random ranking: smallest r with P(rank <= r) >= 1/2
    r = 1
    while r < n_candidates:
        miss = math.comb(n_candidates - n_relevant, r) / math.comb(n_candidates, r) if n_candidates - n_relevant >= r else 0.0
        if 1.0 - miss >= 0.5:
            break
        r += 1
    out["Med r"] = float(r)
    return out


def log_prior(logp: np.ndarray) -> np.ndarray:
    """log P(sentence) = log mean_{I'} P(sentence | I') from log-probabilities [n_images, S]."""
    m = logp.max(axis=0, keepdims=True)
    return (m + np.log(np.exp(logp - m).mean(axis=0, keepdims=True)))[0]


def retrieval_scores(logp: np.ndarray, sentence_image: np.ndarray, prior_logp: np.ndarray | None = None,
                     normalise: bool = True) -> dict[str, Any]:
    """Both tasks from a score matrix ``logp`` [N images, S sentences] (log P(s | I) or a
    similarity) and each sentence's image index. ``prior_logp`` [n, S] (log P(s | I') of other
    sampled images) estimates P(s); by default the N images themselves."""
    N, S = logp.shape
    relevant = np.zeros((N, S), dtype=bool)
    relevant[sentence_image, np.arange(S)] = True
    sent_scores = logp - log_prior(logp if prior_logp is None else prior_logp)[None, :] if normalise else logp
    per_image = np.bincount(sentence_image, minlength=N)
    sent_ranks, img_ranks = first_match_ranks(sent_scores, relevant), first_match_ranks(logp.T, relevant.T)
    return {
        "sentence_retrieval": recall_metrics(sent_ranks),
        "image_retrieval": recall_metrics(img_ranks),
        # per-query first-match ranks (image queries, then sentence queries in sentence order): the
        # retrieval table's bootstrap over queries (`dvc metrics show` skips lists)
        "ranks": {"sentence_retrieval": sent_ranks.tolist(), "image_retrieval": img_ranks.tolist()},
        "chance": {"sentence_retrieval": chance_metrics(S, int(np.median(per_image))),
                   "image_retrieval": chance_metrics(N, 1)},
        "n_images": int(N), "n_sentences": int(S),
        "normalised": bool(normalise),
    }


# --------------------------------------------------------------------------- supervised models
@no_grad
def sup_logp(model, feats, rows: np.ndarray, inputs, targets, lengths, block: int, device) -> np.ndarray:
    """log P(sentence_j | image_i) for images at feature ``rows`` × all sentences → [N, S]."""
    from r2m.utils.progress import progress

    out = np.empty((len(rows), inputs.shape[0]), dtype=np.float64)
    inputs, targets, lengths = inputs.to(device), targets.to(device), lengths.to(device)
    for s in progress(range(0, len(rows), block), desc="retrieval"):
        f = {k: v.to(device) for k, v in feats.get(rows[s: s + block]).items()}
        out[s: s + block] = model.score_block(model.encode(f), inputs, targets, lengths).double().cpu().numpy()
    return out


def prior_image_ids(pool: Sequence[str], n: int, seed: int) -> list[str]:
    """I′ for P(sentence): ``n`` ids drawn without replacement from ``pool`` with ``seed``, in pool
    order (all of it when ``n`` ≥ its size). Same ``pool``, ``n``, ``seed`` → same ids."""
    if n <= 0:
        raise ValueError(f"retrieval.prior_images {n}: the sampled prior needs at least one image")
    pick = np.random.default_rng(seed).choice(len(pool), min(n, len(pool)), replace=False)
    return [pool[k] for k in sorted(pick)]


def sampled_prior(model, feats, pool: Sequence[str], n: int, seed: int, inputs, targets, lengths, block: int,
                  device) -> tuple[list[str], np.ndarray]:
    """The sampled images I′ (:func:`prior_image_ids` over the ``pool`` images that have features)
    and log P(sentence | I′) for each of them × all sentences → ``(ids, [n, S])``."""
    ids = prior_image_ids([i for i in pool if i in feats.row_of], n, seed)
    rows = np.array([feats.row_of[i] for i in ids], dtype=np.int64)
    return ids, sup_logp(model, feats, rows, inputs, targets, lengths, block, device)


def split_pairs(sup_vocab: Path, split: str, row_of: dict[str, int]) -> tuple[list[str], pa.Table]:
    """The split's images (in first-seen order, with features) and their sentences."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(sup_vocab / "captions.parquet")
    t = t.filter(pc.equal(t["split"], split))
    ids = [str(i) for i in t["image_id"].to_pylist()]
    keep = [i in row_of for i in ids]
    t = t.filter(pa.array(keep))
    images = list(dict.fromkeys(i for i, k in zip(ids, keep, strict=True) if k))
    return images, t


def summary(res: dict[str, Any]) -> str:
    s, i = res["sentence_retrieval"], res["image_retrieval"]
    return (f"{res['n_images']} images x {res['n_sentences']} sentences; sentence R@1/5/10 "
            f"{s['R@1']:.1f}/{s['R@5']:.1f}/{s['R@10']:.1f} Med r {s['Med r']:g}; image R@1/5/10 "
            f"{i['R@1']:.1f}/{i['R@5']:.1f}/{i['R@10']:.1f} Med r {i['Med r']:g} "
            f"(chance R@10 {res['chance']['sentence_retrieval']['R@10']:.1f} / {res['chance']['image_retrieval']['R@10']:.1f})")


# --------------------------------------------------------------------------- the stages
def run_sup(ctx: StageContext) -> None:
    """DAG stage ``retrieval_sup``: one supervised model on ``retrieval.split``."""
    from r2m.supervised.skip import skip_reason

    out = Path(ctx.outs["retrieval"])
    reason = skip_reason(ctx.deps["sup_vocab"])
    if reason:
        write_json(out, {"skipped": reason})
        ctx.log.info("retrieval_sup: %s", reason)
        return
    from r2m.captioning.captioner import load_checkpoint_model
    from r2m.supervised.data import model_features, teacher_forcing

    rp = ctx.params.retrieval
    device = ctx.runtime.torch_device()
    model, _, _ = load_checkpoint_model(ctx.deps["model"], device)
    feats = model_features(ctx.deps["model"], ctx.deps["features"], model.feature_kinds)
    images, t = split_pairs(Path(ctx.deps["sup_vocab"]), rp.split, feats.row_of)
    if not images:
        raise ValueError(f"{ctx.deps['sup_vocab']}: no {rp.split} image-sentence pairs with features")
    index = {i: k for k, i in enumerate(images)}
    sentence_image = np.array([index[str(i)] for i in t["image_id"].to_pylist()], dtype=np.int64)
    max_len = ctx.params.train_sup.for_model(ctx.model).max_len
    inputs, targets, lengths = teacher_forcing(t["ids"].combine_chunks(), max_len)
    rows = np.array([feats.row_of[i] for i in images], dtype=np.int64)
    logp = sup_logp(model, feats, rows, inputs, targets, lengths, rp.image_block, device)
    prior, prior_ids = None, None
    if rp.prior_images:
        prior_ids, prior = sampled_prior(model, feats, _split_images(ctx, "train"), rp.prior_images, rp.seed,
                                         inputs, targets, lengths, rp.image_block, device)
        if not prior_ids:
            raise ValueError(f"{ctx.deps['prepared']}: no train images with features to sample "
                             "retrieval.prior_images from (set retrieval.prior_images: 0 for the split's own images)")
    feats.close()
    res = retrieval_scores(logp, sentence_image, prior)
    res.update(model=ctx.model, dataset=ctx.dataset, split=rp.split,
               prior=(f"{len(prior_ids)} training images sampled with seed {rp.seed}" if prior_ids
                      else f"the {len(images)} {rp.split} images"),
               prior_image_ids=prior_ids,
               scoring="log P(sentence | image); sentence retrieval normalised by P(sentence)")
    write_json(out, res)
    ctx.save_params(out.parent, "retrieval.params.yaml")
    ctx.log.info("retrieval_sup: %s", summary(res))


def _split_images(ctx: StageContext, split: str) -> list[str]:
    import pyarrow.parquet as pq

    images = pq.read_table(Path(ctx.deps["prepared"]) / "images.parquet", columns=["image_id", "split"]).to_pandas()
    return [str(i) for i in images.loc[images["split"] == split, "image_id"]]


@no_grad
def r2m_similarity(model, image_feats: torch.Tensor, concepts: torch.Tensor, concept_lens: torch.Tensor,
                   inputs: torch.Tensor, lengths: torch.Tensor, batch: int = 256) -> np.ndarray:
    """v̂^I · ṽ for every image × sentence → [N, S] (ṽ teacher-forced from each sentence's concepts)."""
    import torch

    v_img = model.project_image(image_feats)
    vt = []
    for s in range(0, inputs.shape[0], batch):
        e = s + batch
        out = model(concepts[s:e], concept_lens[s:e], inputs[s:e], lengths[s:e], reconstruct=True)
        vt.append(out["v_tilde"])
    return (v_img @ torch.cat(vt).T).double().cpu().numpy()


def run_r2m(ctx: StageContext) -> None:
    """DAG stage ``retrieval_r2m``: R²M (final checkpoint) through its joint space."""
    import pyarrow as pa
    import torch

    from r2m.captioning.captioner import load_checkpoint_model
    from r2m.supervised.data import Features, teacher_forcing
    from r2m.text.dictionary import load_dictionary
    from r2m.text.tokenize import tokenize
    from r2m.text.vocab import Vocab, pad_lists
    from r2m.utils.coco import read_coco_captions

    rp = ctx.params.retrieval
    out = Path(ctx.outs["retrieval"])
    device = ctx.runtime.torch_device()
    model, _, _ = load_checkpoint_model(ctx.deps["model"], device)
    if not model.cfg.image_dim:
        raise ValueError(f"{ctx.deps['model']}: this R2M checkpoint has no image projection (image_dim 0)")
    vocab = Vocab.load(Path(ctx.deps["vocab"]) / "vocab.json")
    refs_path = Path(ctx.deps["references"]) / "references.json"
    refs = read_coco_captions(refs_path)
    split_of = refs.split_of("test")
    feats = Features(ctx.deps["features"], ("pooled",))
    pairs = [(i, c) for i, c in refs.annotations if split_of.get(i) == rp.split and i in feats.row_of]
    if not pairs:
        raise ValueError(f"{refs_path}: no {rp.split} references with features")
    images = list(dict.fromkeys(i for i, _ in pairs))
    index = {i: k for k, i in enumerate(images)}
    dictionary = load_dictionary(ctx.params.concepts.dictionary)
    tokens = [tokenize(c) for _, c in pairs]
    stoi = vocab.stoi
    ids = [vocab.encode(tok) for tok in tokens]
    cids = [[stoi[w] for w in dictionary.sentence_concepts(tok) if w in stoi] for tok in tokens]
    inputs, _, lengths = teacher_forcing(ids, ctx.params.train_s.max_len)
    concepts, clens = pad_lists(pa.array(cids, pa.list_(pa.int64())))
    rows = np.array([feats.row_of[i] for i in images], dtype=np.int64)
    img = feats.get(rows)["pooled"].to(device)
    feats.close()
    sim = r2m_similarity(model, img, torch.from_numpy(concepts).to(device), torch.from_numpy(clens).to(device),
                         inputs.to(device), lengths.to(device))
    res = retrieval_scores(sim, np.array([index[i] for i, _ in pairs], dtype=np.int64), normalise=False)
    res.update(model="r2m", dataset=ctx.dataset, split=rp.split,
               scoring="joint space: projected image feature . reconstructed sentence vector (teacher-forced)")
    write_json(out, res)
    ctx.save_params(out.parent, "retrieval.params.yaml")
    ctx.log.info("retrieval_r2m: %s", summary(res))

"""Stage ``retrieval_r2m``: image↔sentence retrieval of R²M (final checkpoint) in its joint space,
``v̂^I · ṽ`` (:func:`r2m_similarity`; the metrics: :mod:`r2m.supervised.retrieval`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from r2m.stage.context import StageContext
from r2m.supervised.retrieval import retrieval_scores, summary
from r2m.utils.io import write_json
from r2m.utils.lazy import no_grad

if TYPE_CHECKING:
    import torch


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


def run(ctx: StageContext) -> None:
    """DAG stage ``retrieval_r2m``: R²M (final checkpoint) through its joint space."""
    import pyarrow as pa
    import torch

    from r2m.decoding.captioner import load_checkpoint_model
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

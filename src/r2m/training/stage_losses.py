"""The loss each R²M training stage computes on a batch, one objective per stage (:data:`OBJECTIVES`: stage
name → :class:`Objective`).

``train_xe``: L_XE on the text corpus; ``train_s``: L_S = L_XE + β·L_rec; ``train_m``: L_M^I (the
ranking loss, γ = 0); ``train_i``: L_I = L_M^I + γ·L_rec on greedy free-running captions of the
images' concepts; ``train_e2e`` (the released end2end.py, one stage): L_S on a batch of sentences plus
L_I on a batch of images at every step. β/γ come from the dataset's catalog entry, the L_rec / ranking forms from
``fidelity.rec_loss`` / ``fidelity.rank_loss`` (what they see of ṽ: ``fidelity.similarity``), the
L_XE reduction from ``fidelity.xe_reduction``. Each ``compute(ctx, model, batch, tp)`` returns
``(loss, components)``; under DDP the text loss is rescaled to the global token mean and the image
loss sees the whole global batch (:mod:`r2m.training.distributed`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from r2m.losses.objectives import loss_i, loss_s
from r2m.losses.xe import linear_xe_loss, reduce_xe, xe_loss
from r2m.models.r2m import R2M
from r2m.stage.context import StageContext
from r2m.training import distributed
from r2m.training.data import TextBatch
from r2m.training.loop import Ratio


@dataclass(frozen=True)
class Objective:
    data: str  # "text" | "image"
    columns: tuple[str, ...]
    compute: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


def token_xe(model: R2M, hidden: Tensor, targets: Tensor) -> Tensor:
    """L_XE over valid positions ([n, N·d], [n]); on CPU without materialising the logits."""
    if hidden.device.type == "cpu" and not torch.is_autocast_enabled():
        return linear_xe_loss(model.out_drop(hidden), model.out.weight, model.out.bias, targets)
    return xe_loss(model.logits(hidden), targets)


CROPPED_V_TILDE = ("last", "zero")


def cropped_v_tilde(v_tilde: Tensor, batch: TextBatch, rule: str = "last") -> Tensor:
    """ṽ [B, d] of a text batch with its cropped sentences' rows as ``fidelity.cropped_v_tilde`` says:
    ``last`` keeps the reconstructor's output at the last (cropped) step; ``zero`` sets them to 0, what
    the released code computed on a GPU (``obj2sen_xe+rec.py:155-156`` gathers at the sentence's full
    length - 1, past its ``pad_length`` steps, and TF's GPU ``gather_nd`` returns 0 for an index out of
    range: no gradient reaches the reconstructor from such a row)."""
    if rule == "last":
        return v_tilde
    if rule != "zero":
        raise ValueError(f"fidelity.cropped_v_tilde {rule!r}: choose from {CROPPED_V_TILDE}")
    return v_tilde * (~batch.cropped).unsqueeze(1).to(v_tilde.dtype)


def text_objective(model: R2M, batch: TextBatch, beta: float | None, rec: str = "sum_normalized",
                   xe_reduction: str = "token_mean", similarity: str = "cosine",
                   cropped: str = "last", accuracy: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
    """L_XE (``beta is None``) or L_S (``rec``: the L_rec form; ``cropped``: the ṽ of a cropped
    sentence, :func:`cropped_v_tilde`). Logits only at valid positions, or, for a static batch
    (:func:`r2m.training.data.pad_text`), at every position with L_XE their masked mean (no boolean
    indexing, no host read: the same value and gradients). ``accuracy`` (validation) adds the token
    accuracy of the arg-max predictions (:func:`token_accuracy`) as ``acc``."""
    out = model(batch.concepts, batch.concept_lens, batch.inputs, batch.lengths, reconstruct=beta is not None)
    mask = batch.mask
    if getattr(batch, "static", False):
        xe = xe_loss(model.logits(out["hidden"]), batch.targets, mask)
    else:
        xe = token_xe(model, out["hidden"][mask], batch.targets[mask])
    if xe_reduction != "token_mean":  # Eq. 10's per-sentence sum (DDP: each rank's sentence mean is averaged)
        xe = reduce_xe(xe_reduction, xe, mask.sum(), mask.shape[0])
    elif distributed.current().enabled:  # DDP: this rank's share of the global token mean
        xe = xe * distributed.current().token_mean_scale(mask.sum())
    if beta is None:
        if accuracy:
            return xe, {"xe": xe, "acc": token_accuracy(model, out["hidden"][mask], batch.targets[mask])}
        return xe, {"xe": xe}
    return loss_s(xe, out["v"], cropped_v_tilde(out["v_tilde_raw"], batch, cropped), beta, rec, similarity)


def token_accuracy(model: R2M, hidden: Tensor, targets: Tensor, chunk: int = 4096) -> Ratio:
    """The valid tokens ([n, N·d], [n]) whose arg-max logit is the target, over their number: the
    released code's held-out ``tf.metrics.accuracy(targets, argmax(logits))`` on the masked tokens
    (``obj2sen_xe+rec.py:191-194``; the loop sums both parts over the held-out batches, so the logged
    value is correct tokens / tokens, as TF's streaming metric). Logits ``chunk`` tokens at a time."""
    correct = torch.zeros((), dtype=torch.long, device=hidden.device)
    for s in range(0, hidden.shape[0], chunk):
        correct = correct + (model.logits(hidden[s: s + chunk]).argmax(-1) == targets[s: s + chunk]).sum()
    return Ratio(correct, torch.tensor(targets.shape[0], device=hidden.device))


def image_objective(model: R2M, batch, gamma: float, margin: float, max_len: int,
                    rec: str = "sum_normalized", rank: str = "vsepp", similarity: str = "cosine"):
    """L_M^I (γ = 0) or L_I on greedy free-running captions (gradients through hidden states); a
    static batch decodes for all ``max_len`` steps without the early-stop test (no host read)."""
    v = model.encode(batch.concepts, batch.concept_lens)
    g = model.greedy(v, max_len, stop_early=not getattr(batch, "static", False))
    img, v_tilde = model.project_image(batch.feats), g["v_tilde_raw"]
    if model.training:  # DDP: in-batch negatives over the whole global batch
        img, v, v_tilde = (distributed.gather_rows(x) for x in (img, v, v_tilde))
    return loss_i(img, v, v_tilde, gamma, margin, rec, rank, similarity)


def _xe(ctx: StageContext, model, batch, tp):
    return text_objective(model, batch, None, xe_reduction=ctx.params.fidelity.xe_reduction)


def _s(ctx: StageContext, model, batch, tp):
    f = ctx.params.fidelity
    return text_objective(model, batch, ctx.entry.beta, f.rec_loss, f.xe_reduction, f.similarity, f.cropped_v_tilde)


def _m(ctx: StageContext, model, batch, tp):
    f = ctx.params.fidelity
    return image_objective(model, batch, 0.0, tp.margin, tp.max_len, f.rec_loss, f.rank_loss, f.similarity)


def _i(ctx: StageContext, model, batch, tp):
    f = ctx.params.fidelity
    return image_objective(model, batch, ctx.entry.gamma, tp.margin, tp.max_len, f.rec_loss, f.rank_loss,
                           f.similarity)


def _e2e(ctx: StageContext, model, batch, tp):
    """The released end2end.py's one-stage loss: L_S on the sentences plus L_I on the images, each step."""
    f = ctx.params.fidelity
    ls, text = text_objective(model, batch.text, ctx.entry.beta, f.rec_loss, f.xe_reduction, f.similarity,
                              f.cropped_v_tilde)
    li, image = image_objective(model, batch.image, ctx.entry.gamma, tp.margin, tp.max_len, f.rec_loss, f.rank_loss,
                                f.similarity)
    return ls + li, {"xe": text["xe"], "rec": text["rec"], "rank": image["rank"], "rec_i": image["rec"]}


OBJECTIVES: dict[str, Objective] = {
    "train_xe": Objective("text", ("xe",), _xe),
    "train_s": Objective("text", ("xe", "rec"), _s),
    "train_m": Objective("image", ("rank", "rec"), _m),
    "train_i": Objective("image", ("rank", "rec"), _i),
    # not one of the paper's four stages: the released end2end.py (a stage outside the tables' DAG)
    "train_e2e": Objective("joint", ("xe", "rec", "rank", "rec_i"), _e2e),
}


def val_gamma(ctx: StageContext, stage: str) -> float:
    """γ in a validation row's ``loss = rank + γ·rec`` of an image stage (0 but for ``train_i``)."""
    return ctx.entry.gamma if stage == "train_i" else 0

"""Safety net: each training stage's objective on one fixed batch, against the paper's formulas written
out here (independently of :mod:`r2m.losses`), under both fidelity profiles.

``train_xe`` L_XE; ``train_s`` L_S = L_XE + β·L_rec; ``train_m`` L_M (γ = 0); ``train_i`` L_I = L_M + γ·L_rec.
β ≠ γ ≠ 1, so a stage that takes the other stage's weight (or none) fails.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from r2m import params as P
from r2m.models.r2m import R2M
from r2m.stage import registry as S
from r2m.stage.context import StageContext
from r2m.text.vocab import END
from r2m.training.data import TextBatch
from r2m.training.stages import OBJECTIVES, model_config

BETA, GAMMA, MARGIN = 0.3, 0.7, 0.25
V, IMAGE_DIM, D = 20, 10, 16


def _params(profile: str) -> P.Params:
    sched = {"steps": 1, "batch_size": 4, "lr": 1e-3, "max_len": 7, "margin": MARGIN}
    raw = {
        "datasets": ["syn"],
        "catalog": {"syn": {"kind": "tiny", "beta": BETA, "gamma": GAMMA, "fidelity": profile}},
        "model": {"d": D, "heads": 2, "d_k": 8, "dropout": 0.0},
        **{st: dict(sched) for st in ("train_xe", "train_s", "train_m", "train_i")},
    }
    return P.for_dataset(P.validate(raw), "syn")


def _ctx(stage: str, params: P.Params, root) -> StageContext:
    return StageContext(stage=S.get(stage), params=params, dataset="syn", variant="r2m", root=root)


def _model(ctx: StageContext, seed: int = 0) -> R2M:
    torch.manual_seed(seed)
    m = R2M(model_config(ctx, V, IMAGE_DIM))
    m.eval()  # dropout 0 anyway: the same outputs for the objective and for the formulas
    return m


def _text_batch() -> TextBatch:
    g = torch.Generator().manual_seed(1)
    B, T, K = 4, 6, 3
    lengths = torch.tensor([6, 4, 5, 2])
    concepts = torch.randint(4, V, (B, K), generator=g)
    concept_lens = torch.tensor([3, 2, 3, 1])
    targets = torch.randint(4, V, (B, T), generator=g)
    targets[torch.arange(B), lengths - 1] = END  # whole sentences: none cut at max_len (item 4 has its own test)
    targets[torch.arange(T)[None, :] >= lengths[:, None]] = 0
    inputs = torch.cat([torch.full((B, 1), 1), targets[:, :-1]], 1)
    return TextBatch(concepts, concept_lens, inputs, targets, lengths)


def _image_batch() -> SimpleNamespace:
    g = torch.Generator().manual_seed(2)
    B, K = 5, 3
    return SimpleNamespace(concepts=torch.randint(4, V, (B, K), generator=g),
                           concept_lens=torch.tensor([3, 3, 2, 1, 3]),
                           feats=torch.randn(B, IMAGE_DIM, generator=g))


# ---------------------------------------------------------------- formulas, written out
def xe_formula(logits: torch.Tensor, targets: torch.Tensor, lengths: torch.Tensor) -> float:
    total, n = 0.0, 0
    for b in range(targets.shape[0]):
        for t in range(int(lengths[b])):
            row = logits[b, t].double()
            total += float(torch.logsumexp(row, 0) - row[targets[b, t]])
            n += 1
    return total / n


def rec_formula(v: torch.Tensor, vt_raw: torch.Tensor, form: str) -> float:
    v, vt = v.double(), vt_raw.double()
    if form == "sum_normalized":  # ‖v − ṽ/‖ṽ‖‖² summed over d, mean over the batch
        vt = vt / vt.norm(dim=1, keepdim=True)
        return float(((v - vt) ** 2).sum(1).mean())
    return float(((v - vt) ** 2).mean())  # mse_raw: mean over B·d, ṽ raw


def rank_formula(img: torch.Tensor, vt_raw: torch.Tensor, form: str, margin: float) -> float:
    img = img.double()
    B = img.shape[0]
    if form == "vsepp":  # hardest negatives, positive pair excluded, ṽ normalised
        cap = vt_raw.double() / vt_raw.double().norm(dim=1, keepdim=True)
        s = lambda i, j: float(img[i] @ cap[j])  # noqa: E731
        tot = 0.0
        for i in range(B):
            worst_img = max(s(j, i) for j in range(B) if j != i)
            worst_cap = max(s(i, j) for j in range(B) if j != i)
            tot += max(0.0, margin - s(i, i) + worst_img) + max(0.0, margin - s(i, i) + worst_cap)
        return tot / B
    # official crit: raw ṽ, no mask, a reduced over rows i, b over columns j
    cap = vt_raw.double()
    s = lambda i, j: float(img[i] @ cap[j])  # noqa: E731
    tot = 0.0
    for k in range(B):
        a = max(max(0.0, margin + s(i, k) - s(i, i)) for i in range(B))
        b = max(max(0.0, margin + s(k, j) - s(j, j)) for j in range(B))
        tot += a + b
    return tot / B


PROFILE_FORMS = {"paper": ("sum_normalized", "vsepp"), "official": ("mse_raw", "official")}


@pytest.mark.parametrize("profile", ["paper", "official"])
def test_profiles_resolve_the_loss_forms(profile: str) -> None:
    f = _params(profile).fidelity
    assert (f.rec_loss, f.rank_loss) == PROFILE_FORMS[profile]


@pytest.mark.parametrize("profile", ["paper", "official"])
@pytest.mark.parametrize("stage", ["train_xe", "train_s"])
def test_text_stage_objective_matches_the_formula(stage: str, profile: str, tmp_path) -> None:
    ctx = _ctx(stage, _params(profile), tmp_path)
    model, batch = _model(ctx), _text_batch()
    tp = getattr(ctx.params, stage)
    with torch.no_grad():
        loss, comp = OBJECTIVES[stage].compute(ctx, model, batch, tp)
        out = model(batch.concepts, batch.concept_lens, batch.inputs, batch.lengths, reconstruct=True)
        xe = xe_formula(model.logits(out["hidden"]), batch.targets, batch.lengths)
        rec = rec_formula(out["v"], out["v_tilde_raw"], PROFILE_FORMS[profile][0])
    assert float(comp["xe"]) == pytest.approx(xe, rel=1e-5, abs=1e-6)
    if stage == "train_xe":
        assert set(comp) == {"xe"}
        assert float(loss) == pytest.approx(xe, rel=1e-5, abs=1e-6)
    else:
        assert rec > 1e-3  # the reconstruction term is not vanishing: β matters
        assert float(comp["rec"]) == pytest.approx(rec, rel=1e-5, abs=1e-6)
        assert float(loss) == pytest.approx(xe + BETA * rec, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("profile", ["paper", "official"])
@pytest.mark.parametrize("stage", ["train_m", "train_i"])
def test_image_stage_objective_matches_the_formula(stage: str, profile: str, tmp_path) -> None:
    ctx = _ctx(stage, _params(profile), tmp_path)
    model, batch = _model(ctx), _image_batch()
    tp = getattr(ctx.params, stage)
    assert tp.margin == MARGIN
    rec_form, rank_form = PROFILE_FORMS[profile]
    with torch.no_grad():
        loss, comp = OBJECTIVES[stage].compute(ctx, model, batch, tp)
        v = model.encode(batch.concepts, batch.concept_lens)
        vt = model.greedy(v, tp.max_len)["v_tilde_raw"]
        img = model.project_image(batch.feats)
        rank = rank_formula(img, vt, rank_form, MARGIN)
        rec = rec_formula(v, vt, rec_form)
    assert rec > 1e-3 and rank > 1e-3
    assert float(comp["rank"]) == pytest.approx(rank, rel=1e-5, abs=1e-6)
    assert float(comp["rec"]) == pytest.approx(rec, rel=1e-5, abs=1e-6)
    weight = 0.0 if stage == "train_m" else GAMMA
    assert float(loss) == pytest.approx(rank + weight * rec, rel=1e-5, abs=1e-6)

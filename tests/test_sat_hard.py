"""Show, Attend and Tell with hard attention (models/sat_hard.py, seed 004 Sec. 4.1): the REINFORCE
estimator against the exact gradient of the lower bound on cases small enough to enumerate, the
moving-average baseline as model state, the test-time attention, the registration."""

from __future__ import annotations

import pytest
import torch

from r2m.baselines import BASELINES
from r2m.models.catalog import MODELS, load_model, sup_model
from r2m.models.sat import SAT, SATConfig
from r2m.models.sat_hard import SATHard, SATHardConfig, hard_attention_terms
from r2m.text.vocab import END, START

torch.set_num_threads(1)


def hard(seed: int = 0, V: int = 7, D: int = 4, **kw) -> SATHard:
    torch.manual_seed(seed)
    kw.setdefault("dropout", 0.0)
    return SATHard(SATHardConfig(vocab_size=V, feat_dim=D, embed=5, hidden=6, att_dim=5, **kw))


def _batch_means(estimate, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard error over ``k`` independent batch estimates (each a flat tensor)."""
    g = torch.stack([estimate(i) for i in range(k)])
    return g.mean(0), g.std(0) / k ** 0.5


# --------------------------------------------------------------------------- the estimator alone
@pytest.mark.parametrize("baseline", [0.0, 3.0])
def test_reinforce_terms_average_to_the_exact_gradient_of_the_bound(baseline: float) -> None:
    """L locations, one step, a fixed log-likelihood f_i per location: the average of the sampled
    gradients of the surrogate is minus ∇θ (E_α[f] + λ_e H(α)), α = softmax(θ) (any baseline)."""
    L, lam_e, n, k = 5, 0.3, 20000, 20
    theta0 = torch.tensor([0.3, -1.0, 0.8, 0.0, -0.4])
    f = torch.tensor([-2.0, -5.0, -1.0, -3.5, -4.0])
    theta = theta0.clone().requires_grad_(True)
    alpha = torch.softmax(theta, 0)
    exact_obj = (alpha * f).sum() - lam_e * (alpha * alpha.log()).sum()
    exact = torch.autograd.grad(exact_obj, theta)[0]
    gen = torch.Generator().manual_seed(0)

    def estimate(_: int) -> torch.Tensor:
        th = theta0.clone().requires_grad_(True)
        al = torch.softmax(th, 0).expand(n, L)
        s = torch.multinomial(al.detach(), 1, generator=gen)  # [n, 1]
        loglik = f[s[:, 0]]
        logp_s = al.log().gather(1, s)[:, 0]
        entropy = -(al * al.log()).sum(-1)
        r, e = hard_attention_terms(loglik, logp_s, entropy, baseline, torch.ones(n, dtype=torch.bool), 1.0, lam_e)
        return -torch.autograd.grad((r + e) / n, th)[0]  # the learning rule's direction

    mean, se = _batch_means(estimate, k)
    assert (mean - exact).abs().max() <= (5 * se + 1e-6).max(), (mean, exact, se)
    assert exact.abs().max() > 10 * se.max()  # the test can tell a wrong gradient


def test_the_baseline_reduces_the_variance_not_the_mean() -> None:
    L, n = 4, 4000
    theta = torch.tensor([0.5, -0.5, 0.2, 0.0])
    f = torch.tensor([-30.0, -32.0, -29.0, -31.0])  # caption log-likelihoods: far from 0
    gen = torch.Generator().manual_seed(1)

    def grads(b: float) -> torch.Tensor:
        th = theta.clone().requires_grad_(True)
        al = torch.softmax(th, 0).expand(n, L)
        s = torch.multinomial(al.detach(), 1, generator=gen)
        r, _ = hard_attention_terms(f[s[:, 0]], al.log().gather(1, s)[:, 0], torch.zeros(n), b,
                                    torch.ones(n, dtype=torch.bool), 1.0, 0.0)
        return torch.stack([torch.autograd.grad(r, th, retain_graph=True)[0]])  # sum over n

    no_b = torch.cat([grads(0.0) for _ in range(20)])
    with_b = torch.cat([grads(float((torch.softmax(theta, 0) * f).sum())) for _ in range(20)])
    assert with_b.var(0).sum() < 0.05 * no_b.var(0).sum()
    # the expectation-set captions (not sampled) get no REINFORCE term
    r, _ = hard_attention_terms(torch.tensor([-3.0]), torch.tensor([-1.0]), torch.zeros(1), 0.0,
                                torch.zeros(1, dtype=torch.bool), 1.0, 0.0)
    assert float(r) == 0.0


# --------------------------------------------------------------------------- through the model
def test_model_gradient_equals_the_enumerated_lower_bound_gradient() -> None:
    """One step, L = 3 locations: log p(y|s=i, a) for every i by forcing the location, the exact
    ∂L_s/∂W = ∂(Σ_i α_i log p(y|s=i, a))/∂W by autograd; the model's training loss (every caption
    sampled, λ_e = 0) averaged over many samples has minus that gradient, for every parameter."""
    m = hard(V=7, D=4, expectation_prob=0.0, entropy_lambda=0.0)
    a = torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(2))
    prev, y = torch.tensor([START]), 5
    params = [p for p in m.parameters()]
    m.train()
    # exact, by enumeration
    state = m.decode_init(a)
    a_, pa, mask, h, c = state
    alpha = m.attention(pa, mask, h)[0]
    logp = []
    for i in range(3):
        z, _ = m.context(a_, torch.nn.functional.one_hot(torch.tensor([i]), 3).float(), h)
        o, _, _ = m.advance(prev, z, h, c)
        logp.append(torch.log_softmax(m.logits(o), -1)[0, y])
    bound = (alpha * torch.stack(logp)).sum()
    exact = torch.cat([g.flatten() for g in torch.autograd.grad(bound, params)])
    n = 4000
    inputs, targets, lengths = prev.repeat(n, 1), torch.full((n, 1), y), torch.ones(n, dtype=torch.long)
    torch.manual_seed(3)

    def estimate(_: int) -> torch.Tensor:
        m.reward_baseline.fill_(-1.5)  # any fixed baseline (the update inside loss is for the next batch)
        loss, parts = m.loss(a.expand(n, 3, 4), inputs, targets, lengths)
        assert set(parts) == {"xe", "dsr", "reinforce", "entropy"}
        return -torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)])

    mean, se = _batch_means(estimate, 12)
    assert (mean - exact).abs().max() <= (5 * se + 1e-5).max(), ((mean - exact).abs().max(), se.max())
    # without the REINFORCE term the average is biased: the score-function part is needed
    m2 = hard(V=7, D=4, expectation_prob=0.0, entropy_lambda=0.0, reinforce_lambda=0.0)
    m2.load_state_dict(m.state_dict())
    m2.train()
    torch.manual_seed(3)
    g2 = -torch.cat([g.flatten() for g in torch.autograd.grad(m2.loss(a.expand(n, 3, 4), inputs, targets,
                                                                       lengths)[0], list(m2.parameters()))])
    assert (g2 - exact).abs().max() > 10 * se.max()


def test_moving_average_baseline_is_model_state() -> None:
    m = hard(expectation_prob=0.0).train()
    a = torch.randn(4, 3, 4)
    inputs = torch.tensor([[START, 4, 5]] * 4)
    targets = torch.tensor([[4, 5, END]] * 4)
    lengths = torch.tensor([3, 3, 2, 1])
    assert float(m.reward_baseline) == 0.0
    with torch.no_grad():
        m.reward_baseline.fill_(-2.0)
    torch.manual_seed(0)
    _, parts = m.loss(a, inputs, targets, lengths)
    # b_1 = 0.9 b_0 + 0.1 mean log p(y|s̃): recompute log p(y|s̃) with the same draws
    torch.manual_seed(0)
    out = m.sample_forward(m.encode({"grid": a}), inputs, lengths)
    lp = torch.log_softmax(out["logits"], -1).gather(-1, targets[..., None])[..., 0]
    loglik = (lp * out["steps"]).sum(-1).detach()
    assert float(m.reward_baseline) == pytest.approx(0.9 * -2.0 + 0.1 * float(loglik.mean()), abs=1e-5)
    assert "reward_baseline" in m.state_dict()
    # eval mode (validation) leaves it alone
    b = float(m.reward_baseline)
    m.eval()
    _, parts = m.loss(a, inputs, targets, lengths)
    assert float(m.reward_baseline) == b and set(parts) == {"xe", "dsr"}


def test_half_the_captions_use_the_expected_context() -> None:
    m = hard(expectation_prob=0.5).train()
    torch.manual_seed(0)
    n = 2000
    out = m.sample_forward(torch.randn(n, 3, 4), torch.full((n, 2), START), torch.full((n,), 2))
    assert abs(float(out["sampled"].float().mean()) - 0.5) < 0.05
    assert out["logp_s"].shape == (n, 2) and out["entropy"].shape == (n, 2)
    assert (out["entropy"] <= torch.log(torch.tensor(3.0)) + 1e-5).all()


@torch.no_grad()
def test_test_time_attention_expected_is_the_soft_model_and_argmax_one_location(tmp_path) -> None:
    h = hard(seed=4, selector=True, dsr_lambda=1.0).eval()
    s = SAT(SATConfig(vocab_size=7, feat_dim=4, embed=5, hidden=6, att_dim=5, dropout=0.0, feature_norm=False)).eval()
    s.load_state_dict({k: v for k, v in h.state_dict().items() if k != "reward_baseline"})
    a = torch.randn(2, 3, 4)
    inputs = torch.tensor([[START, 4, 5], [START, 6, 0]])
    torch.testing.assert_close(h(a, inputs)["logits"], s(a, inputs)["logits"])
    h.cfg.test_attention = "argmax"
    st = h.decode_init(a)
    z, alpha, _ = h.attend(*st[:4])
    beta = torch.sigmoid(h.beta(st[3]))
    torch.testing.assert_close(z, beta * st[0][torch.arange(2), alpha.argmax(-1)])
    # a checkpoint round trip keeps the model, its options and the baseline
    h.reward_baseline.fill_(-7.0)
    torch.save(h.checkpoint(), tmp_path / "model.pt")
    h2, ckpt = load_model(tmp_path)
    assert ckpt["model"] == "sat_hard" and isinstance(h2, SATHard) and h2.cfg.test_attention == "argmax"
    assert float(h2.reward_baseline) == -7.0


def test_registered_with_its_own_name_label_and_params() -> None:
    cls = sup_model("sat_hard")
    assert cls is SATHard and MODELS.load("sat_hard") is SATHard and cls.feature_kinds == ("grid",)
    assert cls.name == "sat_hard" and cls.aux_losses == ("dsr", "reinforce", "entropy")
    assert "hard" in BASELINES["sat_hard"].label.lower()
    from r2m import params as P

    p = P.load("params.yaml")
    assert "sat_hard" in p.baselines.models
    assert (p.sat_hard.reinforce_lambda, p.sat_hard.entropy_lambda, p.sat_hard.baseline_decay,
            p.sat_hard.expectation_prob) == (1.0, 0.002, 0.9, 0.5)
    assert p.sat.feature_norm is False and p.sat_hard.feature_norm is False  # the seed has no LayerNorm
    with pytest.raises(ValueError, match="test_attention"):
        SATHardConfig(vocab_size=5, test_attention="sample")
    assert BASELINES["sat_hard"].inspector == BASELINES["sat"].inspector  # α_t maps, as the soft model's


# --------------------------------------------------------------------------- the stages
def test_stages_train_resume_and_inspect_sat_hard(tmp_path, monkeypatch) -> None:
    """prepare → extract_features_sup → sup_vocab → train_sup → inspect_sup for ``sat_hard`` on a few
    synthetic images: the loop logs its surrogate terms, the checkpoint carries the moving-average
    baseline, a run stopped half-way resumes to the same weights and baseline, the maps are written."""
    import importlib
    import json

    from r2m import params as P
    from r2m.stage import registry as S
    from r2m.stage.context import StageContext

    sched = {"steps": 6, "batch_size": 8, "lr": 3e-3, "max_len": 12, "eval_every": 3, "checkpoint_every": 3}
    raw = {"datasets": ["syn"], "baselines": {"datasets": ["syn"], "models": ["sat_hard"]},
           "catalog": {"syn": {"kind": "tiny", "seed": 3, "n_train_images": 10, "n_val_images": 3,
                               "n_test_images": 3, "n_sentences": 20, "image_size": 64}},
           "detect_concepts": {"backend": "precomputed"},
           "sup_features": {"backend": "random_cnn", "options": {"kinds": ["pooled", "grid"]}},
           "sup_vocab": {"min_count": 1}, "train_sup": sched,
           "sat_hard": {"embed": 8, "hidden": 12, "att_dim": 8, "dropout": 0.0},
           "caption": {"beam": 2, "max_len": 8, "batch_size": 4, "split": "test"}, "report": {"figure_images": 2}}

    def run(root, stage: str, params, model: str | None = None) -> None:
        ctx = StageContext(stage=S.get(stage), params=params, dataset="syn", model=model, root=root)
        mod, fn = S.get(stage).impl.split(":")
        importlib.import_module(mod).__dict__[fn](ctx)

    full = P.for_dataset(P.validate(raw), "syn")
    for stage in ("prepare", "references", "extract_features_sup", "sup_vocab"):
        run(tmp_path, stage, full)
    run(tmp_path, "train_sup", full, "sat_hard")
    head = (tmp_path / "results/syn/sat_hard/s0/train_sup/loss.tsv").read_text().splitlines()[0]
    assert head.split("\t") == ["step", "split", "loss", "xe", "dsr", "reinforce", "entropy"]
    ck = torch.load(tmp_path / "models/syn/sat_hard/s0/train_sup/model.pt", weights_only=True)
    assert ck["model"] == "sat_hard" and float(ck["state_dict"]["reward_baseline"]) < 0  # log-likelihoods
    run(tmp_path, "inspect_sup", full, "sat_hard")
    ins = json.loads((tmp_path / "results/syn/sat_hard/s0/train_sup/inspect/inspect.json").read_text())
    assert ins["model"] == "sat_hard" and len(ins["figures"]) == 2

    # stopped by SIGTERM at step 4 (last.pt written), then rerun: it resumes to the same weights and
    # the same moving-average baseline as the straight run
    other = tmp_path / "resumed"
    other.mkdir()
    (other / "data").symlink_to(tmp_path / "data")
    monkeypatch.setenv("R2M_FAULT", "train_sup@4:TERM")
    with pytest.raises(BaseException):  # noqa: B017  (the loop's preemption exit)
        run(other, "train_sup", full, "sat_hard")
    monkeypatch.delenv("R2M_FAULT")
    assert not (other / "models/syn/sat_hard/s0/train_sup/model.pt").exists()
    last = torch.load(next((other / ".r2m/resume/train_sup").rglob("last.pt")), weights_only=True)
    assert last["step"] == 4 and float(last["model"]["state_dict"]["reward_baseline"]) < 0  # b is resume state
    run(other, "train_sup", full, "sat_hard")
    resumed = torch.load(other / "models/syn/sat_hard/s0/train_sup/model.pt", weights_only=True)["state_dict"]
    assert resumed.keys() == ck["state_dict"].keys()
    for k, v in ck["state_dict"].items():
        assert torch.equal(v, resumed[k]), k

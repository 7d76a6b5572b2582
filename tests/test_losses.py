from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from r2m.losses.objectives import loss_i, loss_s
from r2m.losses.ranking import triplet_hardest
from r2m.losses.reconstruction import rec_loss
from r2m.losses.xe import xe_loss


def brute_force_triplet(img, cap, margin):
    B = img.shape[0]
    total = 0.0
    for i in range(B):
        s_ii = float(img[i] @ cap[i])
        worst_img = max(float(img[j] @ cap[i]) for j in range(B) if j != i)
        worst_cap = max(float(img[i] @ cap[j]) for j in range(B) if j != i)
        total += max(0.0, margin - s_ii + worst_img) + max(0.0, margin - s_ii + worst_cap)
    return total / B


@pytest.mark.parametrize("seed", range(5))
def test_triplet_hardest_vs_brute_force(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    img = F.normalize(torch.randn(7, 5, generator=g), dim=-1)
    cap = F.normalize(torch.randn(7, 5, generator=g), dim=-1)
    assert triplet_hardest(img, cap, 0.2).item() == pytest.approx(brute_force_triplet(img, cap, 0.2), abs=1e-5)


def test_triplet_zero_when_well_separated_and_batch_of_one() -> None:
    e = torch.eye(4)
    assert triplet_hardest(e, e, 0.2).item() == 0.0
    assert triplet_hardest(e, e, 1.5).item() == pytest.approx(2 * 0.5)
    assert triplet_hardest(e[:1], e[:1]).item() == 0.0


def test_xe_masked_mean_over_valid_tokens() -> None:
    logits = torch.randn(2, 4, 6)
    targets = torch.randint(0, 6, (2, 4))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    nll = -torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert xe_loss(logits, targets, mask).item() == pytest.approx(nll[mask].mean().item(), rel=1e-6)
    logits2 = logits.clone()
    logits2[~mask] = 100.0
    assert xe_loss(logits2, targets, mask).item() == pytest.approx(xe_loss(logits, targets, mask).item(), rel=1e-6)
    assert xe_loss(logits[mask], targets[mask]).item() == pytest.approx(nll[mask].mean().item(), rel=1e-6)


def test_rec_loss_and_objectives() -> None:
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    vt = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    assert rec_loss(v, vt).item() == pytest.approx(1.0)  # (2 + 0) / 2
    logits, targets = torch.randn(5, 3), torch.randint(0, 3, (5,))
    total, comp = loss_s(xe_loss(logits, targets), v, vt, beta=0.5)
    assert total.item() == pytest.approx(comp["xe"].item() + 0.5)
    img = F.normalize(torch.randn(2, 2), dim=-1)
    total, comp = loss_i(img, v, vt, gamma=0.2)
    assert total.item() == pytest.approx(triplet_hardest(img, vt).item() + 0.2)
    assert set(comp) == {"rank", "rec"}


@pytest.mark.parametrize("bias", [True, False])
def test_linear_xe_matches_plain_value_and_gradients(bias: bool) -> None:
    from r2m.losses.xe import linear_xe_loss

    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 8, generator=g, requires_grad=True)
    w = torch.randn(50, 8, generator=g, requires_grad=True)
    b = torch.randn(50, generator=g, requires_grad=True) if bias else None
    t = torch.randint(0, 50, (37,), generator=g)
    ref = xe_loss(F.linear(h, w, b), t)
    gr = torch.autograd.grad(ref * 3, [h, w] + ([b] if bias else []))
    got = linear_xe_loss(h, w, b, t, chunk=10)
    gg = torch.autograd.grad(got * 3, [h, w] + ([b] if bias else []))
    torch.testing.assert_close(got, ref)
    for x, y in zip(gg, gr, strict=True):
        torch.testing.assert_close(x, y)

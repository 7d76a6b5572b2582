"""Operators per training step: the counter, and the budget a regression must not break.

A step at paper sizes is launch-bound, so the number of top-level aten ops one step dispatches is
its cost on a GPU. The count depends on T (the recurrence's steps) but not on d or the batch, so it
is checked at small sizes. Before the fused RM recurrence (r2m.models.rm_fused) the same count was
4,461 for L_XE (T = 30) and 11,605 for L_S (T = 40); the budget is a third of that.
"""

from __future__ import annotations

import pytest
import torch

from r2m.bench.schedule import synthetic_text
from r2m.models.r2m import R2M, R2MConfig
from r2m.training.data import TextBatch, pad_text
from r2m.training.opcount import bench_counts, count_ops
from r2m.training.stage_losses import text_objective
from r2m.training.stages import make_adam
from r2m.training.step import clip_grad_norm

BUDGET = {"L_XE": (30, None, 1500), "L_S": (40, 1.0, 4000)}  # name: (T, beta, max ops per step)


def _batch(B: int, T: int, vocab: int, seed: int = 0) -> TextBatch:
    """Ragged sentences, the longest exactly T steps (so the recurrence runs T steps)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    lengths[0] = T
    return synthetic_text(g, lengths, vocab, 3)


def _train_step(model: R2M, opt: torch.optim.Optimizer, batch: TextBatch, beta: float | None):
    """One step as the training loop runs it: objective, backward, clipping, Adam."""
    def step() -> None:
        loss, _ = text_objective(model, batch, beta)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm(list(model.parameters()), 10.0)  # the loop's (r2m.training.step)
        opt.step()
    return step


def test_counter_counts_top_level_aten_ops_only():
    x, w = torch.randn(3, 4), torch.randn(5, 4)
    c = count_ops(lambda: torch.nn.functional.linear(x, w), warmup=0, cuda=False)
    assert c.by_name.get("aten::linear") == 1  # not its t / mm children
    assert "aten::mm" not in c.by_name and "aten::t" not in c.by_name
    assert c.aten_ops == sum(c.by_name.values()) and c.kernels is None
    assert c.per_step(2) == c.aten_ops / 2
    assert c.summary(2).startswith(f"{c.aten_ops:,} aten ops/step (") and "GPU" not in c.summary()
    if not torch.cuda.is_available():
        assert bench_counts(lambda: torch.nn.functional.linear(x, w)) == {"ops_per_step": 1}


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_ops_per_training_step_within_budget(static):
    """Both steps the stages run: the dynamic one (CPU default) and the static-shape one (CUDA)."""
    torch.manual_seed(0)
    model = R2M(R2MConfig.for_variant("r2m", vocab_size=50, d=32, heads=2, d_k=16)).train()
    opt = make_adam(model, 1e-4)
    counts = {}
    for name, (T, beta, budget) in BUDGET.items():
        batch = pad_text(_batch(4, T, 50), T) if static else _batch(4, T, 50)
        c = count_ops(_train_step(model, opt, batch, beta), cuda=False)
        counts[name] = c.aten_ops
        print(f"{'static' if static else 'dynamic'} {name} T={T}: {c.aten_ops} top-level aten ops per step "
              f"({c.per_step(T):.1f} per time step; budget {budget}); most frequent: {c.top(5)}")
    for name, (T, _, budget) in BUDGET.items():
        assert counts[name] <= budget, f"{name} (T={T}): {counts[name]} ops per step > {budget}"

"""The shared training loop (r2m.training.loop) on a toy model: the step, selection keeps the
best-scoring weights, resume after preemption is bit-identical, the batcher, the non-finite check."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from r2m.training import loop as L
from r2m.utils.resume import Preempted


@dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor

    def to(self, device):
        return Batch(self.x.to(device), self.y.to(device))

    def __len__(self) -> int:
        return len(self.x)


class Toy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)
        self.drop = torch.nn.Dropout(0.3)  # draws from the torch RNG: resume must restore it

    def checkpoint(self, **meta):
        return {"state_dict": {k: v.detach().cpu() for k, v in self.state_dict().items()}, **meta}


X = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
Y = X @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.1


def batches(start: int):
    for step in range(start, 10**6):
        idx, _, _ = L.epoch_batch(len(X), 8, 0, step)
        yield Batch(X[idx], Y[idx])


def mse(model, b):
    err = ((model.drop(model.lin(b.x)) - b.y) ** 2).mean()
    return err, {"mse": err}


@dataclass
class Sched:
    steps: int = 12
    eval_every: int = 3
    checkpoint_every: int = 4
    clip: float = 1.0


def spec(work: Path, loss=mse, select=None, steps: int = 12) -> L.Loop:
    torch.manual_seed(0)
    model = Toy()
    return L.Loop(name="toy", model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.05),
                  objective=L.LoopObjective(("mse",), loss, lambda m, b: loss(m, b)[1], lambda ev: ev["mse"]),
                  schedule=Sched(steps=steps), batches=batches, val_batches=lambda: [Batch(X[:16], Y[:16])],
                  device=torch.device("cpu"), work=work, fingerprint="fp", log=logging.getLogger("toy"),
                  lr_param="toy.lr = 0.05", select=select)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_one_step_is_clip_then_adam(tmp_path: Path) -> None:
    s = spec(tmp_path / "a", steps=1)
    before = weights(s.model)
    res = L.fit(s)
    # by hand: the same forward (same dropout draw), the clipped gradient, one Adam step
    torch.manual_seed(0)
    ref = Toy()
    ref.load_state_dict(before)
    opt = torch.optim.Adam(ref.parameters(), lr=0.05)
    ref.train()
    loss, _ = mse(ref, next(batches(0)))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
    opt.step()
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in s.model.state_dict().items())
    assert res.rows[0][:3] == [1, "train", float(loss.detach())] and res.rows[1][1] == "val"


def test_selection_keeps_the_best_scoring_weights_not_the_last(tmp_path: Path) -> None:
    seen: dict[int, dict[str, torch.Tensor]] = {}
    scores = {3: 0.2, 6: 0.9, 9: 0.5, 12: 0.1}

    def select(model, step):
        seen[step] = weights(model)
        return scores[step]

    s = spec(tmp_path / "a", select=select)
    res = L.fit(s)
    assert res.best is not None and res.best.step == 6 and res.best.score == 0.9
    assert res.selections == [(k, v) for k, v in scores.items()]
    assert res.keep_best(s.model) == 6
    kept = s.model.state_dict()
    assert all(torch.equal(kept[k], v) for k, v in seen[6].items())
    assert not all(torch.equal(kept[k], v) for k, v in seen[12].items())  # the last weights differ


def test_resume_after_preemption_is_bit_identical(tmp_path: Path, monkeypatch) -> None:
    def select(model, step):
        return float(-model.lin.weight.detach().abs().sum())

    full_spec = spec(tmp_path / "full", select=select)
    full = L.fit(full_spec)
    monkeypatch.setenv("R2M_FAULT", "toy@7:TERM")  # after the step-4 checkpoint: last.pt saved at 7
    with pytest.raises(Preempted):
        L.fit(spec(tmp_path / "cut", select=select))
    assert torch.load(tmp_path / "cut/last.pt", weights_only=True)["step"] == 7
    monkeypatch.delenv("R2M_FAULT")
    again_spec = spec(tmp_path / "cut", select=select)
    again = L.fit(again_spec)
    assert again.rows == full.rows and again.selections == full.selections and again.step == 12
    assert again.best is not None and full.best is not None and again.best.step == full.best.step
    assert all(torch.equal(v, full.best.state_dict[k]) for k, v in again.best.state_dict.items())
    assert all(torch.equal(v, full_spec.model.state_dict()[k]) for k, v in again_spec.model.state_dict().items())


def test_fresh_ignores_last(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("R2M_FAULT", "toy@5:TERM")
    with pytest.raises(Preempted):
        L.fit(spec(tmp_path / "w"))
    monkeypatch.delenv("R2M_FAULT")
    s = spec(tmp_path / "w")
    s.fresh = True
    res = L.fit(s)
    assert [r[0] for r in res.rows if r[1] == "train"] == list(range(1, 13))
    assert res.rows == L.fit(spec(tmp_path / "other")).rows


def test_timings_count_every_validation_and_selection_across_a_resume(tmp_path: Path, monkeypatch) -> None:
    full = L.fit(spec(tmp_path / "full", select=lambda model, step: float(step))).timings()
    assert set(full) == {"loop_s", "validations", "val_s", "selections", "select_s"}
    # evaluations at 3, 6, 9 and 12, each a validation pass and a selection, within the loop's seconds
    assert (full["validations"], full["selections"]) == (4, 4)
    assert 0 <= full["val_s"] + full["select_s"] <= full["loop_s"]
    monkeypatch.setenv("R2M_FAULT", "toy@7:TERM")  # last.pt at 7: the evaluations at 3 and 6 made before it
    with pytest.raises(Preempted):
        L.fit(spec(tmp_path / "cut", select=lambda model, step: float(step)))
    monkeypatch.delenv("R2M_FAULT")
    again = L.fit(spec(tmp_path / "cut", select=lambda model, step: float(step)))
    assert (again.validations, len(again.selections)) == (4, 4)
    assert 0 <= again.val_s + again.select_s <= again.elapsed


def test_non_finite_loss_is_one_line_naming_step_and_lr(tmp_path: Path) -> None:
    def nan_at_3(model, b, calls=[0]):  # noqa: B006 - a counter
        calls[0] += 1
        loss, comp = mse(model, b)
        return (loss * float("nan"), comp) if calls[0] == 3 else (loss, comp)

    with pytest.raises(L.NonFiniteLoss) as err:
        L.fit(spec(tmp_path / "w", loss=nan_at_3))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("toy: loss is nan at step 3 (mse=") and "toy.lr = 0.05" in msg


def test_epoch_batch_is_a_pure_function_of_n_size_seed_step() -> None:
    n, bs = 23, 5
    per_epoch = n // bs
    for epoch in range(3):
        idx = np.concatenate([L.epoch_batch(n, bs, 7, epoch * per_epoch + b)[0] for b in range(per_epoch)])
        assert len(idx) == per_epoch * bs and len(set(idx.tolist())) == len(idx)  # no repeat inside an epoch
        assert idx.min() >= 0 and idx.max() < n
    a, e, b = L.epoch_batch(n, bs, 7, 6)
    assert (e, b) == (1, 2) and np.array_equal(a, L.epoch_batch(n, bs, 7, 6)[0])
    assert not np.array_equal(L.epoch_batch(n, bs, 7, 0)[0], L.epoch_batch(n, bs, 8, 0)[0])
    assert len(L.epoch_batch(3, 5, 0, 4)[0]) == 3  # a batch larger than the set: the whole set

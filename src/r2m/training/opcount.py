"""Counting the operators one training step launches (the aim: fewer kernels per step).

A training step at paper sizes is launch-bound: its time is the number of operators it dispatches
times a few microseconds each, not their arithmetic. :func:`count_ops` measures that number.

Method (fixed, so figures before and after a change compare):

* ``step`` is a zero-argument callable that runs ONE whole training step (forward, backward,
  gradient clipping, optimiser update), e.g. ``lambda: train_step(batch)``;
* it is run ``warmup`` times unprofiled (lazy state such as Adam's moments, allocator caches),
  then once under :mod:`torch.profiler` (CPU activity; on CUDA also the device activity);
* **top-level aten ops** (``aten_ops``): profiler events named ``aten::…`` that have no ``aten::``
  ancestor — what the dispatcher was asked to run, forward and backward (the autograd engine's
  ``evaluate_function`` wrappers are not ``aten::``, so each backward node's ops count), with the
  ops that other aten ops call internally not counted again. On CPU this is a proxy for the
  launches the same step makes on a GPU (each op is one dispatch; view ops such as ``t`` or
  ``reshape`` count though they launch no kernel, fused ops like ``addmm`` count once);
* **GPU kernels** (``kernels``, CUDA only; ``None`` otherwise): device-side kernel events recorded
  during the step (memcpy / memset included, as the GPU executes them).

``per_step(T)`` in :class:`OpCount` divides by the number of time steps for "ops per time step"
figures, :meth:`OpCount.summary` a one-line description for a benchmark to print.

Usage: ``count_ops(lambda: train_step(batch))`` → :class:`OpCount`. ``tests/test_opcount.py`` holds
the budget (L_XE at T = 30, L_S at T = 40) so a regression fails CI.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.autograd.profiler_util import FunctionEvent


@dataclass(frozen=True)
class OpCount:
    """What one profiled step launched."""

    aten_ops: int  # top-level aten:: operators (forward + backward + clip + optimiser)
    kernels: int | None  # GPU kernels (CUDA devices only)
    by_name: dict[str, int] = field(default_factory=dict)  # top-level aten ops per name

    def per_step(self, time_steps: int) -> float:
        """Top-level aten ops per time step of a recurrence of ``time_steps`` steps."""
        return self.aten_ops / max(time_steps, 1)

    def top(self, k: int = 10) -> list[tuple[str, int]]:
        """The ``k`` most frequent top-level ops."""
        return Counter(self.by_name).most_common(k)

    def summary(self, time_steps: int | None = None) -> str:
        """One line for a benchmark's output, e.g. ``1,455 aten ops/step (48.5 per time step), 2,765 GPU kernels``."""
        line = f"{self.aten_ops:,} aten ops/step"
        if time_steps:
            line += f" ({self.per_step(time_steps):.1f} per time step)"
        return line + (f", {self.kernels:,} GPU kernels" if self.kernels is not None else "")


def _has_aten_ancestor(evt: FunctionEvent) -> bool:
    p = evt.cpu_parent
    while p is not None:
        if p.name.startswith("aten::"):
            return True
        p = p.cpu_parent
    return False


def top_level_aten(events: list[FunctionEvent]) -> Counter[str]:
    """Names of the ``aten::`` events without an ``aten::`` ancestor, with their counts."""
    return Counter(e.name for e in events
                   if e.name.startswith("aten::") and e.device_type.name == "CPU" and not _has_aten_ancestor(e))


def _device_kernels(events: list[FunctionEvent]) -> int:
    return sum(1 for e in events if e.device_type.name == "CUDA")


def count_ops(step: Callable[[], object], warmup: int = 1, cuda: bool | None = None) -> OpCount:
    """Run ``step()`` ``warmup`` times, then once under the profiler; count what it launched.

    ``cuda``: also record GPU kernels (default: when CUDA is available). See the module docstring.
    """
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step()
    cuda = torch.cuda.is_available() if cuda is None else cuda
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    events = list(prof.events())
    names = top_level_aten(events)
    return OpCount(aten_ops=sum(names.values()), kernels=_device_kernels(events) if cuda else None,
                   by_name=dict(names))


def bench_counts(step: Callable[[], object]) -> dict[str, int]:
    """:func:`count_ops` as a benchmark's per-stage record: ``{"ops_per_step": top-level aten ops}``
    plus ``"kernels_per_step"`` on CUDA — the shape ``r2m.bench.schedule.COUNT_OPS`` takes
    (``COUNT_OPS = bench_counts``). Count an eager step: a replayed CUDA graph is one launch to the
    profiler, whatever it runs."""
    c = count_ops(step)
    return {"ops_per_step": c.aten_ops, **({"kernels_per_step": c.kernels} if c.kernels is not None else {})}

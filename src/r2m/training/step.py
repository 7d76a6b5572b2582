"""The training step as the loop and ``r2m bench schedule`` run it: eager, static-shape, or one CUDA graph.

* :class:`StepMode` / :func:`step_mode` — what a run does, decided once from the device, DDP and the
  runtime switches (``R2M_STATIC_STEP``, ``R2M_CUDA_GRAPH``; :mod:`r2m.runtime`): the *static* step
  pads every batch to fixed shapes (text: the stage's ``max_len``; concepts: a grow-only width) and
  the objectives then use their host-read-free forms (a masked-mean L_XE, greedy decoding for the
  fixed ``max_len`` steps); the *graph* step captures forward, backward, clipping and the
  (capturable) Adam update as one ``torch.cuda.CUDAGraph`` — CUDA only, never under DDP, and only
  over static shapes. On CPU both stay off by default (today's dynamic step; see docs/guide/benchmarks.md
  for the measurement behind that).
* :class:`EagerStep` — one optimiser step; returns the step's losses as one device vector
  (:func:`pack`: the loss, then its components) so the loop can defer the non-finite check.
* :class:`GraphStep` — copies each batch into static input buffers (:func:`static_buffers`,
  :func:`copy_into`) and replays the captured step; it warms up with real (eager) steps on a side
  stream first, as PyTorch's CUDA-graph docs require, re-captures when the batch shapes change and
  falls back to eager for good when capture raises (one log line saying why). Dropout stays random
  across replays: the default CUDA generator is graph-safe (each replay advances its offset).
* :class:`StaticShape` — the trainer's pad-to-static-shape function with its grow-only concept width.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from r2m.runtime import STATIC_CHOICES

LossFn = Callable[[Any], tuple[Tensor, dict[str, Tensor]]]

CUDA_API: Any = torch.cuda
"""The CUDA stream/graph API :class:`GraphStep` calls (a seam: the CPU tests drive its control flow
with a stand-in)."""


# --------------------------------------------------------------------------- the decision
@dataclass(frozen=True)
class StepMode:
    """``static``: fixed shapes, no host reads in the step; ``graph``: one CUDA graph per step;
    ``why``: why the graph is off (empty when it is on)."""

    static: bool = False
    graph: bool = False
    why: str = ""  # the default (supervised trainers): eager, nothing to log


# (condition, reason): the first that holds turns the graph off
GRAPH_BLOCKERS: tuple[tuple[Callable[..., bool], str], ...] = (
    (lambda device, **_: device.type != "cuda", "device is {device.type}, CUDA graphs need CUDA"),
    (lambda want_graph, **_: not want_graph, "switched off (R2M_CUDA_GRAPH=0 / --no-graph)"),
    (lambda distributed, **_: distributed, "DDP (torchrun) trains eagerly"),
    (lambda static, **_: not static, "dynamic shapes (R2M_STATIC_STEP=0)"),
)


def step_mode(device: torch.device, distributed: bool = False, want_graph: bool = True,
              static: str = "auto") -> StepMode:
    """The step a run uses. ``static``: ``auto`` (on CUDA only), ``1`` (always), ``0`` (never)."""
    if static not in STATIC_CHOICES:
        raise ValueError(f"R2M_STATIC_STEP={static!r}: choose auto, 0 or 1")
    is_static = device.type == "cuda" if static == "auto" else static == "1"
    facts = dict(device=device, want_graph=want_graph, distributed=distributed, static=is_static)
    for blocked, why in GRAPH_BLOCKERS:
        if blocked(**facts):
            return StepMode(static=is_static, graph=False, why=why.format(**facts))
    return StepMode(static=is_static, graph=True, why="")


# --------------------------------------------------------------------------- the eager step
def pack(loss: Tensor, comp: dict[str, Tensor]) -> tuple[Tensor, tuple[str, ...]]:
    """The loss and its components as one float32 device vector (no host read) and their names."""
    names = tuple(comp)
    return torch.stack([loss.detach().float(), *(comp[n].detach().float() for n in names)]), names


def clip_grad_norm(params: Any, max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm)`` (the same global L2 norm, coefficient
    ``max_norm / (norm + 1e-6)`` clamped at 1, the same floating-point operations) in fewer ops when
    every gradient shares one device and dtype: torch's version adds a ``to`` per gradient, ~50 ops
    a step of a launch-bound model. Mixed devices or dtypes go to torch's."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    if len({(g.device, g.dtype) for g in grads}) > 1:
        torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm)
        return
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))


@dataclass
class EagerStep:
    """Forward (under ``autocast``), ``zero_grad``, ``backward``, global-norm clipping, ``optimizer.step``.

    ``reduce`` turns a rank's scalar into the global batch's (DDP: the mean over ranks; identity
    otherwise). Returns :func:`pack` of the (reduced) loss and components."""

    model: Any
    optimizer: torch.optim.Optimizer
    loss: LossFn
    clip: float
    autocast: Callable[[], Any] = contextlib.nullcontext
    reduce: Callable[[Tensor], Tensor] = lambda x: x  # noqa: E731

    def __call__(self, batch: Any) -> tuple[Tensor, tuple[str, ...]]:
        with self.autocast():
            loss, comp = self.loss(batch)
        comp = {k: self.reduce(v) for k, v in comp.items()}
        out = pack(self.reduce(loss.detach()), comp)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm(list(self.model.parameters()), self.clip)
        self.optimizer.step()
        return out

    @property
    def used_graph(self) -> bool:
        return False


# --------------------------------------------------------------------------- static buffers
def _tensor_fields(batch: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(batch) if isinstance(getattr(batch, f.name), Tensor)]


def signature(batch: Any) -> tuple:
    """What a captured graph depends on: every tensor field's name, shape, dtype and device."""
    return tuple((n, tuple(t.shape), t.dtype, str(t.device)) for n in _tensor_fields(batch)
                 for t in (getattr(batch, n),))


def static_buffers(batch: Any) -> Any:
    """A copy of ``batch`` (a dataclass) whose tensors are fresh buffers the graph reads from."""
    return dataclasses.replace(batch, **{n: getattr(batch, n).clone() for n in _tensor_fields(batch)})


def copy_into(static: Any, batch: Any) -> Any:
    """Copy every tensor of ``batch`` into ``static``'s buffers (same shapes), in place."""
    if signature(static) != signature(batch):
        raise ValueError(f"batch shapes {signature(batch)} differ from the captured {signature(static)}")
    for n in _tensor_fields(batch):
        getattr(static, n).copy_(getattr(batch, n), non_blocking=True)
    return static


# --------------------------------------------------------------------------- the graph step
class GraphStep:
    """The whole step as one CUDA graph over static input buffers (see the module); CUDA only.

    ``warmup`` eager steps (real steps, on a side stream) precede each capture; after
    ``max_captures`` captures (shapes kept changing) or a capture that raised, every later step is
    eager. ``used_graph`` says whether any step was a replay; ``why`` why it stopped (empty if not)."""

    def __init__(self, eager: EagerStep, log: Any, name: str, warmup: int = 3, max_captures: int = 8) -> None:
        self.eager, self.log, self.name = eager, log, name
        self.warmup, self.max_captures = warmup, max_captures
        self.stream = CUDA_API.Stream()
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: Any = None
        self.out: tuple[Tensor, tuple[str, ...]] | None = None
        self.warm, self.captures, self.replays = 0, 0, 0
        self.why = ""

    @property
    def used_graph(self) -> bool:
        return self.replays > 0

    def _side(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the side stream, ordered after and before the current stream's work."""
        self.stream.wait_stream(CUDA_API.current_stream())
        with CUDA_API.stream(self.stream):
            out = fn()
        CUDA_API.current_stream().wait_stream(self.stream)
        return out

    def give_up(self, why: str) -> None:
        self.why, self.graph, self.static, self.out = why, None, None, None
        self.log.info("%s: CUDA graph off from here on (%s); eager steps", self.name, why)

    def _capture(self) -> None:
        self.eager.optimizer.zero_grad(set_to_none=True)  # backward allocates the grads inside the graph
        graph = CUDA_API.CUDAGraph()
        with CUDA_API.graph(graph, stream=self.stream):
            out = self.eager(self.static)
        self.graph, self.out = graph, out
        self.captures += 1

    def __call__(self, batch: Any) -> tuple[Tensor, tuple[str, ...]]:
        if self.why:
            return self.eager(batch)
        if self.static is None or signature(self.static) != signature(batch):
            if self.captures >= self.max_captures:
                self.give_up(f"batch shapes changed after {self.captures} captures")
                return self.eager(batch)
            self.static, self.graph, self.out, self.warm = static_buffers(batch), None, None, 0
        copy_into(self.static, batch)
        if self.graph is None and self.warm < self.warmup:
            self.warm += 1
            return self._side(lambda: self.eager(self.static))
        if self.graph is None:
            try:
                self._capture()
            except Exception as err:  # noqa: BLE001 - any capture failure means: train eagerly
                CUDA_API.synchronize()
                self.give_up(f"capture raised {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}")
                return self.eager(batch)
        assert self.graph is not None and self.out is not None
        self.graph.replay()
        self.replays += 1
        return self.out[0].clone(), self.out[1]  # the next replay overwrites the graph's output


def make_step(eager: EagerStep, mode: StepMode, log: Any, name: str) -> EagerStep | GraphStep:
    """The step for ``mode``: a :class:`GraphStep` around ``eager`` when the graph is on, else ``eager``
    (logging once why the graph is off on CUDA)."""
    if mode.graph:
        return GraphStep(eager, log, name)
    if mode.why and "CUDA graphs need CUDA" not in mode.why:
        log.info("%s: CUDA graph off (%s)", name, mode.why)
    return eager


def graph_record(step: Any, mode: StepMode) -> dict[str, Any]:
    """What ``train_metrics.json`` records about the step: ``cuda_graph`` (a replay ran), the reason
    it did not (``cuda_graph_off``, null when it did) and ``static_step``."""
    used = bool(getattr(step, "used_graph", False))
    pending = "no capture yet: fewer steps than the warm-up" if isinstance(step, GraphStep) else "not requested"
    why = "" if used else (getattr(step, "why", "") or mode.why or pending)
    return {"cuda_graph": used, "cuda_graph_off": why or None, "static_step": mode.static}


# --------------------------------------------------------------------------- static shapes
class StaticShape:
    """The trainer's pad-to-static-shape function: ``pad(batch, width) -> batch`` with concepts
    padded to a width that only grows (a wider batch widens every later one: one re-capture)."""

    def __init__(self, pad: Callable[[Any, int], Any], width: int = 0) -> None:
        self.pad, self.width = pad, width

    def __call__(self, batch: Any) -> Any:
        self.width = max(self.width, int(batch.concepts.shape[1]))
        return self.pad(batch, self.width)


# --------------------------------------------------------------------------- device batches
def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` on ``device``; on CUDA from pinned memory with a non-blocking copy. With no host read
    in the step, the loop builds batch k+1 and queues its copy while the device still runs step k."""
    if device.type == "cuda" and hasattr(batch, "pin_memory"):
        batch = batch.pin_memory()
    return batch.to(device)

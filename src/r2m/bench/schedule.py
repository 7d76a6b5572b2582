"""``r2m bench schedule``: the paper's whole training schedule at paper sizes on synthetic data.

Stages (official defaults, DESIGN.md §2): L_XE 5,000 steps and L_S 6,000 steps × 256 sentences
(max length 30 / 40), L_M 50 and L_I 100 steps × 256 images with 40-step greedy decoding;
vocabulary 18,679, d 512, H 2, d_k 256, 1,536-d image features. ``--scale`` runs that fraction
of every stage's steps (at least one each; on CPU use a tiny fraction, e.g. 0.001). Prints
per-stage seconds and sentences (images)/s, and the whole schedule's time extrapolated to
``--scale 1``.

Each step is the training loop's own step (:mod:`r2m.training.step`: the objective of
:func:`r2m.training.stage_losses.text_objective` / ``image_objective``, backward, global-norm clipping
10 and Adam), in the mode the stages would use on that device (:func:`r2m.training.step.step_mode`):

* static shapes on CUDA (sentences padded to the stage's ``max_len``, L_XE a masked mean, greedy
  decoding for the fixed 40 steps without the early-stop test; ``R2M_STATIC_STEP`` as in the stages);
* the whole step as one CUDA graph on CUDA (``--no-graph`` or ``R2M_CUDA_GRAPH=0`` to compare);
* TF32 matmuls on CUDA (``R2M_TF32=0`` for full fp32); ``--bf16``: bf16 autocast (CUDA only);
* data already on the device: a pool of synthetic batches is made there once and cycled;
* no host synchronisation inside the step: losses are summed on the device and checked for NaN/Inf
  once per stage (``--check-every`` to check sooner);
* ``--compile``: ``torch.compile`` of the memory units' recurrent step (``auto``: on CUDA without
  the graph only; ``reduce-overhead`` adds CUDA graphs of its own).

:data:`COUNT_OPS` counts each stage's top-level aten ops per step (and GPU kernels on CUDA) on one
more eager step (:func:`r2m.training.opcount.bench_counts`; a CUDA graph replays the same kernels).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from r2m import runtime as R
from r2m.datasets.check import PAPER_VOCAB
from r2m.models.r2m import R2M, R2MConfig
from r2m.text.vocab import END, START
from r2m.training import step as ST
from r2m.training.data import ImageBatch, TextBatch, pad_image, pad_text
from r2m.training.opcount import bench_counts
from r2m.training.stage_losses import image_objective, text_objective
from r2m.training.stages import make_adam
from r2m.utils.cliargs import bench_parser as parser
from r2m.utils.cliargs import float_in, int_in, names_in

log = logging.getLogger("r2m.bench.schedule")

COUNT_OPS: Callable[[Callable[[], Any]], dict[str, Any] | None] | None = bench_counts
"""Op counter: ``COUNT_OPS(one_step) -> {"ops_per_step": …, …}`` (``one_step()`` runs one more
eager training step); its result is kept as each stage's ``ops`` and printed. ``None``: no count."""

IMAGE_DIM = 1536


@dataclass(frozen=True)
class StagePlan:
    name: str
    kind: str  # text | image
    steps: int
    max_len: int
    lr: float
    beta: float | None = None  # L_S
    gamma: float = 0.0  # L_I


SCHEDULE = (
    StagePlan("train_xe", "text", 5000, 30, 1e-4),
    StagePlan("train_s", "text", 6000, 40, 1e-4, beta=1.0),
    StagePlan("train_m", "image", 50, 40, 1e-5, gamma=0.0),
    StagePlan("train_i", "image", 100, 40, 1e-5, gamma=1.0),
)


@dataclass(frozen=True)
class _TP:  # the few schedule fields image_objective reads
    margin: float
    max_len: int


def synthetic_text(g: torch.Generator, lengths: Tensor, vocab: int, concept_width: int) -> TextBatch:
    """A random :class:`TextBatch` of sentences with these ``lengths`` (incl. <#end>), 0 after them in
    inputs and targets, with 1..``concept_width`` concepts each (0-padded to ``concept_width``)."""
    B, T = len(lengths), int(lengths.max())
    targets = torch.randint(4, vocab, (B, T), generator=g)
    pos = torch.arange(T)[None, :]
    targets[pos == (lengths - 1)[:, None]] = END
    targets[pos >= lengths[:, None]] = 0
    inputs = torch.cat([torch.full((B, 1), START), targets[:, :-1]], 1) * (pos < lengths[:, None])
    return TextBatch(*_concepts(g, B, vocab, concept_width), inputs, targets, lengths)


def synthetic_image(g: torch.Generator, ids: list[str], vocab: int, concept_width: int, image_dim: int) -> ImageBatch:
    """A random :class:`ImageBatch` of ``len(ids)`` images: concepts as :func:`synthetic_text`'s, features N(0, 1)."""
    concepts, clens = _concepts(g, len(ids), vocab, concept_width)
    return ImageBatch(concepts, clens, torch.randn(len(ids), image_dim, generator=g), ids)


def _concepts(g: torch.Generator, batch: int, vocab: int, width: int) -> tuple[Tensor, Tensor]:
    """1..``width`` random concepts per row, 0-padded to ``width``, and their counts."""
    clens = torch.randint(1, width + 1, (batch,), generator=g)
    concepts = torch.randint(4, vocab, (batch, width), generator=g) * (torch.arange(width)[None, :] < clens[:, None])
    return concepts, clens


def text_batches(n: int, batch: int, max_len: int, vocab: int, device: torch.device, seed: int) -> list[TextBatch]:
    """Synthetic sentences of 10..max_len tokens (incl. <#end>), 1–5 concepts each, on ``device``."""
    g = torch.Generator().manual_seed(seed)
    return [synthetic_text(g, torch.randint(10, max_len + 1, (batch,), generator=g), vocab, 5).to(device)
            for _ in range(n)]


def image_batches(n: int, batch: int, vocab: int, device: torch.device, seed: int) -> list[ImageBatch]:
    g = torch.Generator().manual_seed(seed + 1)
    return [synthetic_image(g, [f"{k}-{i}" for i in range(batch)], vocab, 5, IMAGE_DIM).to(device) for k in range(n)]


def _compile(model: R2M, mode: str, device: torch.device, graph: bool) -> str:
    if mode == "auto":
        mode = "default" if device.type == "cuda" and not graph else "none"
    if mode == "none":
        return "none"
    for mem in (model.decoder, model.reconstructor):
        mem.step = torch.compile(mem.step, mode=mode, dynamic=False)
    return mode


def _static(plan: StagePlan, batch: Any, on: bool) -> Any:
    if not on:
        return batch
    return pad_text(batch, plan.max_len, 5) if plan.kind == "text" else pad_image(batch, 5)


def run_schedule(device: str = "cpu", scale: float = 0.001, batch: int = 256,
                 vocab: int = PAPER_VOCAB["coco_shutterstock"],
                 d: int = 512, heads: int = 2, d_k: int = 256, bf16: bool = False, compile_mode: str = "auto",
                 pool: int = 4, check_every: int = 0, seed: int = 0, stages: tuple[str, ...] | None = None,
                 graph: bool = True) -> dict:
    torch.manual_seed(seed)
    dev = torch.device(device)
    rt = R.Runtime.from_env(device=device)
    tf32 = R.apply_tf32(dev, rt.tf32)
    mode = ST.step_mode(dev, False, graph and rt.cuda_graph, rt.static_step)
    model = R2M(R2MConfig.for_variant("r2m", vocab_size=vocab, d=d, heads=heads, d_k=d_k,
                                      image_dim=IMAGE_DIM)).to(dev).train()
    compiled = _compile(model, compile_mode, dev, mode.graph)
    use_bf16 = bf16 and dev.type == "cuda"
    results = []
    why = mode.why
    for plan in SCHEDULE:
        if stages and plan.name not in stages:
            continue
        steps = max(1, math.ceil(plan.steps * scale))
        opt = make_adam(model, plan.lr, capturable=mode.graph)
        if plan.kind == "text":
            data = text_batches(pool, batch, plan.max_len, vocab, dev, seed)
            compute = lambda b, p=plan: text_objective(model, b, p.beta)  # noqa: E731
        else:
            data = image_batches(pool, batch, vocab, dev, seed)
            tp = _TP(margin=0.2, max_len=plan.max_len)
            compute = lambda b, p=plan, tp=tp: image_objective(model, b, p.gamma, tp.margin, tp.max_len)  # noqa: E731
        data = [_static(plan, b, mode.static) for b in data]
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16,  # noqa: E731
                                          cache_enabled=not mode.graph)
        step = ST.make_step(ST.EagerStep(model, opt, compute, 10.0, autocast), mode, log, plan.name)
        warm = (step.warmup + 1) if isinstance(step, ST.GraphStep) else 1  # warm-up (+ capture); not timed
        total = sum(step(data[k % len(data)])[0][0] for k in range(warm))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for k in range(steps):
            total = total + step(data[(warm + k) % len(data)])[0][0]
            if check_every and (k + 1) % check_every == 0 and not torch.isfinite(total):
                raise FloatingPointError(f"{plan.name}: non-finite loss by step {k + 1}")
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        mean_loss = float(total) / (steps + warm)  # the deferred check: one sync per stage
        if not math.isfinite(mean_loss):
            raise FloatingPointError(f"{plan.name}: non-finite loss in the stage")
        eager = getattr(step, "eager", step)  # a graph step's eager twin: the ops its capture recorded
        ops = COUNT_OPS(lambda s=eager, b=data[0]: s(b)) if COUNT_OPS is not None else None
        why = getattr(step, "why", "") or why
        results.append({"stage": plan.name, "kind": plan.kind, "steps": steps, "paper_steps": plan.steps,
                        "seconds": dt, "per_s": steps * batch / dt, "mean_loss": mean_loss,
                        "full_stage_seconds": dt / steps * plan.steps, "graph": step.used_graph,
                        "ops": ops})
    used_graph = any(r["graph"] for r in results)
    return {"device": str(dev), "dtype": "bf16" if use_bf16 else "fp32", "compile": compiled,
            "threads": torch.get_num_threads(), "batch": batch, "vocab": vocab, "scale": scale,
            "params": model.param_count(include_image_proj=False), "stages": results,
            "tf32": tf32, "graph": used_graph, "graph_off": "" if used_graph else why, "static": mode.static,
            "seconds": sum(r["seconds"] for r in results),
            "full_schedule_seconds": sum(r["full_stage_seconds"] for r in results)}


def main(argv: list[str] | None = None) -> int:
    p = parser("schedule", __doc__.splitlines()[0])
    p.add_argument("--scale", type=float_in(0, 100, open_lo=True), default=None,
                   help="fraction of every stage's steps (default 1 on CUDA, 0.001 on CPU)")
    p.add_argument("--batch", type=int_in(1, 65536), default=256)
    p.add_argument("--vocab", type=int_in(8, 10**7), default=PAPER_VOCAB["coco_shutterstock"])
    p.add_argument("--d", type=int_in(1, 16384), default=512)
    p.add_argument("--heads", type=int_in(1, 256), default=2)
    p.add_argument("--d-k", type=int_in(1, 16384), default=256)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA only)")
    p.add_argument("--compile", default="auto", choices=["auto", "none", "default", "reduce-overhead", "max-autotune"],
                   help="torch.compile of the recurrent step (auto: CUDA only)")
    p.add_argument("--check-every", type=int_in(0, 10**6), default=0, help="NaN check every k steps (0: once per stage)")
    p.add_argument("--stages", type=names_in([s.name for s in SCHEDULE], empty=True), default=[],
                   help="comma-separated subset (default: all four)")
    p.add_argument("--no-graph", action="store_true", help="eager steps instead of one CUDA graph per step (CUDA)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    devices = [a.device] if a.device != "auto" else ["cuda" if torch.cuda.is_available() else "cpu"]
    for dev in devices:
        scale = a.scale if a.scale is not None else (1.0 if dev.startswith("cuda") else 0.001)
        r = run_schedule(dev, scale, a.batch, a.vocab, a.d, a.heads, a.d_k, a.bf16, a.compile,
                         check_every=a.check_every, stages=tuple(a.stages) or None,
                         graph=not a.no_graph)
        print(f"schedule on {r['device']} ({r['dtype']}, tf32={'on' if r['tf32'] else 'off'}, "
              f"cuda graph={'on' if r['graph'] else 'off (' + r['graph_off'] + ')'}, "
              f"static shapes={'on' if r['static'] else 'off'}, compile={r['compile']}, {r['threads']} threads), "
              f"vocab {r['vocab']}, batch {r['batch']}, {r['params'] / 1e6:.1f}M params, scale {r['scale']:g}:")
        for s in r["stages"]:
            unit = "sentences/s" if s["kind"] == "text" else "images/s"
            ops = "".join(f", {k} {v}" for k, v in (s["ops"] or {}).items())
            print(f"  {s['stage']:<9} {s['steps']:>5}/{s['paper_steps']} steps {s['seconds']:8.1f} s "
                  f"{s['per_s']:9.1f} {unit}  (full stage ~{s['full_stage_seconds']:.0f} s{ops})")
        print(f"  total {r['seconds']:.1f} s; whole paper schedule extrapolated: {r['full_schedule_seconds']:.0f} s "
              f"({r['full_schedule_seconds'] / 60:.1f} min)", flush=True)
    return 0

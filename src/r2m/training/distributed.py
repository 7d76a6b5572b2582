"""Multi-GPU (or multi-process CPU) training with PyTorch DDP, launched by ``torchrun`` or Slurm's ``srun``.

Launch (one machine, N GPUs)::

    r2m train_xe --dataset D --variant r2m --nproc N        # re-executes itself under torchrun
    torchrun --standalone --nproc-per-node N -m r2m.cli train_xe --dataset D --variant r2m   # the same

or as one Slurm job of N tasks (``sbatch --ntasks=N … --wrap "srun r2m train_xe …"``): each task takes
its rank, world size and local rank from Slurm's step environment (:func:`adopt_slurm`).

**The global batch stays the paper's** (``<stage>.batch_size``, 256): every rank draws the same
global batch from the same seeded stream and keeps its contiguous slice of ``batch_size / N`` rows,
so the learning rate is unchanged. The losses are made those of the global batch:

* the token-mean cross-entropy is rescaled by ``N · n_local / n_global`` tokens, so DDP's gradient
  average equals the gradient of the mean over all tokens of the global batch;
* the ranking loss (hardest negatives *inside the mini-batch*) sees the whole global batch: image
  and sentence embeddings are all-gathered with gradients (:func:`gather_rows`);
* per-row means (``‖v − ṽ‖²`` in L_S) need nothing: equal slices, averaged (text batches are always
  full; choose ``batch_size`` divisible by N — 256 is, for N = 1, 2, 4, 8).

Hence one process and N processes follow the same loss curve (up to float summation order; tested
with two gloo processes on CPU). Dropout masks are drawn per rank, so with dropout > 0 the curves
agree in distribution, not bit for bit. Rank 0 alone writes checkpoints, ``loss.tsv`` and metrics;
every rank resumes from the same ``last.pt``. Validation and checkpoint selection run on every rank
(identical models, identical results), so no rank waits on another's decision.

Nothing here changes a single-process run: :func:`current` is a no-op context when ``WORLD_SIZE``
is unset or 1 (a Slurm step of one task, or a batch script outside ``srun``, is a single process).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    sizes: list[int] = dataclasses.field(default_factory=list)  # rows per rank of the last sharded batch

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ batches
    def shard(self, batch: Any) -> Any:
        """This rank's contiguous slice of a global batch (a dataclass of tensors / lists); a last,
        short batch (image stages) is split as evenly as it goes."""
        if not self.enabled:
            return batch
        n = len(batch)
        if n < self.world:
            raise ValueError(f"a batch of {n} rows cannot feed {self.world} processes; use fewer (--nproc)")
        self.sizes = [n * (r + 1) // self.world - n * r // self.world for r in range(self.world)]
        lo, hi = n * self.rank // self.world, n * (self.rank + 1) // self.world
        return dataclasses.replace(batch, **{f.name: getattr(batch, f.name)[lo:hi] for f in dataclasses.fields(batch)})

    def global_rows(self, local: int) -> int:
        return local * self.world

    # ------------------------------------------------------------------ losses
    def token_mean_scale(self, n_local: Tensor) -> Tensor | float:
        """Factor turning a mean over this rank's tokens into its share of the global token mean
        (under DDP's gradient average)."""
        if not self.enabled:
            return 1.0
        n = n_local.detach().to(torch.float32).reshape(1).clone()
        total = n.clone()
        torch.distributed.all_reduce(total)
        return (n * self.world / total.clamp_min(1)).squeeze(0)

    def mean(self, x: Tensor) -> Tensor:
        """The mean of a scalar over ranks (for logging the global loss)."""
        if not self.enabled:
            return x
        x = x.detach().to(torch.float32).reshape(1).clone()
        torch.distributed.all_reduce(x)
        return (x / self.world).squeeze(0)

    def barrier(self) -> None:
        if self.enabled:
            torch.distributed.barrier()

    # ------------------------------------------------------------------ model
    def wrap(self, model: torch.nn.Module, compute: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
        """``compute(model, batch)`` run through DDP's forward (so its reducer all-reduces the
        gradients in backward); ``compute`` itself when not distributed."""
        if not self.enabled:
            return lambda batch: compute(model, batch)
        step = _Step(model, compute)
        ids = [device.index] if device.type == "cuda" else None
        ddp = torch.nn.parallel.DistributedDataParallel(step, device_ids=ids, find_unused_parameters=True)
        return lambda batch: ddp(batch)


class _Step(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, compute: Callable[..., Any]) -> None:
        super().__init__()
        self.model = model
        self.compute = compute

    def forward(self, batch: Any) -> Any:
        return self.compute(self.model, batch)


_CURRENT = Dist()


def current() -> Dist:
    return _CURRENT


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``factor``."""

    @staticmethod
    def forward(ctx, x: Tensor, factor: float) -> Tensor:  # type: ignore[override]
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        return grad * ctx.factor, None


def gather_rows(x: Tensor) -> Tensor:
    """All ranks' rows of ``x`` in rank order (identity when not distributed).

    Every rank then computes the same global-batch loss; gradients flow into this rank's own rows
    only, scaled by the number of ranks, so that DDP's gradient *average* equals the gradient of
    that one global loss.
    """
    if not _CURRENT.enabled:
        return x
    sizes = _CURRENT.sizes or [len(x)] * _CURRENT.world
    if sizes[_CURRENT.rank] != len(x):
        raise RuntimeError(f"gather_rows: {len(x)} local rows, the last sharded batch gave this rank {sizes}")
    pad = max(sizes)
    local = x.detach()
    if len(local) < pad:  # all_gather needs equal shapes
        local = torch.cat([local, local.new_zeros((pad - len(local), *local.shape[1:]))], 0)
    parts = [torch.empty_like(local) for _ in range(_CURRENT.world)]
    torch.distributed.all_gather(parts, local.contiguous())
    parts = [p[:k] for p, k in zip(parts, sizes, strict=True)]
    parts[_CURRENT.rank] = _ScaleGrad.apply(x, float(_CURRENT.world))
    return torch.cat(parts, 0)


def setup(device: torch.device | None = None) -> Dist:
    """Join the process group torchrun describes in the environment (gloo on CPU, NCCL on CUDA)."""
    global _CURRENT
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        _CURRENT = Dist()
        return _CURRENT
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device is not None and device.type == "cuda"
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    _CURRENT = Dist(rank, world, local)
    return _CURRENT


def device_for(device: torch.device) -> torch.device:
    """Under torchrun on CUDA each rank takes GPU ``LOCAL_RANK``."""
    if device.type == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return device


def teardown() -> None:
    global _CURRENT
    if _CURRENT.enabled and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _CURRENT = Dist()


def launch(nproc: int, argv: list[str]) -> int:
    """Re-run ``r2m <argv>`` under ``torchrun --standalone --nproc-per-node nproc``."""
    from torch.distributed.run import main as torchrun

    args = ["--standalone", f"--nproc-per-node={nproc}", "-m", "r2m.cli", *argv]
    try:
        torchrun(args)
    except SystemExit as exc:  # torchrun exits with the workers' status
        return int(exc.code or 0)
    except Exception as exc:  # noqa: BLE001 - ChildFailedError: one line, the workers' logs say more
        print(f"r2m {argv[0] if argv else ''}: torchrun with {nproc} processes failed: {exc}", file=sys.stderr)
        return 1
    return 0


SLURM_PORT_BASE = 20000  # MASTER_PORT under srun: this plus the job id modulo 20000 (unless MASTER_PORT is set)


def adopt_slurm(env: MutableMapping[str, str] | None = None) -> bool:
    """Inside a Slurm step of several tasks (``srun``; ``SLURM_STEP_NUM_TASKS`` > 1) and outside torchrun,
    set torchrun's variables from Slurm's: ``RANK`` = ``SLURM_PROCID``, ``WORLD_SIZE`` =
    ``SLURM_STEP_NUM_TASKS``, ``LOCAL_RANK`` = ``SLURM_LOCALID``, ``MASTER_ADDR`` = the step's first node,
    ``MASTER_PORT`` from the job id. A batch script itself (no ``srun``) is one process, even with
    ``--ntasks=N``: only ``srun`` sets ``SLURM_STEP_NUM_TASKS``. True when it set them."""
    env = os.environ if env is None else env
    tasks = env.get("SLURM_STEP_NUM_TASKS", "")
    if "WORLD_SIZE" in env or not tasks.isdigit() or int(tasks) <= 1:
        return False
    env.update(RANK=env["SLURM_PROCID"], WORLD_SIZE=tasks, LOCAL_RANK=env.get("SLURM_LOCALID", "0"))
    env.setdefault("MASTER_ADDR", first_node(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")))
    env.setdefault("MASTER_PORT", str(SLURM_PORT_BASE + int(env.get("SLURM_JOB_ID", "0")) % 20000))
    return True


def first_node(nodelist: str) -> str:
    """The first host of a Slurm node list (``node[03-05,07],gpu1`` → ``node03``); 127.0.0.1 when empty."""
    head = nodelist.split(",")[0].strip()
    if "[" not in head:
        return head or "127.0.0.1"
    prefix, ranges = head.split("[", 1)
    return prefix + ranges.split(",")[0].split("-")[0].rstrip("]")


def relaunch(stage: str, argv: list[str]) -> int | None:
    """For ``r2m <stage> … --nproc N``: the exit status of the torchrun re-launch, or None to run
    here (N = 1, or already inside torchrun or a Slurm step of several tasks)."""
    try:
        nproc, rest = strip_nproc(argv)
    except ValueError as err:
        print(f"r2m {stage}: {err}", file=sys.stderr)
        return 2
    if adopt_slurm() and nproc > 1 and nproc != int(os.environ["WORLD_SIZE"]):
        print(f"r2m {stage}: --nproc {nproc} inside a Slurm step of {os.environ['WORLD_SIZE']} tasks: "
              "srun starts the processes, drop --nproc", file=sys.stderr)
        return 2
    if nproc <= 1 or "WORLD_SIZE" in os.environ:
        return None
    return launch(nproc, [stage, *rest])


MAX_NPROC = 1024  # processes one `--nproc` starts at most (one per GPU)


def _nproc(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--nproc {text!r}: expected a number of processes (an integer >= 1)") from None


def strip_nproc(argv: list[str]) -> tuple[int, list[str]]:
    """Take ``--nproc N`` / ``--nproc=N`` out of ``argv``; (1, argv) when absent."""
    out, nproc, skip = [], 1, False
    for k, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--nproc":
            if k + 1 >= len(argv):
                raise ValueError("--nproc needs a number")
            nproc, skip = _nproc(argv[k + 1]), True
        elif a.startswith("--nproc="):
            nproc = _nproc(a.split("=", 1)[1])
        else:
            out.append(a)
    if not 1 <= nproc <= MAX_NPROC:
        raise ValueError(f"--nproc must be from 1 to {MAX_NPROC}, got {nproc}")
    return nproc, out

"""Runtime settings that never live in tracked params: device, threads, data-loader workers.

Set them with the environment (``R2M_DEVICE``, ``R2M_THREADS``, ``R2M_WORKERS``) or the
matching ``--device/--threads/--workers`` flags of any stage command. One place for both engines: a stage
run takes them from here alone (Snakemake's and DVC's commands set none), with one torch thread unless
``R2M_THREADS`` says otherwise (``0``: torch's own choice, the machine's cores), so an instance gives the
same bytes whichever engine ran it. Each setting a run reads is part of its record
(:func:`r2m.utils.reads.note_runtime`): the thread count changes float sums, so an instance run with
another count is not current. ``R2M_BF16=1`` turns on bf16
autocast in the training stages on CUDA (as their ``--bf16`` flag; ignored on CPU).

The training step on CUDA (:mod:`r2m.training.step`; each is ignored on CPU unless said otherwise):
``R2M_TF32=0`` keeps fp32 matmuls in full precision (default: TF32, :func:`apply_tf32`);
``R2M_CUDA_GRAPH=0`` trains eagerly instead of replaying the whole step as one CUDA graph;
``R2M_STATIC_STEP`` = ``auto`` (static shapes on CUDA only), ``1`` (also on CPU) or ``0`` (never).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from r2m.utils.guard import BadInput, env_number, parse_number
from r2m.utils.reads import note_runtime

DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
STATIC_CHOICES = ("auto", "0", "1")  # R2M_STATIC_STEP (r2m.training.step.step_mode)


def check_device(value: str, what: str = "--device") -> str:
    """``value`` when it names a device (auto, cpu, mps, cuda, cuda:N); :class:`BadInput` otherwise."""
    if not DEVICE_PATTERN.fullmatch(value.strip()):
        raise BadInput(f"{what} {value!r}: choose auto, cpu, cuda, cuda:N or mps")
    return value.strip()


def check_choice(value: str, what: str, choices: tuple[str, ...]) -> str:
    """``value`` when it is one of ``choices``; :class:`BadInput` (one line) otherwise."""
    if value.strip() not in choices:
        raise BadInput(f"{what}={value!r}: choose {', '.join(choices)}")
    return value.strip()


def switch(name: str, default: str = "1") -> bool:
    """A switch: ``0`` off, ``1`` on, unset ``default``; anything else (``true``, ``off``…) is
    refused rather than silently read as the opposite of what was meant."""
    return check_choice(os.environ.get(name) or default, name, ("0", "1")) == "1"


# far above any machine's cores: a typo (torch overflows past 2^63 threads; each worker is a process)
MAX_THREADS, MAX_WORKERS = 4096, 512


STAGE_THREADS = 1  # a stage's torch threads when neither --threads nor R2M_THREADS says


def _count(flag_value: int | None, flag: str, env: str, maximum: int, default: int = 0) -> int:
    """``--threads``/``--workers`` (else its ``R2M_*`` variable, else ``default``) in ``[0, maximum]``."""
    value, what = ((parse_number(str(flag_value), flag, int, 0), flag) if flag_value is not None
                   else (env_number(env, default, int, 0), env))
    if value > maximum:
        raise BadInput(f"{what}={value!r}: expected an integer in [0, {maximum}]")
    return int(value)


# switches read elsewhere (progress bars, GPU JPEG decoding): checked here, when a command starts
OTHER_SWITCHES = {"R2M_NO_PROGRESS": "0", "R2M_GPU_DECODE": "1"}


def apply_tf32(device, enabled: bool = True) -> bool:
    """TF32 for fp32 matmuls on CUDA (``torch.set_float32_matmul_precision("high")``), full
    precision when ``enabled`` is false; nothing on other devices. Whether TF32 is on."""
    if getattr(device, "type", str(device)) != "cuda":
        return False
    import torch

    torch.set_float32_matmul_precision("high" if enabled else "highest")
    return enabled


@dataclass(frozen=True)
class Runtime:
    device: str = "auto"
    threads: int = 0
    workers: int = 0
    bf16: bool = False
    tf32: bool = True
    cuda_graph: bool = True
    static_step: str = "auto"

    def __getattribute__(self, name: str):
        value = object.__getattribute__(self, name)
        if name in _FIELDS:
            note_runtime(name, value)  # a setting the recording run used
        return value

    @classmethod
    def from_env(cls, device: str | None = None, threads: int | None = None, workers: int | None = None,
                 default_threads: int = 0) -> Runtime:
        """Flags first, then ``R2M_*``; :class:`r2m.utils.guard.BadInput` (one line) for a bad value.
        ``default_threads``: the thread count when neither says (a stage's: :data:`STAGE_THREADS`)."""
        dev = check_device(device, "--device") if device else check_device(os.environ.get("R2M_DEVICE") or "auto",
                                                                           "R2M_DEVICE")
        for name, default in OTHER_SWITCHES.items():
            switch(name, default)
        return cls(
            device=dev,
            threads=_count(threads, "--threads", "R2M_THREADS", MAX_THREADS, default_threads),
            workers=_count(workers, "--workers", "R2M_WORKERS", MAX_WORKERS),
            bf16=switch("R2M_BF16", "0"),
            tf32=switch("R2M_TF32"),
            cuda_graph=switch("R2M_CUDA_GRAPH"),
            static_step=check_choice(os.environ.get("R2M_STATIC_STEP") or "auto", "R2M_STATIC_STEP",
                                     STATIC_CHOICES),
        )

    def torch_device(self):
        import torch

        if self.device == "auto":
            if not torch.cuda.is_available():
                return torch.device("cpu")
            n = torch.cuda.device_count()
            if n > 1 and "WORLD_SIZE" not in os.environ:  # torchrun assigns GPUs itself
                return torch.device("cuda", claim_gpu(n))
            return torch.device("cuda")
        return torch.device(self.device)

    def settings(self) -> dict[str, object]:
        """Every setting by name, as a record compares them (not recorded as read)."""
        return {f: object.__getattribute__(self, f) for f in _FIELDS}

    def apply(self) -> None:
        """Apply thread settings to torch (``0``: torch's own)."""
        if self.threads > 0:
            import torch

            torch.set_num_threads(self.threads)


_FIELDS = frozenset(f for f in Runtime.__dataclass_fields__)


# --------------------------------------------------------------------------- GPU sharing
_CLAIMED: dict[str, object] = {}  # held open for the life of the process (the lock is the claim)


def claim_gpu(count: int, lock_dir: str | None = None) -> int:
    """The first of ``count`` GPUs no other r2m process on this machine holds, claimed with an
    exclusive ``flock`` on ``<lock_dir>/r2m-gpu-<i>.lock`` until this process exits.

    Lets ``snakemake --resources gpu=N`` run N GPU jobs at once on an N-GPU box, each on its own
    GPU (Snakemake counts GPUs but does not assign them). When all are held (more jobs than
    ``--resources gpu`` allows), GPU 0 is shared.
    """
    import fcntl
    import tempfile

    folder = lock_dir or os.environ.get("R2M_GPU_LOCK_DIR") or tempfile.gettempdir()
    if not os.path.isdir(folder):
        raise BadInput(f"R2M_GPU_LOCK_DIR={folder!r}: not a folder (it holds the GPU claim files)")
    for i in range(count):
        path = os.path.join(folder, f"r2m-gpu-{i}.lock")
        if path in _CLAIMED:
            return i
        fh = open(path, "a+")  # noqa: SIM115 - kept open: closing would release the claim
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            continue
        _CLAIMED[path] = fh
        return i
    return 0

"""Runtime settings that never live in tracked params: device, threads, data-loader workers.

Set them with the environment (``R2M_DEVICE``, ``R2M_THREADS``, ``R2M_WORKERS``) or the
matching ``--device/--threads/--workers`` flags of any stage command.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Runtime:
    device: str = "auto"
    threads: int = 0
    workers: int = 0

    @classmethod
    def from_env(cls, device: str | None = None, threads: int | None = None, workers: int | None = None) -> Runtime:
        return cls(
            device=device or os.environ.get("R2M_DEVICE", "auto"),
            threads=int(threads if threads is not None else os.environ.get("R2M_THREADS", 0)),
            workers=int(workers if workers is not None else os.environ.get("R2M_WORKERS", 0)),
        )

    def torch_device(self):
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def apply(self) -> None:
        """Apply thread settings to torch (only when asked, the default is torch's own)."""
        if self.threads > 0:
            import torch

            torch.set_num_threads(self.threads)

"""Loading checkpoints (``model.pt``, ``last.pt``) with one clear error per problem.

:func:`load_checkpoint` always uses ``torch.load(weights_only=True)`` (a foreign pickle stays
refused) and turns every failure — missing, truncated or corrupt, refused pickle, not a dict, keys
missing — into a :class:`CheckpointError` whose one-line message names the file and says what to do.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file."""


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:160] if text else type(err).__name__


def load_checkpoint(path: str | Path, required: Sequence[str] = (), hint: str = "rerun with --fresh",
                    map_location: Any = "cpu") -> dict[str, Any]:
    """``torch.load(path, weights_only=True)`` checked to be a dict holding ``required`` keys."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"missing checkpoint: {path}")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        msg = _first_line(err)
        if "weights_only" in str(err) or "Unsupported global" in str(err) or "GLOBAL" in str(err):
            raise CheckpointError(f"{path}: refused, not a weights-only checkpoint (it pickles Python objects: "
                                  f"foreign or unsafe file); {hint}") from None
        raise CheckpointError(f"{path}: unreadable checkpoint (corrupt: {msg}); {hint}") from None
    except (RuntimeError, EOFError, OSError, ValueError, AttributeError, TypeError, IndexError) as err:
        raise CheckpointError(f"{path}: unreadable checkpoint (truncated or corrupt: {_first_line(err)}); "
                              f"{hint}") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: not a checkpoint dict (holds a {type(obj).__name__}); {hint}")
    missing = [k for k in required if k not in obj]
    if missing:
        raise CheckpointError(f"{path}: not an r2m checkpoint, missing key(s) {missing} "
                              f"(has {sorted(map(str, obj))[:8]}); {hint}")
    return obj

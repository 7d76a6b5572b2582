"""Loading checkpoints (``model.pt``, ``last.pt``) with one clear error per problem.

:func:`load_checkpoint` always uses ``torch.load(weights_only=True)`` (a foreign pickle stays
refused) and turns every failure — missing, truncated or corrupt, refused pickle, not a dict, keys
missing, content that does not match its digest — into a :class:`CheckpointError` whose one-line
message names the file and says what to do.

**Digest.** Every checkpoint dict r2m writes (:func:`save_torch`) carries
``"digest"``: the SHA-256 of its content (:func:`content_digest`: keys, plain values, every tensor's
dtype, shape and bytes), checked on load. A file whose bytes changed after it was written (bit rot,
a partial copy that still unpickles) is refused instead of loading garbage weights. Checkpoints
without the key (written before it, or by other tools) load unchecked.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from r2m.utils.io import atomic_path


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file."""


DIGEST_KEY = "digest"


def _feed(h: Any, value: Any) -> None:
    """Hash ``value`` (nested dicts/lists of tensors and plain values) into ``h``, unambiguously."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(value.shape)}:".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, dict):
        h.update(f"D{len(value)}:".encode())
        for k, v in sorted(value.items(), key=lambda kv: repr(kv[0])):
            _feed(h, k)
            _feed(h, v)
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}:".encode())
        for v in value:
            _feed(h, v)
    else:
        text = repr(value)
        h.update(f"V{len(text)}:{text}".encode())


def content_digest(obj: dict[str, Any]) -> str:
    """SHA-256 of a checkpoint dict's content, its own ``digest`` key left out."""
    import hashlib

    h = hashlib.sha256()
    _feed(h, {k: v for k, v in obj.items() if k != DIGEST_KEY})
    return h.hexdigest()


def with_digest(obj: Any) -> Any:
    """``obj`` with its :func:`content_digest` added (dicts only; anything else unchanged)."""
    if not isinstance(obj, dict):
        return obj
    return {**{k: v for k, v in obj.items() if k != DIGEST_KEY}, DIGEST_KEY: content_digest(obj)}


def check_digest(path: Path, obj: dict[str, Any], hint: str) -> None:
    """A :class:`CheckpointError` naming ``path`` when ``obj`` does not match its recorded digest."""
    recorded = obj.get(DIGEST_KEY)
    if recorded is None:
        return
    if not isinstance(recorded, str) or recorded != content_digest(obj):
        raise CheckpointError(f"{path}: corrupt checkpoint (its content does not match the digest recorded "
                              f"when it was written: the file changed after it was saved); {hint}")


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
    check_digest(path, obj, hint)
    missing = [k for k in required if k not in obj]
    if missing:
        raise CheckpointError(f"{path}: not an r2m checkpoint, missing key(s) {missing} "
                              f"(has {sorted(map(str, obj))[:8]}); {hint}")
    return obj


def save_torch(path: str | Path, obj: Any) -> Path:
    """``torch.save`` atomically (:func:`r2m.utils.io.atomic_path`); a dict gets its content digest (checked
    by :func:`load_checkpoint`)."""
    import torch

    with atomic_path(path, suffix=".pt") as tmp, open(tmp, "wb", buffering=0) as fh:
        out = _Writes(fh)
        try:
            torch.save(with_digest(obj), out)
        except RuntimeError:  # torch reports a failed write as "[enforce fail ...] unexpected pos ..."
            if out.error is None:
                raise
            raise OSError(out.error.errno, out.error.strerror, str(path)) from None
    return Path(path)


class _Writes:
    """A file for ``torch.save`` that keeps the ``OSError`` of a failed write (a full disk), which
    torch itself reports only as a position mismatch."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.error = fh, None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):
                done += self.fh.write(view[done:]) or 0
        except OSError as err:
            self.error = err
            raise
        return done

    def flush(self) -> None:
        self.fh.flush()

"""Atomic output helpers: every stage writes through these so a crash never leaves a half
output that looks complete."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only on success.

    Works for files and for directories (write a whole directory under the yielded path).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or ".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    tmp_path.unlink()
    try:
        yield tmp_path
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp_path, path)
    except BaseException:
        if tmp_path.is_dir():
            shutil.rmtree(tmp_path, ignore_errors=True)
        elif tmp_path.exists():
            tmp_path.unlink()
        raise


def write_text(path: str | Path, text: str) -> Path:
    """``text`` into the file ``path`` atomically; a folder in the way is an error, never replaced
    (``r2m evaluate --out photos``, a folder named ``dvc.yaml``: its files were deleted)."""
    if Path(path).is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not replaced by a file", str(path))
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    return write_text(path, json.dumps(obj, indent=indent, sort_keys=False) + "\n")


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json`` keeps the last of a key given twice; we refuse it (which one was meant is unknown)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} given twice in one object")
        out[key] = value
    return out


def read_json(path: str | Path) -> Any:
    """The JSON document at ``path``; every error is one line naming the file (a key given twice in
    one object, too large an integer, not UTF-8 and invalid JSON included)."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
    except FileNotFoundError:
        raise FileNotFoundError(f"missing input file: {path}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: line {err.lineno}: not valid JSON ({err.msg})") from None
    except ValueError as err:  # a duplicate key, an integer of > 4300 digits, not UTF-8
        raise ValueError(f"{path}: not usable JSON ({' '.join(str(err).split())})") from None


def file_digest(path: str | Path, algo: str = "sha256", chunk: int = 1 << 20) -> str:
    """Hex digest of a file, read in chunks (weights, downloads, checkpoints)."""
    import hashlib

    h = hashlib.new(algo)
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def open_h5(path: str | Path) -> Any:
    """``h5py.File(path, "r")``; a truncated or corrupt file is a one-line ValueError naming it."""
    import h5py

    try:
        return h5py.File(path, "r")
    except FileNotFoundError:
        raise FileNotFoundError(f"missing input file: {path}") from None
    except OSError as err:
        why = " ".join(str(err).split())[:160]
        raise ValueError(f"{path}: unreadable HDF5 file (truncated or corrupt: {why}); rerun the stage "
                         "that writes it") from None


def write_parquet(path: str | Path, table: Any) -> Path:
    """Write a pandas DataFrame or pyarrow Table atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table, preserve_index=False)
    with atomic_path(path, suffix=".parquet") as tmp:
        pq.write_table(table, tmp)
    return Path(path)


def save_torch(path: str | Path, obj: Any) -> Path:
    """``torch.save`` atomically; a dict gets its content digest (checked by
    :func:`r2m.utils.checkpoint.load_checkpoint`)."""
    import torch

    from r2m.utils.checkpoint import with_digest

    with atomic_path(path, suffix=".pt") as tmp:
        torch.save(with_digest(obj), tmp)
    return Path(path)

"""The on-disk features folder and its shard parts (no model code; used by the ``extract_features``
stage to write and by captioning to read).

A features folder holds ``features.h5`` (float16, one chunked dataset per kind), ``index.parquet``
(``image_id``, ``row``), ``meta.json`` (backend, dims, bad images) and ``bad_images.csv``. It is
assembled from ``shard-NNNNN.h5`` parts (the rows of one shard of the image list, their positions and
the bad images), each tied to the inputs by a fingerprint kept in the parts folder's ``config.json``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from r2m.utils.io import atomic_path, open_h5, write_json, write_parquet
from r2m.vision.images import write_bad_images

FORMAT_VERSION = 1
log = logging.getLogger("r2m")


def fingerprint(backend: str, options: dict[str, Any], shard_size: int, ids: Sequence[str], files: Sequence[str],
                contents: Sequence[str]) -> str:
    """What the parts and the finished folder were made from: format, backend, options, shard size, and each
    image's id, path and content (``contents``: :func:`image_digests`), so a photo replaced under the same
    name is computed again."""
    h = hashlib.sha256()
    h.update(json.dumps({"v": FORMAT_VERSION, "backend": backend, "options": options, "shard_size": shard_size},
                        sort_keys=True, default=str).encode())
    for i, f, c in zip(ids, files, contents, strict=True):
        h.update(f"{i}\t{f}\t{c}\n".encode())
    return h.hexdigest()


def image_digests(files: Sequence[str], cache: Path | None = None) -> list[str]:
    """The SHA-256 of each image file (``missing``, or ``special`` for a FIFO or device, which the loader
    reports as a bad image), through the stat cache ``cache`` (:class:`r2m.utils.digest.StatCache`: an
    unchanged file is not read again)."""
    from r2m.utils.digest import StatCache
    from r2m.utils.guard import BadInput

    stats = StatCache(cache)
    out = []
    for f in files:
        try:
            rec = stats.record(Path(f))
        except BadInput:
            rec = {"special": True}
        out.append(rec.get("sha256") or ("missing" if rec.get("missing") else "special"))
    stats.save()
    return out


def default_parts(out: Path) -> Path:
    """Where a features folder's parts go when no resume folder is named: ``.<name>.parts`` beside it (the
    output folder itself is only ever replaced whole)."""
    return out.with_name(f".{out.name}.parts")


def shard_ranges(n: int, shard_size: int) -> list[tuple[int, int]]:
    return [(a, min(a + shard_size, n)) for a in range(0, n, shard_size)]


def part_path(parts: Path, j: int) -> Path:
    return parts / f"shard-{j:05d}.h5"


def write_h5(path: Path, arrays: dict[str, np.ndarray], extra: dict[str, np.ndarray], attrs: dict[str, str]) -> None:
    """Atomically write float16 ``arrays`` (chunked ~1 MiB), ``extra`` datasets as they are, and string ``attrs``."""
    import h5py

    with atomic_path(path, suffix=".h5") as tmp:
        with h5py.File(tmp, "w", track_order=True) as f:
            for k, a in arrays.items():
                row_bytes = max(1, int(np.prod(a.shape[1:])) * a.itemsize)
                rows = max(1, min(len(a), (1 << 20) // row_bytes)) if len(a) else None
                f.create_dataset(k, data=a, dtype=np.float16, chunks=(rows, *a.shape[1:]) if rows else None,
                                 track_times=False)
            for k, a in extra.items():
                f.create_dataset(k, data=a, track_times=False)
            for k, v in attrs.items():
                f.attrs[k] = v


def write_part(part: Path, start: int, arrays: dict[str, np.ndarray], good: Sequence[int],
               bad: Sequence[tuple[int, str]]) -> None:
    """One shard's part: the features of its good images, their rows in the image list (``start`` +
    position in the shard) and the bad ones with reasons."""
    rows = np.asarray([start + i for i in good], dtype=np.int64)
    write_h5(part, arrays, {"rows": rows}, {"bad": json.dumps([[start + i, r] for i, r in bad])})


def finished_meta(out: Path) -> dict[str, Any] | None:
    """``meta.json`` of a complete features folder, else ``None``."""
    if not all((out / n).exists() for n in ("features.h5", "index.parquet", "meta.json")):
        return None
    try:
        return json.loads((out / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def prepare_parts(parts: Path, fingerprint: str) -> None:
    """Make the parts folder for ``fingerprint``, discarding parts made from other inputs or options."""
    cfg = parts / "config.json"
    if parts.exists():
        try:
            same = json.loads(cfg.read_text()).get("fingerprint") == fingerprint
        except (OSError, ValueError):
            same = False
        if not same:
            log.info("features: discarding stale parts in %s (inputs or options changed)", parts)
            shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    if not cfg.exists():
        write_json(cfg, {"fingerprint": fingerprint})


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def collect_parts(shard_root: Path, parts: Path, fingerprint: str) -> int:
    """Link (or copy) the parts of every shard job's folder ``shard_root/<I>/`` into ``parts``.

    A shard folder made with other inputs or options is an error, not silently mixed in."""
    n = 0
    for folder in sorted(p for p in shard_root.iterdir() if p.is_dir()):
        try:
            fp = json.loads((folder / "config.json").read_text()).get("fingerprint")
        except (OSError, ValueError):
            fp = None
        if fp != fingerprint:
            raise ValueError(f"features: shard folder {folder} was made with other inputs or options; "
                             "delete it and run its shard job again")
        for part in sorted(folder.glob("shard-*.h5")):
            dst = parts / part.name
            if not dst.exists():
                _link_or_copy(part, dst)
            n += 1
    return n


def publish_parts(parts: Path, dest: Path, shards: Sequence[int]) -> None:
    """Move a shard job's finished parts (and their fingerprint) from its resume folder into its
    declared output folder ``dest`` (replaced as a whole)."""
    with atomic_path(dest) as tmp:
        tmp.mkdir()
        shutil.copy2(parts / "config.json", tmp / "config.json")
        for j in shards:
            src = part_path(parts, j)
            _link_or_copy(src, tmp / src.name)
    shutil.rmtree(parts, ignore_errors=True)


def assemble(out: Path, ids: Sequence[str], files: Sequence[str], n_shards: int, meta: dict[str, Any],
             parts: Path | None = None, finalize: Callable[[Path], Any] | None = None) -> dict[str, Any]:
    """Merge ``parts/shard-*.h5`` (default :func:`default_parts`) into ``features.h5`` + ``index.parquet`` +
    ``meta.json``, written to a temporary folder that replaces ``out`` as a whole (``finalize(folder)``
    may add files first); drop the parts."""
    parts = default_parts(out) if parts is None else parts
    with atomic_path(out) as tmp:
        tmp.mkdir()
        meta = _assemble_into(tmp, ids, files, n_shards, meta, parts)
        if finalize is not None:
            finalize(tmp)
    shutil.rmtree(parts, ignore_errors=True)
    return meta


def _assemble_into(out: Path, ids: Sequence[str], files: Sequence[str], n_shards: int, meta: dict[str, Any],
                   parts: Path) -> dict[str, Any]:
    import h5py
    import pandas as pd

    missing = [j for j in range(n_shards) if not part_path(parts, j).exists()]
    if missing:
        raise FileNotFoundError(
            f"features: cannot merge, {len(missing)} of {n_shards} shard(s) missing in {parts} "
            f"(e.g. {[part_path(parts, j).name for j in missing[:5]]}); run the --shard jobs first"
        )
    kinds: dict[str, tuple[int, ...]] = {}
    total = 0
    bad: list[list[Any]] = []
    for j in range(n_shards):
        with h5py.File(part_path(parts, j), "r") as f:
            total += len(f["rows"])
            bad += json.loads(f.attrs["bad"])
            for k in f:
                if k != "rows":
                    kinds[k] = tuple(f[k].shape[1:])
    all_rows: list[np.ndarray] = []
    with atomic_path(out / "features.h5", suffix=".h5") as tmp:
        with h5py.File(tmp, "w", track_order=True) as dst:
            for k, shape in kinds.items():
                row_bytes = max(1, int(np.prod(shape)) * 2)
                chunk = max(1, min(max(total, 1), (1 << 20) // row_bytes))
                dst.create_dataset(k, shape=(total, *shape), dtype=np.float16,
                                   chunks=(chunk, *shape) if total else None, track_times=False)
            pos = 0
            for j in range(n_shards):
                with h5py.File(part_path(parts, j), "r") as f:
                    rows = f["rows"][:]
                    for k in kinds:
                        dst[k][pos:pos + len(rows)] = f[k][:]
                    all_rows.append(rows)
                    pos += len(rows)
            dst.attrs["backend"] = meta["backend"]
    rows = np.concatenate(all_rows) if all_rows else np.zeros(0, np.int64)
    index = pd.DataFrame({"image_id": [ids[i] for i in rows], "row": np.arange(len(rows), dtype=np.int64)})
    write_parquet(out / "index.parquet", index)
    bad_rows = [(ids[i], files[i], r) for i, r in sorted(bad)]
    write_bad_images(out / "bad_images.csv", bad_rows)
    meta = {**meta, "n_images": int(total), "n_bad": len(bad_rows),
            "kinds": {k: list(s) for k, s in kinds.items()}, "dtype": "float16"}
    write_json(out / "meta.json", meta)
    return meta


def load_features(folder: str | Path, kind: str = "pooled") -> tuple[np.ndarray, Any]:
    """Read back ``(array [N, ...] float16, index DataFrame)`` from a features folder."""
    import pandas as pd

    folder = Path(folder)
    index = pd.read_parquet(folder / "index.parquet")
    with open_h5(folder / "features.h5") as f:
        if kind not in f:
            raise KeyError(f"{folder / 'features.h5'}: no feature kind {kind!r} (has {sorted(f)})")
        arr = f[kind][:]
    return arr, index


def load_rows(folder: str | Path, ids: Sequence[str], kind: str = "pooled") -> dict[str, np.ndarray]:
    """``{image id: float16 row}`` of ``kind`` for the ``ids`` that have features, reading only those rows
    (memory as the rows asked for, not as the whole folder)."""
    import pyarrow.parquet as pq

    folder = Path(folder)
    index = pq.read_table(folder / "index.parquet", columns=["image_id", "row"]).to_pandas()
    where = dict(zip(index["image_id"].astype(str), index["row"].astype(np.int64), strict=True))
    rows = sorted({int(where[i]) for i in ids if i in where})
    with open_h5(folder / "features.h5") as f:
        if kind not in f:
            raise KeyError(f"{folder / 'features.h5'}: no feature kind {kind!r} (has {sorted(f)})")
        arr = f[kind][rows] if rows else np.zeros((0, *f[kind].shape[1:]), np.float16)
    pos = {r: n for n, r in enumerate(rows)}
    return {i: arr[pos[int(where[i])]] for i in ids if i in where}

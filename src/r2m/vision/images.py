"""Safe image loading for the vision stages.

* :func:`load_image` opens one file and returns an RGB :class:`PIL.Image.Image` or raises
  :class:`BadImage` with a short reason (unreadable, truncated, too small, ...). Truncated files are
  detected because PIL's ``LOAD_TRUNCATED_IMAGES`` is left at its default (``False``): decoding a
  short JPEG raises, and we report it instead of silently padding it with grey.
* :class:`ImageDataset` + :func:`make_loader` feed a model in batches through a torch
  ``DataLoader`` (``workers`` processes); bad images are skipped and come back in
  :attr:`Batch.bad` so the caller can list them (``data/<dataset>/bad_images.csv``).
* :func:`read_plain_jpeg` + :class:`EncodedDataset` (``make_loader(encoded=True)``, or
  :func:`threaded_batches`: the same items read by a pool of threads in the calling process): only
  the bytes of plain JPEG files are read (:class:`Encoded`), which the caller decodes in batches on
  the GPU (``r2m.vision.extractors.gpu_decode``); any other file goes through :func:`load_image` and
  ``prepare`` in the worker as before.
"""

from __future__ import annotations

import csv
import io
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageFile, ImageOps

BAD_COLUMNS = ("image_id", "path", "reason")


class BadImage(Exception):
    """An image that cannot be used; ``str(err)`` is the reason written to the report."""


# ----------------------------------------------------------------------------- paths
def resolve_path(path: str | Path, prepared_dir: str | Path, root: str | Path = ".") -> Path:
    """Where an ``images.parquet`` path points (``r2m.datasets.base.resolve_image_path``: absolute,
    else under the prepared folder, else under the repository root); ``root`` anchors the last case
    when a stage runs with a root other than the working directory."""
    from r2m.datasets.base import resolve_image_path

    p = Path(resolve_image_path(Path(prepared_dir), str(path)))
    if not p.exists() and not Path(path).is_absolute() and (Path(root) / path).exists():
        return Path(root) / path
    return p


# ----------------------------------------------------------------------------- one image
def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode -> RGB: alpha is composited on white, 16-bit/float grey is rescaled to 8 bits."""
    if img.mode == "RGB":
        return img
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        a = np.asarray(img, dtype=np.float64)
        lo, hi = float(a.min()), float(a.max())
        a = (a - lo) * (255.0 / (hi - lo)) if hi > lo else np.zeros_like(a)
        return Image.fromarray(a.round().astype(np.uint8), "L").convert("RGB")
    has_alpha = img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info)
    if has_alpha:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV


def load_image(path: str | Path, min_side: int = 1) -> Image.Image:
    """Open, fully decode and convert one image to RGB; raise :class:`BadImage` with a reason."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:  # someone enabled it globally: truncation would go unseen
        warnings.warn("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is True; truncated images will not be detected",
                      stacklevel=2)
    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                im.load()  # full decode: raises on truncated/corrupt data
                im = ImageOps.exif_transpose(im)
                rgb = to_rgb(im)
    except FileNotFoundError:
        raise BadImage("missing file") from None
    except Image.UnidentifiedImageError:
        raise BadImage("not a recognised image format") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise BadImage(f"too large: {err}") from None
    except OSError as err:  # truncated, corrupt, unreadable
        raise BadImage(f"unreadable: {err}") from None
    except (ValueError, SyntaxError, MemoryError) as err:  # PIL plugins raise these on broken headers
        raise BadImage(f"unreadable: {type(err).__name__}: {err}") from None
    if min(rgb.size) < min_side:
        raise BadImage(f"too small: {rgb.size[0]}x{rgb.size[1]} < min_side {min_side}")
    return rgb


# ----------------------------------------------------------------------------- plain JPEG bytes
JPEG_MODES = ("RGB", "L")  # what decode_jpeg(mode=RGB) turns into the same pixels as load_image
EXIF_ORIENTATION = 0x0112
PLAIN_FRAMES = (0xC0, 0xC1, 0xC2)  # baseline, extended, progressive Huffman (not lossless, arithmetic, 12-bit)


def jpeg_frame(data: bytes) -> tuple[int, int] | None:
    """``(SOF marker, sample precision)`` of JPEG ``data``: the markers are walked from SOI up to the
    first frame header; ``None`` when none comes before the scan data (or the stream is malformed)."""
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker == 0xDA:  # scan data before any frame header
            return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return (marker, data[i + 4]) if i + 4 < n else None
        i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return None


@dataclass(frozen=True)
class Encoded:
    """The bytes of a plain JPEG file (see :func:`read_plain_jpeg`), decoded later by the caller."""

    data: bytes


def read_plain_jpeg(path: str | Path, min_side: int = 1) -> tuple[bytes, tuple[int, int]] | None:
    """``(bytes, (width, height))`` of a JPEG that needs nothing :func:`load_image` does beyond decoding
    (8-bit Huffman baseline or progressive, RGB or grey, no EXIF rotation, complete: it ends with the
    EOI marker, at least ``min_side``, not a decompression bomb); ``None`` for anything else, which :func:`load_image` then handles (and
    reports, when bad). Only the header is parsed, nothing is decoded."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if not data.startswith(b"\xff\xd8") or not data.rstrip(b"\x00\r\n ").endswith(b"\xff\xd9"):
        return None  # not a JPEG, or truncated: load_image says which
    frame = jpeg_frame(data)
    if frame is None or frame[0] not in PLAIN_FRAMES or frame[1] != 8:
        return None  # lossless, arithmetic-coded, 12-bit or malformed: as PIL decides
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                plain = (im.format == "JPEG" and im.mode in JPEG_MODES and min(im.size) >= min_side
                         and im.getexif().get(EXIF_ORIENTATION, 1) == 1)
                size = im.size
    except Exception:  # any header problem: let load_image give its reason
        return None
    return (data, size) if plain else None


# ----------------------------------------------------------------------------- batches
@dataclass
class Batch:
    indices: list[int]  # positions in the dataset's path list of the good images
    data: Any  # stacked tensor when every item is a tensor of one shape, else a list
    sizes: list[tuple[int, int]]  # (width, height) of each good image as loaded
    bad: list[tuple[int, str]] = field(default_factory=list)  # (index, reason)

    def pin_memory(self) -> Batch:  # called by DataLoader(pin_memory=True)
        if hasattr(self.data, "pin_memory"):
            self.data = self.data.pin_memory()
        return self


class ImageDataset:
    """Items ``(index, prepared, (w, h), None)`` or ``(index, None, None, reason)`` for bad images.

    ``prepare`` turns an RGB PIL image into whatever the model consumes (a tensor, an array...);
    it runs in the DataLoader workers.
    """

    def __init__(self, paths: Sequence[str | Path], prepare: Callable[[Image.Image], Any], min_side: int = 1):
        self.paths = [str(p) for p in paths]
        self.prepare = prepare
        self.min_side = min_side

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, Any, tuple[int, int] | None, str | None]:
        try:
            img = load_image(self.paths[i], self.min_side)
        except BadImage as err:
            return i, None, None, str(err)
        try:
            return i, self.prepare(img), img.size, None
        except Exception as err:  # a failing transform is a bad image, not a crashed run
            return i, None, None, f"preprocessing failed: {type(err).__name__}: {err}"


class EncodedDataset(ImageDataset):
    """:class:`ImageDataset` whose plain JPEG files come as :class:`Encoded` bytes (decoded by the
    caller, on the GPU); every other file is loaded and prepared here, as by :class:`ImageDataset`."""

    def __getitem__(self, i: int) -> tuple[int, Any, tuple[int, int] | None, str | None]:
        plain = read_plain_jpeg(self.paths[i], self.min_side)
        if plain is None:
            return super().__getitem__(i)
        return i, Encoded(plain[0]), plain[1], None


def collate(items: list[tuple[int, Any, Any, str | None]]) -> Batch:
    """Split good items from bad ones; stack tensors of one shape."""
    import torch

    good = [it for it in items if it[3] is None]
    bad = [(it[0], str(it[3])) for it in items if it[3] is not None]
    data: Any = [it[1] for it in good]
    if data and all(isinstance(x, torch.Tensor) for x in data) and len({tuple(x.shape) for x in data}) == 1:
        data = torch.stack(data)
    return Batch([it[0] for it in good], data, [it[2] for it in good], bad)


def make_loader(
    paths: Sequence[str | Path],
    prepare: Callable[[Image.Image], Any],
    batch_size: int,
    workers: int = 0,
    min_side: int = 1,
    pin_memory: bool = False,
    encoded: bool = False,
):
    """A DataLoader over ``paths`` yielding :class:`Batch` objects, in order; ``encoded``: plain JPEG
    files come as :class:`Encoded` bytes in ``Batch.data`` (then a list), see :class:`EncodedDataset`."""
    from torch.utils.data import DataLoader

    ds = (EncodedDataset if encoded else ImageDataset)(paths, prepare, min_side)
    return DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=False,
        num_workers=max(0, int(workers)),
        collate_fn=collate,
        persistent_workers=False,
        pin_memory=pin_memory,
        prefetch_factor=4 if workers and workers > 0 else None,
    )


def read_ahead(fn: Callable[[int], Any], n: int, threads: int, ahead: int) -> Iterator[Any]:
    """``fn(0), fn(1), ... fn(n - 1)`` in that order, computed by ``threads`` threads with at most
    ``ahead`` calls submitted beyond the one being returned (``threads`` <= 0: inline, one by one).
    Closing the iterator early cancels the calls not yet started and waits for the running ones."""
    if threads <= 0:
        yield from (fn(i) for i in range(n))
        return
    ahead = max(1, int(ahead))
    with ThreadPoolExecutor(threads, thread_name_prefix="r2m-read") as pool:
        pending: deque = deque()
        nxt = 0
        try:
            while nxt < n or pending:
                while nxt < n and len(pending) < ahead:
                    pending.append(pool.submit(fn, nxt))
                    nxt += 1
                yield pending.popleft().result()
        finally:
            for fut in pending:
                fut.cancel()


def threaded_batches(paths: Sequence[str | Path], prepare: Callable[[Image.Image], Any], batch_size: int,
                     threads: int, min_side: int = 1, ahead_batches: int = 3) -> Iterator[Batch]:
    """The batches of ``make_loader(paths, prepare, batch_size, encoded=True)``, in order, with the
    items read by ``threads`` threads of this process (:func:`read_ahead`, up to ``ahead_batches``
    batches ahead) instead of worker processes: the bytes of a plain JPEG stay in this process (no
    pickling through a pipe) for the GPU decoder; file reads and PIL's decoding release the GIL."""
    ds = EncodedDataset(paths, prepare, min_side)
    batch_size = max(1, int(batch_size))
    items: list[Any] = []
    for item in read_ahead(ds.__getitem__, len(ds), threads, ahead_batches * batch_size):
        items.append(item)
        if len(items) == batch_size:
            yield collate(items)
            items = []
    if items:
        yield collate(items)


# ----------------------------------------------------------------------------- report
def write_bad_images(path: str | Path, rows: Sequence[tuple[str, str, str]]) -> Path:
    """Write ``image_id,path,reason`` rows (header always present) atomically."""
    from r2m.utils.io import atomic_path

    with atomic_path(path, suffix=".csv") as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(BAD_COLUMNS)
            w.writerows(rows)
    return Path(path)


def read_image_index(prepared_dir: str | Path, root: str | Path = "."):
    """``images.parquet`` of a prepared folder with an extra ``file`` column (the resolved path)."""
    import pandas as pd

    path = Path(prepared_dir) / "images.parquet"
    if not path.exists():
        raise FileNotFoundError(f"missing input file: {path}")
    df = pd.read_parquet(path)
    missing = {"image_id", "path"} - set(df.columns)
    if missing:
        raise ValueError(f"{path}: missing column(s) {sorted(missing)}")
    df = df.astype({"image_id": str, "path": str}).reset_index(drop=True)
    dup = df["image_id"][df["image_id"].duplicated()]
    if len(dup):
        raise ValueError(f"{path}: duplicate image_id(s), e.g. {dup.iloc[0]!r}")
    df["file"] = [str(resolve_path(p, prepared_dir, root)) for p in df["path"]]
    return df

"""JPEG decoding on the GPU for feature extraction (``compute.extract_arrays`` on CUDA).

The reader threads only read the bytes of plain JPEG files (``r2m.vision.images.read_plain_jpeg``);
a batch of them is decoded at once with ``torchvision.io.decode_jpeg(device="cuda")`` and resized
on the GPU by the tensor twin of the backend's CPU transform (registry :data:`TENSOR_PREP`, keyed
by the transform's class):

* ``ResizeToUint8`` (PIL bilinear/bicubic resize, uint8): ``interpolate(antialias=True)`` (PIL's
  filters, a = -0.5 for bicubic), rounded to uint8. Not bit-equal to PIL: PIL resamples in fixed
  point and rounds to uint8 between its horizontal and vertical passes; this resamples in float and
  rounds once, so pixels differ by a level or two (``tests/test_gpu_decode.py`` states the bound).
* ``OfficialResizeCrop`` (TF1 bilinear 346, centre crop 299, float): the same formula as
  ``tf1.tf1_resize_bilinear`` in float32, evaluated only on the cropped rows and columns (equal to
  the CPU path on the same decoded pixels).

The pipeline (:func:`decoded_batches`): a pool of reader threads reads the files' bytes (and loads
the files that are not plain JPEGs) a few batches ahead (``images.threaded_batches``); one decode
thread decodes and resizes each batch on its own CUDA stream, up to ``DEPTH`` batches ahead of the
model, so reading, decoding and the model's forward pass overlap; the model's stream waits on each
batch's event. Batches come out in file order.

Everything else falls back to the CPU for that file: a file that is not a plain JPEG (PNG, CMYK,
rotated, truncated...) is prepared in the worker as before, and a file the GPU decoder refuses is
loaded again with ``load_image`` (whose ``BadImage`` reason lists a corrupt file by name). A backend
whose transform has no tensor twin decodes on the CPU. ``R2M_GPU_DECODE=0`` turns it off; it is on
by default on CUDA and never used on other devices (the CPU path is unchanged there).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from r2m.vision.extractors.base import Extractor, ResizeToUint8
from r2m.vision.extractors.tf1 import OfficialResizeCrop, tf1_axis
from r2m.vision.images import BadImage, Batch, Encoded, load_image, threaded_batches

ENV = "R2M_GPU_DECODE"
DEPTH = 2  # decoded batches kept ready ahead of the model
READERS = 4  # reader threads (measured on an H200 with 16 cores: 4 beat 12 and 16, which contend for the GIL)

# a tensor twin: (the CPU transform, uint8 [N, 3, H, W] on the device) -> the model's input [N, 3, h, w]
TensorPrep = Callable[[Any, torch.Tensor], torch.Tensor]
TENSOR_PREP: dict[type, TensorPrep] = {}


def tensor_twin(cls: type) -> Callable[[TensorPrep], TensorPrep]:
    """Register the tensor twin of the CPU transform class ``cls``."""

    def deco(fn: TensorPrep) -> TensorPrep:
        TENSOR_PREP[cls] = fn
        return fn

    return deco


@tensor_twin(ResizeToUint8)
def resize_uint8(t: ResizeToUint8, x: torch.Tensor) -> torch.Tensor:
    """PIL-style resize (antialiased bilinear/bicubic) of uint8 images to ``t.size``, uint8 out."""
    mode = {"bilinear": "bilinear", "bicubic": "bicubic"}[t.resample]
    y = F.interpolate(x.float(), size=tuple(t.size), mode=mode, align_corners=False, antialias=True)
    return y.round_().clamp_(0, 255).to(torch.uint8)


def _tf1_axis(n_in: int, n_out: int, first: int, count: int, device) -> tuple[torch.Tensor, ...]:
    """Rows (or columns) ``first .. first + count - 1`` of a TF1 bilinear resize ``n_in -> n_out``:
    low and high source indices and the float32 weight of the high one (``tf1.tf1_axis``)."""
    return tuple(torch.from_numpy(a[first:first + count]).to(device) for a in tf1_axis(n_in, n_out))


@tensor_twin(OfficialResizeCrop)
def tf1_resize_crop(t: OfficialResizeCrop, x: torch.Tensor) -> torch.Tensor:
    """TF1 bilinear resize to ``t.resize`` then the centre crop ``t.crop``, float32 in 0..255 units."""
    h, w = x.shape[-2:]
    y0, y1, dy = _tf1_axis(h, t.resize, t.offset, t.crop, x.device)
    x0, x1, dx = _tf1_axis(w, t.resize, t.offset, t.crop, x.device)
    a = x.float()
    top = a[:, :, y0][:, :, :, x0] * (1 - dx) + a[:, :, y0][:, :, :, x1] * dx
    bottom = a[:, :, y1][:, :, :, x0] * (1 - dx) + a[:, :, y1][:, :, :, x1] * dx
    return top * (1 - dy)[:, None] + bottom * dy[:, None]


def tensor_prep(ex: Extractor) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The tensor twin of ``ex``'s CPU transform, or ``None`` when it has none (decode on the CPU)."""
    transform = ex.prepare
    fn = TENSOR_PREP.get(type(transform))
    return None if fn is None else (lambda x: fn(transform, x))


def wanted(device: torch.device, enabled: bool | None = None) -> tuple[bool, str]:
    """Whether to decode JPEGs on ``device`` (``enabled`` overrides ``R2M_GPU_DECODE``), and why."""
    if device.type != "cuda":
        return False, f"device {device.type}"
    if enabled is None:
        enabled = os.environ.get(ENV, "1").strip() != "0"
        if not enabled:
            return False, f"{ENV}=0"
    if not enabled:
        return False, "turned off"
    return True, f"{device}; {ENV}=0 turns it off"


def decode(datas: Sequence[bytes], device: torch.device) -> list[torch.Tensor | None]:
    """uint8 ``[3, H, W]`` images on ``device`` decoded from JPEG bytes, one batched call; when the
    batch fails, file by file, ``None`` for a file that does not decode."""
    from torchvision.io import ImageReadMode, decode_jpeg

    tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
    if not tensors:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torchvision 0.29: "use TorchCodec" on every call
        try:
            return list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device))
        except RuntimeError:
            pass
        out: list[torch.Tensor | None] = []
        for t in tensors:
            try:
                out.append(decode_jpeg(t, mode=ImageReadMode.RGB, device=device))
            except RuntimeError:
                out.append(None)
    return out


def prepare_decoded(prep: Callable[[torch.Tensor], torch.Tensor], images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``prep`` over decoded images, one call per group of images of one size; results in order."""
    out: list[Any] = [None] * len(images)
    groups: dict[tuple[int, ...], list[int]] = {}
    for k, img in enumerate(images):
        groups.setdefault(tuple(img.shape), []).append(k)
    for ks in groups.values():
        y = prep(torch.stack([images[k] for k in ks]))
        for k, row in zip(ks, y, strict=True):
            out[k] = row
    return out


def device_batch(ex: Extractor, prep: Callable[[torch.Tensor], torch.Tensor], batch: Batch,
                 files: Sequence[str], device: torch.device) -> tuple[torch.Tensor | None, list[int], list[tuple[int, str]], int]:
    """One loader batch of ``make_loader(encoded=True)`` as the model's input on ``device``:
    ``(x [n, 3, h, w] or None, positions of its rows, bad [(pos, reason)], files decoded on the CPU)``.

    Encoded files are decoded on ``device`` and resized by ``prep``; one the decoder refuses is
    loaded with ``load_image`` and ``ex.prepare`` instead (a ``BadImage`` becomes a bad entry)."""
    items = list(batch.data) if isinstance(batch.data, list) else list(batch.data.unbind(0))
    enc = [k for k, it in enumerate(items) if isinstance(it, Encoded)]
    rows: list[Any] = [None if isinstance(it, Encoded) else it.to(device, non_blocking=True) for it in items]
    decoded = decode([items[k].data for k in enc], device)
    ok = [k for k, img in zip(enc, decoded, strict=True) if img is not None]
    for k, y in zip(ok, prepare_decoded(prep, [img for img in decoded if img is not None]), strict=True):
        rows[k] = y
    bad: list[tuple[int, str]] = []
    cpu = len(items) - len(enc)
    for k in (k for k, img in zip(enc, decoded, strict=True) if img is None):
        pos = batch.indices[k]
        try:
            img = load_image(files[pos])
        except BadImage as err:
            bad.append((pos, str(err)))
            continue
        try:  # as ImageDataset: a failing transform is a bad image, not a crashed run
            rows[k] = ex.prepare(img).to(device)
            cpu += 1
        except Exception as err:
            bad.append((pos, f"preprocessing failed: {type(err).__name__}: {err}"))
    keep = [k for k, r in enumerate(rows) if r is not None]
    x = torch.stack([rows[k] for k in keep]) if keep else None
    return x, [batch.indices[k] for k in keep], bad, cpu


_DONE = object()


def background(make: Callable[[], Iterator[Any]], depth: int = DEPTH, name: str = "r2m-decode") -> Iterator[Any]:
    """The items of ``make()``, produced in a thread of their own up to ``depth`` items ahead, in order;
    an exception raised there is raised here, and closing this iterator early stops the thread (which
    closes its iterator) before it returns."""
    q: queue.Queue = queue.Queue(max(1, int(depth)))
    stop = threading.Event()

    def put(entry: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        it = make()
        try:
            for item in it:
                if not put((True, item)):
                    return
            put((True, _DONE))
        except BaseException as err:  # handed to the consumer, raised there
            put((False, err))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    try:
        while True:
            ok, item = q.get()
            if not ok:
                raise item
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        thread.join()


def decoded_batches(ex: Extractor, prep: Callable[[torch.Tensor], torch.Tensor], files: Sequence[str],
                    batch_size: int, device: torch.device, workers: int,
                    stats: dict[str, int] | None = None) -> Iterator[tuple[list[int], torch.Tensor | None,
                                                                           list[tuple[int, str]], int]]:
    """``(positions, x or None, bad [(pos, reason)], files done)`` per batch of ``files``, in order: read
    by ``READERS`` threads (``workers``, the loader processes of the CPU path, is not used), decoded and resized by :func:`device_batch` in a
    background thread (on its own CUDA stream on CUDA), ``x`` ready to use on the caller's stream.
    ``stats["cpu"]`` counts the files decoded on the CPU."""
    cuda = device.type == "cuda"
    side = torch.cuda.Stream(device) if cuda else None
    readers = READERS

    def produce() -> Iterator[tuple[Any, ...]]:
        for batch in threaded_batches(files, ex.prepare, batch_size, readers):
            done = len(batch.indices) + len(batch.bad)
            if not batch.indices:
                yield [], None, list(batch.bad), done, None, 0
                continue
            with torch.cuda.stream(side) if cuda else contextlib.nullcontext():
                x, indices, more_bad, n_cpu = device_batch(ex, prep, batch, files, device)
                event = None
                if cuda:
                    event = torch.cuda.Event()
                    event.record(side)
            yield indices, x, sorted(list(batch.bad) + more_bad), done, event, n_cpu

    for indices, x, bad, done, event, n_cpu in background(produce, DEPTH):
        if event is not None:
            current = torch.cuda.current_stream(device)
            current.wait_event(event)
            if x is not None:
                x.record_stream(current)  # allocated on the decode stream, used on this one
        if stats is not None:
            stats["cpu"] = stats.get("cpu", 0) + n_cpu
        yield indices, x, bad, done

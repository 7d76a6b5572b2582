"""One lent-GPU session's measurements, section by section (each section its own process and time
limit, see ``scripts/device_bench.sh``); every figure is printed as it comes and appended as one JSON
line to ``$OUT/results.jsonl``.

Sections: ``env`` (device, versions), ``features`` (Inception-V4 and VGG-16 from 500x500 JPEG files:
the model alone and its variants, each part of the files path alone, the batch-by-batch path of
before and the threaded pipeline), ``schedule`` (``r2m bench schedule``'s run in fp32/TF32 and bf16,
with one profiled eager step per stage: kernels per step and GPU time per kernel class).

Usage: ``python scripts/device_bench.py SECTION [--quick]`` (``--quick``: tiny sizes, for a CPU smoke run).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

OUT = Path(os.environ.get("OUT") or tempfile.mkdtemp())
QUICK = "--quick" in sys.argv
OUT.mkdir(parents=True, exist_ok=True)


def emit(section: str, **row) -> None:
    row = {"section": section, **row}
    print(json.dumps(row, default=str), flush=True)
    with open(OUT / "results.jsonl", "a") as fh:
        fh.write(json.dumps(row, default=str) + "\n")


def guarded(section: str, name: str, fn, *args, **kw):
    t0 = time.perf_counter()
    try:
        out = fn(*args, **kw)
        return out
    except Exception as err:  # one failing measurement must not lose the others
        emit(section, what=name, error=f"{type(err).__name__}: {err}", trace=traceback.format_exc()[-1500:])
        return None
    finally:
        print(f"# {section}/{name}: {time.perf_counter() - t0:.1f} s", flush=True)


def sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


# ============================================================================ env
def env() -> None:
    import platform

    import torchvision

    row = {"python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__,
           "cuda_available": torch.cuda.is_available(), "cpus": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        row.update(gpu=p.name, sms=p.multi_processor_count, mem_gib=round(p.total_memory / 2**30, 1),
                   cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    emit("env", **row)


# ============================================================================ features
def write_files(folder: Path, n: int, size: int, kind: str) -> list[str]:
    """``n`` ``size`` x ``size`` JPEGs (quality 90): ``noise`` (uniform noise, as ``r2m bench features``:
    the worst case for entropy decoding) or ``photo`` (crops of scikit-image's photos, flipped and
    shifted: what real photos cost)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    if kind == "photo":
        from skimage import data, transform

        bases = []
        for a in (data.astronaut(), data.coffee(), data.chelsea(), data.rocket(), data.immunohistochemistry()):
            scale = (size + 64) / min(a.shape[:2])
            b = transform.rescale(a, scale, channel_axis=2, anti_aliasing=True, preserve_range=True)
            bases.append(np.clip(b, 0, 255).astype(np.uint8))

    def one(i: int) -> str:
        rng = np.random.default_rng(i)
        if kind == "noise":
            arr = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        else:
            b = bases[i % len(bases)]
            y, x = rng.integers(0, b.shape[0] - size + 1), rng.integers(0, b.shape[1] - size + 1)
            arr = b[y:y + size, x:x + size]
            if i // len(bases) % 2:
                arr = arr[:, ::-1]
        path = folder / f"{kind}-{i}.jpg"
        Image.fromarray(np.ascontiguousarray(arr)).save(path, quality=90)
        return str(path)

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(one, range(n)))


def build(backend: str):
    import warnings

    from r2m.vision.extractors.factory import build_extractor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_extractor(backend, {} if backend == "random_cnn" else {"random_init": True})


def model_rate(backend: str, dev, batch: int, n: int, variant: str) -> float:
    """Images/s of the model alone on uint8 batches (``features_of_batch``, as the stage calls it)."""
    from r2m.vision.extractors import compute as X

    ex = build(backend)
    torch.backends.cudnn.benchmark = "bench" in variant
    model = X.to_device(ex, dev)
    if "bf16w" in variant:
        model.net.to(torch.bfloat16)
    h, w = ex.size
    x = torch.randint(0, 256, (batch, 3, h, w), dtype=torch.uint8)
    if "devin" in variant:
        x = x.to(dev)
    for _ in range(2):
        X.features_of_batch(ex, model, x, dev)
    sync(dev)
    t0 = time.perf_counter()
    done = 0
    while done < n:
        X.features_of_batch(ex, model, x, dev)
        done += batch
    sync(dev)
    torch.backends.cudnn.benchmark = False
    return done / (time.perf_counter() - t0)


def read_rate(files: list[str], threads: int, batch: int) -> float:
    from r2m.vision.images import threaded_batches

    t0 = time.perf_counter()
    n = sum(len(b.indices) for b in threaded_batches(files, lambda img: None, batch, threads))
    return n / (time.perf_counter() - t0)


def decode_rates(backend: str, files: list[str], dev, batch: int) -> dict:
    """Images/s of nvjpeg decoding alone and of decoding + the resize twin (one thread, batch by batch)."""
    from r2m.vision.extractors import gpu_decode as G

    ex = build(backend)
    prep = G.tensor_prep(ex)
    datas = [Path(f).read_bytes() for f in files]
    G.decode(datas[:batch], dev)
    sync(dev)
    t0 = time.perf_counter()
    for k in range(0, len(datas), batch):
        G.decode(datas[k:k + batch], dev)
    sync(dev)
    t_dec = time.perf_counter() - t0
    t0 = time.perf_counter()
    for k in range(0, len(datas), batch):
        G.prepare_decoded(prep, G.decode(datas[k:k + batch], dev))
    sync(dev)
    t_both = time.perf_counter() - t0
    return {"decode": len(datas) / t_dec, "decode_resize": len(datas) / t_both,
            "mean_kb": sum(map(len, datas)) / len(datas) / 1024}


def old_files_rate(backend: str, files: list[str], dev, batch: int, workers: int) -> float:
    """The files path as it was: DataLoader worker processes hand the bytes over, then decode + model
    batch after batch in one thread."""
    from r2m.vision.extractors import compute as X
    from r2m.vision.extractors import gpu_decode as G
    from r2m.vision.images import make_loader

    ex = build(backend)
    model = X.to_device(ex, dev)
    prep = G.tensor_prep(ex)

    def run(fs, w):
        n = 0
        for b in make_loader(fs, ex.prepare, batch, w, encoded=True):
            x, idx, _, _ = G.device_batch(ex, prep, b, fs, dev)
            X.features_of_batch(ex, model, x, dev)
            n += len(idx)
        return n

    run(files[:batch], 0)
    t0 = time.perf_counter()
    n = run(files, workers)
    return n / (time.perf_counter() - t0)


def new_files_rate(backend: str, files: list[str], dev, batch: int, workers: int, gpu: bool,
                   cudnn_bench: bool = False) -> float:
    """The stage's own ``extract_arrays`` (threaded pipeline with GPU decoding, or CPU decoding)."""
    from r2m.vision.extractors import compute as X

    ex = build(backend)
    torch.backends.cudnn.benchmark = cudnn_bench
    X.extract_arrays(ex, files[:batch], batch, dev, 0, show=False, gpu_decode=gpu)
    sync(dev)
    t0 = time.perf_counter()
    arrays, good, bad = X.extract_arrays(ex, files, batch, dev, workers, show=False, gpu_decode=gpu)
    dt = time.perf_counter() - t0
    torch.backends.cudnn.benchmark = False
    assert len(good) == len(files) and not bad
    return len(files) / dt


def features() -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n = 64 if QUICK else 2048
    size = 120 if QUICK else 500
    batch = 16 if QUICK else 128
    workers = 2 if QUICK else 12
    root = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    sets = {k: write_files(root / k, n, size, k) for k in ("noise", "photo")}
    emit("features", what="files_written", n=n, size=size, seconds=time.perf_counter() - t0)
    S = "features"
    backends = ("random_cnn",) if QUICK else ("inception_v4", "vgg16")
    for backend in backends:
        for variant in ("base", "bench", "bench+bf16w"):
            r = guarded(S, f"model {backend} {variant}", model_rate, backend, dev, batch, n, variant)
            if r:
                emit(S, what="model", backend=backend, variant=variant, batch=batch, images_per_s=r)
    for kind, files in sets.items():
        r = guarded(S, "read", read_rate, files, 12, batch)
        if r:
            emit(S, what="read_threads12", files=kind, images_per_s=r)
        if dev.type == "cuda":
            r = guarded(S, "decode", decode_rates, backends[0], files, dev, batch)
            if r:
                emit(S, what="decode_alone", files=kind, backend="inception_v4", **r)
            r = guarded(S, "decode vgg", decode_rates, "vgg16", files, dev, batch)
            if r:
                emit(S, what="decode_alone", files=kind, backend="vgg16", **r)
    for kind in ("noise", "photo"):
        files = sets[kind]
        for backend in backends:
            if dev.type == "cuda":
                r = guarded(S, f"old {backend} {kind}", old_files_rate, backend, files, dev, batch, workers)
                if r:
                    emit(S, what="files_old_serial_gpu_decode", backend=backend, files=kind, images_per_s=r)
            for cb in (False, True):
                r = guarded(S, f"new {backend} {kind} bench={cb}", new_files_rate, backend, files, dev, batch,
                            workers, dev.type == "cuda", cb)
                if r:
                    emit(S, what="files_pipeline_gpu_decode", backend=backend, files=kind, cudnn_benchmark=cb,
                         images_per_s=r)
        if kind == "noise":
            r = guarded(S, "cpu decode", new_files_rate, backends[0], files, dev, batch, workers, False)
            if r:
                emit(S, what="files_cpu_decode", backend=backends[0], files=kind, workers=workers, images_per_s=r)


def features2() -> None:
    """The threaded pipeline (Inception-V4) with more reader threads and a deeper decode queue."""
    from r2m.vision.extractors import gpu_decode as G

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n, size, batch = (64, 120, 16) if QUICK else (2048, 500, 128)
    backend = "random_cnn" if QUICK else "inception_v4"
    root = Path(tempfile.mkdtemp())
    for kind in ("noise", "photo"):
        files = write_files(root / kind, n, size, kind)
        for readers, depth in ((4, 2), (16, 2), (16, 4)):
            G.READERS, G.DEPTH = readers, depth
            r = guarded("features2", f"{kind} r{readers} d{depth}", new_files_rate, backend, files, dev, batch, 0,
                        dev.type == "cuda")
            if r:
                emit("features2", what="files_pipeline_gpu_decode", backend=backend, files=kind, readers=readers,
                     depth=depth, images_per_s=r)


# ============================================================================ schedule
KERNEL_CLASSES = (
    ("matmul", ("gemm", "xmma", "cutlass", "cublas", "sm90_", "sm80_", "nvjet", "splitk")),
    ("copy/memset", ("memcpy", "memset", "copy_kernel", "catarraybatchedcopy", "cat_")),
    ("reduction", ("reduce", "norm", "sum_", "max_", "argmax")),
    ("softmax/logsoftmax", ("softmax",)),
    ("optimizer (foreach)", ("multi_tensor", "foreach", "adam")),
    ("index/gather/embedding", ("index", "gather", "scatter", "embedding", "take")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "pointwise")),
)


def kernel_class(name: str) -> str:
    low = name.lower()
    for cls, keys in KERNEL_CLASSES:
        if any(k in low for k in keys):
            return cls
    return "other"


PROFILES: dict[str, dict] = {}


def profile_step(one_step, stage: str) -> dict:
    """One eager step under the profiler: kernels, their summed GPU time per class, the step's wall time."""
    from torch.profiler import ProfilerActivity, profile

    from r2m.training.opcount import top_level_aten

    cuda = torch.cuda.is_available()
    wait = torch.cuda.synchronize if cuda else (lambda: None)
    one_step()
    wait()
    t0 = time.perf_counter()
    one_step()
    wait()
    eager_ms = (time.perf_counter() - t0) * 1e3
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        one_step()
        wait()
    events = list(prof.events())
    kern = [e for e in events if e.device_type.name == "CUDA"]
    by_class: Counter = Counter()
    count_class: Counter = Counter()
    by_name: Counter = Counter()
    for e in kern:
        us = e.time_range.elapsed_us()
        by_class[kernel_class(e.name)] += us
        count_class[kernel_class(e.name)] += 1
        by_name[e.name[:90]] += us
    aten = top_level_aten(events)
    rec = {"kernels_per_step": len(kern), "aten_ops_per_step": sum(aten.values()),
           "kernel_ms": round(sum(by_class.values()) / 1e3, 3), "eager_step_ms": round(eager_ms, 3),
           "ms_by_class": {k: round(v / 1e3, 3) for k, v in by_class.most_common()},
           "kernels_by_class": dict(count_class.most_common()),
           "top_kernels_ms": [(k, round(v / 1e3, 3)) for k, v in by_name.most_common(12)],
           "top_aten": aten.most_common(12)}
    PROFILES[stage] = rec
    return {"kernels": len(kern), "kernel_ms": rec["kernel_ms"], "eager_ms": rec["eager_step_ms"]}


def schedule() -> None:
    from r2m.training import bench_schedule as BS

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    scale = 0.001 if QUICK else float(os.environ.get("R2M_BENCH_SCALE", "0.04"))
    for bf16 in (False, True):
        name = "bf16" if bf16 else "fp32/tf32"
        stage_names = iter(p.name for p in BS.SCHEDULE)
        BS.COUNT_OPS = (lambda step, names=stage_names: profile_step(step, next(names))) if dev == "cuda" else None
        PROFILES.clear()
        r = guarded("schedule", name, BS.run_schedule, dev, scale, bf16=bf16)
        if r is None:
            continue
        for s in r["stages"]:
            emit("schedule", what="stage", dtype=r["dtype"], tf32=r["tf32"], graph=r["graph"], scale=scale,
                 stage=s["stage"], steps=s["steps"], seconds=s["seconds"], per_s=s["per_s"],
                 ms_per_step=s["seconds"] / s["steps"] * 1e3, full_stage_seconds=s["full_stage_seconds"],
                 profile=PROFILES.get(s["stage"]))
        emit("schedule", what="total", dtype=r["dtype"], tf32=r["tf32"], graph=r["graph"],
             full_schedule_seconds=r["full_schedule_seconds"])


if __name__ == "__main__":
    section = sys.argv[1]
    t = time.perf_counter()
    guarded(section, "all", {"env": env, "features": features, "features2": features2, "schedule": schedule}[section])
    print(f"# section {section} done in {time.perf_counter() - t:.1f} s", flush=True)

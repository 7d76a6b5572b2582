"""GPU JPEG decode for feature extraction (``r2m.vision.extractors.gpu_decode``), tested on the CPU:
the tensor twins of the CPU transforms on ``decode_jpeg(device="cpu")`` pixels, the encoded loader
path end to end (with the device check forced open), the per-file CPU fallback (PNG, CMYK, rotated,
truncated, a JPEG the decoder refuses), the switch, and the CPU path left as it was. One test runs
on CUDA only.

Tolerances: ``decode_jpeg`` on the CPU gives PIL's pixels exactly (both libjpeg-turbo, same
settings), and the TF1 resize + crop of ``inception_v4`` is the same float32 formula, so that path
is bit-equal. PIL's own resize is not reproduced bit for bit: PIL resamples in fixed point and
rounds to uint8 between its horizontal and vertical passes, ``interpolate(antialias=True)``
resamples in float and rounds once. Bilinear pixels differ by at most one level; bicubic ones
(whose overshoot PIL clips between the passes) by more on a few pixels: mean < 0.3 level and
< 0.5 % of pixels off by more than one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from r2m.vision.extractors import compute as C
from r2m.vision.extractors import gpu_decode as G
from r2m.vision.extractors.base import ResizeToUint8
from r2m.vision.extractors.factory import build_extractor
from r2m.vision.extractors.tf1 import OfficialResizeCrop
from r2m.vision.images import Encoded, jpeg_frame, load_image, make_loader, read_plain_jpeg

torch.set_num_threads(1)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Three photos of different sizes as JPEG, and a small one (upscaled by the resizes)."""
    from skimage import data

    d = tmp_path_factory.mktemp("photos")
    out = {}
    for name, a in {"coffee": data.coffee(), "astronaut": data.astronaut(), "chelsea": data.chelsea(),
                    "small": data.coffee()[::7, ::5]}.items():
        out[name] = d / f"{name}.jpg"
        Image.fromarray(np.ascontiguousarray(a)).save(out[name], quality=90)
    return out


@pytest.fixture(scope="module")
def odd_files(photos, tmp_path_factory):
    """Files the GPU path must leave to the CPU: PNG, grey PNG, CMYK JPEG, EXIF-rotated JPEG, a
    truncated JPEG, text named .jpg, a lossless-JPEG frame header on baseline data, and a complete
    baseline JPEG with a broken Huffman table, which the decoder refuses."""
    from skimage import data

    d = tmp_path_factory.mktemp("odd")
    good = photos["coffee"].read_bytes()
    Image.fromarray(data.chelsea()).save(d / "chelsea.png")
    Image.fromarray(data.camera()).save(d / "gray.png")
    Image.fromarray(data.chelsea()).convert("CMYK").save(d / "cmyk.jpg", quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90
    Image.fromarray(data.astronaut()).save(d / "rotated.jpg", quality=90, exif=exif)
    (d / "trunc.jpg").write_bytes(good[:4000])
    (d / "text.jpg").write_text("not an image")
    (d / "lossless.jpg").write_bytes(good.replace(b"\xff\xc0", b"\xff\xc3", 1))  # SOF0 -> SOF3
    sos = good.index(b"\xff\xda")
    (d / "refused.jpg").write_bytes(good[:sos] + b"\xff\xc4\x00\x03" + good[sos:])  # an empty DHT segment
    return {p.stem: p for p in sorted(d.iterdir())}


def _pil_opens(path) -> bool:
    """Whether this Pillow reads the file's header. Versions differ on the empty DHT segment of ``refused.jpg``:
    13.0 opens it (its decoder then refuses the data); the GPU machine's Pillow refused it at open."""
    try:
        with Image.open(path):
            return True
    except Exception:
        return False


def _decode_cpu(path):
    return G.decode([path.read_bytes()], CPU)[0]


def test_cpu_decode_gives_pils_pixels(photos):
    for path in photos.values():
        pil = torch.from_numpy(np.asarray(load_image(path)).copy()).permute(2, 0, 1)
        assert torch.equal(_decode_cpu(path), pil), path.name


@pytest.mark.parametrize("size, resample, max_diff", [((224, 224), "bilinear", 1), ((64, 64), "bilinear", 1),
                                                       ((299, 299), "bicubic", None)])
def test_resize_twin_close_to_pil(photos, size, resample, max_diff):
    t = ResizeToUint8(size, resample)
    for path in photos.values():
        cpu = t(load_image(path))
        twin = G.TENSOR_PREP[ResizeToUint8](t, _decode_cpu(path)[None])[0]
        assert twin.dtype == cpu.dtype == torch.uint8 and twin.shape == cpu.shape == (3, *size)
        diff = (twin.float() - cpu.float()).abs()
        if max_diff is not None:
            assert diff.max() <= max_diff, path.name
        assert diff.mean() < 0.3 and (diff > 1).float().mean() < 0.005, path.name


def test_official_resize_crop_twin_is_exact(photos):
    for t in (OfficialResizeCrop(), OfficialResizeCrop(320, 256)):
        for path in photos.values():
            cpu = t(load_image(path))
            twin = G.TENSOR_PREP[OfficialResizeCrop](t, _decode_cpu(path)[None])[0]
            assert twin.dtype == cpu.dtype == torch.float32 and torch.equal(twin, cpu), path.name


def test_read_plain_jpeg_only_takes_what_needs_no_cpu_work(photos, odd_files):
    for path in photos.values():
        data, size = read_plain_jpeg(path)
        assert data == path.read_bytes() and size == load_image(path).size
    gray = odd_files["gray"].parent / "gray.jpg"
    Image.open(odd_files["gray"]).save(gray)
    assert read_plain_jpeg(gray) is not None
    assert read_plain_jpeg(photos["small"], min_side=1000) is None
    # a plain header (the decoder finds the fault), where this Pillow reads it
    assert (read_plain_jpeg(odd_files["refused"]) is not None) == _pil_opens(odd_files["refused"])
    for name in ("chelsea", "gray", "cmyk", "rotated", "trunc", "text", "lossless"):
        assert read_plain_jpeg(odd_files[name]) is None, name
    assert read_plain_jpeg(odd_files["text"].parent / "missing.jpg") is None


def test_switch_and_devices(monkeypatch):
    monkeypatch.delenv(G.ENV, raising=False)
    assert G.wanted(torch.device("cuda"))[0] is True
    assert G.wanted(CPU)[0] is False and G.wanted(CPU, True)[0] is False
    assert G.wanted(torch.device("cuda"), False)[0] is False
    monkeypatch.setenv(G.ENV, "0")
    on, why = G.wanted(torch.device("cuda"))
    assert not on and "R2M_GPU_DECODE=0" in why
    assert G.wanted(torch.device("cuda"), True)[0] is True  # an explicit choice (bench) wins


def test_every_backend_transform_has_a_twin():
    for name, opts in {"random_cnn": {}, "vgg16": {"random_init": True}, "inception_v4": {"random_init": True},
                       "inception_v3_fid": {}}.items():
        with pytest.warns(UserWarning) if name in ("vgg16", "inception_v4") else _nothing():
            ex = build_extractor(name, opts)
        assert G.tensor_prep(ex) is not None, name
    ex = build_extractor("random_cnn", {})
    ex.transform = lambda img: torch.zeros(3, 4, 4, dtype=torch.uint8)  # unknown transform: CPU decode
    assert G.tensor_prep(ex) is None


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _features(files, monkeypatch, gpu_path: bool, backend="random_cnn", options=None):
    """extract_arrays on the CPU, with the GPU decode path forced open when ``gpu_path``."""
    if gpu_path:
        monkeypatch.setattr(G, "wanted", lambda device, enabled=None: (True, "forced by the test"))
    ex = build_extractor(backend, options or {})
    out = C.extract_arrays(ex, [str(f) for f in files], batch_size=3, device="cpu", show=False)
    monkeypatch.undo()
    return out


def test_jpeg_frame():
    good = b"\xff\xd8\xff\xe0\x00\x04ab\xff\xff\xc2\x00\x0b\x08rest"
    assert jpeg_frame(good) == (0xC2, 8)
    assert jpeg_frame(b"\xff\xd8\xff\xda\x00\x02\xff\xc0\x00\x0b\x08") is None  # scan before the frame
    assert jpeg_frame(b"\xff\xd8\x00\x00") is None and jpeg_frame(b"\xff\xd8\xff\xc4\x00\x02") is None


def test_a_file_the_decoder_refuses_is_loaded_on_the_cpu(photos, monkeypatch):
    """Any file ``decode`` gives up on goes through load_image + the CPU transform (same features)."""
    files = [photos["coffee"], photos["astronaut"]]
    a, good_a, _ = _features(files, monkeypatch, gpu_path=False)
    monkeypatch.setattr(G, "decode", lambda datas, device: [None] * len(datas))
    b, good_b, _ = _features(files, monkeypatch, gpu_path=True)
    assert good_a == good_b == [0, 1] and np.array_equal(a["pooled"], b["pooled"])


def test_encoded_path_end_to_end_with_fallbacks(photos, odd_files, monkeypatch):
    files = [photos["coffee"], odd_files["chelsea"], odd_files["trunc"], photos["astronaut"], odd_files["cmyk"],
             odd_files["refused"], odd_files["text"], photos["small"], odd_files["rotated"], odd_files["gray"],
             odd_files["lossless"]]
    (a_cpu, good_cpu, bad_cpu) = _features(files, monkeypatch, gpu_path=False, options={"size": 96})
    (a_gpu, good_gpu, bad_gpu) = _features(files, monkeypatch, gpu_path=True, options={"size": 96})
    assert good_gpu == good_cpu == [0, 1, 3, 4, 7, 8, 9]
    assert bad_gpu == bad_cpu and [p for p, _ in bad_cpu] == [2, 5, 6, 10]
    reasons = dict(bad_gpu)
    assert "truncated" in reasons[2] and "not a recognised" in reasons[6]
    assert reasons[5].startswith("unreadable" if _pil_opens(odd_files["refused"]) else "not a recognised")
    assert reasons[10].startswith("unreadable")
    x, y = a_cpu["pooled"].astype(np.float32), a_gpu["pooled"].astype(np.float32)
    cpu_rows = [good_cpu.index(i) for i in (1, 4, 8, 9)]  # not plain JPEG: prepared by the CPU transform
    assert np.array_equal(x[cpu_rows], y[cpu_rows])
    jpeg_rows = [good_cpu.index(i) for i in (0, 3, 7)]  # decoded + resized by the tensor twin
    rel = np.abs(x[jpeg_rows] - y[jpeg_rows]).max() / np.abs(x[jpeg_rows]).max()
    assert 0 < rel < 0.02  # resize rounding only (module docstring); not bit-equal


def test_official_preprocessing_features_equal_on_the_encoded_path(photos, monkeypatch):
    files = [photos["coffee"], photos["small"]]
    opts = {"random_init": True, "kinds": ["pooled"]}
    with pytest.warns(UserWarning):
        a, good_a, _ = _features(files, monkeypatch, gpu_path=False, backend="inception_v4", options=opts)
    with pytest.warns(UserWarning):
        b, good_b, _ = _features(files, monkeypatch, gpu_path=True, backend="inception_v4", options=opts)
    assert good_a == good_b == [0, 1] and np.array_equal(a["pooled"], b["pooled"])


def test_cpu_path_unchanged(photos, monkeypatch):
    """On the CPU the loader never hands out encoded bytes (even with R2M_GPU_DECODE=1), and the
    features are the CPU transform's, bit for bit."""
    monkeypatch.setenv(G.ENV, "1")
    files = [str(photos["coffee"]), str(photos["chelsea"])]
    ex = build_extractor("random_cnn", {})
    seen = []
    real = C.make_loader

    def spy(*args, **kw):
        seen.append(kw.get("encoded", False))
        return real(*args, **kw)

    monkeypatch.setattr(C, "make_loader", spy)
    arrays, good, bad = C.extract_arrays(ex, files, batch_size=2, device="cpu", show=False, gpu_decode=True)
    assert seen == [False] and good == [0, 1] and bad == []
    x = torch.stack([ex.prepare(load_image(f)) for f in files])
    with torch.inference_mode():
        ref = ex.model(x)["pooled"].float().numpy().astype(np.float16)
    assert np.array_equal(arrays["pooled"], ref)


def test_encoded_loader_items(photos, odd_files):
    ex = build_extractor("random_cnn", {})
    batches = list(make_loader([photos["coffee"], odd_files["chelsea"], odd_files["text"]], ex.prepare, 3,
                               encoded=True))
    (b,) = batches
    assert b.indices == [0, 1] and [p for p, _ in b.bad] == [2]
    assert isinstance(b.data[0], Encoded) and isinstance(b.data[1], torch.Tensor)
    assert b.sizes == [(600, 400), (451, 300)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (nvjpeg decode)")
def test_cuda_decode_close_to_cpu_path(photos, odd_files):
    """On CUDA: nvjpeg's pixels are not libjpeg's (different IDCT / upsampling), so features are close,
    not equal; the fallbacks give the CPU path's bad list."""
    files = [str(p) for p in (*photos.values(), odd_files["chelsea"], odd_files["trunc"], odd_files["refused"],
                              odd_files["lossless"])]
    ex = build_extractor("random_cnn", {"size": 96})
    a, good_a, bad_a = C.extract_arrays(ex, files, 4, "cuda", show=False, gpu_decode=False)
    b, good_b, bad_b = C.extract_arrays(ex, files, 4, "cuda", show=False, gpu_decode=True)
    assert good_a == good_b and [p for p, _ in bad_a] == [p for p, _ in bad_b]
    x, y = a["pooled"].astype(np.float32), b["pooled"].astype(np.float32)
    assert np.abs(x - y).max() / np.abs(x).max() < 0.05


def test_bench_features_files_prints_images_per_s(capsys):
    from r2m.bench import features as B

    assert B.main(["--files", "--backends", "random_cnn", "--images", "4", "--batch", "2", "--size", "40",
                   "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("random_cnn"))
    assert "files(w=0,cpu)" in row and float(row.split()[-1]) > 0


# ----------------------------------------------------------------------------- the pipeline (threads)
def test_read_ahead_keeps_order_and_its_bound():
    """Results in index order whatever order the threads finish in; no call starts more than
    ``ahead`` places beyond the one being returned; inline with 0 threads."""
    import random
    import threading
    import time

    from r2m.vision.images import read_ahead

    started: list[int] = []
    lock = threading.Lock()
    delays = [random.Random(i).random() * 0.004 for i in range(40)]

    def fn(i):
        with lock:
            started.append(i)
        time.sleep(delays[i])
        return i * i

    got = []
    for k, v in enumerate(read_ahead(fn, 40, threads=4, ahead=5)):
        with lock:
            assert max(started) <= k + 5  # the bound: at most 5 submitted beyond the one returned
        got.append(v)
    assert got == [i * i for i in range(40)] and sorted(started) == list(range(40))
    assert list(read_ahead(lambda i: -i, 3, threads=0, ahead=1)) == [0, -1, -2]


def test_read_ahead_closed_early_starts_no_more():
    from r2m.vision.images import read_ahead

    started = []
    it = read_ahead(lambda i: started.append(i) or i, 1000, threads=2, ahead=3)
    assert [next(it), next(it)] == [0, 1]
    it.close()
    assert len(started) <= 2 + 3 + 1  # the returned ones, the window, one in flight at most
    assert not [t for t in __import__("threading").enumerate() if t.name.startswith("r2m-read")]


def test_threaded_batches_equal_the_encoded_loader(photos, odd_files):
    """The thread reader yields the encoded DataLoader's batches: positions, bad entries, sizes, data."""
    from r2m.vision.images import threaded_batches

    ex = build_extractor("random_cnn", {})
    files = [photos["coffee"], odd_files["chelsea"], odd_files["text"], photos["small"], odd_files["trunc"],
             odd_files["cmyk"], photos["astronaut"]]
    ref = list(make_loader(files, ex.prepare, 3, encoded=True))
    for threads in (0, 3):
        got = list(threaded_batches(files, ex.prepare, 3, threads))
        assert [b.indices for b in got] == [b.indices for b in ref] == [[0, 1], [3, 5], [6]]
        assert [b.bad for b in got] == [b.bad for b in ref] and [b.sizes for b in got] == [b.sizes for b in ref]
        for g, r in zip(got, ref, strict=True):
            for a, b in zip(g.data, r.data, strict=True):
                assert (a == b) if isinstance(a, Encoded) else torch.equal(a, b)


def test_background_order_errors_and_early_close():
    import threading

    assert list(G.background(lambda: iter(range(7)), depth=2)) == list(range(7))

    def failing():
        yield 1
        raise ValueError("boom in the decode thread")

    it = G.background(failing)
    assert next(it) == 1
    with pytest.raises(ValueError, match="boom in the decode thread"):
        next(it)

    closed = threading.Event()

    def endless():
        try:
            k = 0
            while True:
                yield k
                k += 1
        finally:
            closed.set()

    it = G.background(endless, depth=2, name="r2m-test-bg")
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()  # stops the producer, which closes its generator, before returning
    assert closed.is_set() and not [t for t in threading.enumerate() if t.name == "r2m-test-bg"]


def test_pipeline_equals_batch_by_batch_decoding(photos, odd_files, monkeypatch):
    """extract_arrays' GPU pipeline (reader threads + decode thread; here on the CPU) gives what the
    plain loop over the encoded loader's batches and ``device_batch`` gives: same rows, bits, bad list."""
    files = [str(f) for f in (photos["coffee"], odd_files["trunc"], odd_files["chelsea"], photos["astronaut"],
                              odd_files["refused"], photos["small"], odd_files["rotated"], photos["chelsea"])]
    ex = build_extractor("random_cnn", {"size": 64})
    prep = G.tensor_prep(ex)
    rows, good, bad = [], [], []
    for batch in make_loader(files, ex.prepare, 3, encoded=True):
        bad.extend(batch.bad)
        x, idx, more_bad, _ = G.device_batch(ex, prep, batch, files, CPU)
        bad.extend(more_bad)
        if idx:
            rows.append(C.features_of_batch(ex, ex.model, x, CPU)["pooled"])
            good.extend(idx)
    monkeypatch.setattr(G, "wanted", lambda device, enabled=None: (True, "forced by the test"))
    a, good_p, bad_p = C.extract_arrays(ex, files, batch_size=3, device="cpu", workers=2, show=False)
    assert good_p == good == [0, 2, 3, 5, 6, 7]
    assert bad_p == sorted(bad) and [p for p, _ in bad_p] == [1, 4]
    assert np.array_equal(a["pooled"], np.concatenate(rows))

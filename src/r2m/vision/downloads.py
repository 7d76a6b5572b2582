"""Which detector and feature backends fetch something from the network, with which options.

:func:`download_of` answers with what a backend would fetch (a URL or a hub name), or ``None`` when
it needs nothing from the network: weights shipped in an installed package, a local file named in its
options, random weights, detections read from a file. :func:`local_copy` says where a backend finds
a file it would otherwise download (torch's hub cache, r2m's cache): once there, loading it opens no
connection. The stage runner lets an instance reach the network only when its params name a download
(:mod:`r2m.pipeline.network`); a model folder's ``inference.json`` may name a backend that downloads
only when what it would fetch is already on this machine (:mod:`r2m.captioning.settings`).

This module imports nothing of r2m's heavy parts (the runner reads it for every stage).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

# the pinned releases of the paper's detector (backend tf_oid, ``options.source``)
TF_OID_SOURCES = {
    "hub": "https://tfhub.dev/google/faster_rcnn/openimages_v4/inception_resnet_v2/1?tf-hub-format=compressed",
    "zoo": "http://download.tensorflow.org/models/object_detection/"
           "faster_rcnn_inception_resnet_v2_atrous_oid_v4_2018_12_12.tar.gz",
}
OWL_DEFAULT_MODEL = "google/owlv2-base-patch16-ensemble"
FASTER_RCNN_DEFAULT_ARCH = "fasterrcnn_resnet50_fpn"
TIMM_INCEPTION_V4 = "timm's inception_v4.tf_in1k from the Hugging Face hub"


def url_file_name(url: str) -> str:
    """The file name a download of ``url`` is kept under (r2m's cache)."""
    parsed = urlparse(url)
    name = Path(parsed.path).name or "download"
    if "tf-hub-format=compressed" in parsed.query and not name.endswith((".tar.gz", ".tgz")):
        name += ".tar.gz"  # TF Hub serves a gzipped tar for ?tf-hub-format=compressed
    return name


def _parts(kind: str, backend: Any, options: Mapping[str, Any]) -> list[tuple[Any, Mapping[str, Any]]]:
    """The backends a combined one is made of, with their options (``offline``'s ``parts``; ``kinds_from``)."""
    out: list[tuple[Any, Mapping[str, Any]]] = []
    if kind == "detector" and backend == "offline":
        for part in options.get("parts") or ():
            sub = options.get(part) if isinstance(part, str) else None
            out.append((part, sub if isinstance(sub, Mapping) else {}))
    if kind == "features":
        for spec in (options.get("kinds_from") or {}).values():
            if isinstance(spec, Mapping):
                sub = spec.get("options")
                out.append((spec.get("backend"), sub if isinstance(sub, Mapping) else {}))
    return out


def _own(kind: str, backend: Any, options: Mapping[str, Any]) -> str | None:
    """What ``backend`` itself (not its parts) would download."""
    if kind == "detector":
        if backend == "faster_rcnn" and not options.get("checkpoint") and not options.get("random_init"):
            return f"torchvision's COCO weights of {options.get('arch', FASTER_RCNN_DEFAULT_ARCH)}"
        if backend == "tf_oid" and not options.get("model"):
            source = str(options.get("source", "zoo"))
            return TF_OID_SOURCES.get(source, source)
        if backend == "owl" and options.get("allow_download"):
            return f"{options.get('model') or OWL_DEFAULT_MODEL} from the Hugging Face hub"
        return None
    if backend == "inception_v4" and not options.get("weights") and not options.get("random_init"):
        return TIMM_INCEPTION_V4
    return None


def local_copy(kind: str, backend: Any, options: Mapping[str, Any]) -> Path | None:
    """The file where ``backend`` looks before downloading what :func:`download_of` names (None: it
    asks the network even for a copy it has, or it downloads nothing)."""
    if kind == "detector" and backend == "faster_rcnn":
        import torch
        import torchvision

        arch = str(options.get("arch", FASTER_RCNN_DEFAULT_ARCH))
        try:
            url = str(torchvision.models.get_model_weights(arch).DEFAULT.url)
        except (ValueError, AttributeError, KeyError):
            return None
        return Path(torch.hub.get_dir()) / "checkpoints" / url_file_name(url)
    if kind == "detector" and backend == "tf_oid":
        source = str(options.get("source", "zoo"))
        folder = cache_root(str(options["cache_dir"]) if options.get("cache_dir") else None)
        return folder / "detectors" / url_file_name(TF_OID_SOURCES.get(source, source))
    return None  # owl, inception_v4: the Hugging Face hub is asked even when its cache holds the files


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where downloads go: ``cache_dir``, else ``$R2M_CACHE``, else ``~/.cache/r2m``."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("R2M_CACHE") or Path.home() / ".cache" / "r2m").expanduser()


def download_of(kind: str, backend: Any, options: Mapping[str, Any] | None, cached: bool = False,
                parts: bool = True) -> str | None:
    """What ``backend`` (``kind``: ``"detector"`` or ``"features"``) with ``options`` would download, the
    parts of a combined backend included (unless ``parts`` is false), or None when it needs nothing from
    the network. ``cached``: also None when the file it would fetch is already where it looks first
    (:func:`local_copy`)."""
    options = options if isinstance(options, Mapping) else {}
    what = _own(kind, backend, options)
    if what is not None and cached:
        local = local_copy(kind, backend, options)
        if local is not None and local.is_file():
            what = None
    if what is not None or not parts:
        return what
    for part, sub in _parts(kind, backend, options):
        found = download_of(kind, part, sub, cached)
        if found:
            return found
    return None

"""The download stages: the stage instances the runner lets reach the network.

Every other instance runs under the network guard (:class:`r2m.utils.netguard.NetworkGuard`): an
attempt to look up a host, connect or fetch a URL fails the stage in one line naming what tried. An
instance may download only when its own params say so:

``prepare``
    the public raw sources of a paper benchmark (a recipe with the ``download`` option,
    ``datasets/benchmarks.py``), unless its catalog entry says ``download: false``;
``detect_concepts``
    a detector backend that fetches its weights (:func:`r2m.vision.downloads.download_of`):
    ``tf_oid`` without ``options.model``, ``faster_rcnn`` without ``options.checkpoint``, ``owl`` with
    ``options.allow_download: true``;
``extract_features``, ``extract_features_sup``
    ``inception_v4`` without ``options.weights`` (timm's copy from the Hugging Face hub).
"""

from __future__ import annotations

from typing import Any

from r2m.vision.downloads import download_of

FEATURE_SECTIONS = {"extract_features": "extract_features", "extract_features_sup": "sup_features"}


def downloads(stage: str, params: Any, dataset: str | None) -> str | None:
    """What the instance of ``stage`` may download (a line for its log), or None: it runs guarded.
    ``params``: the instance's params view (:func:`r2m.params.for_dataset`)."""
    if stage == "prepare" and dataset is not None:
        from r2m.catalogs import RECIPES

        entry = params.catalog.get(dataset)
        if entry is None or entry.kind not in RECIPES or "download" not in RECIPES[entry.kind].keys \
                or (entry.model_extra or {}).get("download", True) is False:
            return None
        return f"the raw sources of catalog.{dataset} (kind {entry.kind}) that are not on disk"
    if stage == "detect_concepts":
        det = params.detect_concepts
        return download_of("detector", det.backend, det.options)
    if stage in FEATURE_SECTIONS:
        feats = getattr(params, FEATURE_SECTIONS[stage])
        return download_of("features", feats.backend, feats.options)
    return None


def guard_for(stage: str, params: Any, dataset: str | None):
    """``(guard, what)``: a :class:`NetworkGuard` for a guarded instance, a do-nothing stand-in and the
    line saying what it may download for a download stage's."""
    from r2m.utils.netguard import NetworkGuard, NoGuard

    what = downloads(stage, params, dataset)
    return (NoGuard(), what) if what else (NetworkGuard(), None)

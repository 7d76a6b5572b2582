"""Building the chosen feature backend by name (:data:`r2m.catalogs.FEATURE_BACKENDS`; its module imported
now)."""

from __future__ import annotations

from typing import Any

from r2m.catalogs import FEATURE_BACKENDS
from r2m.vision.extractors.base import Extractor


def build_extractor(backend: str, options: dict[str, Any] | None = None) -> Extractor:
    """The backend ``backend`` built with ``options`` (unknown name: ``KeyError`` naming the known
    ones); ``options.kinds_from`` takes some kinds from other backends (``combined.py``)."""
    options = dict(options or {})
    if options.get("kinds_from"):
        from r2m.vision.extractors.combined import build_combined  # only a combined backend loads it

        return build_combined(lambda b, o: FEATURE_BACKENDS.load(b)(o), backend, options)
    return FEATURE_BACKENDS.load(backend)(options)

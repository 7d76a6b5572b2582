"""Progress bars that do not flood logs: on a terminal a live bar, otherwise a line every
``R2M_PROGRESS_SECONDS`` (default 30) seconds."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm.auto import tqdm

from r2m.utils.guard import env_number

T = TypeVar("T")


def progress(iterable: Iterable[T] | None = None, **kwargs: Any) -> tqdm:
    interactive = sys.stderr.isatty()
    kwargs.setdefault("dynamic_ncols", True)
    kwargs.setdefault("disable", os.environ.get("R2M_NO_PROGRESS") == "1")
    if not interactive:
        kwargs.setdefault("mininterval", env_number("R2M_PROGRESS_SECONDS", 30.0, float, 0))
        kwargs.setdefault("ascii", True)
    return tqdm(iterable, **kwargs)

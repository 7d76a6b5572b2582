"""``@no_grad``: :func:`torch.no_grad` for a function, torch imported when the function is called
rather than when its module is imported.

Importing torch costs about 1.3 CPU s, paid by every job of the DAG that imports it. A stage module
whose functions run under ``no_grad`` but whose quick paths (a skipped baseline, a model with
nothing to inspect) need no tensor can then be imported without torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def no_grad(fn: F) -> F:
    """``fn`` run under ``torch.no_grad()`` (a plain function, not a generator)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.no_grad():
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]

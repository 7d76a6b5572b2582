"""Backend options: a small dataclass per backend, filled from the free-form ``options`` mapping of a
stage's params, and optional heavy dependencies ("extras") imported with a one-line hint.

``parse_options(Config, options, "detect_concepts.options (backend x)")`` rejects unknown keys and
values of the wrong type with a message naming the key; ``require(module, extra, what)`` imports an
optional dependency or raises :class:`MissingExtraError` saying what to install.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from typing import Any, TypeVar

C = TypeVar("C")

# extra name -> what to run to get it (pyproject's optional dependencies)
EXTRAS = {
    "tf": "pip install -e '.[tf]'  (or: make setup-tf)",
    "owl": "pip install -e '.[owl]'  (or: make setup-owl)",
}


class MissingExtraError(ImportError):
    """An optional dependency of a backend is not installed; the message says what to install."""


def require(module: str, extra: str, what: str) -> Any:
    """Import ``module`` or raise :class:`MissingExtraError` (one line: what needs it, how to install)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtraError(
            f"{what} needs the optional extra '{extra}' ({module} is not importable: {err}); "
            f"install it with: {EXTRAS.get(extra, f'pip install -e .[{extra}]')}"
        ) from None


def _check(value: Any, tp: Any, key: str, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check(value, arg, key, where)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(errors[0] if errors else f"{where}: bad value for {key!r}")
    if tp is Any:
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where}: {key} must be a list, got {value!r}")
        (inner, *_) = typing.get_args(tp) or (Any,)
        return [_check(v, inner, key, where) for v in value]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: {key} must be a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {key} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: {key} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}: {key} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ValueError(f"{where}: {key} must be a string, got {value!r}")
        return str(value)
    return value


def parse_options(cls: type[C], options: dict[str, Any] | None, where: str) -> C:
    """``cls(**options)`` for a dataclass ``cls``, with unknown keys and wrong types reported by name."""
    options = dict(options or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {unknown}; known: {', '.join(sorted(fields))}")
    hints = typing.get_type_hints(cls)
    values = {k: _check(v, hints[k], k, where) for k, v in options.items()}
    obj = cls(**values)
    check = getattr(obj, "validate", None)
    if callable(check):
        check(where)
    return obj

"""What a scan of r2m's own source files found, kept on disk under the files' content.

Params validation reads registrations from the source (:func:`r2m.utils.registry.declared_names`,
:func:`r2m.utils.declared.declared_keys`) instead of importing backends: some 40 files parsed
into syntax trees and walked, about 0.1 CPU s that every ``r2m`` job of the DAG paid again (issue
33). :func:`cached_scan` keeps the result in ``$R2M_CACHE`` (or ``~/.cache/r2m``) under
``source-scans/<key>.json``, the key a SHA-256 of the scan's name, its arguments and the path and
bytes of every file it reads — a file edited, added or removed is another key, so an entry is
never stale. Only scans of files inside the installed package are kept (a test's temporary
sources are scanned each time); an entry that cannot be read or does not have the expected shape
is ignored and written again, a cache that cannot be written is not used. Errors are never kept.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from r2m.utils.io import write_json

FORMAT = 1  # bump when a scan's result changes meaning
_PACKAGE = Path(__file__).resolve().parents[1]  # src/r2m


def cache_root() -> Path:
    """r2m's cache folder: ``$R2M_CACHE``, else ``~/.cache/r2m``."""
    return Path(os.environ.get("R2M_CACHE") or Path.home() / ".cache" / "r2m").expanduser()


def _key(name: str, args: Any, files: Sequence[Path]) -> str | None:
    h = hashlib.sha256(json.dumps([FORMAT, name, args]).encode())
    for f in files:
        path = f.resolve()
        if not path.is_relative_to(_PACKAGE):
            return None
        h.update(b"\0" + str(path).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def cached_scan(name: str, args: Any, files: Sequence[Path], scan: Callable[[], Any],
                valid: Callable[[Any], bool]) -> Any:
    """``scan()`` (a JSON value), or what it returned before for the same ``name``, ``args``
    (JSON) and file contents; ``valid`` checks a stored value's shape."""
    try:
        key = _key(name, args, files)
    except OSError:  # a file vanished while listed: the scan says what it says
        key = None
    if key is None:
        return scan()
    entry = cache_root() / "source-scans" / f"{key}.json"
    try:
        value = json.loads(entry.read_text(encoding="utf-8"))
        if valid(value):
            return value
    except (OSError, ValueError):
        pass
    value = scan()
    try:
        write_json(entry, value, indent=None)  # atomic: a reader never sees half an entry
    except OSError:  # read-only home, disk full: the scan's result is still good
        pass
    return value


def is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)

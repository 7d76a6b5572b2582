"""Checks of inputs nobody vetted: numbers from the environment, paths derived from names, a full disk.

Every check raises :class:`BadInput` (a ``ValueError``) with one line naming the variable, option
or path, so a command can print it as it is (``r2m <command>: <message>``) instead of a traceback.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)

# The files of a user's folder that are photos (suffix in any case): those ``r2m caption FOLDER`` captions and
# those a ``folder`` dataset lists (r2m.datasets.folder.list_images). PIL opens every one of them.
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})


class BadInput(ValueError):
    """An input (environment variable, option, path) that cannot be used; the message is one line."""


def parse_number(text: str, what: str, kind: type = int, minimum: float | None = None) -> int | float:
    """``text`` as ``kind`` (``int`` or ``float``, finite) ``>= minimum``; :class:`BadInput` naming ``what``."""
    noun = "an integer" if kind is int else "a number"
    bound = "" if minimum is None else f" >= {minimum:g}"
    try:
        value = kind(str(text).strip())
    except ValueError:
        raise BadInput(f"{what}={text!r}: expected {noun}{bound}") from None
    if value != value or value in (float("inf"), float("-inf")) or (minimum is not None and value < minimum):
        raise BadInput(f"{what}={text!r}: expected {noun}{bound}")
    return value


def env_number(name: str, default: int | float, kind: type = int, minimum: float | None = None) -> int | float:
    """The environment variable ``name`` parsed by :func:`parse_number` (``default`` when unset or empty)."""
    raw = os.environ.get(name, "")
    return default if raw.strip() == "" else parse_number(raw, name, kind, minimum)


def inside(root: str | Path, path: str | Path, what: str = "path") -> Path:
    """``root / path`` when ``path`` is relative and stays inside ``root`` once ``..`` are folded;
    else :class:`BadInput`. Lexical on purpose: a ``data/`` that is a link to another disk is fine.

    Guards every path built from a name someone else wrote (catalog names, axis values)."""
    rel = os.path.normpath(str(path))
    if os.path.isabs(rel) or rel == ".." or rel.startswith(".." + os.sep):
        raise BadInput(f"{what} {str(path)!r} leaves its folder {str(root)!r}")
    return Path(root) / path


def is_disk_full(err: BaseException) -> bool:
    """An ``OSError`` saying the disk (or the file-size limit, ``ulimit -f``, or a quota) is full."""
    return isinstance(err, OSError) and err.errno in DISK_FULL


def disk_full_message(err: OSError) -> str:
    """One line naming the path and saying "disk full"."""
    where = err.filename2 or err.filename or "an output file"  # copies: filename2 is the target
    return f"disk full writing {where} ({os.strerror(err.errno) if err.errno else err}); nothing finished was replaced"


def os_error_line(err: OSError) -> str:
    """One line naming what failed and the path(s): ``Not a directory: logs/prepare``."""
    where = " -> ".join(str(f) for f in (err.filename, err.filename2) if f is not None)
    return f"{err.strerror or err}: {where}" if where else str(err)


def not_a_file(path: Path) -> str | None:
    """Why ``path`` cannot be read as a regular file (missing, a link loop, a FIFO/device), or None."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "symbolic link loop"
        return "no such file or folder" if err.errno == errno.ENOENT else (err.strerror or str(err))
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    return f"not a regular file ({kind})"

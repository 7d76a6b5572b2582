"""Streaming corpus reading, sentence filters and the deterministic held-out split.

A corpus file is UTF-8 text, one sentence per line. Lines are read as bytes and decoded one at a
time so a bad byte is reported with its file and line number; empty (whitespace-only) lines are
skipped and counted. Nothing holds the whole corpus in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from r2m.utils.registry import Registry


class CorpusError(ValueError):
    """Bad corpus input; the message starts with ``file:line``."""


@dataclass
class ReadStats:
    lines: int = 0
    empty: int = 0
    bad_utf8: int = 0
    bad_lines: list[int] = field(default_factory=list)  # first few skipped line numbers

    def as_dict(self) -> dict[str, int | list[int]]:
        return {"lines": self.lines, "empty": self.empty, "bad_utf8": self.bad_utf8, "bad_lines": self.bad_lines[:20]}


def _physical_lines(fh) -> Iterator[bytes]:
    """The lines of a binary file whatever its line ends (``\\n``, ``\\r\\n``, or a lone ``\\r`` as
    in old Mac files, which would otherwise glue every sentence into one), without a leading UTF-8 BOM."""
    first = True
    for raw in fh:
        if first and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        first = False
        body = raw[:-1] if raw.endswith(b"\n") else raw
        body = body[:-1] if body.endswith(b"\r") else body
        yield from body.split(b"\r")


def read_lines(path: str | Path, stats: ReadStats | None = None, errors: str = "raise") -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, sentence)`` (1-based) for the non-empty lines of ``path``.

    ``errors="raise"`` (default) stops at the first line that is not valid UTF-8 with a
    :class:`CorpusError` naming file and line; ``errors="skip"`` skips and counts it in ``stats``.
    """
    if errors not in ("raise", "skip"):
        raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
    path = Path(path)
    stats = stats if stats is not None else ReadStats()
    if not path.exists():
        raise FileNotFoundError(f"corpus file missing: {path}")
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(_physical_lines(fh), 1):
            stats.lines = lineno
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                if errors == "raise":
                    raise CorpusError(f"{path}:{lineno}: not valid UTF-8 (byte {err.start}: {err.reason})") from None
                stats.bad_utf8 += 1
                stats.bad_lines.append(lineno)
                continue
            text = text.strip()
            if not text:
                stats.empty += 1
                continue
            yield lineno, text


# --------------------------------------------------------------------------- filters
@dataclass(frozen=True)
class FilterConfig:
    min_tokens: int = 1
    max_tokens: int = 40
    require_concept: bool = True
    count_specials: bool = False  # lengths count <S> and </S> (the official ">= 10 tokens")

    def length(self, tokens: list[str]) -> int:
        return len(tokens) + (2 if self.count_specials else 0)


# a filter is (tokens, concepts, cfg) -> True when the sentence must be dropped; applied in name order
SentenceFilter = Callable[[list[str], list[str], FilterConfig], bool]
FILTERS: Registry[SentenceFilter] = Registry("sentence filter")


@FILTERS.register("too_short")
def _too_short(tokens: list[str], concepts: list[str], cfg: FilterConfig) -> bool:
    return cfg.length(tokens) < cfg.min_tokens


@FILTERS.register("too_long")
def _too_long(tokens: list[str], concepts: list[str], cfg: FilterConfig) -> bool:
    return cfg.length(tokens) > cfg.max_tokens


@FILTERS.register("no_concept")
def _no_concept(tokens: list[str], concepts: list[str], cfg: FilterConfig) -> bool:
    return cfg.require_concept and not concepts


def drop_reason(tokens: list[str], concepts: list[str], cfg: FilterConfig) -> str | None:
    """Name of the first filter that rejects the sentence (``too_short``, ``too_long``, ``no_concept``) or None."""
    for name in FILTERS.names():
        if FILTERS.get(name)(tokens, concepts, cfg):
            return name
    return None


# --------------------------------------------------------------------------- held-out split
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a fast, well-mixed, platform-independent integer hash."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
        return x ^ (x >> np.uint64(31))


def holdout_mask(indices: np.ndarray | list[int], holdout: float, seed: int = 0) -> np.ndarray:
    """Boolean array: True where sentence ``index`` goes to ``val``.

    ``hash(index, seed) / 2**64 < holdout`` — depends only on the sentence's index (its line
    number in ``corpus.txt``) and the seed, not on chunking, filtering or the machine.
    """
    idx = np.asarray(indices, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = _mix64(idx ^ _mix64(np.full(idx.shape, seed, dtype=np.uint64)))
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53) < holdout


def split_of(index: int, holdout: float, seed: int = 0) -> str:
    return "val" if bool(holdout_mask([index], holdout, seed)[0]) else "train"

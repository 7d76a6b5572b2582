"""Argument parsers shared by the commands and the benchmarks, below every package that uses them, and the
argparse types that check a value before any work: a number in its range, a comma-separated list of numbers or
of known names. A bad value is one line naming the option (``r2m bench plan: argument --runs: expected an
integer from 1 to 1000, got '0' (see --help)``)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterable

DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d{1,3})?")


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``r2m <command>: argument --x: why (see --help)``."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: {' '.join(message.split())} (see --help)\n")


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _range(lo: float | None, hi: float | None, open_lo: bool = False, open_hi: bool = False) -> str:
    low = "" if lo is None else f"{'above' if open_lo else 'at least'} {_num(lo)}"
    high = "" if hi is None else f"{'below' if open_hi else 'at most'} {_num(hi)}"
    return ", ".join(x for x in (low, high) if x)


def int_in(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer from ``lo`` to ``hi`` (either bound may be None)."""

    def parse(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            value = None
        if value is None or (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected an integer {_range(lo, hi)}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def float_in(lo: float | None = None, hi: float | None = None, open_lo: bool = False,
             open_hi: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number from ``lo`` to ``hi`` (each excluded when ``open_lo`` / ``open_hi``)."""

    def parse(text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            value = math.nan
        bad = not math.isfinite(value) or (lo is not None and (value <= lo if open_lo else value < lo)) \
            or (hi is not None and (value >= hi if open_hi else value > hi))
        if bad:
            raise argparse.ArgumentTypeError(f"expected a number {_range(lo, hi, open_lo, open_hi)}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def list_of(item: Callable[[str], float], empty: bool = False, most: int = 1000) -> Callable[[str], list]:
    """argparse type: a comma-separated list, each item checked by ``item`` (:func:`int_in`, :func:`float_in`);
    ``empty``: an empty list is allowed."""

    def parse(text: str) -> list:
        items = [s.strip() for s in str(text).split(",") if s.strip()]
        if not items and not empty:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        if len(items) > most:
            raise argparse.ArgumentTypeError(f"at most {most} items, got {len(items)}")
        out = []
        for s in items:
            try:
                out.append(item(s))
            except argparse.ArgumentTypeError as err:
                raise argparse.ArgumentTypeError(f"{s!r} in {text!r}: {err}") from None
        return out

    parse.__name__ = "list"
    return parse


def names_in(known: Iterable[str], empty: bool = False) -> Callable[[str], list[str]]:
    """argparse type: a comma-separated list of names, each one of ``known``."""
    choices = list(known)

    def parse(text: str) -> list[str]:
        names = [s.strip() for s in str(text).split(",") if s.strip()]
        if not names and not empty:
            raise argparse.ArgumentTypeError(f"name at least one of {', '.join(choices)}")
        unknown = [n for n in names if n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown[0]!r}; choose from {', '.join(choices)}")
        return names

    parse.__name__ = "names"
    return parse


def device(text: str) -> str:
    """argparse type: auto, cpu, cuda, cuda:N or mps."""
    if not DEVICE.fullmatch(str(text).strip()):
        raise argparse.ArgumentTypeError(f"{text!r}: choose auto, cpu, cuda, cuda:N or mps")
    return str(text).strip()


def loop_options(p: argparse.ArgumentParser) -> None:
    """The options every trainer's loop takes: ``--fresh`` (start over) and ``--timings`` (the loop's seconds in
    the metrics file, for ``r2m bench scale``)."""
    p.add_argument("--fresh", action="store_true", help="ignore last.pt and start over")
    p.add_argument("--timings", action="store_true",
                   help="add the training loop's seconds (`timings`: the loop, its validation passes and "
                        "selections) to train_metrics.json, what `r2m bench scale` reads; the file is then no "
                        "longer the same bytes from the same inputs")


def step_options(p: argparse.ArgumentParser, steps: int, warmup: int, batch: int, length: int, vocab: int) -> None:
    """The sizes the training benchmarks share (``--steps``, ``--warmup``, ``--batch``, ``--length``,
    ``--vocab``), with these defaults."""
    p.add_argument("--steps", type=int_in(1, 10**6), default=steps)
    p.add_argument("--warmup", type=int_in(0, 10**6), default=warmup)
    p.add_argument("--batch", type=int_in(1, 65536), default=batch)
    p.add_argument("--length", type=int_in(2, 1000), default=length)
    p.add_argument("--vocab", type=int_in(8, 10**7), default=vocab)


def bench_parser(name: str, description: str) -> argparse.ArgumentParser:
    """A parser for ``r2m bench <name>``, pre-filled with the options every benchmark shares (device, threads)."""
    p = OneLineParser(prog=f"r2m bench {name}", description=description)
    p.add_argument("--device", type=device, default="auto", help="auto|cpu|cuda[:N] (default: auto = all present)")
    p.add_argument("--threads", type=int_in(0, 1024), default=0, help="torch CPU threads (0 = torch default)")
    return p

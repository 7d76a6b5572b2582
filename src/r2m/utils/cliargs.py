"""Argument parsers shared by the commands and the benchmarks, below every package that uses them."""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``r2m <command>: argument --x: why (see --help)``."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: {' '.join(message.split())} (see --help)\n")


def bench_parser(name: str, description: str) -> argparse.ArgumentParser:
    """A parser for ``r2m bench <name>``, pre-filled with the options every benchmark shares (device, threads)."""
    p = argparse.ArgumentParser(prog=f"r2m bench {name}", description=description)
    p.add_argument("--device", default="auto", help="auto|cpu|cuda[:N] (default: auto = all present)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    return p

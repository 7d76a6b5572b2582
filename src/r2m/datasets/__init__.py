"""Dataset recipes behind one interface (see :mod:`r2m.datasets.base`)."""

from __future__ import annotations

import importlib

# modules that register recipes; imported lazily so `import r2m.datasets` stays cheap
RECIPE_MODULES = (
    "r2m.datasets.tiny",
    "r2m.datasets.demo",
    "r2m.datasets.folder",
    "r2m.datasets.benchmarks",
)


def load_recipes() -> None:
    for name in RECIPE_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise


def main(argv: list[str] | None = None) -> int:
    """`r2m datasets`: list recipe kinds and the catalog of params.yaml;
    `r2m datasets check DATASET`: sentence counts per filter and vocabulary size beside the paper's."""
    import argparse
    import sys

    from r2m import params as P
    from r2m.datasets.base import RECIPES

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "check":
        ap = argparse.ArgumentParser(prog="r2m datasets check",
                                     description="compare a prepared dataset's text preprocessing with the paper")
        ap.add_argument("dataset")
        ap.add_argument("--params", default="params.yaml")
        args = ap.parse_args(argv[1:])
        from r2m.datasets.check import check

        try:
            return check(args.dataset, args.params)
        except (FileNotFoundError, P.ParamsError) as err:
            print(f"r2m datasets check: {err}", file=sys.stderr)
            return 2
    ap = argparse.ArgumentParser(prog="r2m datasets")
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args(argv)
    load_recipes()
    print("recipe kinds:", ", ".join(RECIPES.names()))
    p = P.load(args.params)
    print("catalog:")
    for name, entry in p.catalog.items():
        mark = "*" if name in p.datasets else " "
        print(f" {mark} {name:<20} kind={entry.kind} fidelity={P.profile_of(entry)}")
    print("(* = selected by `datasets`; `r2m datasets check NAME` compares its preprocessing with the paper)")
    return 0

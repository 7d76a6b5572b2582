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
    """`r2m datasets`: list recipe kinds and the catalog of params.yaml."""
    import argparse

    from r2m import params as P
    from r2m.datasets.base import RECIPES

    ap = argparse.ArgumentParser(prog="r2m datasets")
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args(argv)
    load_recipes()
    print("recipe kinds:", ", ".join(RECIPES.names()))
    p = P.load(args.params)
    print("catalog:")
    for name, entry in p.catalog.items():
        mark = "*" if name in p.datasets else " "
        print(f" {mark} {name:<20} kind={entry.kind}")
    print("(* = selected by `datasets`)")
    return 0

"""The ``r2m datasets`` command: list the recipe kinds and the catalog of params.yaml, and
``r2m datasets check NAME``: a prepared dataset's sentence counts per filter and vocabulary size
beside the paper's (:func:`r2m.datasets.check.report`).

It sits above :mod:`r2m.pipeline` (it reads the stage registry for the output paths), so
:mod:`r2m.datasets` imports nothing from the pipeline.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from r2m import params as P
from r2m.pipeline import validate as V


def check(dataset: str, params_path: str = "params.yaml") -> int:
    """Print the preprocessing report of one dataset from its stage outputs."""
    from r2m.datasets.check import report, vocab_filter_warning
    from r2m.stage.registry import BY_NAME

    p = V.load(params_path)
    if dataset not in p.catalog:
        raise P.ParamsError(f"unknown dataset {dataset!r}; declared under 'catalog': {sorted(p.catalog)}")
    corpus = Path(BY_NAME["corpus_concepts"].outs["corpus"].path.format(dataset=dataset))
    vocab = Path(BY_NAME["build_vocab"].outs["vocab"].path.format(dataset=dataset))
    entry = p.catalog[dataset]
    warning = vocab_filter_warning(dataset, entry.kind, P.profile_of(entry),
                                   P.for_dataset(p, dataset).fidelity.vocab_filter, vocab)
    if warning:
        print(warning, file=sys.stderr)
    print("\n".join(report(dataset, p.catalog[dataset].kind, corpus, vocab)))
    return 0


def _check_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="r2m datasets check",
                                 description="compare a prepared dataset's text preprocessing with the paper")
    ap.add_argument("dataset")
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args(argv)
    try:
        return check(args.dataset, args.params)
    except (FileNotFoundError, P.ParamsError) as err:
        print(f"r2m datasets check: {err}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """`r2m datasets`: list recipe kinds and the catalog of params.yaml;
    `r2m datasets check DATASET`: sentence counts per filter and vocabulary size beside the paper's."""
    from r2m.catalogs import RECIPES

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "check":
        return _check_main(argv[1:])
    ap = argparse.ArgumentParser(prog="r2m datasets")
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args(argv)
    try:
        p = V.load(args.params)
    except P.ParamsError as err:
        print(f"r2m datasets: {err}", file=sys.stderr)
        return 2
    print("recipe kinds:", ", ".join(RECIPES.names()))
    print("catalog:")
    for name, entry in p.catalog.items():
        mark = "*" if name in p.datasets else " "
        print(f" {mark} {name:<20} kind={entry.kind} fidelity={P.profile_of(entry)}")
    print("(* = selected by `datasets`; `r2m datasets check NAME` compares its preprocessing with the paper)")
    return 0

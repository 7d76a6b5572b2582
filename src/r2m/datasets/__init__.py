"""Dataset recipes behind one interface (see :mod:`r2m.datasets.base`); the ``r2m datasets``
command that lists them sits above the pipeline (:mod:`r2m.pipeline.datasets_cmd`)."""

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

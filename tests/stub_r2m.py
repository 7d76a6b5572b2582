#!/usr/bin/env python3
"""A stand-in for ``r2m`` in DAG tests that check *what* the engines run, not what a stage computes:
``stub_r2m.py <stage> --dataset D [--variant V …] [--params F] [--no-log-file]`` creates the stage's
outputs (from the registry) holding the stage and its axis values.
``stub_r2m.py resolve-params`` runs the real resolver (it is what DVC's first stage runs), and ``inputs``
the real stage (the digest of a dataset's files outside the DAG, which the engines' plans hinge on); any
other stage that reads files outside the DAG (``Stage.external``, e.g. ``references``) writes their digest
into its outputs, as its real outputs change with what those files say."""

from __future__ import annotations

import sys
from pathlib import Path


def outputs_map(stages) -> dict[str, dict]:
    """What the stub needs of each stage (``R2M_STUB_OUTS`` names a JSON file of it: a job then starts without
    importing r2m, a tenth of the time)."""
    return {s.name: {"axes": list(s.axes), "external": bool(s.external),
                     "outs": [[o.path, o.directory, list(o.members)] for o in s.outs.values()]} for s in stages}


def make_outputs(stage, bound: dict[str, str], root: Path, extra: str = "") -> str:
    """Create ``stage``'s outputs at ``bound`` under ``root``; returns what they hold (``extra`` appended)."""
    return _make(outputs_map([stage])[stage.name] | {"name": stage.name}, bound, root, extra)


def _make(stage: dict, bound: dict[str, str], root: Path, extra: str = "") -> str:
    line = " ".join([stage["name"], *(f"--{a} {bound[a]}" for a in stage["axes"] if a in bound),
                     *([extra] if extra else [])])
    for template, directory, members in stage["outs"]:
        path = root / template.format(**bound)
        if directory:
            path.mkdir(parents=True, exist_ok=True)
            for name in ("stub.txt", *members):  # a complete folder holds its key files
                (path / name).write_text(line + "\n")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(line + "\n")
    return line


def main(argv: list[str]) -> int:
    if argv[0] == "resolve-params":
        from r2m.pipeline.resolve_cmd import main as resolve

        return resolve(argv[1:])
    if argv[0] == "inputs":
        from r2m.cli import main as r2m

        return r2m(argv)
    import os

    if os.environ.get("R2M_STUB_OUTS"):
        import json

        stage = json.loads(Path(os.environ["R2M_STUB_OUTS"]).read_text())[argv[0]] | {"name": argv[0]}
    else:
        from r2m.stage.registry import get

        stage = outputs_map([get(argv[0])])[argv[0]] | {"name": argv[0]}
    bound, i = {}, 1
    while i < len(argv):
        if argv[i].startswith("--") and argv[i][2:] in stage["axes"]:
            bound[argv[i][2:]] = argv[i + 1]
            i += 2
        else:
            i += 1
    extra = ""
    if stage["external"]:
        import importlib

        from r2m.params import load
        from r2m.stage.registry import get

        module, func = get(argv[0]).external.split(":")
        params_file = argv[argv.index("--params") + 1] if "--params" in argv else "params.yaml"
        extra = getattr(importlib.import_module(module), func)(load(params_file), bound["dataset"])
    _make(stage, bound, Path("."), extra)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``r2m stamps``: check every stage instance of the DAG against its record and write its stamp
(``.stamps/<stage>/<instance>.json``, :mod:`r2m.stage.record`), touching only the stamps whose text
changed. The first stage of ``dvc.yaml``, run at every ``dvc repro``: DVC's stages read their stamps as
params files, so a stamp turned stale reruns its stage."""

from __future__ import annotations

import argparse
from pathlib import Path

from r2m import params as P
from r2m.pipeline.dag import stale_dvc_file
from r2m.pipeline.resolved import dag_instances
from r2m.stage.record import STAMPS, Planner, remove_old_stamps


def plan_all(params: P.Params, root: Path = Path(".")) -> dict[str, list[str]]:
    """``{stage@key: why}`` of every DAG instance that is not current; every stamp written."""
    planner = Planner(params, root)
    out = {}
    for stage, bound in dag_instances(params):
        why = planner.plan(stage, bound)[1]
        if why:
            out[f"{stage.name}@{stage.key(bound)}"] = why
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="r2m stamps", description=__doc__.split("\n")[0])
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--root", default=".", help="the workspace (its records, its .stamps/ and its dvc.yaml)")
    args = p.parse_args(argv)
    root = Path(args.root)
    if not any((root / f).is_file() for f in ("params.yaml", "dvc.yaml")):  # never stamps into any folder
        raise SystemExit(f"r2m stamps: --root {args.root}: not a workspace (no params.yaml or dvc.yaml there)")
    try:
        params = P.load(Path(args.params))
    except P.ParamsError as err:
        raise SystemExit(f"r2m stamps: {err}") from None
    dvc_file = Path(args.root) / "dvc.yaml"
    # DVC expanded its stages from dvc.yaml's instance lists before this ran: stale lists (a `-S seeds=…`)
    # would run the wrong instances, and stamps read from where they were kept before (.params/) would show DVC
    # no change at all, so the repro stops here, before any of them
    stale = stale_dvc_file(dvc_file, params) if dvc_file.exists() else None
    if stale:
        raise SystemExit(f"r2m stamps: {stale}")
    remove_old_stamps(root)  # a workspace made before the stamps moved: its .params/ is no engine's input now
    todo = plan_all(params, Path(args.root))
    shown = ", ".join(list(todo)[:8]) + (" ..." if len(todo) > 8 else "")
    print(f"{STAMPS}: {len(todo)} instance(s) to run" + (f": {shown}" if todo else ""))
    return 0

"""``r2m resolve-params``: write each stage instance's resolved params (``.params/<stage>/<instance>.json``),
touching only the files whose content changed. The first stage of ``dvc.yaml``; DVC's stages depend on
the files (see :mod:`r2m.pipeline.resolved`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from r2m import params as P
from r2m.pipeline.dag import stale_instances
from r2m.pipeline.resolved import PARAMS_DIR, write_params_files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="r2m resolve-params", description=__doc__.split("\n")[0])
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--root", default=".", help="the folder .params/ is written in (and its dvc.yaml checked)")
    args = p.parse_args(argv)
    try:
        params = P.load(Path(args.params))
    except P.ParamsError as err:
        raise SystemExit(f"r2m resolve-params: {err}") from None
    dvc_file = Path(args.root) / "dvc.yaml"
    # DVC expanded its stages from dvc.yaml's instance lists before this ran: stale lists (a `-S seeds=…`)
    # would run the wrong instances, so the repro stops here, before any of them
    stale = stale_instances(dvc_file, params) if dvc_file.exists() else None
    if stale:
        raise SystemExit(f"r2m resolve-params: {stale}")
    changed = write_params_files(params, Path(args.root))
    shown = ", ".join(changed[:8]) + (" ..." if len(changed) > 8 else "")
    print(f"{PARAMS_DIR}: {len(changed)} resolved-params file(s) changed" + (f": {shown}" if changed else ""))
    return 0

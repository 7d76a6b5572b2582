"""``r2m why STAGE --dataset … --variant … --ckpt … --model … --seed …``: is a stage instance current?

One line per change since the instance's last successful run (:func:`r2m.stage.record.stale`): a read
file changed, removed or appeared, a params key read whose value changed or that is gone, or no record.
Exit 0: current; 1: not current; 2: bad input.
"""

from __future__ import annotations

import sys

from r2m.stage.record import stale
from r2m.utils.cliargs import OneLineParser


def main(argv: list[str]) -> int:
    """``r2m why STAGE [--dataset D] [--variant V] [--ckpt C] [--model M] [--seed S]``."""
    from r2m import params as P
    from r2m.stage import registry as S

    ap = OneLineParser(prog="r2m why", description="is a stage instance current? one line per "
                                 "change since its last successful run (exit 0: current, 1: stale)")
    ap.add_argument("stage", help="a stage name (r2m --help lists them)")
    for axis in ("dataset", "variant", "ckpt", "model"):
        ap.add_argument(f"--{axis}", default=None)
    ap.add_argument("--seed", default="0", help="the run's seed (default 0)")
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args(argv)
    stage = S.BY_NAME.get(args.stage)
    if stage is None:
        print(f"r2m why: unknown stage {args.stage!r}; r2m --help lists them", file=sys.stderr)
        return 2
    missing = [a for a in stage.axes if getattr(args, a) is None]
    if missing:
        print(f"r2m why: {stage.name} needs --{' --'.join(missing)}", file=sys.stderr)
        return 2
    axes = {a: str(getattr(args, a)) for a in stage.axes}
    try:
        params = P.load(args.params)
        known = {"dataset": list(params.catalog), "variant": P.VARIANT_NAMES, "ckpt": P.TRAIN_STAGES,
                 "model": P.SUP_MODEL_NAMES}
        for axis, value in axes.items():  # an axis value no run can have is a typo, not "never ran"
            if axis == "seed" and not (value.isascii() and value.isdigit() and int(value) <= P.MAX_SEED):
                raise P.ParamsError(f"--seed {value!r}: a run's seed is a non-negative integer, at most {P.MAX_SEED}")
            if axis in known and value not in known[axis]:
                raise P.ParamsError(f"--{axis} {value!r}: choose from {', '.join(known[axis])}")
        lines = stale(stage, axes, params)
    except P.ParamsError as err:
        print(f"r2m why: {err}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    if not lines:
        print(f"{stage.name}@{stage.key(axes)}: current")
    return 1 if lines else 0

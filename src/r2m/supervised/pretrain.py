"""``pretrain_sup``: the model's pretraining phase (S-CNN-RNN: concept head and LSTM in parallel, the LSTM fed
the ground-truth concepts) for ``train_sup.pretrain_steps`` steps; a model without one (or with 0 steps), or a
dataset without paired captions, gets ``skipped.json`` and train_sup starts from scratch.

The baselines with a pretraining phase say so in their catalogue entry (``phases`` in
:data:`r2m.baselines.BASELINES`); the training is :func:`r2m.supervised.train.train_phase`, imported only for them.
"""

from __future__ import annotations

from r2m.baselines import BASELINES
from r2m.stage.context import StageContext
from r2m.supervised.skip import skip_reason, write_skipped
from r2m.utils.registry import load_target

# the trainer, loaded by name where a baseline has a pretraining phase (r2m.supervised.train imports this module)
TRAINER = "r2m.supervised.train:train_phase"


def add_arguments(parser) -> None:
    parser.add_argument("--fresh", action="store_true", help="ignore last.pt and start over")


def run(ctx: StageContext) -> None:
    reason = skip_reason(ctx.deps["sup_vocab"])
    if not reason:
        if "pretrain" not in BASELINES[ctx.model].phases:
            reason = f"{ctx.model} has no pretraining phase"
        elif ctx.params.train_sup.for_model(ctx.model).pretrain_steps == 0:
            reason = f"train_sup.pretrain_steps is 0 for {ctx.model}"
    if reason:
        write_skipped(ctx, reason)
        return
    load_target(TRAINER)(ctx, "pretrain")

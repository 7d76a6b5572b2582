"""``pretrain_sup``: the model's pretraining phase (S-CNN-RNN: concept head and LSTM in parallel, the LSTM fed
the ground-truth concepts) for ``train_sup.pretrain_steps`` steps; a model without one (or with 0 steps), or a
dataset without paired captions, gets ``skipped.json`` and train_sup starts from scratch.

The training is :func:`r2m.supervised.train.train_phase`, loaded by name for the baselines that have a pretraining
phase (:data:`PRETRAINING_MODULES`; tests/test_code_deps.py checks it against the models' ``phases``): the
pretraining of every other baseline, which writes its skip marker only, does not depend on the training code
(:mod:`r2m.pipeline.codedeps`).
"""

from __future__ import annotations

import importlib

from r2m.pipeline.context import StageContext
from r2m.supervised.skip import skip_reason, write_skipped

# the baselines with a pretraining phase -> the module that trains it
PRETRAINING_MODULES: dict[str, str] = {"scnn": "r2m.supervised.train"}


def add_arguments(parser) -> None:
    parser.add_argument("--fresh", action="store_true", help="ignore last.pt and start over")


def run(ctx: StageContext) -> None:
    reason = skip_reason(ctx.deps["sup_vocab"])
    if not reason:
        if ctx.model not in PRETRAINING_MODULES:
            reason = f"{ctx.model} has no pretraining phase"
        elif ctx.params.train_sup.for_model(ctx.model).pretrain_steps == 0:
            reason = f"train_sup.pretrain_steps is 0 for {ctx.model}"
    if reason:
        write_skipped(ctx, reason)
        return
    importlib.import_module(PRETRAINING_MODULES[ctx.model]).train_phase(ctx, "pretrain")

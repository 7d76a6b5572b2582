"""``train_sup`` / ``pretrain_sup``: every supervised captioner (``--model``), trained in the shared loop
(:mod:`r2m.training.loop`).

Objective: the average negative log-likelihood per word of the training captions given their
image (+ the model's aux terms), L2 through Adam's ``weight_decay``, global-norm clipping. The
schedule is ``train_sup`` (with ``train_sup.per_model.<model>`` merged), the model's sizes its own
params section. Resumable like the R²M stages: ``last.pt`` (model, optimizer, step, RNG, loss
rows) is used when its fingerprint (the resolved params) matches; ``--fresh`` ignores it.

Outputs: ``model.pt`` (the final weights; ``r2m.models.catalog.load_model``), ``params.yaml``,
``loss.tsv`` (``step split loss xe …aux``; a ``val`` row every ``eval_every`` steps = the val pairs'
per-word NLL) and ``train_metrics.json`` (``val_perplexity``,
``test_perplexity``: exp of the per-word NLL over all held-out pairs, <#end> included; null with
``--no-perplexity``, which ``r2m bench scale`` passes; with ``--timings``, which it passes too, also the
loop's seconds, ``timings``: :meth:`r2m.training.loop.Result.timings`).
S-CNN-RNN with ``scnn.cnn: end_to_end`` trains its CNN on the prepared images' pixels and also
writes ``cnn.pt`` (+ ``features/`` in ``train_sup``): :mod:`r2m.supervised.finetune`.

A dataset without paired captions gets ``skipped.json`` and metrics ``{"skipped": reason}``; a
skipped step's output folder holds nothing else (no older ``model.pt``: the folder is
``persist=True`` under DVC), and ``train_sup`` never starts from a skip-marked ``pretrain_sup``.
"""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r2m.baselines import BASELINES
from r2m.stage.context import StageContext
from r2m.supervised.skip import skip_reason, write_skipped
from r2m.utils.cliargs import loop_options
from r2m.utils.io import atomic_path, write_json
from r2m.utils.lazy import no_grad

# torch, the models and the training loop are imported by the functions that train: a skipped
# baseline (a dataset without paired captions) starts without them
if TYPE_CHECKING:
    from r2m.supervised.data import PairedSet
    from r2m.training import loop as L


def add_arguments(parser) -> None:
    loop_options(parser)
    parser.add_argument("--no-perplexity", action="store_true",
                        help="skip the closing perplexities of the train, val and test pairs (metrics null): "
                             "a forward pass over every held-out pair, longer than a short benchmark run's training")


def pretrain(ctx: StageContext) -> None:
    """Stage ``pretrain_sup``: the model's pretraining phase (S-CNN-RNN: concept head and LSTM in parallel, the
    LSTM fed the ground-truth concepts) for ``train_sup.pretrain_steps`` steps; a model without one (``phases``
    of its :data:`r2m.baselines.BASELINES` entry), 0 steps, or a dataset without paired captions gets
    ``skipped.json`` and ``train_sup`` starts from scratch."""
    reason = skip_reason(ctx.deps["sup_vocab"])
    if not reason:
        if "pretrain" not in BASELINES[ctx.model].phases:
            reason = f"{ctx.model} has no pretraining phase"
        elif ctx.params.train_sup.for_model(ctx.model).pretrain_steps == 0:
            reason = f"train_sup.pretrain_steps is 0 for {ctx.model}"
    if reason:
        write_skipped(ctx, reason)
        return
    train_phase(ctx, "pretrain")


def model_section(ctx: StageContext) -> dict[str, Any]:
    return getattr(ctx.params, ctx.model).model_dump()


def pretrained(folder: Path | None) -> bool:
    """A pretrain_sup folder to start from: it has a ``model.pt`` and no skip marker."""
    return folder is not None and (folder / "model.pt").exists() and not (folder / "skipped.json").exists()


@no_grad
def perplexity(model, pairs: PairedSet, batch_size: int, device) -> float | None:
    """exp(mean per-word NLL) over the pairs (every valid position, <#end> included)."""
    if len(pairs) == 0:
        return None
    was = model.training
    model.eval()
    nll, words = 0.0, 0
    for b in pairs.ordered(batch_size):
        b = b.to(device)
        lp = model.sentence_logprob(model.encode(b.feats), b.inputs, b.targets, b.lengths)
        nll -= float(lp.sum())
        words += int(b.lengths.sum())
    model.train(was)
    return math.exp(nll / words) if words else None


def run(ctx: StageContext) -> None:
    train_phase(ctx, "train")


def _end_to_end(name: str, section: dict[str, Any]):
    """The module that trains ``name``'s CNN end to end (``end_to_end`` of its :data:`r2m.baselines.BASELINES`
    entry) when its section asks for it, else None."""
    from r2m.baselines import BASELINES
    from r2m.utils.registry import load_target

    module = BASELINES[name].end_to_end
    if module is None:
        return None
    finetune = load_target(module)
    return finetune if finetune.end_to_end(section) else None


def train_phase(ctx: StageContext, phase: str) -> None:
    """``phase`` ``train`` (stage ``train_sup``) or ``pretrain`` (``pretrain_sup``: :func:`pretrain`)."""
    reason = skip_reason(ctx.deps["sup_vocab"])
    if reason:
        write_skipped(ctx, reason)
        return
    import torch

    from r2m.models.catalog import build_sup_model
    from r2m.supervised.data import Features, PairedSet
    from r2m.text.vocab import load_itos
    from r2m.training import loop as L
    from r2m.utils import resume as RS
    from r2m.utils.checkpoint import save_torch

    name = ctx.model
    tp = ctx.params.train_sup.for_model(name)
    if phase == "pretrain":  # the pretraining phase: its own step count, the last weights
        tp = tp.model_copy(update={"steps": tp.pretrain_steps, "select_by": "last"})
    device = ctx.runtime.torch_device()
    args = ctx.args
    torch.manual_seed(tp.seed)
    itos = load_itos(ctx.deps["sup_vocab"])

    import pyarrow.parquet as pq

    from r2m.models.catalog import sup_model

    cls = sup_model(name)
    captions = pq.read_table(Path(ctx.deps["sup_vocab"]) / "captions.parquet",
                             columns=["image_id", "split", "caption"]).to_pydict()
    section = cls.prepare_params(model_section(ctx), captions)
    finetune = _end_to_end(name, section)
    e2e = finetune is not None
    feats = Features(ctx.deps["features"], cls.feature_kinds)
    source, backbone = feats, None
    sf = ctx.params.sup_features
    if e2e:  # the CNN reads the prepared images (those sup_features could read)
        backbone = finetune.build_cnn(sf.backend, sf.options)
        source = finetune.Pixels(ctx.deps["prepared"], ctx.root, backbone.prepare, backbone.size, feats.row_of)
    train = PairedSet(ctx.deps["sup_vocab"], source, "train", tp.max_len)
    val = PairedSet(ctx.deps["sup_vocab"], source, "val", tp.max_len)
    test = PairedSet(ctx.deps["sup_vocab"], source, "test", tp.max_len)
    ctx.log.info("train_sup: %s on %d training pairs (%d val, %d test); %d pairs lack features", name,
                 len(train), len(val), len(test), train.n_missing + val.n_missing + test.n_missing)
    if e2e:
        model = finetune.end_to_end_class(name).from_params(section, len(itos), feats.shapes).attach_cnn(backbone.model)
        ctx.log.info("train_sup: %s end to end: the %s CNN trains on %s images", name, sf.backend,
                     "x".join(map(str, backbone.size)))
    else:
        model = build_sup_model(name, section, len(itos), feats.shapes)
    # statistics only of the kinds the model standardises (m-RNN's pooled vector; SAT none: its grid at MSCOCO
    # size is 22 GB, read for nothing otherwise)
    normed = [k for k in feats.kinds if hasattr(model, f"norm_{k}_mean")]
    if normed:
        model.fit_feature_norm(source.channel_stats(train.rows, kinds=normed))
    model.to(device)
    model.bind_data(captions)
    model.set_phase(phase)
    info = model.train_info()
    if info:
        ctx.log.info("train_sup: %s", ", ".join(f"{k} {v}" for k, v in info.items()))
    pre_dir = Path(ctx.deps["pretrain"]) if "pretrain" in ctx.deps else None
    if phase == "train" and pretrained(pre_dir):
        from r2m.models.catalog import load_model

        pre, _ = load_model(pre_dir)
        if e2e:
            model.load_state_dict({**model.state_dict(), **pre.state_dict()})
            if finetune.load_cnn(model, pre_dir, sf.backend):
                ctx.log.info("train_sup: the CNN starts from the pretrained %s", pre_dir / finetune.CNN_FILE)
        else:
            model.load_state_dict(pre.state_dict())
        ctx.log.info("train_sup: starting from the pretrained %s", pre_dir / "model.pt")
    selector = None
    if tp.select_by != "last":
        from r2m.supervised.select import val_selector

        selector = val_selector(ctx, source, itos, tp.select_by, device)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=tp.lr,
                           weight_decay=tp.weight_decay)
    columns = ("xe", *model.aux_losses)
    spec = L.Loop(
        name="train_sup", model=model, optimizer=opt, objective=caption_objective(columns), schedule=tp,
        batches=lambda start: train.batches(tp.batch_size, tp.seed, start),
        val_batches=lambda: itertools.islice(val.ordered(tp.batch_size), 20), device=device,
        work=L.resume_folder(ctx), fingerprint=L.fingerprint(ctx), log=ctx.log,
        lr_param=f"train_sup.lr = {tp.lr}", fresh=getattr(args, "fresh", False), select=selector,
        desc=f"train_sup ({name})")
    ctx.log.info("train_sup: %s on %s, %d parameters, %d steps x %d", name, device, model.param_count(),
                 tp.steps, tp.batch_size)
    res = L.fit(spec)

    selected = res.keep_best(model)  # the checkpoint with the best val metric (or the last)
    if res.best is not None:
        ctx.log.info("train_sup: keeping step %d (val %s %.4f)", selected, tp.select_by, res.best.score)
    # the model folder written whole (built beside it, renamed over it): nothing of an older run (model.pt,
    # cnn.pt, features/, skipped.json) outlives this one
    with atomic_path(Path(ctx.outs["model"])) as out_dir:
        out_dir.mkdir()
        save_torch(out_dir / "model.pt", model.checkpoint(stage=ctx.stage.name, step=selected,
                                                          dataset=ctx.dataset or ""))
        if e2e:
            finetune.save_cnn(model, out_dir, sf.backend, sf.options)
            if phase == "train":  # what captioning, retrieval and inspection read
                n = finetune.write_features(model, source, out_dir, max(tp.batch_size, 64), device, sf.backend)
                ctx.log.info("train_sup: the fine-tuned CNN's features of %d images -> %s", n,
                             Path(ctx.outs["model"]) / finetune.OWN_FEATURES)
        ctx.save_params(out_dir)
    L.write_loss(Path(ctx.outs["loss"]), columns, res.rows)
    bs = max(tp.batch_size, 64)
    selections = [{"step": k, tp.select_by: score} for k, score in res.selections]
    t0 = time.perf_counter()
    ppl = not getattr(args, "no_perplexity", False)
    metrics = {
        "model": name, "stage": ctx.stage.name, "steps": res.step, "selected_step": selected,
        "select_by": tp.select_by, "selection": selections or None, **L.loss_summary(res.rows),
        "train_perplexity": perplexity(model, train, bs, device) if ppl and len(train) <= 50000 else None,
        "val_perplexity": perplexity(model, val, bs, device) if ppl else None,
        "test_perplexity": perplexity(model, test, bs, device) if ppl else None,
        "device": str(device), "parameters": model.param_count(),  # (timings only with --timings: same inputs, same bytes)
        "train_pairs": len(train), "vocab_size": len(itos), **info,
        **({"timings": res.timings()} if getattr(args, "timings", False) else {}),
    }
    metrics = L.finite_or_none(metrics)
    ctx.log.info("train_sup: perplexities %s in %.1f s", "computed" if ppl else "skipped (--no-perplexity)",
                 time.perf_counter() - t0)
    write_json(Path(ctx.outs["metrics"]), metrics)
    feats.close()
    source.close()
    RS.clear(spec.work)  # outputs complete: the resumable state is no longer needed
    ctx.log.info("train_sup: done, %d steps in %.1f s (%.1f sentences/s); perplexity val %s test %s", res.step,
                 res.elapsed, res.seen / res.elapsed if res.elapsed > 0 else 0.0, metrics["val_perplexity"],
                 metrics["test_perplexity"])


def caption_objective(columns: tuple[str, ...]) -> L.LoopObjective:
    """The supervised objective for the loop: the model's own ``loss`` (per-word NLL + its aux
    terms) on the encoded batch features; a val row's loss is the sum of its components."""

    def loss(model, b):
        return model.loss(model.encode(model.batch_features(b.feats, b.image_ids)), b.inputs, b.targets, b.lengths)

    from r2m.training import loop as L

    return L.LoopObjective(columns, loss, lambda m, b: loss(m, b)[1], lambda ev: sum(ev.values()))

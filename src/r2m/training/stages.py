"""The four R²M training stages (``train_xe``, ``train_s``, ``train_m``, ``train_i``).

``run(ctx)`` trains the stage named ``ctx.stage.name`` with its objective from
:data:`r2m.training.stage_losses.OBJECTIVES` in the shared loop (:mod:`r2m.training.loop`). Every
stage but the first starts from the previous stage's ``model.pt`` (``ctx.deps['init']``); the
schedule is ``ctx.params.<stage>`` (Adam, global-norm clipping), β/γ come from the dataset's
catalog entry.

Outputs: ``<model>/model.pt`` (``torch.load(weights_only=True)``-safe) and ``<model>/params.yaml``
(the folder appears complete or not at all), ``loss.tsv`` and ``train_metrics.json``.
A NaN/Inf loss raises :class:`NonFiniteLoss` naming stage and step.

**Resume, preemption, lock** (:mod:`r2m.utils.resume`, through the loop): every
``checkpoint_every`` steps the stage writes ``last.pt`` (model + optimizer + step + RNG + loss rows)
into its resume folder ``.r2m/resume/<stage>/<dataset>-<variant>/`` — outside the declared
outputs, so Snakemake and DVC leave it alone when a job fails or is killed — and resumes from it
when its fingerprint (resolved params and the init checkpoint) matches; the folder is deleted once
the outputs are written. SIGTERM/SIGINT stop the loop at the next step boundary after saving
``last.pt`` (:class:`r2m.utils.resume.Preempted`). ``r2m`` holds an exclusive lock per stage output.

**The step** (:mod:`r2m.training.step`): on CUDA batches are padded to static shapes
(:func:`static_shape`), each step is replayed as one CUDA graph (capturable Adam) and fp32 matmuls use
TF32 (``R2M_CUDA_GRAPH=0``, ``R2M_TF32=0``, ``R2M_STATIC_STEP``: :mod:`r2m.runtime`); on CPU the
dynamic eager step of before. ``train_metrics.json`` records ``tf32``, ``cuda_graph``,
``cuda_graph_off`` and ``static_step``; with ``--timings`` (``r2m bench scale``) also the loop's seconds
(``timings``: :meth:`r2m.training.loop.Result.timings`), which no run of the DAG writes.

**Checkpoint selection** (e.g. by validation CIDEr): call :func:`train` with
``select=fn(model, step) -> float`` (higher is better). It is called at every ``eval_every`` step
and the final step; ``model.pt`` then holds the best-scoring weights (``selected_step`` and
``selected_score`` in the metrics) instead of the last ones. :func:`run` passes the image stages
(``train_m``, ``train_i``) a CIDEr selector (``<stage>.select_by``: auto/cider; :mod:`r2m.training.selection`,
imported there only: the text stages never load captioning's beam search or the scorers); the text stages
(``train_xe``, ``train_s``) have no images to select by and keep the last checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from r2m import runtime as R
from r2m.models.r2m import R2M, R2MConfig
from r2m.stage.context import StageContext
from r2m.text.dictionary import concept_order
from r2m.text.vocab import load_itos
from r2m.training import distributed
from r2m.training import loop as L
from r2m.training import step as ST
from r2m.training.data import ImageSet, JointBatch, TextStream, pad_image, pad_joint, pad_text
from r2m.training.loop import NonFiniteLoss, Selector  # noqa: F401  (public names of this stage)
from r2m.training.stage_losses import OBJECTIVES, Objective, text_objective, val_gamma  # noqa: F401
from r2m.utils import resume as RS
from r2m.utils.checkpoint import CheckpointError, load_checkpoint, save_torch
from r2m.utils.cliargs import int_in, loop_options
from r2m.utils.io import atomic_path, write_json


def add_arguments(parser) -> None:
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on CUDA")
    loop_options(parser)
    parser.add_argument("--nproc", type=int_in(1, distributed.MAX_NPROC), default=1,
                        help="data-parallel processes (torch DDP under torchrun; one per GPU); the global "
                             "batch stays <stage>.batch_size")


def relaunch(stage: str, argv: list[str]) -> int | None:
    """``--nproc N`` (N > 1) outside torchrun: re-run this command under torchrun."""
    return distributed.relaunch(stage, argv)


# --------------------------------------------------------------------------- the model
def model_config(ctx: StageContext, vocab_size: int, image_dim: int = 0) -> R2MConfig:
    f = ctx.params.fidelity
    return R2MConfig.for_variant(ctx.variant or "r2m", vocab_size=vocab_size, image_dim=image_dim,
                                 init=f.init, dropout_scope=f.dropout, rm_input=f.rm_input, qkv_norm=f.qkv_norm,
                                 out_bias=f.out_bias, rm_scale=f.rm_scale, fm_output=f.fm_output,
                                 fm_attention=f.fm_attention, **ctx.params.model.model_dump())


# ``frozen_random`` (the official code): the projection is neither trained nor saved, so every
# image stage draws its own; a fixed seed per stage (plus the run's seed) keeps runs repeatable.
FROZEN_PROJ_SEED = {"train_m": 0, "train_i": 1}


def build_model(ctx: StageContext, vocab_size: int, image_dim: int) -> R2M:
    cfg = model_config(ctx, vocab_size, image_dim)
    run_seed = int(ctx.seed or 0)
    seed = (FROZEN_PROJ_SEED.get(ctx.stage.name, 0) + run_seed if cfg.image_proj == "frozen_random"
            else cfg.image_proj_seed)
    cfg.image_proj_seed = seed
    if "init" not in ctx.deps:
        return R2M(cfg)
    path = ctx.deps["init"] / "model.pt"
    if not path.exists():
        raise FileNotFoundError(f"{ctx.stage.name}: missing init checkpoint {path} (run the previous stage)")
    prev = ctx.deps["init"].name
    hint = (f"rebuild it: r2m {prev} --dataset {ctx.dataset} --variant {ctx.variant or 'r2m'} "
            f"--seed {ctx.seed or 0} --fresh")
    ckpt = load_checkpoint(path, ("config", "state_dict"), hint=hint)
    if not isinstance(ckpt["config"], dict) or not isinstance(ckpt["state_dict"], dict):
        raise CheckpointError(f"{path}: 'config' and 'state_dict' must be dicts; {hint}")
    want = cfg.to_dict()
    have = ckpt["config"]
    diff = {k: (have.get(k), v) for k, v in want.items()
            if k not in ("image_dim", "image_proj", "image_proj_seed") and have.get(k) != v}
    if diff:
        raise ValueError(f"{ctx.stage.name}: init checkpoint {path} was built with other model settings "
                         f"(key: (checkpoint, now)) {diff}; rerun the previous stages")
    try:
        return R2M.from_checkpoint(ckpt, image_dim=image_dim or have.get("image_dim", 0),
                                   image_proj=cfg.image_proj, image_proj_seed=seed)
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path}: {err}; {hint}") from None


def make_adam(model: torch.nn.Module, lr: float, capturable: bool = False) -> torch.optim.Adam:
    """Adam with the fused kernel when the build has it (same update; ~7x faster step on CPU);
    ``capturable`` (CUDA graphs: the step count stays on the device) only when asked."""
    params = [p for p in model.parameters() if p.requires_grad]
    extra = {"capturable": True} if capturable else {}
    try:
        return torch.optim.Adam(params, lr=lr, fused=True, **extra)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, **extra)


def static_shape(obj: Objective, tp, ctx: StageContext) -> ST.StaticShape:
    """The stage's pad-to-static-shape function: text to ``max_len`` steps, concepts to a width that
    starts at ``concepts.max_per_image`` (image stages) or 8 (corpus sentences) and only grows."""
    if obj.data == "text":
        return ST.StaticShape(lambda b, w: pad_text(b, tp.max_len, w), 8)
    if obj.data == "joint":
        return ST.StaticShape(lambda b, w: pad_joint(b, tp.max_len, w), max(8, ctx.params.concepts.max_per_image))
    return ST.StaticShape(pad_image, ctx.params.concepts.max_per_image)


# --------------------------------------------------------------------------- the stage
def run(ctx: StageContext) -> None:
    """Every training stage. The image stages (``train_m``, ``train_i``) keep the checkpoint with the best
    validation CIDEr unless ``<stage>.select_by`` is ``last``; the text stages (``train_xe``, ``train_s``)
    keep the last one (``select_by`` auto or last)."""
    select_by = getattr(ctx.params, ctx.stage.name).select_by
    if "prepared" not in ctx.deps:  # a text stage
        if select_by == "cider":
            raise ValueError(f"{ctx.stage.name}.select_by: cider needs images; only train_m/train_i can use it")
        train(ctx)
        return
    select = None
    if select_by != "last":  # auto: cider for the image stages
        from r2m.text.vocab import load_itos
        from r2m.training import selection

        select = selection.cider_selector(ctx, ctx.runtime.torch_device(), load_itos(ctx.deps["vocab"]))
    train(ctx, select)


class _Data:
    """The stage's training and validation batches (text corpus or unpaired images)."""

    def __init__(self, ctx: StageContext, obj: Objective, tp, itos: list[str]) -> None:
        self.images: list[ImageSet] = []
        if obj.data == "joint":  # train_e2e: the text stage's sentences and the image stage's images, each step
            text, image = (_Data(ctx, Objective(kind, obj.columns, obj.compute), tp, itos) for kind in ("text", "image"))
            self.images, self.val, self.image_dim, self.rows = image.images, text.val, image.image_dim, text.rows
            self.train = lambda start: map(JointBatch, text.train(start), image.train(start))
            return
        if obj.data == "text":
            enc = Path(ctx.deps["vocab"]) / "encoded.parquet"
            stream = TextStream(enc, "train", tp.batch_size, tp.max_len, tp.seed)
            try:
                val = TextStream(enc, "val", tp.batch_size, tp.max_len, tp.seed)
                self.val: Callable[[], Iterator[Any]] = lambda: val.ordered(max_batches=20)
            except ValueError:
                ctx.log.warning("%s: no 'val' sentences in %s; no held-out XE", ctx.stage.name, enc)
                self.val = lambda: iter(())
            self.image_dim, self.train, self.rows = 0, stream.batches, stream.n
            return
        cp = ctx.params.concepts
        official = ctx.params.fidelity.image_concepts == "official"  # unshuffled, official order
        kw = dict(prepared=ctx.deps["prepared"], concepts=ctx.deps["concepts"], features=ctx.deps["features"],
                  itos=itos, threshold=cp.score_threshold, max_per_image=cp.max_per_image,
                  order=concept_order(ctx.params.fidelity.image_concepts, "train"), shuffle=not official,
                  dictionary=cp.dictionary, per_class=bool(ctx.params.fidelity.concept_per_class))
        images = ImageSet(split="train", crops=bool(ctx.params.extract_features.crops), **kw)
        ctx.log.info("%s: %d training images with concepts and features%s", ctx.stage.name, len(images),
                     f", each step one of its {images.crops.shape[1]} random crops" if images.crops is not None else "")
        val_images = ImageSet(split="val", **kw)
        self.images = [images, val_images]
        self.val = lambda: val_images.ordered(tp.batch_size, max_batches=20)
        self.image_dim, self.rows = images.dim, len(images)
        self.train = lambda start: images.batches(tp.batch_size, tp.seed, start)

    def close(self) -> None:
        for s in self.images:
            s.close()


def loop_objective(ctx: StageContext, obj: Objective, tp) -> L.LoopObjective:
    """The stage's objective for the loop: validation is the held-out L_XE on text, with the held-out
    token accuracy (column ``acc``, val rows only: the released code's eval metric), the stage's own
    loss on images (``loss = rank + γ·rec``, γ = 0 but for train_i)."""
    name = ctx.stage.name
    if obj.data in ("text", "joint"):  # train_e2e validates on the held-out sentences
        return L.LoopObjective((*obj.columns, "acc"), lambda m, b: obj.compute(ctx, m, b, tp),
                               lambda m, b: text_objective(m, b, None, accuracy=True)[1], lambda ev: ev["xe"])
    gamma = val_gamma(ctx, name)
    return L.LoopObjective(obj.columns, lambda m, b: obj.compute(ctx, m, b, tp),
                           lambda m, b: obj.compute(ctx, m, b, tp)[1], lambda ev: ev["rank"] + gamma * ev["rec"])


def train(ctx: StageContext, select: Selector | None = None) -> dict[str, Any]:
    name = ctx.stage.name
    if name not in OBJECTIVES:
        raise KeyError(f"r2m.training.stages: no objective for stage {name!r}; known: {', '.join(OBJECTIVES)}")
    obj = OBJECTIVES[name]
    tp = getattr(ctx.params, name)
    args = ctx.args
    device = distributed.device_for(ctx.runtime.torch_device())
    dist = distributed.setup(device)
    out_dir = Path(ctx.outs["model"])
    torch.manual_seed(tp.seed)
    itos = load_itos(ctx.deps["vocab"])
    data = _Data(ctx, obj, tp, itos)
    model = build_model(ctx, len(itos), data.image_dim).to(device)
    use_bf16 = (bool(getattr(args, "bf16", False)) or getattr(ctx.runtime, "bf16", False)) and device.type == "cuda"
    tf32 = R.apply_tf32(device, getattr(ctx.runtime, "tf32", True))
    mode = ST.step_mode(device, dist.enabled, getattr(ctx.runtime, "cuda_graph", True) and obj.data != "joint",
                        getattr(ctx.runtime, "static_step", "auto"))
    if obj.data == "joint" and dist.enabled:
        raise ValueError(f"{name}: one-stage training runs in one process (no --nproc)")

    def bf16():  # autocast's weight cache cannot live across graph replays
        return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not mode.graph)

    spec = L.Loop(
        name=name, model=model, optimizer=make_adam(model, tp.lr, capturable=mode.graph),
        objective=loop_objective(ctx, obj, tp),
        schedule=tp, batches=data.train, val_batches=data.val, device=device, work=L.resume_folder(ctx),
        fingerprint=L.fingerprint(ctx), log=ctx.log, lr_param=f"{name}.lr = {tp.lr}",
        fresh=getattr(args, "fresh", False), select=select, dist=dist,
        autocast=bf16 if use_bf16 else contextlib.nullcontext, mode=mode, static=static_shape(obj, tp, ctx))
    batch = min(tp.batch_size, data.rows or tp.batch_size)  # what the batcher draws (epoch_batch, TextStream)
    clamped = f" ({name}.batch_size {tp.batch_size} > the {data.rows} training rows)" if batch < tp.batch_size else ""
    ctx.log.info("%s: %s on %s, %d parameters, %d steps x batch %d%s", name, ctx.variant, device,
                 model.param_count(), tp.steps, batch, clamped)
    res = L.fit(spec)

    # outputs ---------------------------------------------------------
    kept = res.keep_best(model)
    if not dist.is_main:  # DDP: rank 0 writes the outputs
        data.close()
        dist.barrier()
        return {}
    from r2m.captioning import settings

    with atomic_path(out_dir) as tmp:  # the model folder appears complete or not at all
        tmp.mkdir()
        save_torch(tmp / "model.pt",  # with its content digest, checked on load
                   model.checkpoint(stage=name, step=kept, variant=ctx.variant or "r2m", dataset=ctx.dataset or ""))
        ctx.save_params(tmp)
        settings.record(ctx, tmp, itos)  # inference.json: what `r2m caption IMAGES --model` needs
    L.write_loss(Path(ctx.outs["loss"]), spec.objective.columns, res.rows)
    val_rows = [r for r in res.rows if r[1] == "val"]
    metrics = {
        "stage": name, "variant": ctx.variant, "steps": res.step, **L.loss_summary(res.rows),
        "val_xe": (val_rows[-1][3] if val_rows and obj.data != "image" else None),
        "val_acc": (val_rows[-1][3 + spec.objective.columns.index("acc")] if val_rows and obj.data != "image"
                    else None),
        "device": str(device), "parameters": model.param_count(),  # (timings only with --timings: same inputs, same bytes)
        "selected_step": res.best.step if res.best else None, "selected_score": res.best.score if res.best else None,
        "tf32": tf32, **res.step_info,
        **({"timings": res.timings()} if getattr(args, "timings", False) else {}),
    }
    write_json(Path(ctx.outs["metrics"]), L.finite_or_none(metrics))
    data.close()
    RS.clear(spec.work)  # outputs complete: the resumable state is no longer needed
    ctx.log.info("%s: done, %d steps in %.1f s (%.1f %s/s)", name, res.step, res.elapsed,
                 res.seen / res.elapsed if res.elapsed > 0 else 0.0, "sentences" if obj.data == "text" else "images")
    dist.barrier()
    return L.finite_or_none(metrics)

"""The four R²M training stages (``train_xe``, ``train_s``, ``train_m``, ``train_i``).

``run(ctx)`` dispatches on ``ctx.stage.name`` through :data:`OBJECTIVES`. Every stage but the first
starts from the previous stage's ``model.pt`` (``ctx.deps['init']``); the schedule is
``ctx.params.<stage>`` (Adam, global-norm clipping), β/γ come from the dataset's catalog entry.

Outputs: ``<model>/model.pt`` (``torch.load(weights_only=True)``-safe) and ``<model>/params.yaml``
(the folder appears complete or not at all), ``loss.tsv`` and ``train_metrics.json``.
A NaN/Inf loss raises :class:`NonFiniteLoss` naming stage and step.

**Resume, preemption, lock** (:mod:`r2m.utils.resume`): every ``checkpoint_every`` steps the stage
writes ``last.pt`` (model + optimizer + step + RNG + loss rows) into its resume folder
``.r2m/resume/<stage>/<dataset>-<variant>/`` — outside the declared outputs, so Snakemake and DVC
leave it alone when a job fails or is killed — and resumes from it when its fingerprint (resolved
params and the init checkpoint) matches; the folder is deleted once the outputs are written.
SIGTERM/SIGINT stop the loop at the next step boundary after saving ``last.pt``
(:class:`r2m.utils.resume.Preempted`). ``r2m`` holds an exclusive lock per stage output.

**Checkpoint selection** (e.g. by validation CIDEr): call :func:`train` with
``select=fn(model, step) -> float`` (higher is better). It is called at every ``eval_every`` step
and the final step; ``model.pt`` then holds the best-scoring weights (``selected_step`` and
``selected_score`` in the metrics) instead of the last ones. The DAG stage passes a CIDEr selector for the image stages (``<stage>.select_by``: auto/cider) (see
:mod:`r2m.training.selection`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from r2m.losses import linear_xe_loss, loss_i, loss_s, xe_loss
from r2m.models.r2m import R2M, R2MConfig
from r2m.text.dictionary import concept_order
from r2m.text.vocab import load_itos
from r2m.training import distributed
from r2m.training.data import ImageSet, TextBatch, TextStream
from r2m.utils import resume as RS
from r2m.utils.checkpoint import CheckpointError, load_checkpoint
from r2m.utils.io import atomic_path, file_digest, save_torch, write_json, write_text
from r2m.utils.progress import progress

Selector = Callable[[R2M, int], float]


class NonFiniteLoss(RuntimeError):
    """Raised when a training loss becomes NaN or Inf."""


def add_arguments(parser) -> None:
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on CUDA")
    parser.add_argument("--fresh", action="store_true", help="ignore last.pt and start over")
    parser.add_argument("--nproc", type=int, default=1,
                        help="data-parallel processes (torch DDP under torchrun; one per GPU); the global "
                             "batch stays <stage>.batch_size")


def relaunch(stage: str, argv: list[str]) -> int | None:
    """``--nproc N`` (N > 1) outside torchrun: re-run this command under torchrun."""
    return distributed.relaunch(stage, argv)


# --------------------------------------------------------------------------- objectives
@dataclass(frozen=True)
class Objective:
    data: str  # "text" | "image"
    columns: tuple[str, ...]
    compute: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


def token_xe(model: R2M, hidden: Tensor, targets: Tensor) -> Tensor:
    """L_XE over valid positions ([n, N·d], [n]); on CPU without materialising the logits."""
    if hidden.device.type == "cpu" and not torch.is_autocast_enabled():
        return linear_xe_loss(model.out_drop(hidden), model.out.weight, model.out.bias, targets)
    return xe_loss(model.logits(hidden), targets)


def text_objective(model: R2M, batch: TextBatch, beta: float | None,
                   rec: str = "sum_normalized") -> tuple[Tensor, dict[str, Tensor]]:
    """L_XE (``beta is None``) or L_S (``rec``: the L_rec form); logits only at valid positions."""
    out = model(batch.concepts, batch.concept_lens, batch.inputs, batch.lengths, reconstruct=beta is not None)
    mask = batch.mask
    xe = token_xe(model, out["hidden"][mask], batch.targets[mask])
    if distributed.current().enabled:  # DDP: this rank's share of the global token mean
        xe = xe * distributed.current().token_mean_scale(mask.sum())
    if beta is None:
        return xe, {"xe": xe}
    return loss_s(xe, out["v"], out["v_tilde_raw"], beta, rec)


def image_objective(model: R2M, batch, gamma: float, margin: float, max_len: int,
                    rec: str = "sum_normalized", rank: str = "vsepp"):
    """L_M^I (γ = 0) or L_I on greedy free-running captions (gradients through hidden states)."""
    v = model.encode(batch.concepts, batch.concept_lens)
    g = model.greedy(v, max_len)
    img, v_tilde = model.project_image(batch.feats), g["v_tilde_raw"]
    if model.training:  # DDP: in-batch negatives over the whole global batch
        img, v, v_tilde = (distributed.gather_rows(x) for x in (img, v, v_tilde))
    return loss_i(img, v, v_tilde, gamma, margin, rec, rank)


def _xe(ctx, model, batch, tp):
    return text_objective(model, batch, None)


def _s(ctx, model, batch, tp):
    return text_objective(model, batch, ctx.entry.beta, ctx.params.fidelity.rec_loss)


def _m(ctx, model, batch, tp):
    f = ctx.params.fidelity
    return image_objective(model, batch, 0.0, tp.margin, tp.max_len, f.rec_loss, f.rank_loss)


def _i(ctx, model, batch, tp):
    f = ctx.params.fidelity
    return image_objective(model, batch, ctx.entry.gamma, tp.margin, tp.max_len, f.rec_loss, f.rank_loss)


OBJECTIVES: dict[str, Objective] = {
    "train_xe": Objective("text", ("xe",), _xe),
    "train_s": Objective("text", ("xe", "rec"), _s),
    "train_m": Objective("image", ("rank", "rec"), _m),
    "train_i": Objective("image", ("rank", "rec"), _i),
}


# --------------------------------------------------------------------------- helpers
def model_config(ctx, vocab_size: int, image_dim: int = 0) -> R2MConfig:
    f = ctx.params.fidelity
    return R2MConfig.for_variant(ctx.variant or "r2m", vocab_size=vocab_size, image_dim=image_dim,
                                 init=f.init, dropout_scope=f.dropout, **ctx.params.model.model_dump())


def fingerprint(ctx) -> str:
    data: dict[str, Any] = {"resolved": ctx.resolved()}
    if "init" in ctx.deps:
        data["init"] = file_digest(ctx.deps["init"] / "model.pt")
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


# ``frozen_random`` (the official code): the projection is neither trained nor saved, so every
# image stage draws its own; a fixed seed per stage keeps runs repeatable.
FROZEN_PROJ_SEED = {"train_m": 0, "train_i": 1}


def build_model(ctx, vocab_size: int, image_dim: int) -> R2M:
    cfg = model_config(ctx, vocab_size, image_dim)
    seed = FROZEN_PROJ_SEED.get(ctx.stage.name, 0) if cfg.image_proj == "frozen_random" else cfg.image_proj_seed
    cfg.image_proj_seed = seed
    if "init" not in ctx.deps:
        return R2M(cfg)
    path = ctx.deps["init"] / "model.pt"
    if not path.exists():
        raise FileNotFoundError(f"{ctx.stage.name}: missing init checkpoint {path} (run the previous stage)")
    prev = ctx.deps["init"].name
    hint = f"rebuild it: r2m {prev} --dataset {ctx.dataset} --variant {ctx.variant or 'r2m'} --fresh"
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


LAST_KEYS = ("model", "optimizer", "step", "rows", "rng", "fingerprint")


def resume_folder(ctx) -> Path:
    """Where the stage keeps ``last.pt`` while it runs (not a declared output)."""
    return RS.resume_dir(ctx.root, ctx.stage.name, ctx.axes)


def load_last(path: Path) -> dict[str, Any]:
    """``last.pt`` checked: clear one-line errors naming the file, suggesting ``--fresh``."""
    last = load_checkpoint(path, LAST_KEYS, hint="delete it or rerun with --fresh")
    if not isinstance(last["model"], dict) or "state_dict" not in last["model"]:
        raise CheckpointError(f"{path}: 'model' holds no state_dict; delete it or rerun with --fresh")
    return last


def make_adam(model: torch.nn.Module, lr: float) -> torch.optim.Adam:
    """Adam with the fused kernel when the build has it (same update; ~7x faster step on CPU)."""
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr)


def _rng_state() -> dict[str, Any]:
    s: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def restore_last(ctx, name: str, work: Path, fp: str, model, opt, fresh: bool = False) -> dict[str, Any] | None:
    """The resume state ``work/last.pt`` loaded into ``model``/``opt`` (and the RNGs) when it was
    written with the same fingerprint, else ``None``; ``fresh`` deletes it first. A state that does
    not fit the model is a one-line :class:`CheckpointError` naming the file."""
    last_path = work / "last.pt"
    if fresh:
        RS.clear(work)
    if not last_path.exists():
        return None
    last = load_last(last_path)
    if last["fingerprint"] != fp:
        ctx.log.info("%s: %s is from other params/init; starting over", name, last_path)
        return None
    try:
        model.load_state_dict(last["model"]["state_dict"])
        opt.load_state_dict(last["optimizer"])
    except (RuntimeError, ValueError, KeyError) as err:
        raise CheckpointError(f"{last_path}: does not fit the model ({str(err).splitlines()[0][:160]}); "
                              "delete it or rerun with --fresh") from None
    _set_rng_state(last["rng"])
    ctx.log.info("%s: resuming from %s at step %d", name, last_path, int(last["step"]))
    return last


def _set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["cpu"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def _write_loss(path: Path, columns: tuple[str, ...], rows: list[list[Any]]) -> None:
    head = "\t".join(("step", "split", "loss", *columns))
    lines = [head] + ["\t".join("" if x is None else (f"{x:.6g}" if isinstance(x, float) else str(x)) for x in r)
                      for r in rows]
    write_text(path, "\n".join(lines) + "\n")


# --------------------------------------------------------------------------- the loop
def run(ctx) -> None:
    select = None
    how = getattr(ctx.params, ctx.stage.name).select_by
    has_images = "prepared" in ctx.deps
    if how == "cider" and not has_images:
        raise ValueError(f"{ctx.stage.name}.select_by: cider needs images; only train_m/train_i can use it")
    if how == "cider" or (how == "auto" and has_images):
        from r2m.training.selection import cider_selector

        select = cider_selector(ctx, ctx.runtime.torch_device(), load_itos(ctx.deps["vocab"]))
    train(ctx, select)


def train(ctx, select: Selector | None = None) -> dict[str, Any]:
    name = ctx.stage.name
    if name not in OBJECTIVES:
        raise KeyError(f"r2m.training.stages: no objective for stage {name!r}; known: {', '.join(OBJECTIVES)}")
    obj = OBJECTIVES[name]
    tp = getattr(ctx.params, name)
    args = getattr(ctx, "args", None)
    device = distributed.device_for(ctx.runtime.torch_device())
    dist = distributed.setup(device)
    out_dir = Path(ctx.outs["model"])
    work = resume_folder(ctx)
    torch.manual_seed(tp.seed)
    itos = load_itos(ctx.deps["vocab"])

    # data ------------------------------------------------------------
    val_iter: Callable[[], Iterator[Any]]
    if obj.data == "text":
        enc = Path(ctx.deps["vocab"]) / "encoded.parquet"
        stream = TextStream(enc, "train", tp.batch_size, tp.max_len, tp.seed)
        try:
            val = TextStream(enc, "val", tp.batch_size, tp.max_len, tp.seed)
            val_iter = lambda: val.ordered(max_batches=20)  # noqa: E731
        except ValueError:
            ctx.log.warning("%s: no 'val' sentences in %s; no held-out XE", name, enc)
            val_iter = lambda: iter(())  # noqa: E731
        image_dim, new_batches = 0, stream.batches
    else:
        cp = ctx.params.concepts
        official = ctx.params.fidelity.image_concepts == "official"  # unshuffled, official order
        kw = dict(prepared=ctx.deps["prepared"], concepts=ctx.deps["concepts"], features=ctx.deps["features"],
                  itos=itos, threshold=cp.score_threshold, max_per_image=cp.max_per_image,
                  order=concept_order(ctx.params.fidelity.image_concepts, "train"), shuffle=not official,
                  dictionary=cp.dictionary)
        images = ImageSet(split="train", **kw)
        ctx.log.info("%s: %d training images with concepts and features", name, len(images))
        val_images = ImageSet(split="val", **kw)
        val_iter = lambda: val_images.ordered(tp.batch_size, max_batches=20)  # noqa: E731
        image_dim = images.dim
        new_batches = lambda start: images.batches(tp.batch_size, tp.seed, start)  # noqa: E731

    # model, optimiser, resume ----------------------------------------
    model = build_model(ctx, len(itos), image_dim).to(device)
    opt = make_adam(model, tp.lr)
    step_fn = dist.wrap(model, lambda m, b: obj.compute(ctx, m, b, tp), device)
    fp = fingerprint(ctx)
    last_path = work / "last.pt"
    step, rows, best = 0, [], None
    elapsed_prev, seen_prev = 0.0, 0
    last = restore_last(ctx, name, work, fp, model, opt, fresh=getattr(args, "fresh", False))
    if last is not None:
        step, rows, best = int(last["step"]), list(last["rows"]), last.get("best")
        elapsed_prev, seen_prev = float(last.get("elapsed", 0.0)), int(last.get("seen", 0))
    ctx.log.info("%s: %s on %s, %d parameters, %d steps x %d", name, ctx.variant, device,
                 model.param_count(), tp.steps, tp.batch_size)

    use_bf16 = (bool(getattr(args, "bf16", False)) or getattr(ctx.runtime, "bf16", False)) and device.type == "cuda"
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_bf16 else contextlib.nullcontext

    def evaluate() -> dict[str, float]:
        model.eval()
        tot: dict[str, float] = {}
        n = 0
        with torch.no_grad(), autocast():
            for b in val_iter():
                b = b.to(device)
                if obj.data == "text":
                    _, comp = text_objective(model, b, None)
                else:
                    _, comp = obj.compute(ctx, model, b, tp)
                for k, v in comp.items():
                    tot[k] = tot.get(k, 0.0) + float(v) * len(b)
                n += len(b)
        model.train()
        return {k: v / n for k, v in tot.items()} if n else {}

    def save_last() -> None:
        save_torch(last_path, {"model": model.checkpoint(), "optimizer": opt.state_dict(), "step": step,
                               "rows": rows, "rng": _rng_state(), "fingerprint": fp, "best": best,
                               "elapsed": elapsed_prev + (time.perf_counter() - t0), "seen": seen})

    def eval_and_select() -> None:
        nonlocal best
        ev = evaluate()
        if ev:
            val_loss = ev["xe"] if obj.data == "text" else ev["rank"] + (ctx.entry.gamma if name == "train_i" else 0) * ev["rec"]
            rows.append([step, "val", val_loss, *(ev.get(c) for c in obj.columns)])
            ctx.log.info("%s step %d: val %s", name, step, " ".join(f"{k}={v:.4f}" for k, v in ev.items()))
        if select is not None:
            score = float(select(model, step))
            if best is None or score > best["score"]:
                best = {"score": score, "step": step, "checkpoint": model.checkpoint(stage=name, step=step)}
            ctx.log.info("%s step %d: selection score %.4f (best %.4f @ %d)", name, step, score, best["score"], best["step"])

    model.train()
    t0, seen = time.perf_counter(), seen_prev
    batches = new_batches(step)
    bar = progress(total=tp.steps, initial=step, desc=name)
    stop = RS.Preemption()  # SIGTERM/SIGINT: finish the step, save last.pt, stop
    with stop:
        while step < tp.steps:
            batch = dist.shard(next(batches)).to(device)
            with autocast():
                loss, comp = step_fn(batch)
            if dist.enabled:  # log the global batch's loss
                comp = {k: dist.mean(v) for k, v in comp.items()}
            loss_value = float(dist.mean(loss.detach()))
            if not math.isfinite(loss_value):
                raise NonFiniteLoss(f"{name}: loss is {loss_value} at step {step + 1} "
                                    f"({', '.join(f'{k}={float(v.detach()):.4g}' for k, v in comp.items())}); "
                                    f"try a lower learning rate (params: {name}.lr = {tp.lr})")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tp.clip)
            opt.step()
            step += 1
            seen += dist.global_rows(len(batch))
            rows.append([step, "train", loss_value, *(float(comp[c].detach()) if c in comp else None for c in obj.columns)])
            bar.update(1)
            if step % tp.eval_every == 0 or step == tp.steps:
                eval_and_select()
            if (step % tp.checkpoint_every == 0 or step == tp.steps) and dist.is_main:
                save_last()
            RS.inject(name, step)  # fault suite (R2M_FAULT), a no-op otherwise
            if stop.requested:
                if step % tp.checkpoint_every and step != tp.steps and dist.is_main:
                    save_last()
                bar.close()
                stop.check(f"step {step} of {tp.steps}", last_path)
    bar.close()
    elapsed = elapsed_prev + time.perf_counter() - t0

    # outputs ---------------------------------------------------------
    final = model.checkpoint(stage=name, step=step, variant=ctx.variant or "r2m", dataset=ctx.dataset or "")
    if best is not None:
        final = {**best["checkpoint"], "variant": ctx.variant or "r2m", "dataset": ctx.dataset or ""}
    if not dist.is_main:  # DDP: rank 0 writes the outputs
        if obj.data == "image":
            images.close()
            val_images.close()
        dist.barrier()
        return {}
    from r2m.decoding import settings

    with atomic_path(out_dir) as tmp:  # the model folder appears complete or not at all
        tmp.mkdir()
        torch.save(final, tmp / "model.pt")
        ctx.save_params(tmp)
        settings.record(ctx, tmp, itos)  # inference.json: what `r2m caption IMAGES --model` needs
    _write_loss(Path(ctx.outs["loss"]), obj.columns, rows)
    train_rows = [r for r in rows if r[1] == "train"]
    val_rows = [r for r in rows if r[1] == "val"]
    metrics = {
        "stage": name, "variant": ctx.variant, "steps": step,
        "train_loss": train_rows[-1][2] if train_rows else None,
        "train_loss_last10": (sum(r[2] for r in train_rows[-10:]) / len(train_rows[-10:])) if train_rows else None,
        "val_loss": val_rows[-1][2] if val_rows else None,
        "val_xe": (val_rows[-1][3] if val_rows and obj.data == "text" else None),
        "sentences_per_s" if obj.data == "text" else "images_per_s": (seen / elapsed) if elapsed > 0 else None,
        "wall_s": elapsed, "device": str(device), "parameters": model.param_count(),
        "selected_step": best["step"] if best else None, "selected_score": best["score"] if best else None,
    }
    metrics = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
    write_json(Path(ctx.outs["metrics"]), metrics)
    if obj.data == "image":
        images.close()
        val_images.close()
    RS.clear(work)  # outputs complete: the resumable state is no longer needed
    ctx.log.info("%s: done, %d steps in %.1f s", name, step, elapsed)
    dist.barrier()
    return metrics

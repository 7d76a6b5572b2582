"""Stages ``extract_features`` and ``extract_features_sup``: CNN features per image into HDF5 (+ a Parquet index).

The backends are ``r2m.vision.extractors`` (one file each, chosen by ``extract_features.backend``);
the folder format, shard parts and assembly are ``r2m.vision.feature_store``. This module is the
stage: ``extract_dataset`` (resumable, shardable computation then assembly), its CLI flags and ``run``.
``run_sup`` is the same stage for the supervised baselines: its own params section ``sup_features``
(same schema) and its own folder ``D/sup_features``, so R²M and the baselines can read different
networks (the benchmarks: Inception-V4 for R²M, VGG-16 fc7 + conv5 grid for the baselines).

Output folder (``D/features``, resp. ``D/sup_features``; a DVC ``persist`` output):
``features.h5`` (float16, one chunked dataset per kind), ``index.parquet`` (``image_id``, ``row``),
``meta.json`` (backend, dims, bad images), ``bad_images.csv``.

**Resumable and shardable.** Images are cut into shards of ``shard_size``; each finished shard is
written atomically to ``shard-NNNNN.h5`` in the stage's resume folder
``.r2m/resume/extract_features/<dataset>/parts`` (not a declared output, so a killed or failed job
keeps them under Snakemake and DVC too) and skipped on restart (the parts are tied to the backend,
options and image list by a fingerprint, stale ones are discarded). SIGTERM/SIGINT stop after the
current shard. For parallel jobs run ``r2m extract_features --dataset D --shard I --num-shards K``
for I = 0..K-1 (each does shards ``j % K == I`` and stops, publishing its parts in ``--parts-dir``),
then ``r2m extract_features --dataset D --merge`` to assemble (a plain run without these flags
computes what is missing and assembles). The output folder is replaced as a whole once assembled
(it appears complete or not at all); the parts are deleted then.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from r2m.stage.context import StageContext
from r2m.utils import resume as RS
from r2m.utils.cliargs import int_in
from r2m.vision import feature_store as FS
from r2m.vision.extractors.base import Extractor
from r2m.vision.extractors.compute import extract_arrays
from r2m.vision.extractors.crops import with_crops
from r2m.vision.extractors.factory import build_extractor
from r2m.vision.images import read_image_index
from r2m.vision.weights import uses_random_weights

log = logging.getLogger("r2m")


def compute_shard(ex: Extractor, files: Sequence[str], a: int, b: int, part: Path, batch_size: int,
                  device: Any, workers: int) -> None:
    """Features of ``files[a:b]`` written as one part."""
    arrays, good, bad = extract_arrays(ex, files[a:b], batch_size, device, workers)
    FS.write_part(part, a, arrays, good, bad)


def extract_dataset(
    ids: Sequence[str],
    files: Sequence[str],
    out: str | Path,
    backend: str,
    options: dict[str, Any] | None = None,
    batch_size: int = 32,
    shard_size: int = 4096,
    device: Any = "cpu",
    workers: int = 0,
    shard: tuple[int, int] | None = None,
    merge_only: bool = False,
    parts_dir: str | Path | None = None,
    parts_from: str | Path | None = None,
    work: str | Path | None = None,
    finalize: Callable[[Path], Any] | None = None,
    fault_point: str = "extract_features",
    digest_cache: str | Path | None = None,
    crops: int = 0,
) -> dict[str, Any] | None:
    """Compute (resumably) and assemble the features folder ``out``; returns ``meta`` once assembled.

    Finished shards go to ``work`` (the resume folder; default ``.<out name>.parts`` beside ``out``: the
    output folder is never filled in place). ``shard=(I, K)``
    computes only shards ``j % K == I``, publishes them in ``parts_dir`` and returns ``None`` (merge
    later with ``merge_only=True``); ``parts_from`` makes the merge collect the parts of every shard
    folder below it first. ``finalize(folder)`` adds files (params) to the assembled folder before it
    replaces ``out``. Nothing existing is deleted before the backend is built. ``fault_point``: the
    fault suite's name for this stage (``R2M_FAULT=<fault_point>@<shard>:<signal>``). ``digest_cache``: the
    stat cache of the images' digests (:func:`r2m.vision.feature_store.image_digests`). ``crops``: K seeded
    random crops per image beside its usual view (:mod:`r2m.vision.extractors.crops`; 0: none).
    """
    out = Path(out)
    options = dict(options or {})
    ranges = FS.shard_ranges(len(ids), shard_size)
    parts = Path(work) if work is not None else FS.default_parts(out)
    # the crops count in the fingerprint only when asked for: features made without them keep their bytes
    made_with = {**options, "crops": crops} if crops else options
    fingerprint = FS.fingerprint(backend, made_with, shard_size, ids, files, FS.image_digests(files, digest_cache))
    done = FS.finished_meta(out)
    if done is not None and done.get("fingerprint") == fingerprint and parts_dir is None:
        log.info("features: %s is up to date", out)
        return done
    todo = [j for j in range(len(ranges)) if not FS.part_path(parts, j).exists()]
    if shard is not None:
        i, k = shard
        todo = [j for j in todo if j % k == i]
    # build the backend first: a bad name or option fails before anything is touched
    ex = with_crops(build_extractor(backend, options), crops) if (not merge_only and todo) else None
    FS.prepare_parts(parts, fingerprint)
    if parts_from is not None:
        FS.collect_parts(Path(parts_from), parts, fingerprint)
    todo = [j for j in todo if not FS.part_path(parts, j).exists()]
    if ex is not None and todo:
        with RS.Preemption() as stop:  # SIGTERM/SIGINT: finish the current shard, then stop
            for j in todo:
                a, b = ranges[j]
                log.info("features: shard %d/%d (images %d-%d)", j + 1, len(ranges), a, b - 1)
                compute_shard(ex, files, a, b, FS.part_path(parts, j), batch_size, device, workers)
                RS.inject(fault_point, j + 1)  # fault suite (R2M_FAULT), a no-op otherwise
                stop.check(f"shard {j + 1} of {len(ranges)}", parts)
    if shard is not None:
        if parts_dir is not None and Path(parts_dir) != parts:
            FS.publish_parts(parts, Path(parts_dir), [j for j in range(len(ranges)) if j % shard[1] == shard[0]])
        log.info("features: shard %d of %d done; assemble with --merge", shard[0], shard[1])
        return None
    meta = {"backend": backend, "options": options, "format": FS.FORMAT_VERSION, "fingerprint": fingerprint,
            "random_weights": uses_random_weights(backend, options), **({"crops": crops} if crops else {})}
    return FS.assemble(out, ids, files, len(ranges), meta, parts, finalize)


# ============================================================================ stage
def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sharding (parallel jobs)")
    g.add_argument("--shard", type=int_in(0, 10**6), default=None, help="compute only shards j %% K == I (this is I)")
    g.add_argument("--num-shards", type=int_in(1, 10**6), default=None, help="K, the number of parallel shard jobs")
    g.add_argument("--merge", action="store_true", help="only assemble the finished shards")
    g.add_argument("--parts-dir", default=None, help="where a shard job writes its parts (default: <out>/parts)")
    g.add_argument("--parts-from", default=None, help="merge: collect parts from every folder below this one")


def _shard_args(args: Any) -> tuple[tuple[int, int] | None, bool]:
    shard, k = getattr(args, "shard", None), getattr(args, "num_shards", None)
    if (shard is None) != (k is None):
        raise ValueError("--shard and --num-shards go together")
    if shard is not None and not (k >= 1 and 0 <= shard < k):
        raise ValueError(f"--shard {shard} --num-shards {k}: need 0 <= shard < num-shards")
    return ((shard, k) if shard is not None else None), bool(getattr(args, "merge", False))


def run(ctx: StageContext) -> None:
    """Stage ``extract_features``: R²M's features (params ``extract_features``) into ``D/features``."""
    p = ctx.params.extract_features
    extract_stage(ctx, p, ctx.outs["features"], p.crops or 0)


def run_sup(ctx: StageContext) -> None:
    """Stage ``extract_features_sup``: the supervised baselines' features (params ``sup_features``,
    e.g. VGG-16 fc7 + conv5 grid on the benchmarks) into ``D/sup_features``."""
    extract_stage(ctx, ctx.params.sup_features, ctx.outs["sup_features"])


def extract_stage(ctx: StageContext, p: Any, out: Path, crops: int = 0) -> None:
    """One features stage: params section ``p`` (:class:`r2m.params.FeatureParams`) into folder ``out``, with
    ``crops`` seeded random crops per image (R²M's features under ``extract_features.crops``; the baselines none)."""
    args = ctx.args
    shard, merge = _shard_args(args)
    images = read_image_index(ctx.deps["prepared"], ctx.root)
    ids, files = list(images["image_id"]), list(images["file"])
    del images  # the table of every image (4 string columns, ~720 B an image) is not held while features run
    ctx.log.info("features: %d images, backend %s, device %s", len(ids), p.backend, ctx.runtime.torch_device())
    work = RS.resume_dir(ctx.root, ctx.stage.name, ctx.axes, None if shard is None else f"shard{shard[0]}")
    meta = extract_dataset(
        ids, files, out, p.backend, p.options, p.batch_size, p.shard_size,
        ctx.runtime.torch_device(), ctx.runtime.workers, shard, merge,
        getattr(args, "parts_dir", None), getattr(args, "parts_from", None),
        work=work / "parts", finalize=ctx.save_params, fault_point=ctx.stage.name,
        digest_cache=ctx.root / ".r2m" / "digests" / ctx.stage.name / f"{ctx.stage.key(ctx.axes)}.json",
        crops=crops,
    )
    if meta is not None or shard is not None:
        RS.clear(work)  # outputs complete (or published): the resumable state is no longer needed
    if meta is not None:
        ctx.log.info("features: %d images -> %s (%s); %d bad image(s) listed in %s", meta["n_images"], out,
                     ", ".join(f"{k} {v}" for k, v in meta["kinds"].items()), meta["n_bad"], out / "bad_images.csv")

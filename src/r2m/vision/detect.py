"""Stage ``detect_concepts``: visual concepts per image (dictionary words with scores and boxes).

The backends live in the package ``r2m.vision.detectors`` (one file each, named in ``r2m.catalogs.DETECTORS``);
this module is the stage (building and running a backend: ``r2m.vision.detectors.factory``).

Output ``D/concepts/detections.parquet``: ``image_id, label, concept, score, x1, y1, x2, y2``;
every detection with a dictionary concept and ``score >= floor`` (the backend's, default 0.05;
``detect_concepts.floor``: 0 under the official profile) is kept — ``concepts.score_threshold`` and the
at-most-5 rule are applied by consumers. Unreadable images are listed in
``data/<dataset>/bad_images.csv`` and never stop the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from r2m.stage.context import StageContext
from r2m.text.dictionary import load_dictionary
from r2m.utils.io import atomic_path, write_json
from r2m.vision.detectors.base import Env
from r2m.vision.detectors.factory import build_detector
from r2m.vision.images import read_image_index, write_bad_images


def summary(df: pd.DataFrame, n_images: int, threshold: float) -> dict[str, Any]:
    kept = df[df["score"] >= threshold]
    per_image = kept.groupby("image_id")["concept"].nunique()
    return {
        "n_images": int(n_images),
        "n_detections": int(len(df)),
        "n_images_with_concept": int(len(per_image)),
        "mean_concepts_per_image": float(per_image.mean()) if len(per_image) else 0.0,
        "threshold": threshold,
        "top_concepts": kept["concept"].value_counts().head(20).to_dict(),
    }


def run(ctx: StageContext) -> None:
    p = ctx.params.detect_concepts
    prepared = ctx.deps["prepared"]
    images = read_image_index(prepared, ctx.root)
    dictionary = load_dictionary(ctx.params.concepts.dictionary)
    device = ctx.runtime.torch_device()
    ctx.log.info("detect: %d images, backend %s, dictionary %s, device %s",
                 len(images), p.backend, dictionary.name, device)
    det = build_detector(p.backend, p.options, dictionary, device, p.floor)
    env = Env(batch_size=p.batch_size, workers=ctx.runtime.workers, min_side=p.min_side,
              prepared_dir=Path(prepared), root=Path(ctx.root))
    df, bad = det.detect(images, env)
    df = df.sort_values(["image_id", "score", "concept"], ascending=[True, False, True], kind="stable")
    info = summary(df, len(images), ctx.params.concepts.score_threshold)
    info.update(backend=p.backend, n_bad_images=len(bad), floor=p.floor)
    with atomic_path(ctx.outs["concepts"]) as tmp:
        tmp.mkdir(parents=True)
        df.to_parquet(tmp / "detections.parquet", index=False)
        write_json(tmp / "summary.json", info)
        ctx.save_params(tmp)
    write_bad_images(ctx.outs["bad_images"], bad)
    ctx.log.info("detect: %d detections; %d/%d images have a concept >= %.2f; %d bad image(s) -> %s",
                 info["n_detections"], info["n_images_with_concept"], len(images),
                 info["threshold"], len(bad), ctx.outs["bad_images"])

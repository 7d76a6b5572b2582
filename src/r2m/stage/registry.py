"""The stage registry: the single source of truth for the DAG.

Snakemake builds its rules from :data:`STAGES` (``workflow/rules/stages.smk``) and ``dvc.yaml`` is
generated from it (:mod:`r2m.pipeline.dag`). Every stage is run as ``r2m <stage> …`` by both tools.

Paths are templates over the stage's *axes*: ``{dataset}``, ``{variant}`` (an R2M variant, see
:data:`r2m.params.VARIANT_NAMES`), ``{ckpt}`` (a training stage whose checkpoint is used) and
``{model}`` (a supervised baseline, :data:`r2m.params.SUP_MODEL_NAMES`). An axis takes its values
from the params list named in :data:`r2m.stage.axes.AXIS_SOURCES` unless the stage (or a Gather)
names another in ``sources`` (the supervised stages, :mod:`r2m.stage.sup_registry`: ``dataset``
from ``baselines.datasets``). A params section name may be a template too (``"{model}"``: the
model's own section).
A :class:`Gather` dependency collects one path per combination of some axes (for the tables);
Snakemake expands it over the configured values, DVC depends on a parent directory instead.

This module must stay cheap to import (no torch, no pandas): Snakemake imports it on every run.
"""

from __future__ import annotations

from r2m.params import TRAIN_STAGES
from r2m.stage.spec import (  # noqa: F401  (re-exported: the registry's types)
    FEATURES,
    GPU_JOB,
    PREPARED,
    REFERENCES,
    SEEDS,
    D,
    FanOut,
    Gather,
    M,
    Out,
    R,
    Resources,
    Stage,
)
from r2m.stage.sup_registry import sup_stages
from r2m.utils.owner import reserve

# the ``fidelity`` items each stage reads, in its resolved params (saved beside its outputs, in a training stage's
# resume fingerprint); which instances a switch reruns is decided by their run records (r2m.stage.record)
FIDELITY_CORPUS = ("fidelity.tokenizer", "fidelity.count_specials", "fidelity.plurals", "fidelity.long_sentences")
FIDELITY_VOCAB = ("fidelity.vocab_counts", "fidelity.vocab_filter", "fidelity.singularise_targets",
                  "fidelity.count_specials", "fidelity.plurals")
# the model's build switches (every training stage builds or rebuilds the model)
FIDELITY_MODEL = ("fidelity.init", "fidelity.dropout", "fidelity.rm_input", "fidelity.qkv_norm", "fidelity.out_bias",
                  "fidelity.rm_scale", "fidelity.fm_output", "fidelity.fm_attention")
FIDELITY_TRAIN = {
    "train_xe": (*FIDELITY_MODEL, "fidelity.xe_reduction"),
    "train_s": (*FIDELITY_MODEL, "fidelity.xe_reduction", "fidelity.rec_loss", "fidelity.similarity",
                "fidelity.cropped_v_tilde"),
    "train_m": (*FIDELITY_MODEL, "fidelity.rec_loss", "fidelity.rank_loss", "fidelity.similarity"),
    "train_i": (*FIDELITY_MODEL, "fidelity.rec_loss", "fidelity.rank_loss", "fidelity.similarity"),
    "train_e2e": (*FIDELITY_MODEL, "fidelity.xe_reduction", "fidelity.rec_loss", "fidelity.rank_loss",
                  "fidelity.similarity", "fidelity.cropped_v_tilde"),
}
FIDELITY_IMAGES = ("fidelity.image_concepts", "fidelity.concept_per_class", "fidelity.decoding", "fidelity.ban_unk",
                   "fidelity.ban_specials")
# the catalog entry's own items a training stage's loss reads (Eq. 11's beta, Eq. 13's gamma); no stage
# reads the entry's `overrides` as such: they reach a stage through the sections it declares
# Stage.priority of the four training stages: the CPU seconds of the demo's chain each starts (train_xe ~56 s,
# train_s ~43 s, train_m/train_i ~4 s each, then caption and evaluate)
TRAIN_PRIORITY = {"train_xe": 110, "train_s": 55, "train_m": 12, "train_i": 8, "train_e2e": 1}
CATALOG_ITEMS = {"train_s": ("catalog.beta",), "train_i": ("catalog.gamma",),
                 "train_e2e": ("catalog.beta", "catalog.gamma")}


def _train(name: str, prev: str | None, uses_images: bool, help: str) -> Stage:
    deps: dict[str, str | Gather] = {"vocab": f"{D}/vocab"}
    if prev:
        deps["init"] = f"{M}/{prev}"
    params: tuple[str, ...] = ("model", name, *CATALOG_ITEMS.get(name, ()), *FIDELITY_TRAIN[name])
    if uses_images:  # image stages also caption the val images (`selection`) to select the checkpoint by CIDEr
        deps.update(concepts=f"{D}/concepts", features=f"{D}/features", prepared=f"{D}/prepared",
                    references=f"{D}/references")
        # extract_features.crops: training draws one of each image's cached random crops
        params += ("selection", "concepts", *FIDELITY_IMAGES, "fidelity.select_on_test", "extract_features.crops")
    else:
        deps["corpus"] = f"{D}/corpus"
    return Stage(
        name=name,
        # the image stages select their checkpoint (decoding, evaluation): an entry of their own
        impl="r2m.training.stages:run",
        help=help,
        axes=("dataset", "variant", "seed"),
        deps=deps,
        outs={
            "model": Out(f"{M}/{name}", directory=True, persist=True, members=("model.pt", "params.yaml")),
            "loss": Out(f"results/{{dataset}}/{{variant}}/s{{seed}}/{name}/loss.tsv", kind="plots", cache=False,
                        plot=(("x", "step"), ("y", "loss"), ("title", f"{name} loss"))),
            "metrics": Out(f"results/{{dataset}}/{{variant}}/s{{seed}}/{name}/train_metrics.json", kind="metrics",
                           cache=False),
        },
        params=params,
        resources=GPU_JOB,
        priority=TRAIN_PRIORITY[name],
    )


STAGES: tuple[Stage, ...] = (
    Stage(
        "inputs",
        impl="r2m.datasets.inputs:run",
        help="digest the files prepare reads outside the DAG (folder images, corpus, the references' image list)",
        axes=("dataset",),
        outs={"inputs": Out(f"{D}/inputs.json", cache=False)},
        params=("catalog",),
        external="r2m.datasets.inputs:input_digest",
        always_changed=True,
        resources=Resources(mem_mb=1000),
        priority=125,
    ),
    Stage(
        "prepare",
        impl="r2m.datasets.stage:run",
        help="materialise a dataset recipe: image index, raw corpus",
        axes=("dataset",),
        deps={"inputs": f"{D}/inputs.json"},  # the entry's external files, digested: edit one, prepare re-runs
        outs={"prepared": Out(f"{D}/prepared", directory=True, members=PREPARED)},
        params=("catalog",),  # the recipe reads its entry only
        priority=125,
    ),
    Stage(
        "references",
        impl="r2m.datasets.stage:references",
        help="the dataset's reference captions (val/test, and the paired train captions when it has them)",
        axes=("dataset",),
        deps={"prepared": f"{D}/prepared"},  # the image index (ids, splits, file names)
        outs={"references": Out(f"{D}/references", directory=True, members=REFERENCES)},
        params=("catalog",),
        # the reference files, digested: edit a caption, this stage and its readers re-run (not prepare)
        external="r2m.datasets.inputs:reference_digest",
        always_changed=True,
        resources=Resources(mem_mb=2000),
    ),
    Stage(
        "detect_concepts",
        impl="r2m.vision.detect:run",
        help="detect visual concepts per image (dictionary words with scores and boxes)",
        axes=("dataset",),
        deps={"prepared": f"{D}/prepared"},
        outs={
            "concepts": Out(f"{D}/concepts", directory=True, members=("detections.parquet",)),
            "bad_images": Out(f"{D}/bad_images.csv", cache=False),
        },
        params=("concepts", "detect_concepts"),
        resources=GPU_JOB,
        priority=35,
    ),
    Stage(
        "extract_features",
        impl="r2m.vision.features:run",
        help="CNN features per image to HDF5 (+ Parquet index)",
        axes=("dataset",),
        deps={"prepared": f"{D}/prepared"},
        outs={"features": Out(f"{D}/features", directory=True, persist=True, members=FEATURES)},
        params=("extract_features",),
        fanout=FanOut(f"{D}/feature_shards"),
        resources=GPU_JOB,
        priority=20,
    ),
    Stage(
        "corpus_concepts",
        impl="r2m.text.stages:corpus_concepts",
        help="tokenise the text corpus and find each sentence's dictionary concepts",
        axes=("dataset",),
        deps={"prepared": f"{D}/prepared"},
        outs={"corpus": Out(f"{D}/corpus", directory=True, members=("corpus.parquet", "stats.json"))},
        params=("concepts", "corpus_concepts", *FIDELITY_CORPUS, "fidelity.vocab_counts"),  # vocab_counts: the
        # split value of sentences kept only for the vocabulary counts
        priority=120,
    ),
    Stage(
        "build_vocab",
        impl="r2m.text.stages:build_vocab",
        help="vocabulary (count threshold + dictionary words) and the encoded, filtered corpus",
        axes=("dataset",),
        deps={"corpus": f"{D}/corpus", "prepared": f"{D}/prepared"},  # prepared: a benchmark's GloVe word list
        outs={"vocab": Out(f"{D}/vocab", directory=True, members=("vocab.json", "encoded.parquet", "stats.json"))},
        params=("concepts", "build_vocab", *FIDELITY_VOCAB),
        priority=115,
    ),
    _train("train_xe", None, False, "stage 1: L_XE on the text corpus"),
    _train("train_s", "train_xe", False, "stage 2: L_S = L_XE + beta * L_rec^S on the text corpus"),
    _train("train_m", "train_s", True, "stage 3: L_M^I (hardest-negative triplet) on unpaired images"),
    _train("train_i", "train_m", True, "stage 4: L_I = L_M^I + gamma * L_rec^I on unpaired images"),
    # the released end2end.py: one stage from scratch; no table reads it, so `all` does not build it
    _train("train_e2e", None, True, "one-stage training: L_S on sentences + L_I on images at every step"),
    Stage(
        "caption",
        impl="r2m.captioning.stage:run",  # `r2m caption IMAGES` (no axes): r2m.cli.STANDALONE's r2m.caption_cli
        help="beam-search captions for the evaluation images (COCO results JSON)",
        axes=("dataset", "variant", "ckpt", "seed"),
        deps={
            "model": f"{M}/{{ckpt}}",
            "vocab": f"{D}/vocab",
            "concepts": f"{D}/concepts",
            "features": f"{D}/features",
            "prepared": f"{D}/prepared",
        },
        outs={
            "captions": Out(f"{R}/captions.json", cache=False),
            "attention": Out(f"{R}/attention.json", cache=False),
            "info": Out(f"{R}/caption_info.json", cache=False),
        },
        params=("caption", "concepts", *FIDELITY_IMAGES),
        resources=Resources(gpu=1, mem_mb=8000),
    ),
    Stage(
        "evaluate",
        impl="r2m.evaluation.stage:run",
        help="coco-caption metrics of the captions against the references",
        axes=("dataset", "variant", "ckpt", "seed"),
        deps={"captions": f"{R}/captions.json", "info": f"{R}/caption_info.json", "prepared": f"{D}/prepared",
              "references": f"{D}/references", "bad_images": f"{D}/bad_images.csv"},
        outs={
            "metrics": Out(f"{R}/eval.json", kind="metrics", cache=False),
            "per_image": Out(f"{R}/eval_per_image.json", cache=False),
            "stats": Out(f"{R}/per_image.parquet", cache=False),
        },
        params=("evaluate",),
    ),
    *sup_stages(),
    Stage(
        "table1",
        impl="r2m.reports.tables:table1",
        help="paper Table 1: R2M per dataset beside the published rows",
        axes=(),
        deps={
            "evals": Gather(f"{R}/eval.json", over=("dataset", "seed"),
                            fixed=(("variant", "r2m"), ("ckpt", "train_i")), dvc_path="results"),
            "stats": Gather(f"{R}/per_image.parquet", over=("dataset", "seed"),
                            fixed=(("variant", "r2m"), ("ckpt", "train_i")), dvc_path="results"),
        },
        outs={"csv": Out("reports/table1.csv", cache=False), "md": Out("reports/table1.md", cache=False)},
        params=("datasets", *SEEDS),
    ),
    Stage(
        "table2",
        impl="r2m.reports.tables:table2",
        help="paper Table 2: memory ablations (final checkpoints)",
        axes=(),
        deps={
            "evals": Gather(f"{R}/eval.json", over=("dataset", "variant", "seed"),
                            fixed=(("ckpt", "train_i"),), dvc_path="results"),
            "stats": Gather(f"{R}/per_image.parquet", over=("dataset", "variant", "seed"),
                            fixed=(("ckpt", "train_i"),), dvc_path="results"),
        },
        outs={"csv": Out("reports/table2.csv", cache=False), "md": Out("reports/table2.md", cache=False)},
        params=("datasets", "variants", *SEEDS),
    ),
    Stage(
        "table3",
        impl="r2m.reports.tables:table3",
        help="paper Table 3: loss ablations (the four stage checkpoints of R2M)",
        axes=(),
        deps={
            "evals": Gather(f"{R}/eval.json", over=("dataset", "ckpt", "seed"),
                            fixed=(("variant", "r2m"),), dvc_path="results"),
            "stats": Gather(f"{R}/per_image.parquet", over=("dataset", "ckpt", "seed"),
                            fixed=(("variant", "r2m"),), dvc_path="results"),
        },
        outs={"csv": Out("reports/table3.csv", cache=False), "md": Out("reports/table3.md", cache=False)},
        params=("datasets", *SEEDS),
    ),
    Stage(
        "claims",
        impl="r2m.reports.claims:run",
        help="a verdict on each claim of the paper's Tables 1-3: supported, contradicted, unresolved, not testable",
        axes=(),
        deps={  # Table 2's rows (each variant's final checkpoint) and Table 3's (R2M's four checkpoints)
            "t2_evals": Gather(f"{R}/eval.json", over=("dataset", "variant", "seed"),
                               fixed=(("ckpt", "train_i"),), dvc_path="results"),
            "t2_stats": Gather(f"{R}/per_image.parquet", over=("dataset", "variant", "seed"),
                               fixed=(("ckpt", "train_i"),), dvc_path="results"),
            "t3_evals": Gather(f"{R}/eval.json", over=("dataset", "ckpt", "seed"),
                               fixed=(("variant", "r2m"),), dvc_path="results"),
            "t3_stats": Gather(f"{R}/per_image.parquet", over=("dataset", "ckpt", "seed"),
                               fixed=(("variant", "r2m"),), dvc_path="results"),
        },
        outs={"csv": Out("reports/claims.csv", cache=False)},
        params=("datasets", "variants", *SEEDS),
    ),
    Stage(
        "figures",
        impl="r2m.reports.figures:run",
        help="loss curves, FM/RM attention and qualitative examples for one dataset",
        axes=("dataset",),
        deps={
            "losses": Gather(f"{R}/loss.tsv", over=("variant", "ckpt", "seed"), dvc_path="results/{dataset}"),
            # the examples and the attention figure show R2M's first seed
            "captions": Gather(f"{R}/captions.json", over=("ckpt", "seed"), fixed=(("variant", "r2m"),),
                               dvc_path="results/{dataset}"),
            "attention": Gather(f"{R}/attention.json", over=("seed",), fixed=(("variant", "r2m"), ("ckpt", "train_i")),
                                dvc_path="results/{dataset}"),
            "prepared": f"{D}/prepared",
            "references": f"{D}/references",
            "concepts": f"{D}/concepts",
        },
        outs={"figures": Out("reports/figures/{dataset}", directory=True, cache=False)},
        # variants: the loss curves gathered; concepts: examples' concepts; seeds: each run's
        params=("report", "variants", "concepts", *SEEDS),
    ),
    Stage(
        "report",
        impl="r2m.reports.html:run",
        help="reports/index.html: the tables and figures on one static page",
        axes=(),
        deps={
            "table1": "reports/table1.csv",
            "table2": "reports/table2.csv",
            "table3": "reports/table3.csv",
            "claims": "reports/claims.csv",
            "baselines": "reports/baselines.csv",
            "baselines_multilabel": "reports/baselines_multilabel.csv",
            "baselines_attention": "reports/figures/baselines",
            "retrieval": "reports/retrieval.csv",
            "figures": Gather("reports/figures/{dataset}", over=("dataset",), dvc_path="reports/figures"),
        },
        outs={"html": Out("reports/index.html", cache=False)},
        # the rest: the "random weights" lines (each dataset's feature and detector backends)
        params=("datasets", "baselines.datasets", "catalog", "extract_features", "detect_concepts", "sup_features"),
    ),
)

BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}
CKPTS = TRAIN_STAGES
# every path a stage writes (its outputs, its shard folders): no other command writes onto, below or above one
reserve([o.path for s in STAGES for o in s.outs.values()] + [s.fanout.folder for s in STAGES if s.fanout])


def folder_members(template: str, bound: dict[str, str]) -> tuple[str, tuple[str, ...]] | None:
    """``(producer, key files)`` of the output folder a dependency ``template`` names at axis values ``bound``
    (:attr:`Out.members`, possibly none; ``models/{dataset}/{variant}/{ckpt}`` at ``ckpt=train_s`` is
    train_s's folder), or None when no stage writes that folder."""
    path = template.format(**bound)
    for stage in STAGES:
        for out in stage.outs.values():
            if out.directory:
                try:
                    if out.path.format(**bound) == path:
                        return stage.name, out.members
                except KeyError:  # the producer has an axis the consumer does not bind
                    continue
    return None


def get(name: str) -> Stage:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; stages: {', '.join(BY_NAME)}") from None

"""The supervised baselines' stages (m-RNN, Show-Attend-Tell, S-CNN-RNN, ...) and the retrieval
and baselines tables, part of :data:`r2m.stage.registry.STAGES`.

Their ``dataset`` axis runs over ``baselines.datasets``, the ``model`` axis over
``baselines.models``; each model reads its own params section (``"{model}"``). They read their own
features, ``D/sup_features`` (stage ``extract_features_sup``, params ``sup_features``: the VGG-16
fc7 + conv5 grid of their papers on the benchmarks), never R²M's ``D/features``; ``retrieval_r2m``
(R²M's joint space) reads R²M's.
"""

from __future__ import annotations

from r2m.stage.spec import FEATURES, GPU_JOB, SEEDS, D, FanOut, Gather, Out, Resources, Stage

# supervised baselines (m-RNN, ...): datasets from `baselines.datasets`, models from `baselines.models`
SB = "models/{dataset}/{model}/s{seed}/train_sup"
SR = "results/{dataset}/{model}/s{seed}/train_sup"
SP = "models/{dataset}/{model}/s{seed}/pretrain_sup"
SPR = "results/{dataset}/{model}/s{seed}/pretrain_sup"
R2M_FINAL = "{dataset}/r2m/s{seed}/train_i"  # R2M's final checkpoint (models/…) and its results (results/…)
SUP = (("dataset", "baselines.datasets"),)
SF = f"{D}/sup_features"  # the baselines' features (the key "features" in their deps)
REFS = f"{D}/references"  # the reference captions (stage ``references``)


def sup_stages() -> tuple[Stage, ...]:
    return (
        Stage(
            "extract_features_sup",
            impl="r2m.vision.features:run_sup",
            help="supervised baselines: their CNN features per image (params sup_features) to HDF5 (+ Parquet index)",
            axes=("dataset",),
            deps={"prepared": f"{D}/prepared"},
            outs={"sup_features": Out(SF, directory=True, persist=True, members=FEATURES)},
            params=("sup_features",),
            sources=SUP,
            fanout=FanOut(f"{D}/sup_feature_shards"),
            resources=GPU_JOB,
            priority=65,
        ),
        Stage(
            "sup_vocab",
            impl="r2m.supervised.vocab:run",
            help="supervised baselines: vocabulary of the paired training captions and the encoded pairs",
            axes=("dataset",),
            deps={"references": REFS},
            outs={"sup_vocab": Out(f"{D}/sup_vocab", directory=True,
                                  members=("vocab.json", "captions.parquet", "stats.json"))},
            params=("sup_vocab",),
            sources=SUP,
            priority=60,
        ),
        Stage(
            "pretrain_sup",
            impl="r2m.supervised.train:pretrain",
            help="supervised baselines: a model's pretraining phase (S-CNN-RNN: CNN + concept head and LSTM in "
                 "parallel; others: a skip marker)",
            axes=("dataset", "model", "seed"),
            deps={"sup_vocab": f"{D}/sup_vocab", "features": SF, "prepared": f"{D}/prepared"},
            outs={
                "model": Out(SP, directory=True, persist=True, members=("params.yaml",)),
                "loss": Out(f"{SPR}/loss.tsv", kind="plots", cache=False,
                            plot=(("x", "step"), ("y", "loss"), ("title", "pretrain_sup loss"))),
                "metrics": Out(f"{SPR}/train_metrics.json", kind="metrics", cache=False),
            },
            params=("train_sup", "{model}", "sup_features"),  # sup_features: S-CNN-RNN's CNN end to end
            sources=SUP,
            priority=55,
        ),
        Stage(
            "train_sup",
            impl="r2m.supervised.train:run",
            help="supervised baselines: train one model on the image-caption pairs",
            axes=("dataset", "model", "seed"),
            deps={"sup_vocab": f"{D}/sup_vocab", "features": SF, "pretrain": SP,
                  "prepared": f"{D}/prepared", "references": REFS},  # references: select_by cider|bleu4
            outs={
                "model": Out(SB, directory=True, persist=True, members=("params.yaml",)),
                "loss": Out(f"{SR}/loss.tsv", kind="plots", cache=False,
                            plot=(("x", "step"), ("y", "loss"), ("title", "train_sup loss"))),
                "metrics": Out(f"{SR}/train_metrics.json", kind="metrics", cache=False),
            },
            params=("train_sup", "{model}", "selection", "sup_features"),  # selection: the val captions of select_by
            sources=SUP,
            resources=GPU_JOB,
            priority=55,
        ),
        Stage(
            "caption_sup",
            impl="r2m.supervised.caption:run",
            help="supervised baselines: beam-search captions for the evaluation images",
            axes=("dataset", "model", "seed"),
            deps={"model": SB, "sup_vocab": f"{D}/sup_vocab", "features": SF,
                  "prepared": f"{D}/prepared"},
            outs={"captions": Out(f"{SR}/captions.json", cache=False)},
            params=("caption",),
            sources=SUP,
            resources=Resources(gpu=1, mem_mb=8000),
        ),
        Stage(
            "evaluate_sup",
            impl="r2m.supervised.scores:evaluate",
            help="supervised baselines: coco-caption metrics of the captions",
            axes=("dataset", "model", "seed"),
            deps={"captions": f"{SR}/captions.json", "prepared": f"{D}/prepared", "references": REFS,
                  "sup_vocab": f"{D}/sup_vocab"},
            outs={
                "metrics": Out(f"{SR}/eval.json", kind="metrics", cache=False),
                "per_image": Out(f"{SR}/eval_per_image.json", cache=False),
                "stats": Out(f"{SR}/per_image.parquet", cache=False),
            },
            params=("evaluate",),
            sources=SUP,
        ),
        Stage(
            "inspect_sup",
            impl="r2m.supervised.inspect:run",
            help="supervised baselines: SAT attention maps and hit rate, S-CNN-RNN concept head P/R/F1",
            axes=("dataset", "model", "seed"),
            deps={"model": SB, "sup_vocab": f"{D}/sup_vocab", "features": SF,
                  "prepared": f"{D}/prepared", "references": REFS},
            outs={"inspect": Out(f"{SR}/inspect", directory=True, cache=False, adopt=("inspect.json",))},
            params=("caption", "report"),
            sources=SUP,
        ),
        Stage(
            "mostfreq",
            impl="r2m.supervised.scores:mostfreq",
            help="supervised baselines' reference point: the most frequent training caption for every image",
            axes=("dataset",),
            deps={"sup_vocab": f"{D}/sup_vocab", "prepared": f"{D}/prepared", "references": REFS},
            outs={"captions": Out("results/{dataset}/mostfreq/captions.json", cache=False),
                  "metrics": Out("results/{dataset}/mostfreq/eval.json", kind="metrics", cache=False),
                  "stats": Out("results/{dataset}/mostfreq/per_image.parquet", cache=False)},
            params=("caption", "evaluate"),
            sources=SUP,
        ),
        Stage(
            "retrieval_sup",
            impl="r2m.supervised.retrieval:run_sup",
            help="supervised baselines: image-sentence retrieval (R@K, Med r) by P(sentence | image)",
            axes=("dataset", "model", "seed"),
            deps={"model": SB, "sup_vocab": f"{D}/sup_vocab", "features": SF,
                  "prepared": f"{D}/prepared"},
            outs={"retrieval": Out(f"{SR}/retrieval.json", kind="metrics", cache=False)},
            params=("retrieval", "train_sup"),
            sources=SUP,
            priority=20,
        ),
        Stage(
            "retrieval_r2m",
            impl="r2m.supervised.retrieval:run_r2m",
            help="image-sentence retrieval (R@K, Med r) of R2M through its joint space",
            axes=("dataset", "seed"),
            deps={"model": f"models/{R2M_FINAL}", "vocab": f"{D}/vocab", "features": f"{D}/features",
                  "prepared": f"{D}/prepared", "references": REFS},
            outs={"retrieval": Out(f"results/{R2M_FINAL}/retrieval.json", kind="metrics", cache=False)},
            params=("retrieval", "concepts", "train_s"),
            fixed=(("variant", "r2m"),),  # R2M's run: its seeds
        ),
        Stage(
            "baselines",
            impl="r2m.reports.baselines:baselines",
            help="the supervised baselines' captioning table beside the seeds' published numbers",
            axes=(),
            deps={
                "evals": Gather(f"{SR}/eval.json", over=("dataset", "model", "seed"), sources=SUP, dvc_path="results"),
                "stats": Gather(f"{SR}/per_image.parquet", over=("dataset", "model", "seed"), sources=SUP, dvc_path="results"),
                "train": Gather(f"{SR}/train_metrics.json", over=("dataset", "model", "seed"), sources=SUP,
                                dvc_path="results"),
                "mostfreq": Gather("results/{dataset}/mostfreq/eval.json", over=("dataset",), sources=SUP,
                                   dvc_path="results"),
                "mostfreq_stats": Gather("results/{dataset}/mostfreq/per_image.parquet", over=("dataset",),
                                         sources=SUP, dvc_path="results"),
                "inspect": Gather(f"{SR}/inspect", over=("dataset", "model", "seed"), sources=SUP, dvc_path="results"),
            },
            outs={"csv": Out("reports/baselines.csv", cache=False), "md": Out("reports/baselines.md", cache=False),
                  "multilabel": Out("reports/baselines_multilabel.csv", cache=False),
                  "attention": Out("reports/figures/baselines", directory=True, cache=False,
                                  adopt=("index.json",))},
            params=("baselines", *SEEDS),
        ),
        Stage(
            "retrieval",
            impl="r2m.reports.baselines:retrieval",
            help="the image-sentence retrieval table: supervised baselines and R2M beside m-RNN's published rows",
            axes=(),
            deps={
                "sup": Gather(f"{SR}/retrieval.json", over=("dataset", "model", "seed"), sources=SUP, dvc_path="results"),
                "r2m": Gather(f"results/{R2M_FINAL}/retrieval.json", over=("dataset", "seed"), fixed=(("variant", "r2m"),),
                              dvc_path="results"),
            },
            outs={"csv": Out("reports/retrieval.csv", cache=False), "md": Out("reports/retrieval.md", cache=False)},
            params=("datasets", "baselines", *SEEDS),
        ),
    )

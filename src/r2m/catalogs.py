"""What params choose by name: dataset kinds (:data:`RECIPES`), concept detector backends
(:data:`DETECTORS`) and CNN feature backends (:data:`FEATURE_BACKENDS`); the supervised baselines are
:data:`r2m.baselines.BASELINES`.

Each member is one line here, ``name -> "module:attr"``; its module is imported when the member is used
(:meth:`r2m.utils.registry.Catalog.load`), so this module stays light: validating params reads the names
and a kind's option keys from it and imports no backend. Add a member: write it in its own module, then
name it here.
"""

from __future__ import annotations

from dataclasses import dataclass

from r2m.utils.registry import Catalog


@dataclass(frozen=True)
class Kind:
    """A dataset kind (``catalog.<name>.kind``)."""

    recipe: str  # "module:attr" of its recipe: an object with prepare(entry, out, log) and references(entry, prepared, log)
    keys: tuple[str, ...] = ()  # the catalog options it reads (any other key of the entry is an error)
    check: str | None = None  # "module:function" checking those options up front (r2m.pipeline.validate.check_files)


BENCHMARK_KEYS = ("raw_dir", "paths", "download")  # the catalog options every paper benchmark reads

RECIPES: Catalog[Kind] = Catalog("dataset kind", {
    "tiny": Kind("r2m.datasets.tiny:RECIPE", ("seed", "n_train_images", "n_val_images", "n_test_images",
                                              "n_sentences", "image_size"), check="r2m.datasets.tiny:check"),
    "demo": Kind("r2m.datasets.demo:RECIPE", ("source_dir", "train_copies", "crop")),
    "rehearsal": Kind("r2m.datasets.rehearsal:RECIPE", ("shape", "corpus", "scale", "seed", "image_size"),
                      check="r2m.datasets.rehearsal:check"),
    "folder": Kind("r2m.datasets.folder:RECIPE", ("images", "corpus", "references", "train_references", "val_fraction"),
                   check="r2m.datasets.folder:check"),
    "coco_shutterstock": Kind("r2m.datasets.benchmarks:COCO_SHUTTERSTOCK", BENCHMARK_KEYS),
    "flickr30k_coco": Kind("r2m.datasets.benchmarks:FLICKR30K_COCO", BENCHMARK_KEYS),
    "coco_gcc": Kind("r2m.datasets.benchmarks:COCO_GCC", BENCHMARK_KEYS),
}, member=lambda kind: kind.recipe)

# a factory (options, dictionary, device) -> r2m.vision.detectors.base.Detector
DETECTORS: Catalog[str] = Catalog("detector backend", {
    "classifier": "r2m.vision.detectors.classifier:build",
    "faces": "r2m.vision.detectors.faces:build",
    "faster_rcnn": "r2m.vision.detectors.faster_rcnn:build",
    "offline": "r2m.vision.detectors.offline:build",
    "owl": "r2m.vision.detectors.owl:build",
    "precomputed": "r2m.vision.detectors.precomputed:build",
    "regions": "r2m.vision.detectors.regions:build",
    "tf_oid": "r2m.vision.detectors.tf_oid:build",
})

# a factory options -> r2m.vision.extractors.base.Extractor
FEATURE_BACKENDS: Catalog[str] = Catalog("feature backend", {
    "inception_v3_fid": "r2m.vision.extractors.inception_v3_fid:inception_v3_fid",
    "inception_v4": "r2m.vision.extractors.inception_v4:inception_v4",
    "random_cnn": "r2m.vision.extractors.random_cnn:random_cnn",
    "vgg16": "r2m.vision.extractors.vgg16:vgg16",
    "vgg19": "r2m.vision.extractors.vgg19:vgg19",
})

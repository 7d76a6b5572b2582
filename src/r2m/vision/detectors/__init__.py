"""Concept detection backends, one per file, named in ``r2m.catalogs.DETECTORS``; each is a
factory ``(options, dictionary, device) -> Detector`` chosen by ``detect_concepts.backend``:

``offline`` (default, ``offline.py``)
    union of ``regions`` and ``faces``; runs offline with weights shipped in registry packages.
``regions`` (``regions.py``)
    several objects per photo: the ImageNet classifier on the whole image and a grid of crops,
    merged per concept (best region's score and box, non-maximum suppression).
``classifier`` (``classifier.py``)
    MobileNetV2 ImageNet classifier mapped to dictionary concepts; top-k whole-image detections.
``faces`` (``faces.py``)
    MTCNN faces -> ``person`` and ``face`` with the face box.
``faster_rcnn`` (``faster_rcnn.py``)
    a torchvision detector from a local checkpoint + class names (or torchvision's COCO weights).
``precomputed`` (``precomputed.py``)
    detections imported from a JSONL / JSON / Parquet / CSV file.
``tf_oid`` (``tf_oid.py``; optional extra ``tf``)
    the paper's detector: TensorFlow Faster R-CNN Inception-ResNet-v2 trained on OpenImages-v4
    (a local SavedModel, or TF Hub / model-zoo release downloaded once with a recorded checksum).
``owl`` (``owl.py``; optional extra ``owl``)
    open-vocabulary OWL-ViT / OWLv2 (Hugging Face ``transformers``) queried with the dictionary's
    class names.

Add a backend: a new module here with its factory ``build(options, dictionary, device) -> Detector``, named
in :data:`r2m.catalogs.DETECTORS`. ``factory.build_detector`` imports the chosen backend's module only; this package
imports none of its modules (editing one backend reruns only the instances that chose it).
Every detection with a dictionary concept and ``score >= floor`` (default 0.05; ``detect_concepts.floor``
sets it for every backend, ``factory.with_floor``) is kept — ``concepts.score_threshold`` and the at-most-5
rule are applied by consumers. The stage is ``r2m.vision.detect``.
"""

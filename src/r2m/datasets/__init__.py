"""Dataset recipes behind one interface (see :mod:`r2m.datasets.base`); which module defines each kind:
:data:`r2m.catalogs.RECIPES`, the loading of one by name: :mod:`r2m.datasets.recipes`. The ``r2m datasets``
command that lists them sits above the pipeline (:mod:`r2m.pipeline.datasets_cmd`)."""

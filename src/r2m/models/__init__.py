"""Caption models: a registry ``name -> model class`` and checkpoint loading.

A checkpoint (``model.pt``) is a plain dict ``{"model": name, "config": {...}, "state_dict": {...}}``
(loadable with ``torch.load(weights_only=True)``). A registered class provides
``from_config(dict)`` and ``from_checkpoint(ckpt, **overrides)``; baselines register here and
reuse :func:`build_model` / :func:`load_model`.

Supervised captioners (the seed baselines) register in :data:`SUP_MODELS` (interface:
:mod:`r2m.models.supervised`) with ``@SUP_MODELS.register(name, label=..., params=XParams)`` in
their own file; every module of this package is imported here, so a new baseline is one model file
(plus its ``params.yaml`` section): :mod:`r2m.params` reads its name, label and params class from
the same decorator.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

from r2m.models.mrnn import MRNN, MRNNConfig
from r2m.models.r2m import R2M, VARIANTS, R2MConfig
from r2m.models.registry import MODELS, SUP_MODELS
from r2m.models.sat import SAT, SATConfig
from r2m.models.scnn import SCNN, SCNNConfig
from r2m.utils.checkpoint import CheckpointError, load_checkpoint

MODELS.register("r2m")(R2M)
for _mod in pkgutil.iter_modules(__path__):  # the baselines register themselves on import
    importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = ["MODELS", "MRNN", "MRNNConfig", "R2M", "R2MConfig", "SAT", "SATConfig", "SCNN", "SCNNConfig", "SUP_MODELS",
           "VARIANTS", "build_model", "build_sup_model", "load_model"]


def build_sup_model(name: str, section: dict[str, Any], vocab_size: int, shapes: dict[str, tuple[int, ...]]):
    """A supervised captioner from its params section and the image feature shapes."""
    return SUP_MODELS.get(name).from_params(section, vocab_size, shapes)


def build_model(name: str, config: dict[str, Any]):
    return MODELS.get(name).from_config(config)


def load_model(path: str | Path, map_location: str = "cpu", **overrides: Any):
    """Load ``model.pt`` (a file, or a folder holding one) → ``(model, checkpoint dict)``."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.pt"
    if not path.exists():
        raise FileNotFoundError(f"missing model checkpoint: {path}")
    hint = f"rebuild it: rerun {path.parent.name} with --fresh"
    ckpt = load_checkpoint(path, ("config", "state_dict"), hint=hint, map_location=map_location)
    try:
        return MODELS.get(ckpt.get("model", "r2m")).from_checkpoint(ckpt, **overrides), ckpt
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path}: {' '.join(str(err).split())}; {hint}") from None

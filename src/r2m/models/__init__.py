"""Caption models: a registry ``name -> model class`` and checkpoint loading.

A checkpoint (``model.pt``) is a plain dict ``{"model": name, "config": {...}, "state_dict": {...}}``
(loadable with ``torch.load(weights_only=True)``). A registered class provides
``from_config(dict)`` and ``from_checkpoint(ckpt, **overrides)``; baselines register here and
reuse :func:`build_model` / :func:`load_model`.

Supervised captioners (the seed baselines) register in ``SUP_MODELS`` (interface:
:mod:`r2m.models.supervised`) with ``@SUP_MODELS.register(name, label=..., params=XParams)`` in
their own file: :mod:`r2m.params` reads its name, label and params class from the same decorator,
and :func:`sup_model_module` the file, so a new baseline is one model file (plus its ``params.yaml``
section). A baseline's module is imported when its name is asked for (:func:`sup_model`,
:func:`build_sup_model`, :func:`load_model`), never all of them: a stage's code dependencies hold its
own model's file only (:mod:`r2m.pipeline.codedeps`). ``MODELS`` and ``SUP_MODELS`` read from this
package (``from r2m.models import SUP_MODELS``) hold every baseline (all imported then).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from r2m.models import registry
from r2m.models.r2m import R2M, VARIANTS, R2MConfig
from r2m.utils.checkpoint import CheckpointError, load_checkpoint
from r2m.utils.declared import sup_model_modules
from r2m.utils.registry import load_member

registry.MODELS.register("r2m")(R2M)

__all__ = ["MODELS", "R2M", "R2MConfig", "SUP_MODELS", "VARIANTS", "build_model", "build_sup_model", "load_model",
           "sup_model", "sup_model_module"]


def sup_model_module(name: str) -> str | None:
    """The module whose file registers the baseline ``name`` (read from the source, nothing imported)."""
    return sup_model_modules(Path(__file__).parent, __name__).get(name)


def _load(name: str) -> None:
    load_member(sup_model_modules(Path(__file__).parent, __name__), name)


def _load_all() -> None:
    for name in sup_model_modules(Path(__file__).parent, __name__):
        _load(name)


def __getattr__(name: str) -> Any:
    """``MODELS`` / ``SUP_MODELS`` with every baseline registered (for listings and tests)."""
    if name in ("MODELS", "SUP_MODELS"):
        _load_all()
        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def sup_model(name: str) -> Any:
    """The class of the supervised baseline ``name`` (its module imported now)."""
    _load(name)
    return registry.SUP_MODELS.get(name)


def build_sup_model(name: str, section: dict[str, Any], vocab_size: int, shapes: dict[str, tuple[int, ...]]):
    """A supervised captioner from its params section and the image feature shapes."""
    return sup_model(name).from_params(section, vocab_size, shapes)


def build_model(name: str, config: dict[str, Any]):
    _load(name)
    return registry.MODELS.get(name).from_config(config)


def load_model(path: str | Path, map_location: str = "cpu", **overrides: Any):
    """Load ``model.pt`` (a file, or a folder holding one) → ``(model, checkpoint dict)``."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.pt"
    if not path.exists():
        raise FileNotFoundError(f"missing model checkpoint: {path}")
    hint = f"rebuild it: rerun {path.parent.name} with --fresh"
    ckpt = load_checkpoint(path, ("config", "state_dict"), hint=hint, map_location=map_location)
    name = ckpt.get("model", "r2m")
    _load(str(name))
    try:
        return registry.MODELS.get(name).from_checkpoint(ckpt, **overrides), ckpt
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path}: {' '.join(str(err).split())}; {hint}") from None

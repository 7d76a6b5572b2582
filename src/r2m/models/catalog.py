"""Caption models by name, and checkpoint loading.

A checkpoint (``model.pt``) is a plain dict ``{"model": name, "config": {...}, "state_dict": {...}}``
(loadable with ``torch.load(weights_only=True)``). A model class provides ``from_config(dict)`` and
``from_checkpoint(ckpt, **overrides)``; :data:`MODELS` names them all: ``r2m`` and every supervised
baseline of :data:`r2m.baselines.BASELINES` (interface: :mod:`r2m.models.supervised`). A model's module
is imported when its name is asked for (:func:`sup_model`, :func:`build_sup_model`, :func:`load_model`),
never all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from r2m.baselines import BASELINES
from r2m.utils.checkpoint import CheckpointError, load_checkpoint
from r2m.utils.registry import Catalog

# every caption model: name -> "module:Class"
MODELS: Catalog[str] = Catalog("model", {"r2m": "r2m.models.r2m:R2M",
                                         **{name: BASELINES.target(name) for name in BASELINES}})


def sup_model(name: str) -> Any:
    """The class of the supervised baseline ``name`` (its module imported now); its ``name`` must be the
    catalogue's (its checkpoints are loaded by it)."""
    cls = BASELINES.load(name)
    if getattr(cls, "name", None) != name:
        raise TypeError(f"{BASELINES.target(name)}: its class attribute name is {getattr(cls, 'name', None)!r}; "
                        f"set name = {name!r} (its name in r2m.baselines.BASELINES)")
    return cls


def build_sup_model(name: str, section: dict[str, Any], vocab_size: int, shapes: dict[str, tuple[int, ...]]):
    """A supervised captioner from its params section and the image feature shapes."""
    return sup_model(name).from_params(section, vocab_size, shapes)


def build_model(name: str, config: dict[str, Any]):
    return MODELS.load(name).from_config(config)


def load_model(path: str | Path, map_location: str = "cpu", **overrides: Any):
    """Load ``model.pt`` (a file, or a folder holding one) → ``(model, checkpoint dict)``."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.pt"
    if not path.exists():
        raise FileNotFoundError(f"missing model checkpoint: {path}")
    hint = f"rebuild it: rerun {path.parent.name} with --fresh"
    ckpt = load_checkpoint(path, ("config", "state_dict"), hint=hint, map_location=map_location)
    name = str(ckpt.get("model", "r2m"))
    try:
        return MODELS.load(name).from_checkpoint(ckpt, **overrides), ckpt
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path}: {' '.join(str(err).split())}; {hint}") from None

"""The model registries: every caption model by name (:data:`MODELS`, checkpoint loading) and the
supervised baselines (:data:`SUP_MODELS`).

A baseline registers on its class with ``@SUP_MODELS.register("name", label="...", params=XParams)``:
the decorator sets the class's ``name``, ``label`` and ``params_cls`` and also registers it in
:data:`MODELS`. :mod:`r2m.params` reads the same decorator from the source (no torch import) for
the baseline names, report labels and params sections (:mod:`r2m.utils.declared`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from r2m.utils.registry import Registry

MODELS: Registry[Any] = Registry("model")


class SupModelRegistry(Registry[Any]):
    """Supervised captioners; registering one also puts it in :data:`MODELS`."""

    def register(self, name: str, *, label: str = "", params: type | None = None) -> Callable[[Any], Any]:  # type: ignore[override]
        base = super().register(name)

        def deco(cls: Any) -> Any:
            cls.name, cls.label, cls.params_cls = name, label or name, params
            MODELS.register(name)(cls)
            return base(cls)

        return deco


SUP_MODELS = SupModelRegistry("supervised model")

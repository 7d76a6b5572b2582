"""S-CNN-RNN end to end (``scnn.cnn: end_to_end``, seed 002): the CNN under the concept head,
trained on the images' pixels.

The CNN is the dataset's ``sup_features`` backbone (same backend and options, so the same weights
source: a file for ``vgg16`` / ``inception_v4``, the seeded net for ``random_cnn``), built with
:func:`r2m.vision.extractors.build_extractor` and asked for its ``pooled`` feature only. It sits
under the baseline's model (:class:`r2m.models.scnn.SCNN`; the models layer knows no image backbone)
in :func:`end_to_end_class`'s class, whose ``encode`` runs the CNN on a batch of ``uint8`` images. That
class is made from the model's catalogue entry (:func:`r2m.models.sup_model`, loaded by name). This module
is loaded for the baselines whose catalogue entry names it (``end_to_end`` in
:data:`r2m.baselines.BASELINES`), when their section asks for it. The images come
from the prepared folder (:class:`Pixels`, the :class:`r2m.supervised.data.Features` interface with
the one kind ``image``; decoded by :mod:`r2m.vision.images`, kept in memory when they fit
``CACHE_BYTES``), restricted to the images ``sup_features`` could read.

* ``pretrain_sup``: CNN + concept head on L_u (gradients into the CNN), the LSTM on L_r fed the
  ground-truth s (no gradient reaches the CNN); writes ``model.pt`` (the part above the CNN) and
  ``cnn.pt`` (the backbone's weights).
* ``train_sup``: starts from both, fine-tunes everything on L_u + L_r with the LSTM fed ŝ, and
  writes ``model.pt``, ``cnn.pt`` and ``features/`` — the fine-tuned CNN's ``pooled`` features of
  every readable prepared image, in the ``sup_features`` folder format. Captioning, retrieval and
  inspection read those (:func:`r2m.supervised.data.model_features`), so a fine-tuned model is
  captioned with its own CNN while ``model.pt`` stays the plain ``scnn`` checkpoint.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from r2m.models.catalog import sup_model
from r2m.supervised.data import OWN_FEATURES
from r2m.utils.checkpoint import save_torch
from r2m.utils.io import atomic_path, write_json, write_parquet

CNN_FILE = "cnn.pt"
CACHE_BYTES = 1 << 30  # decoded images kept in memory up to this size (tiny_paired: 3.7 MB)


def end_to_end(section: dict[str, Any]) -> bool:
    """Whether a model's params section asks for the CNN trained end to end."""
    return section.get("cnn") == "end_to_end"


class Pixels:
    """Prepared images by id as ``uint8`` tensors [3, H, W] in the extractor's input size: ``row_of``,
    ``get(rows) -> {"image": [B, 3, H, W]}``, ``shapes``, ``channel_stats`` (none), ``close``."""

    def __init__(self, prepared: str | Path, root: str | Path, prepare: Any, size: tuple[int, int],
                 readable: Iterable[str] | None = None, cache_bytes: int = CACHE_BYTES) -> None:
        from r2m.vision.images import read_image_index

        df = read_image_index(prepared, root)
        keep = set(readable) if readable is not None else None
        ids, files = [], []
        for i, f in zip(df["image_id"], df["file"], strict=True):
            if keep is None or i in keep:
                ids.append(str(i))
                files.append(str(f))
        self.image_ids, self.files, self.prepare = ids, files, prepare
        self.row_of = {i: r for r, i in enumerate(ids)}
        self.shapes = {"image": (3, *size)}
        self.kinds = ("image",)
        self._cache: dict[int, Tensor] | None = {} if len(ids) * 3 * size[0] * size[1] <= cache_bytes else None

    def _load(self, row: int) -> Tensor:
        from r2m.vision.images import BadImage, load_image

        if self._cache is not None and row in self._cache:
            return self._cache[row]
        try:
            x = self.prepare(load_image(self.files[row]))
        except BadImage as err:
            raise BadImage(f"{self.files[row]}: {err}") from None
        if self._cache is not None:
            self._cache[row] = x
        return x

    def get(self, rows: np.ndarray) -> dict[str, Tensor]:
        return {"image": torch.stack([self._load(int(r)) for r in rows])}

    def channel_stats(self, rows: np.ndarray, kinds: Sequence[str] | None = None) -> dict[str, tuple[Tensor, Tensor]]:
        return {}  # pixels: the CNN's own normalisation

    def close(self) -> None:
        self._cache = None


class EndToEnd:
    """A baseline with its CNN, mixed in before the baseline's class (:func:`end_to_end_class`):
    ``encode`` runs ``cnn`` (uint8 images → ``{"pooled": [B, F]}``) when the batch carries ``image``;
    everything above the CNN is the baseline's. ``checkpoint`` saves that part only (a plain checkpoint
    of the baseline, e.g. ``scnn``); the CNN goes to ``cnn.pt`` (:func:`save_cnn`)."""

    cnn: nn.Module

    def attach_cnn(self, cnn: nn.Module) -> EndToEnd:
        self.cnn = cnn  # nn.Module's __setattr__ (the baseline's): a submodule
        return self

    def encode(self, feats: dict[str, Tensor]) -> Tensor:
        if "image" in feats:
            pooled = self.cnn(feats["image"])["pooled"]
            feats = {**{k: v for k, v in feats.items() if k != "image"}, "pooled": pooled}
        return super().encode(feats)  # type: ignore[misc]  # the baseline's

    def head_state(self) -> dict[str, Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.startswith("cnn.")}  # type: ignore[attr-defined]

    def checkpoint(self, **meta: Any) -> dict[str, Any]:
        ck = super().checkpoint(**meta)  # type: ignore[misc]
        ck["state_dict"] = {k: v.detach().cpu() for k, v in self.head_state().items()}
        return ck


@functools.cache
def end_to_end_class(model: str) -> type:
    """The class of the baseline ``model`` (from its catalogue entry) with :class:`EndToEnd` on top."""
    base = sup_model(model)
    return type(f"{base.__name__}EndToEnd", (EndToEnd, base), {})


def build_cnn(backend: str, options: dict[str, Any]):
    """The ``sup_features`` backbone (its weights from the backend's own source), pooled kind only."""
    from r2m.vision.extractors.factory import build_extractor

    return build_extractor(backend, {**dict(options or {}), "kinds": ["pooled"]})


def save_cnn(model: EndToEnd, folder: Path, backend: str, options: dict[str, Any]) -> None:
    save_torch(folder / CNN_FILE, {"backend": backend, "options": dict(options or {}),
                                   "state_dict": {k: v.detach().cpu() for k, v in model.cnn.state_dict().items()}})


def load_cnn(model: EndToEnd, folder: Path, backend: str) -> bool:
    """Load ``folder/cnn.pt`` into the model's CNN; False when the folder has none."""
    from r2m.utils.checkpoint import load_checkpoint

    path = Path(folder) / CNN_FILE
    if not path.exists():
        return False
    ck = load_checkpoint(path)
    if ck.get("backend") != backend:
        raise ValueError(f"{path}: a {ck.get('backend')} CNN, sup_features.backend is {backend}")
    model.cnn.load_state_dict(ck["state_dict"])
    return True


@torch.no_grad()
def write_features(model: EndToEnd, pixels: Pixels, folder: Path, batch_size: int, device: Any,
                   backend: str) -> int:
    """The fine-tuned CNN's ``pooled`` features of every image of ``pixels`` into ``folder/features``
    (``features.h5`` float16, ``index.parquet``, ``meta.json``), written whole."""
    import pandas as pd

    from r2m.vision.feature_store import write_h5

    was = model.training
    model.eval()
    chunks = []
    for s in range(0, len(pixels.image_ids), batch_size):
        rows = np.arange(s, min(s + batch_size, len(pixels.image_ids)))
        x = pixels.get(rows)["image"].to(device)
        chunks.append(model.cnn(x)["pooled"].float().cpu().numpy().astype(np.float16))
    model.train(was)
    arr = np.concatenate(chunks) if chunks else np.zeros((0, model.cfg.image_dim), np.float16)
    with atomic_path(folder / OWN_FEATURES) as tmp:
        tmp.mkdir()
        write_h5(tmp / "features.h5", {"pooled": arr}, {}, {"backend": f"{backend} (fine-tuned)"})
        write_parquet(tmp / "index.parquet", pd.DataFrame({"image_id": pixels.image_ids,
                                                           "row": np.arange(len(arr), dtype=np.int64)}))
        write_json(tmp / "meta.json", {"backend": backend, "fine_tuned": True, "n_images": len(arr),
                                       "kinds": {"pooled": list(arr.shape[1:])}, "dtype": "float16"})
    return len(arr)

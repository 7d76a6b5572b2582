"""Image–caption pairs for the supervised models: caption ids from ``sup_vocab/captions.parquet``
and the image features each model reads (``pooled`` and/or ``grid``) from ``features/features.h5``.

A trained model folder may hold its own ``features/`` (S-CNN-RNN end to end: its fine-tuned
CNN's, :mod:`r2m.supervised.finetune`); :func:`model_features` opens those in place of the stage's.

Features are read per batch (sorted unique rows, as h5py wants), so memory stays flat in dataset
size. Batches are a pure function of ``(seed, step)``: resuming at step s draws what a run that
never stopped would have drawn.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch import Tensor

from r2m.training.data import teacher_forcing
from r2m.training.loop import epoch_batch


@dataclass
class CaptionBatch:
    feats: dict[str, Tensor]  # kind -> [B, ...] float32
    inputs: Tensor  # [B, T] <#start> w_1 …
    targets: Tensor  # [B, T] w_1 … <#end>, 0 after
    lengths: Tensor  # [B] valid steps
    image_ids: list[str]

    def to(self, device: torch.device) -> CaptionBatch:
        return CaptionBatch({k: v.to(device) for k, v in self.feats.items()}, self.inputs.to(device),
                            self.targets.to(device), self.lengths.to(device), self.image_ids)

    def __len__(self) -> int:
        return len(self.image_ids)


CACHE_BYTES = 256 * 2**20  # a feature kind up to this size is read into memory whole (Features.get)
STATS_CHUNK_BYTES = 256 * 2**20  # channel_stats: at most this many bytes of float64 rows at a time


class Features:
    """Rows of ``features.h5`` by image id, for the given kinds."""

    def __init__(self, folder: str | Path, kinds: Sequence[str]) -> None:
        from r2m.utils.io import open_h5

        folder = Path(folder)
        index = pq.read_table(folder / "index.parquet").to_pandas()
        self.row_of = dict(zip(index["image_id"].astype(str), index["row"].astype(np.int64), strict=True))
        self.path = folder / "features.h5"
        self.h5 = open_h5(self.path)
        self._cache: dict[str, np.ndarray | None] = {}  # kind -> the whole array (see _rows)
        missing = [k for k in kinds if k not in self.h5]
        if missing:
            raise KeyError(f"{self.path}: no feature kind(s) {missing} (has {sorted(self.h5)}); set "
                           "extract_features.options.kinds for this dataset")
        self.kinds = tuple(kinds)
        self.shapes = {k: tuple(int(x) for x in self.h5[k].shape[1:]) for k in self.h5}

    def get(self, rows: np.ndarray) -> dict[str, Tensor]:
        uniq, inv = np.unique(rows, return_inverse=True)
        return {k: torch.from_numpy(np.asarray(self._rows(k, uniq), dtype=np.float32)[inv]) for k in self.kinds}

    def _rows(self, kind: str, uniq: np.ndarray) -> np.ndarray:
        """Sorted unique ``uniq`` rows of ``kind``: from memory when the whole array is at most
        :data:`CACHE_BYTES` (read once: h5py's row-list selection costs ~9 ms a batch, a sixth of a small
        SAT training), else from the file. The same values either way."""
        if kind not in self._cache:
            ds = self.h5[kind]
            self._cache[kind] = ds[()] if ds.size * ds.dtype.itemsize <= CACHE_BYTES else None
        whole = self._cache[kind]
        return self.h5[kind][uniq.tolist()] if whole is None else whole[uniq]

    def channel_stats(self, rows: np.ndarray, chunk: int = 1024, kinds: Sequence[str] | None = None,
                      chunk_bytes: int = STATS_CHUNK_BYTES) -> dict[str, tuple[Tensor, Tensor]]:
        """Per-channel mean and std of each kind (of ``kinds``, default all) over the given rows, streamed
        in chunks of ``chunk`` rows, fewer where a chunk in float64 would exceed ``chunk_bytes``."""
        rows = np.unique(rows)
        out = {}
        for k in self.kinds if kinds is None else [k for k in self.kinds if k in kinds]:
            row_values = int(np.prod(self.h5[k].shape[1:]))
            step = max(1, min(chunk, chunk_bytes // (8 * max(row_values, 1))))
            n, s1, s2 = 0, 0.0, 0.0
            for a in range(0, len(rows), step):
                x = np.asarray(self.h5[k][rows[a: a + step].tolist()], dtype=np.float64)
                x = x.reshape(-1, x.shape[-1])
                n, s1, s2 = n + len(x), s1 + x.sum(0), s2 + (x * x).sum(0)
            mean = s1 / max(n, 1)
            std = np.sqrt(np.maximum(s2 / max(n, 1) - mean * mean, 0.0))
            out[k] = (torch.from_numpy(mean).float(), torch.from_numpy(std).float())
        return out

    def close(self) -> None:
        self.h5.close()


OWN_FEATURES = "features"  # a model folder's own features (its fine-tuned CNN's), same format


def model_features(model_dir: str | Path, features_dir: str | Path, kinds: Sequence[str]) -> Features:
    """The features a trained model reads: its folder's own ``features/`` when it wrote them (a
    fine-tuned CNN), else the stage's ``features_dir`` (``D/sup_features``)."""
    own = Path(model_dir) / OWN_FEATURES
    return Features(own if (own / "features.h5").exists() else features_dir, kinds)


class PairedSet:
    """The (image, caption) pairs of one split whose image has features."""

    def __init__(self, sup_vocab: str | Path, features: Features, split: str, max_len: int) -> None:
        t = pq.read_table(Path(sup_vocab) / "captions.parquet")
        t = t.filter(pc.equal(t["split"], split))
        ids = [str(i) for i in t["image_id"].to_pylist()]
        keep = np.array([i in features.row_of for i in ids], dtype=bool)
        self.n_missing = int((~keep).sum())
        t = t.filter(pa.array(keep))
        self.image_ids = [i for i, k in zip(ids, keep, strict=True) if k]
        self.rows = np.array([features.row_of[i] for i in self.image_ids], dtype=np.int64)
        self.ids = t["ids"].combine_chunks() if t.num_rows else pa.array([], pa.list_(pa.int32()))
        self.captions = t["caption"].to_pylist()
        self.features, self.max_len, self.split = features, max_len, split

    def __len__(self) -> int:
        return len(self.image_ids)

    def batch(self, idx: np.ndarray) -> CaptionBatch:
        inputs, targets, lengths = teacher_forcing(self.ids.take(pa.array(idx)), self.max_len)
        return CaptionBatch(self.features.get(self.rows[idx]), inputs, targets, lengths,
                            [self.image_ids[i] for i in idx])

    def batches(self, batch_size: int, seed: int, start_step: int = 0) -> Iterator[CaptionBatch]:
        """Endless shuffled batches (:func:`r2m.training.loop.epoch_batch`)."""
        if len(self) == 0:
            raise ValueError(f"no {self.split} image-caption pairs with features")
        for step in itertools.count(start_step):
            yield self.batch(epoch_batch(len(self), batch_size, seed, step)[0])

    def ordered(self, batch_size: int) -> Iterator[CaptionBatch]:
        for s in range(0, len(self), batch_size):
            yield self.batch(np.arange(s, min(s + batch_size, len(self))))

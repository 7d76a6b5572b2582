"""Training data: a streamed, shuffled text corpus (``encoded.parquet``) and the unpaired image set.

Memory stays flat in corpus size: the corpus is read one *window* of Parquet row groups at a time
(≥ ``window_rows`` sentences), shuffled inside the window, and cut into batches. The order of
windows and the shuffles are pure functions of ``(seed, epoch, window)``, so a run is repeatable
and resuming at step s skips the first s batches without reading them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch import Tensor

from r2m.text.dictionary import image_concept_lists
from r2m.text.vocab import END, START, pad_lists
from r2m.training.loop import epoch_batch


def shuffle_concepts(concepts: np.ndarray, lens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Randomly permute each row's first ``lens[i]`` entries (padding stays at the end)."""
    if concepts.shape[1] == 0:
        return concepts
    keys = rng.random(concepts.shape)
    keys[np.arange(concepts.shape[1])[None, :] >= lens[:, None]] = np.inf
    return np.take_along_axis(concepts, np.argsort(keys, axis=1, kind="stable"), axis=1)


@dataclass
class TextBatch:
    concepts: Tensor  # [B, K] (shuffled per example)
    concept_lens: Tensor  # [B]
    inputs: Tensor  # [B, T] <#start> w_1 …
    targets: Tensor  # [B, T] w_1 … <#end>, 0 after
    lengths: Tensor  # [B] valid steps
    static: ClassVar[bool] = False  # padded to fixed shapes (:func:`pad_text`): host-read-free objectives

    @property
    def mask(self) -> Tensor:
        return torch.arange(self.inputs.shape[1], device=self.inputs.device)[None, :] < self.lengths[:, None]

    @property
    def cropped(self) -> Tensor:
        """[B] bool: the sentence was cut at ``max_len`` (its last valid target is not <#end>)."""
        last = (self.lengths - 1).clamp(min=0).unsqueeze(1)
        return self.targets.gather(1, last).squeeze(1) != END

    def _map(self, fn) -> TextBatch:
        return type(self)(*(fn(t) for t in (self.concepts, self.concept_lens, self.inputs, self.targets,
                                            self.lengths)))

    def to(self, device: torch.device) -> TextBatch:
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> TextBatch:
        return self._map(lambda t: t.pin_memory())

    def __len__(self) -> int:
        return self.inputs.shape[0]


class StaticTextBatch(TextBatch):
    """A :class:`TextBatch` padded to the stage's ``max_len`` and a fixed concept width."""

    static: ClassVar[bool] = True


def _pad_cols(t: Tensor, width: int) -> Tensor:
    """``t`` [B, n] right-padded with 0 (<pad>) to ``width`` columns."""
    return F.pad(t, (0, width - t.shape[1])) if width > t.shape[1] else t


def pad_text(batch: TextBatch, max_len: int, concept_width: int = 0) -> StaticTextBatch:
    """``batch`` with inputs/targets padded to ``max_len`` steps and concepts to ``concept_width``
    columns. Nothing it computes changes: the recurrences are causal, ṽ and v are gathered at
    each row's last valid step and the loss masks the padded positions."""
    return StaticTextBatch(_pad_cols(batch.concepts, concept_width), batch.concept_lens,
                           _pad_cols(batch.inputs, max_len), _pad_cols(batch.targets, max_len), batch.lengths)


def teacher_forcing(ids: pa.Array | Sequence[Sequence[int]], max_len: int) -> tuple[Tensor, Tensor, Tensor]:
    """Caption ids → (inputs, targets, lengths): targets are ``ids + [<#end>]`` cut to ``max_len``
    (a cut caption has no <#end>), inputs the targets shifted right behind <#start>."""
    arr = ids if isinstance(ids, (pa.Array, pa.ChunkedArray)) else pa.array(list(ids), pa.list_(pa.int64()))
    words, n = pad_lists(arr)
    lengths = np.minimum(n + 1, max_len)
    T = int(lengths.max(initial=1))
    targets = np.zeros((len(n), T), dtype=np.int64)
    w = min(words.shape[1], T)
    targets[:, :w] = words[:, :w]
    rows = np.nonzero(n < max_len)[0]
    targets[rows, n[rows]] = END
    targets[np.arange(T)[None, :] >= lengths[:, None]] = 0
    inputs = np.zeros_like(targets)
    inputs[:, 0] = START
    inputs[:, 1:] = targets[:, :-1]
    inputs[np.arange(T)[None, :] >= lengths[:, None]] = 0
    return torch.from_numpy(inputs), torch.from_numpy(targets), torch.from_numpy(lengths.astype(np.int64))


def make_text_batch(ids: pa.Array, concept_ids: pa.Array, max_len: int, rng: np.random.Generator) -> TextBatch:
    """Sentences → teacher-forcing tensors (:func:`teacher_forcing`) with their shuffled concepts."""
    inputs, targets, lengths = teacher_forcing(ids, max_len)
    concepts, clens = pad_lists(concept_ids)
    concepts = shuffle_concepts(concepts, clens, rng)
    return TextBatch(torch.from_numpy(concepts), torch.from_numpy(clens), inputs, targets, lengths)


# --------------------------------------------------------------------------- text stream
class TextStream:
    """Sentences of one split of ``encoded.parquet``, streamed in shuffled windows of row groups."""

    def __init__(self, path: str | Path, split: str, batch_size: int, max_len: int, seed: int = 0,
                 window_rows: int = 65536) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"missing encoded corpus: {self.path}")
        self.pf = pq.ParquetFile(self.path)
        missing = {"ids", "concept_ids", "split"} - set(self.pf.schema_arrow.names)
        if missing:
            raise ValueError(f"{self.path}: missing column(s) {sorted(missing)}")
        self.split, self.max_len, self.seed = split, max_len, seed
        # rows of the split per row group (reads only the 'split' column, one row group at a time)
        self.counts = np.array([int(pc.sum(pc.equal(self.pf.read_row_group(i, columns=["split"])["split"], split)).as_py() or 0)
                                for i in range(self.pf.num_row_groups)], dtype=np.int64)
        self.n = int(self.counts.sum())
        if self.n == 0:
            raise ValueError(f"{self.path}: no sentences in split {split!r}")
        self.batch_size = min(batch_size, self.n)
        self.window_rows = max(window_rows, self.batch_size)

    def _read(self, groups: list[int]) -> pa.Table:
        t = self.pf.read_row_groups(groups, columns=["ids", "concept_ids", "split"])
        return t.filter(pc.equal(t["split"], self.split))

    def _windows(self, epoch: int) -> list[list[int]]:
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.counts))
        windows, cur, rows = [], [], 0
        for g in order:
            if self.counts[g] == 0:
                continue
            cur.append(int(g))
            rows += self.counts[g]
            if rows >= self.window_rows:
                windows.append(cur)
                cur, rows = [], 0
        if cur:
            if windows and rows < self.batch_size:
                windows[-1].extend(cur)
            else:
                windows.append(cur)
        return windows

    def batches(self, start_step: int = 0) -> Iterator[TextBatch]:
        """Endless batches (epoch after epoch); the first ``start_step`` are skipped unread."""
        skip, epoch = start_step, 0
        while True:
            for wi, groups in enumerate(self._windows(epoch)):
                n = int(self.counts[groups].sum())
                nb = max(n // self.batch_size, 1)
                if skip >= nb:
                    skip -= nb
                    continue
                rng = np.random.default_rng([self.seed, epoch, wi])
                table = self._read(groups)
                perm = rng.permutation(n)
                for b in range(skip, nb):
                    take = pa.array(perm[b * self.batch_size: (b + 1) * self.batch_size])
                    rows = table.take(take)
                    yield make_text_batch(rows["ids"], rows["concept_ids"], self.max_len,
                                          np.random.default_rng([self.seed, epoch, wi, b]))
                skip = 0
            epoch += 1

    def ordered(self, max_batches: int | None = None) -> Iterator[TextBatch]:
        """The split in file order (validation): fixed concept order, at most ``max_batches``."""
        done = 0
        for g in np.nonzero(self.counts)[0]:
            t = self._read([int(g)])
            for s in range(0, t.num_rows, self.batch_size):
                if max_batches is not None and done >= max_batches:
                    return
                rows = t.slice(s, self.batch_size)
                yield make_text_batch(rows["ids"], rows["concept_ids"], self.max_len,
                                      np.random.default_rng([self.seed, 10**6, done]))
                done += 1


# --------------------------------------------------------------------------- images
@dataclass
class ImageBatch:
    concepts: Tensor
    concept_lens: Tensor
    feats: Tensor
    image_ids: list[str]
    static: ClassVar[bool] = False  # concepts at a fixed width (:func:`pad_image`), fixed-length greedy

    def _map(self, fn) -> ImageBatch:
        return type(self)(fn(self.concepts), fn(self.concept_lens), fn(self.feats), self.image_ids)

    def to(self, device: torch.device) -> ImageBatch:
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> ImageBatch:
        return self._map(lambda t: t.pin_memory())

    def __len__(self) -> int:
        return len(self.image_ids)


class StaticImageBatch(ImageBatch):
    """An :class:`ImageBatch` with concepts padded to a fixed width; its captions are decoded for the
    stage's ``max_len`` steps without the early-stop test."""

    static: ClassVar[bool] = True


def pad_image(batch: ImageBatch, concept_width: int = 0) -> StaticImageBatch:
    return StaticImageBatch(_pad_cols(batch.concepts, concept_width), batch.concept_lens, batch.feats,
                            batch.image_ids)


@dataclass
class JointBatch:
    """One step of one-stage training (``train_e2e``): a batch of sentences and a batch of images."""

    text: TextBatch
    image: ImageBatch

    @property
    def static(self) -> bool:
        return self.text.static

    def to(self, device: torch.device) -> JointBatch:
        return JointBatch(self.text.to(device), self.image.to(device))

    def pin_memory(self) -> JointBatch:
        return JointBatch(self.text.pin_memory(), self.image.pin_memory())

    def __len__(self) -> int:
        return len(self.text)


def pad_joint(batch: JointBatch, max_len: int, concept_width: int = 0) -> JointBatch:
    """Both halves at fixed shapes (:func:`pad_text`, :func:`pad_image`), concepts at one width."""
    return JointBatch(pad_text(batch.text, max_len, concept_width), pad_image(batch.image, concept_width))


class ImageSet:
    """Images of a split that have features (and, with ``require_concept``, ≥ 1 known concept)."""

    def __init__(self, prepared: Path, concepts: Path, features: Path, itos: list[str], split: str,
                 threshold: float, max_per_image: int, require_concept: bool = True,
                 feature_kind: str = "pooled", order: str = "by_score", shuffle: bool = True,
                 dictionary: str = "openimages", crops: bool = False, per_class: bool = False) -> None:
        from r2m.utils.io import open_h5

        images = pq.read_table(Path(prepared) / "images.parquet", columns=["image_id", "split"]).to_pandas()
        ids = [str(i) for i in images.loc[images["split"] == split, "image_id"]]
        det_path = Path(concepts) / "detections.parquet"
        if not det_path.exists():
            raise FileNotFoundError(f"missing detections: {det_path}")
        per_image = image_concept_lists(pq.read_table(det_path), threshold, max_per_image, order, dictionary,
                                        per_class)
        self.shuffle = shuffle
        index = pq.read_table(Path(features) / "index.parquet").to_pandas()
        row_of = dict(zip(index["image_id"].astype(str), index["row"].astype(np.int64), strict=True))
        stoi = {w: i for i, w in enumerate(itos)}
        self.image_ids, self.concept_ids, self.rows, self.concept_words = [], [], [], []
        for i in ids:
            words = [w for w in per_image.get(i, []) if w in stoi]
            if (require_concept and not words) or i not in row_of:
                continue
            self.image_ids.append(i)
            self.concept_words.append(words)
            self.concept_ids.append([stoi[w] for w in words])
            self.rows.append(row_of[i])
        self.h5_path = Path(features) / "features.h5"
        self.h5 = open_h5(self.h5_path)
        if feature_kind not in self.h5:
            raise KeyError(f"{self.h5_path}: no dataset {feature_kind!r} (has {list(self.h5)})")
        self.feats = self.h5[feature_kind]
        self.dim = int(self.feats.shape[1])
        # crops: the training batches draw one of each image's cached random crops (extract_features.crops)
        self.crops = None
        if crops:
            name = feature_kind + "_crops"
            if name not in self.h5:
                raise KeyError(f"{self.h5_path}: no dataset {name!r}: extract_features.crops asks for random crops "
                               "but these features were made without them; run extract_features again")
            self.crops = self.h5[name]

    def __len__(self) -> int:
        return len(self.image_ids)

    def batch(self, idx: np.ndarray, rng: np.random.Generator | None = None,
              crop_rng: np.random.Generator | None = None) -> ImageBatch:
        """Images ``idx``; with ``crop_rng`` (and crops) each image's features are one of its cached random crops."""
        rows = np.asarray([self.rows[i] for i in idx])
        uniq, inv = np.unique(rows, return_inverse=True)
        if crop_rng is not None and self.crops is not None:
            picks = crop_rng.integers(0, self.crops.shape[1], len(idx))
            feats = torch.from_numpy(np.asarray(self.crops[uniq.tolist()], dtype=np.float32)[inv, picks])
        else:
            feats = torch.from_numpy(np.asarray(self.feats[uniq.tolist()], dtype=np.float32)[inv])
        concepts, lens = pad_lists(pa.array([self.concept_ids[i] for i in idx], type=pa.list_(pa.int64())))
        if rng is not None:
            concepts = shuffle_concepts(concepts, lens, rng)
        return ImageBatch(torch.from_numpy(concepts), torch.from_numpy(lens), feats,
                          [self.image_ids[i] for i in idx])

    def batches(self, batch_size: int, seed: int, start_step: int = 0) -> Iterator[ImageBatch]:
        """Endless shuffled batches (:func:`r2m.training.loop.epoch_batch`); concepts shuffled from
        ``(seed, epoch, batch)`` unless the set is unshuffled; with crops, each image's crop drawn from
        ``(seed, epoch, batch, 1)`` (its own stream: the concept order is the same with or without crops)."""
        if len(self) == 0:
            raise ValueError("no training images with features and at least one concept")
        for step in itertools.count(start_step):
            idx, epoch, b = epoch_batch(len(self), batch_size, seed, step)
            yield self.batch(idx, np.random.default_rng([seed, epoch, b]) if self.shuffle else None,
                             np.random.default_rng([seed, epoch, b, 1]) if self.crops is not None else None)

    def ordered(self, batch_size: int, max_batches: int | None = None) -> Iterator[ImageBatch]:
        for k, s in enumerate(range(0, len(self), batch_size)):
            if max_batches is not None and k >= max_batches:
                return
            yield self.batch(np.arange(s, min(s + batch_size, len(self))))

    def close(self) -> None:
        self.h5.close()

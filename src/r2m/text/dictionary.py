"""The visual dictionary D: detector class names reduced to single, singular, lower-case words.

Each class name is lower-cased and its **last** whitespace-separated word kept ("Bicycle wheel" ->
``wheel``, "Moths and butterflies" -> ``butterfly``), then singularised with
:class:`r2m.text.singular.Singulariser`. The same singulariser maps sentence tokens, so image and
sentence concepts live in one word space.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from r2m.text.singular import Singulariser
from r2m.utils.registry import Registry

DICTIONARY_DIR = Path(__file__).resolve().parents[3] / "data" / "dictionaries"
# dictionary name -> class-name file under data/dictionaries
DICTIONARY_FILES: Registry[str] = Registry("dictionary")
DICTIONARY_FILES.register("openimages")("openimages_v4_boxable.names")
DICTIONARY_FILES.register("coco80")("coco80.names")


def class_word(label: str, singulariser: Singulariser) -> str:
    """The dictionary word of one detector class name: last word, lower-case, singular."""
    words = label.strip().lower().split()
    if not words:
        raise ValueError("empty class name")
    return singulariser.singular(words[-1])


def read_names(path: Path) -> list[str]:
    """Class names, one per line; blank lines are an error naming the file and line."""
    names = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            raise ValueError(f"{path}:{i}: empty class name")
        names.append(line.strip())
    return names


@dataclass
class Dictionary:
    name: str
    labels: list[str]  # the detector class names, as in the .names file
    singulariser: Singulariser = field(repr=False, default_factory=Singulariser)
    words: frozenset[str] = field(init=False)
    _label_map: dict[str, str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._label_map = {lab.lower(): class_word(lab, self.singulariser) for lab in self.labels}
        self.words = frozenset(self._label_map.values())

    def __contains__(self, word: object) -> bool:
        return word in self.words

    def label_to_concept(self, label: str) -> str | None:
        """Dictionary word for a detector class name (any case); ``None`` when it maps outside D."""
        key = label.strip().lower()
        word = self._label_map.get(key)
        if word is None and key:
            word = class_word(key, self.singulariser)
        return word if word in self.words else None

    def sentence_concepts(self, tokens: Iterable[str]) -> list[str]:
        """Sorted set(singularised tokens) ∩ dictionary words."""
        words = self.words
        return sorted({w for w in self.singulariser.singularise(tokens) if w in words})


@lru_cache(maxsize=4)
def load_dictionary(name: str = "openimages") -> Dictionary:
    """``openimages`` (601 OpenImages-v4 boxable classes) or ``coco80``; cached per process."""
    path = DICTIONARY_DIR / DICTIONARY_FILES.get(name)
    if not path.exists():
        raise FileNotFoundError(f"dictionary {name!r}: class-name file missing: {path}")
    return Dictionary(name=name, labels=read_names(path))


def _ranked(pairs: Sequence[tuple[str, float]], max_per_image: int) -> list[tuple[str, float]]:
    best: dict[str, float] = {}
    for concept, score in pairs:
        if score > best.get(concept, float("-inf")):
            best[concept] = score
    ranked = sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))
    return ranked[:max_per_image]


def image_concepts(
    df: Any,
    threshold: float = 0.3,
    max_per_image: int = 5,
    dictionary: Dictionary | None = None,
) -> dict[str, list[tuple[str, float]]]:
    """Concepts per image from a detections table (``image_id``, ``score`` and ``concept`` or ``label``).

    Rule: keep detections with ``score >= threshold`` whose concept is set; de-duplicate per concept
    keeping its maximum score; order by descending score (ties: concept name) and keep the first
    ``max_per_image``. (The official code keeps the *last* 5 after de-duplicating in detector
    order; detector order is not stored here, so we keep the 5 most confident, a deterministic
    choice.) Images without any concept left are absent from the result.
    """
    import pandas as pd

    if "concept" not in df.columns:
        if "label" not in df.columns:
            raise ValueError("detections need a 'concept' or a 'label' column")
        d = dictionary or load_dictionary()
        df = df.assign(concept=[d.label_to_concept(str(x)) for x in df["label"]])
    keep = df[(df["score"] >= threshold) & df["concept"].notna() & (df["concept"] != "")]
    out: dict[str, list[tuple[str, float]]] = {}
    if keep.empty:
        return out
    ids = keep["image_id"].astype(str).to_numpy()
    concepts = keep["concept"].astype(str).to_numpy()
    scores = pd.to_numeric(keep["score"]).to_numpy(dtype=float)
    grouped: dict[str, list[tuple[str, float]]] = {}
    for i, c, s in zip(ids, concepts, scores, strict=True):
        grouped.setdefault(i, []).append((c, float(s)))
    for image_id, pairs in grouped.items():
        out[image_id] = _ranked(pairs, max_per_image)
    return out

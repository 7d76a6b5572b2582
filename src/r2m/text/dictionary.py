"""The visual dictionary D: detector class names reduced to single, singular, lower-case words.

Each class name is lower-cased and its **last** whitespace-separated word kept ("Bicycle wheel" ->
``wheel``, "Moths and butterflies" -> ``butterfly``), then singularised with
:class:`r2m.text.singular.Singulariser`. The same singulariser maps sentence tokens, so image and
sentence concepts live in one word space.

``fidelity.plurals`` picks how a sentence's plurals reach the dictionary (:data:`PLURAL_RULES`):
``lemma`` (ours: the lemmatiser, "people" -> ``person``) or ``official`` (the authors': one plural per
raw class word mapped back, :class:`r2m.text.singular.OfficialPlurals`; the concept is then that
class's dictionary word, so image and sentence concepts still share one word space — "stairs" is
the concept ``stair`` of the class "Stairs", as the detections name it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from r2m.text.singular import OfficialPlurals, Singulariser
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
        # raw class word (last word, lower-case, as written) -> dictionary word
        self.raw_words: dict[str, str] = {lab.split()[-1]: w for lab, w in self._label_map.items()}
        self.official_plurals = OfficialPlurals(self.raw_words)

    def __contains__(self, word: object) -> bool:
        return word in self.words

    def label_to_concept(self, label: str) -> str | None:
        """Dictionary word for a detector class name (any case); ``None`` when it maps outside D."""
        key = label.strip().lower()
        word = self._label_map.get(key)
        if word is None and key:
            word = class_word(key, self.singulariser)
        return word if word in self.words else None

    @property
    def word_rank(self) -> dict[str, int]:
        """Concept word → line of its first class name in the ``.names`` file (for OpenImages the
        file is in label-map id order, the order the official code's ``np.unique`` sorts by)."""
        rank: dict[str, int] = {}
        for i, lab in enumerate(self.labels):
            rank.setdefault(self._label_map[lab.lower()], i)
        return rank

    @property
    def label_rank(self) -> dict[str, int]:
        """Class name (lower-case) → its line in the ``.names`` file (its label-map id order)."""
        return {lab.lower(): i for i, lab in enumerate(self.labels)}

    def class_keys(self, labels: Iterable[str], concepts: Iterable[str]) -> list[tuple[int, str]]:
        """One ``(class line, concept)`` per detection: the line of its label when the label is one of
        the dictionary's class names naming that concept ("Hot dog" → (46, ``dog``), "Dog" → (445,
        ``dog``) in OpenImages), else the concept's first line (:attr:`word_rank`: a label of another
        detector, e.g. an ImageNet class, stands for its word's first class)."""
        line, first, words = self.label_rank, self.word_rank, self._label_map
        out = []
        for lab, c in zip(labels, concepts, strict=True):
            key = str(lab).strip().lower()
            i = line.get(key)
            out.append((i if i is not None and words[key] == c else first.get(c, len(line)), c))
        return out

    def sentence_concepts(self, tokens: Iterable[str], plurals: str = "lemma") -> list[str]:
        """Sorted set(singularised tokens) ∩ dictionary words; ``plurals`` names the rule
        (:data:`PLURAL_RULES`: ``lemma`` or ``official``)."""
        if plurals == "official":
            return self.official_concepts(tokens)
        if plurals != "lemma":
            raise ValueError(f"fidelity.plurals {plurals!r}: choose from {PLURAL_RULES}")
        words = self.words
        return sorted({w for w in self.singulariser.singularise(tokens) if w in words})

    def official_concepts(self, tokens: Iterable[str]) -> list[str]:
        """The authors' key words: tokens with their class plural mapped back, ∩ the raw class
        words, each given as its dictionary word ("stairs" -> ``stair``; "people" -> none)."""
        raw = self.raw_words
        return sorted({raw[t] for t in self.official_plurals.singularise(tokens) if t in raw})

    def raw_word_concepts(self, tokens: Iterable[str]) -> list[str]:
        """Tokens as written ∩ the raw class words (no plural mapping), as dictionary words."""
        raw = self.raw_words
        return sorted({raw[t] for t in tokens if t in raw})

    def singular_targets(self, tokens: list[str], plurals: str = "lemma") -> list[str]:
        """Target tokens with plural dictionary words singularised: ``lemma`` replaces a token whose
        lemma is a dictionary word (``dogs`` -> ``dog``, "people" -> ``person``); ``official`` maps
        exactly each class word's one plural back ("persons" -> ``person``; "people", "mice",
        "stairs" stay)."""
        if plurals == "official":
            return self.official_plurals.singularise(tokens)
        if plurals != "lemma":
            raise ValueError(f"fidelity.plurals {plurals!r}: choose from {PLURAL_RULES}")
        out = []
        for t in tokens:
            w = self.singulariser.singular(t)
            out.append(w if w != t and w in self.words else t)
        return out


PLURAL_RULES = ("lemma", "official")


@lru_cache(maxsize=4)
def load_dictionary(name: str = "openimages") -> Dictionary:
    """``openimages`` (601 OpenImages-v4 boxable classes) or ``coco80``; cached per process. ``name`` is a
    registered name, never a path (a model folder's ``inference.json`` names it): anything else is a
    one-line :class:`r2m.utils.guard.BadInput` (a ``ValueError``)."""
    from r2m.utils.guard import BadInput, inside

    try:
        file = DICTIONARY_FILES.get(name) if isinstance(name, str) else None
    except KeyError:
        file = None
    if file is None:
        raise BadInput(f"dictionary {name!r} is not one of this project's dictionaries "
                       f"({', '.join(DICTIONARY_FILES.names())}; their class lists are in {DICTIONARY_DIR})")
    path = inside(DICTIONARY_DIR, file, "dictionary file")
    if not path.exists():
        raise FileNotFoundError(f"dictionary {name!r}: class-name file missing: {path}")
    return Dictionary(name=name, labels=read_names(path))


def _best(triples: Sequence[tuple[Any, str, float]]) -> dict[tuple[Any, str], float]:
    """The maximum score per ``(key, concept)``."""
    best: dict[tuple[Any, str], float] = {}
    for key, concept, score in triples:
        if score > best.get((key, concept), float("-inf")):
            best[(key, concept)] = score
    return best


def _ranked(triples: Sequence[tuple[Any, str, float]], max_per_image: int) -> list[tuple[str, float]]:
    ranked = sorted(_best(triples).items(), key=lambda kv: (-kv[1], kv[0][1], kv[0][0]))
    return [(c, s) for (_, c), s in ranked[:max_per_image]]


def _official(triples: Sequence[tuple[Any, str, float]], max_per_image: int, at_test: bool) -> list[tuple[str, float]]:
    ordered = [(c, s) for (_, c), s in sorted(_best(triples).items(), key=lambda kv: kv[0])]
    if at_test:
        ordered = ordered[::-1]
    return ordered[-max_per_image:]


CONCEPT_ORDERS = ("by_score", "official_train", "official_test")


def image_concepts(
    df: Any,
    threshold: float = 0.3,
    max_per_image: int = 5,
    dictionary: Dictionary | None = None,
    order: str = "by_score",
    per_class: bool = False,
) -> dict[str, list[tuple[str, float]]]:
    """Concepts per image from a detections table (``image_id``, ``score`` and ``concept`` or ``label``).

    Rule: keep detections with ``score >= threshold`` whose concept is set; de-duplicate per concept
    keeping its maximum score; then, by ``order``:

    * ``by_score`` (ours): descending score (ties: concept name), the first ``max_per_image``;
    * ``official_train``: the released code's training input — ``np.unique`` over the class ids
      (ascending label-map id), then the *last* ``max_per_image``;
    * ``official_test``: its test input — the same list reversed (``[::-1]``), then the last
      ``max_per_image`` (so the lowest ids, in descending order: a different subset when an image
      has more than ``max_per_image`` concepts).

    The detections stage does not keep the detector's own output order; the official code does not
    use it either (``np.unique`` sorts by class id), so the class id is taken as the concept's line
    in the dictionary's ``.names`` file (:attr:`Dictionary.word_rank`: a word two class names end in
    takes its first line).

    ``per_class`` (``fidelity.concept_per_class``; the released code's ``process_imgaes.py:39-41``):
    de-duplicate per detected *class* instead of per word — each class id becomes its name's last
    word, so two detected classes ending in one word ("Dog", "Hot dog") give that word twice, each at
    its own class id (:meth:`Dictionary.class_keys`; needs the ``label`` column, else each concept is
    its own class). Images without any concept left are absent from the result.
    """
    if order not in CONCEPT_ORDERS:
        raise ValueError(f"image concept order {order!r}: choose from {CONCEPT_ORDERS}")
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
    keys: list[Any]
    if per_class and "label" in keep.columns:
        keys = (dictionary or load_dictionary()).class_keys(keep["label"].astype(str), concepts)
    elif order == "by_score":
        keys = [None] * len(concepts)
    else:
        rank = (dictionary or load_dictionary()).word_rank
        keys = [(rank.get(c, len(rank)), c) for c in concepts]
    grouped: dict[str, list[tuple[Any, str, float]]] = {}
    for i, k, c, s in zip(ids, keys, concepts, scores, strict=True):
        grouped.setdefault(i, []).append((k, c, float(s)))
    for image_id, triples in grouped.items():
        out[image_id] = (_ranked(triples, max_per_image) if order == "by_score"
                         else _official(triples, max_per_image, order == "official_test"))
    return out


def concept_order(fidelity_image_concepts: str, at: str) -> str:
    """The :func:`image_concepts` order for ``fidelity.image_concepts`` in training (``at="train"``)
    or captioning (``at="test"``)."""
    if fidelity_image_concepts == "by_score":
        return "by_score"
    if fidelity_image_concepts == "official":
        return f"official_{at}"
    raise ValueError(f"fidelity.image_concepts {fidelity_image_concepts!r}: choose by_score or official")


def image_concept_lists(detections: Any, threshold: float, max_per_image: int,
                        order: str = "by_score", dictionary: str = "openimages",
                        per_class: bool = False) -> dict[str, list[str]]:
    """image_id → concept words by the project's one rule, :func:`image_concepts` (score ≥
    threshold, de-duplicated per word or, ``per_class``, per detected class, at most
    ``max_per_image``, in ``order``); ``detections`` is a ``detections.parquet`` table (pyarrow) or
    data frame."""
    import pyarrow as pa

    df = detections.to_pandas() if isinstance(detections, pa.Table) else detections
    need = order != "by_score" or per_class or "concept" not in df.columns
    d = load_dictionary(dictionary) if need else None
    return {str(k): [c for c, _ in v]
            for k, v in image_concepts(df, threshold, max_per_image, d, order, per_class).items()}

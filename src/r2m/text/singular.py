"""Singularise nouns with spaCy's lookup lemmatiser (``spacy.blank("en")`` + ``spacy-lookups-data``).

No model is downloaded: the English ``lemma_lookup`` table ships in the ``spacy-lookups-data`` wheel.
By default the table file is read directly (identical to what the lookup-mode lemmatiser of
``spacy.blank("en")`` uses, see :func:`spacy_table`; a test checks they agree) because importing
spaCy costs ~0.5 GB of memory and seconds of start-up in every stage.
The table is part-of-speech blind (``building`` -> ``build``, ``is`` -> ``be``), so only plural-looking
mappings are accepted:

* a word ending in ``s`` whose lemma differs and starts with the same letter
  (``dogs`` -> ``dog``, ``buses`` -> ``bus``, ``knives`` -> ``knife``, ``glasses`` -> ``glass``);
* irregular plurals the table knows (``women`` -> ``woman``, ``children`` -> ``child``,
  ``teeth`` -> ``tooth``, ``mice`` -> ``mouse``, ``geese`` -> ``goose``, ``firemen`` -> ``fireman``);
* :data:`OVERRIDES`, applied first: the table leaves ``people`` as ``people``; we map it to
  ``person`` (the OpenImages/COCO class), and keep plural-only nouns as they are
  (``jeans``, ``shorts``, ``scissors``, ``glasses`` as eyewear…), otherwise ``shorts`` -> ``short``.

Results are cached per word type, so a corpus of millions of sentences costs one table look-up
per distinct word.

**The authors' rule** (``fidelity.plurals: official``, :class:`OfficialPlurals`): UC-GAN's / R²M's
preprocessing does not lemmatise. It scraped *one* plural per class word (lower-cased last word of
an OpenImages class name, not singularised) from an online dictionary and maps exactly that plural
back to its class word; every other token stays as written. So "persons" -> ``person`` and
"mouses" -> ``mouse``, but "people" and "mice" stay; a class word that is itself plural ("stairs",
"fries", "goods") is its own plural and stays. The scraped plurals follow regular English spelling
(:func:`regular_plural`: a word ending in ``s`` is its own plural, ``-x/-ch/-sh/-z`` + ``es``,
consonant + ``y`` -> ``ies``, else + ``s``) except for :data:`OFFICIAL_PLURALS`, the scraped forms
that differ from it (irregular nouns, ``'phones``/``'cellos`` as scraped, which therefore never
match a token). The map is built over the class words in sorted order and a later entry wins when
two class words share a plural (``butterfly`` and ``butterflies`` both give "butterflies", which
maps to ``butterfly``; ``glass``/``glasses`` give "glasses", which stays ``glasses``). Checked equal
to the authors' table on all 480 of its class words; class words of our 601-class list that their
label map lacks get the regular rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

OVERRIDES: dict[str, str] = {
    "people": "person",
    "persons": "person",
    **{w: w for w in ("jeans", "shorts", "scissors", "glasses", "sunglasses", "trousers", "pants",
                      "goggles", "binoculars", "pliers", "tongs", "headphones", "news", "species",
                      "series", "bus", "gas", "lens", "is", "was", "has", "as", "us", "this", "its", "does")},
    "leaves": "leaf",
}
IRREGULAR_ENDINGS = ("men", "ren", "eeth", "eet", "ice", "eese", "xen")


def spacy_table() -> Any:
    """The table through spaCy itself: ``spacy.blank("en")`` + the lookup-mode lemmatiser.

    Importing spaCy pulls in thinc (and torch when installed): ~0.5 GB and a few seconds, so the
    default path, :func:`lookups_table`, reads the same file without spaCy."""
    import spacy

    nlp = spacy.blank("en")
    lemmatizer = nlp.add_pipe("lemmatizer", config={"mode": "lookup"})
    try:
        nlp.initialize()
    except (OSError, ValueError) as err:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "spaCy lookup lemmatiser unavailable: install `spacy-lookups-data` (no download needed)"
        ) from err
    # a spacy Table keys its entries by string hash; its .get(str) hashes for us
    return lemmatizer.lookups.get_table("lemma_lookup")


def lookups_table() -> dict[str, str]:
    """``en_lemma_lookup`` read straight from the ``spacy-lookups-data`` wheel (what spaCy loads)."""
    import gzip
    import json

    try:
        import spacy_lookups_data
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise RuntimeError("install `spacy-lookups-data` for the English lemma table") from err
    path = Path(spacy_lookups_data.__file__).parent / "data" / "en_lemma_lookup.json.gz"
    if not path.exists():  # pragma: no cover - a future layout: go through spaCy
        return spacy_table()
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


@lru_cache(maxsize=1)
def shared_table() -> Any:
    """The English lemma table (loaded once per process, about 40k entries)."""
    return lookups_table()


def _accept(word: str, lemma: str | None) -> bool:
    if not lemma or lemma == word or lemma[0] != word[0]:
        return False
    return word.endswith("s") or word.endswith(IRREGULAR_ENDINGS)


class Singulariser:
    """``singular("dogs") == "dog"``; ``singularise(["two", "dogs"]) == ["two", "dog"]``."""

    def __init__(self, table: Any = None, overrides: dict[str, str] | None = None):
        self._table = shared_table() if table is None else table
        self._cache: dict[str, str] = dict(OVERRIDES if overrides is None else overrides)

    def singular(self, word: str) -> str:
        hit = self._cache.get(word)
        if hit is None:
            lemma = self._table.get(word)
            hit = lemma if _accept(word, lemma) else word
            self._cache[word] = hit
        return hit

    def singularise(self, tokens: Iterable[str]) -> list[str]:
        cache, single = self._cache, self.singular
        return [cache.get(t) or single(t) for t in tokens]

    def __len__(self) -> int:
        return len(self._cache)


# --------------------------------------------------------------------------- the authors' plural rule
# the scraped plurals that differ from :func:`regular_plural` (the authors' table, read as facts)
OFFICIAL_PLURALS: dict[str, str] = {
    "man": "men", "woman": "women", "snowman": "snowmen", "foot": "feet", "goose": "geese",
    "knife": "knives", "shelf": "shelves", "tomato": "tomatoes", "potato": "potatoes", "mango": "mangoes",
    "bus": "buses", "dress": "dresses", "glass": "glasses", "asparagus": "asparaguses",
    "rhinoceros": "rhinoceroses", "hippopotamus": "hippopotamuses", "ski": "skies", "segway": "segwaies",
    "phone": "'phones", "cello": "'cellos",
    **{w: w for w in ("goat", "sheep", "cattle", "aircraft", "drink")},
}


def regular_plural(word: str) -> str:
    """Regular English plural spelling; a word ending in ``s`` is taken as its own plural."""
    if word.endswith("s"):
        return word
    if word.endswith(("x", "ch", "sh", "z")):
        return word + "es"
    if len(word) > 1 and word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def official_plural(word: str) -> str:
    """The one plural the authors' preprocessing knows for class word ``word``."""
    return OFFICIAL_PLURALS.get(word) or regular_plural(word)


class OfficialPlurals:
    """The authors' target singularisation: each class word's one plural mapped back to it.

    ``OfficialPlurals(["person", "mouse", "stairs"]).singularise(["persons", "people", "mouses",
    "stairs"]) == ["person", "people", "mouse", "stairs"]``."""

    def __init__(self, class_words: Iterable[str]):
        self.replace: dict[str, str] = {}
        for word in sorted(set(class_words)):  # the authors' dict(zip(plurals, sorted words)): last wins
            self.replace[official_plural(word)] = word

    def singularise(self, tokens: Iterable[str]) -> list[str]:
        get = self.replace.get
        return [get(t, t) for t in tokens]

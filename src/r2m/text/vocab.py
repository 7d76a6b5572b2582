"""The caption vocabulary and the token ids every model shares: specials first (``<pad>`` = 0,
``<#start>`` = 1, ``<#end>`` = 2, ``<UNK>`` = 3), then words.

This module sits below every model, decoder and trainer: the ids (:data:`PAD`, :data:`START`,
:data:`END`, :data:`UNK`), reading a vocabulary folder (:func:`load_itos`) and padding id lists
(:func:`pad_lists`) live here so no caption model has to import another one for them.

UC-GAN / R2M convention: the vocabulary is the words seen at least ``min_count`` times in the
corpus plus every dictionary word (so concept ids are always in range); sentences with more than
``max_unk_ratio`` unknown tokens are dropped (see :func:`unk_ratio`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from r2m.utils.io import write_json

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

# the token ids (positions of the specials in every vocabulary, R²M's and the baselines')
PAD, START, END, UNK = 0, 1, 2, 3
# the special words, in id order
PAD_WORD, START_WORD, END_WORD, UNK_WORD = "<pad>", "<#start>", "<#end>", "<UNK>"
SPECIALS = (PAD_WORD, START_WORD, END_WORD, UNK_WORD)


@dataclass
class Vocab:
    itos: list[str]
    stoi: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if tuple(self.itos[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"vocab must start with {SPECIALS}, got {self.itos[:4]}")
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("vocab has duplicate words")

    # ids of the specials
    pad_id, start_id, end_id, unk_id = PAD, START, END, UNK

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: object) -> bool:
        return word in self.stoi

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Token ids (unknown words -> ``<UNK>``); no start/end tokens are added."""
        get, unk = self.stoi.get, self.unk_id
        return [get(t, unk) for t in tokens]

    def decode(self, ids: Iterable[int]) -> str:
        """Words joined by spaces; stops at ``<#end>``, skips ``<pad>`` and ``<#start>``."""
        words = []
        for i in ids:
            i = int(i)
            if i == self.end_id:
                break
            if i in (self.pad_id, self.start_id):
                continue
            words.append(self.itos[i] if 0 <= i < len(self.itos) else UNK_WORD)
        return " ".join(words)

    @property
    def specials(self) -> dict[str, int]:
        return {"pad": self.pad_id, "start": self.start_id, "end": self.end_id, "unk": self.unk_id}

    def save(self, path: str | Path) -> Path:
        return write_json(path, {"itos": self.itos, "specials": self.specials}, indent=None)

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"vocabulary file missing: {path}") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {err.lineno}: not valid JSON ({err.msg})") from None
        if not isinstance(data, dict) or not isinstance(data.get("itos"), list):
            raise ValueError(f"{path}: expected an object with an 'itos' list")
        return cls(list(data["itos"]))


def build_vocab(counts: Mapping[str, int], min_count: int, dictionary_words: Iterable[str] = (),
                allowed: Collection[str] | None = None) -> Vocab:
    """Words with ``count >= min_count`` (most frequent first, ties alphabetical; with ``allowed``,
    only those in it, e.g. the GloVe vocabulary as the official preprocessing) ∪ dictionary words
    (those not already in, alphabetical), after the specials."""
    frequent = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS
                       and (allowed is None or w in allowed)),
                      key=lambda w: (-counts[w], w))
    seen = set(frequent)
    extra = sorted(w for w in set(dictionary_words) if w not in seen and w not in SPECIALS)
    return Vocab(list(SPECIALS) + frequent + extra)


def unk_ratio(ids: Sequence[int], unk_id: int = Vocab.unk_id, extra: int = 0) -> float:
    """Fraction of ``<UNK>`` among the ids (0.0 for an empty sentence); ``extra`` tokens (e.g. 2
    for <S> and </S>, as the official filter counts them) add to the length."""
    n = len(ids) + extra
    return sum(1 for i in ids if i == unk_id) / n if n else 0.0


GLOVE = "glove"  # fidelity.vocab_filter: the word list a paper benchmark's prepare stage fetched
GLOVE_WORDS = "glove_words.txt"  # that list in the prepared folder, one word per line


def vocab_filter_file(value: str | None, prepared: str | Path | None) -> Path | None:
    """The word-list file ``fidelity.vocab_filter`` names: a path, or for :data:`GLOVE` the prepared folder's
    :data:`GLOVE_WORDS` (None when that folder has none: a dataset whose recipe fetches no list)."""
    if not value:
        return None
    if value != GLOVE:
        return Path(value)
    path = Path(prepared) / GLOVE_WORDS if prepared is not None else None
    return path if path is not None and path.exists() else None


def read_word_list(path: str | Path) -> frozenset[str]:
    """A word-list file (one word per line; anything after the first whitespace ignored, so a GloVe
    ``.txt`` vectors file works too); blank lines skipped. Clear error when it is missing."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"fidelity.vocab_filter: word list not found: {path} (one word per line, "
                                f"e.g. the words of GloVe's glove.840B.300d.txt; see docs/guide/reproduce.md)")
    words = set()
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            w = line.split(" ", 1)[0].strip()
            if w:
                words.add(w)
    if not words:
        raise ValueError(f"fidelity.vocab_filter: {path} holds no words")
    return frozenset(words)


def load_itos(vocab_dir: str | Path) -> list[str]:
    """The id → word list of ``vocab/vocab.json`` (a vocabulary folder or the file itself)."""
    path = Path(vocab_dir)
    path = path / "vocab.json" if path.is_dir() else path
    if not path.exists():
        raise FileNotFoundError(f"missing vocabulary: {path}")
    itos = list(Vocab.load(path).itos)
    if len(itos) < 4 or itos[0] != PAD_WORD:
        raise ValueError(f"{path}: 'itos' must start with <pad>, <#start>, <#end>, <UNK>")
    return itos


def pad_lists(arr: pa.Array | pa.ChunkedArray, width: int | None = None,
              shift: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A list<int> array → (padded [n, W] int64 with 0s placed from column ``shift``, true lengths [n])."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    lens = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    n = len(lens)
    W = int(lens.max(initial=0)) + shift if width is None else width
    out = np.zeros((n, max(W, 0)), dtype=np.int64)
    rows = np.repeat(np.arange(n), lens)
    pos = np.arange(len(values)) - np.repeat(np.cumsum(lens) - lens, lens) + shift
    keep = pos < W
    out[rows[keep], pos[keep]] = values[keep]
    return out, lens

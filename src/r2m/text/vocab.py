"""The caption vocabulary: specials first (``<pad>`` = 0, ``<#start>``, ``<#end>``, ``<UNK>``), then words.

UC-GAN / R2M convention: the vocabulary is the words seen at least ``min_count`` times in the
corpus plus every dictionary word (so concept ids are always in range); sentences with more than
``max_unk_ratio`` unknown tokens are dropped (see :func:`unk_ratio`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from r2m.utils.io import write_json

PAD, START, END, UNK = "<pad>", "<#start>", "<#end>", "<UNK>"
SPECIALS = (PAD, START, END, UNK)


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
    pad_id, start_id, end_id, unk_id = 0, 1, 2, 3

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
            words.append(self.itos[i] if 0 <= i < len(self.itos) else UNK)
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


def read_word_list(path: str | Path) -> frozenset[str]:
    """A word-list file (one word per line; anything after the first whitespace ignored, so a GloVe
    ``.txt`` vectors file works too); blank lines skipped. Clear error when it is missing."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"fidelity.vocab_filter: word list not found: {path} (one word per line, "
                                f"e.g. the words of GloVe's glove.840B.300d.txt; see README)")
    words = set()
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            w = line.split(" ", 1)[0].strip()
            if w:
                words.add(w)
    if not words:
        raise ValueError(f"fidelity.vocab_filter: {path} holds no words")
    return frozenset(words)

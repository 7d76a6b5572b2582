"""Caption-style tokenisation (a pure-Python approximation of coco-caption's PTB step).

coco-caption runs the Stanford PTBTokenizer and then drops the tokens in its punctuation list
(:data:`PTB_PUNCTUATION`). Java is not needed here: we lower-case, turn brackets and double quotes
into spaces, peel punctuation off both ends of each whitespace-separated word (keeping it inside
words, e.g. ``t-shirt``, ``3.5``), split English clitics the way PTB does (``man's`` ->
``man 's``; ``don't`` -> ``do n't``) and drop tokens that are pure punctuation.
"""

from __future__ import annotations

import re

from r2m.utils.registry import Catalog

# the tokens coco-caption's PTBTokenizer wrapper removes after tokenising
PTB_PUNCTUATION = frozenset(
    ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--", "...", ";"]
)
# characters those tokens are made of (brackets become -LRB- etc. in PTB, so they vanish too)
_EDGE = ".?!,:;-'`\""
_SPACE_OUT = str.maketrans({c: " " for c in '()[]{}"'})
_CLITIC = re.compile(r"^(.+?)(n't|'s|'re|'ve|'ll|'d|'m)$")


def _split_word(word: str) -> list[str]:
    word = word.strip(_EDGE)
    if not word:
        return []
    m = _CLITIC.match(word)
    if m and m.group(1).strip(_EDGE):
        return [m.group(1).strip(_EDGE), m.group(2)]
    return [word]


def tokenize(sentence: str) -> list[str]:
    """Lower-cased caption tokens without PTB punctuation: ``"A dog's ball."`` -> ``['a', 'dog', "'s", 'ball']``."""
    out: list[str] = []
    for word in sentence.lower().translate(_SPACE_OUT).split():
        out.extend(_split_word(word))
    return out


# ``fidelity.tokenizer`` -> the tokeniser, its module imported only when that one is asked for
CORPUS_TOKENIZERS: Catalog[str] = Catalog("tokenizer", {"caption": "r2m.text.tokenize:tokenize",
                                                        "official": "r2m.text.tokenize_official:tokenize_keep_punct"})
corpus_tokenizer = CORPUS_TOKENIZERS.load  # the tokeniser ``fidelity.tokenizer`` names (KeyError for another name)

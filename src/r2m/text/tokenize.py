"""Caption-style tokenisation (a pure-Python approximation of coco-caption's PTB step).

coco-caption runs the Stanford PTBTokenizer and then drops the tokens in its punctuation list
(:data:`PTB_PUNCTUATION`). Java is not needed here: we lower-case, turn brackets and double quotes
into spaces, peel punctuation off both ends of each whitespace-separated word (keeping it inside
words, e.g. ``t-shirt``, ``3.5``), split English clitics the way PTB does (``man's`` ->
``man 's``; ``don't`` -> ``do n't``) and drop tokens that are pure punctuation.
"""

from __future__ import annotations

import re

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


# --------------------------------------------------------------------------- official (UC-GAN) tokens
_PUNCT_CHARS = ".?!,:;'\"`()[]{}"
_OPEN_QUOTE = re.compile(r'^"')


def _peel(word: str) -> list[str]:
    """One whitespace word → leading punctuation, the word (clitic split), trailing punctuation."""
    lead: list[str] = []
    trail: list[str] = []
    while word and word[0] in _PUNCT_CHARS and not word.startswith("'s"):
        lead.append("``" if word[0] == '"' else word[0])
        word = word[1:]
    while word and word[-1] in _PUNCT_CHARS:
        if word.endswith("..."):
            trail.append("...")
            word = word[:-3]
            continue
        trail.append("''" if word[-1] == '"' else word[-1])
        word = word[:-1]
    mid: list[str] = []
    if word:
        m = _CLITIC.match(word)
        mid = [m.group(1), m.group(2)] if m and m.group(1) else [word]
    return lead + mid + trail[::-1]


def tokenize_keep_punct(sentence: str) -> list[str]:
    """The official preprocessing's tokens (im2txt ``_process_caption``: NLTK ``word_tokenize`` of the
    lower-cased sentence), approximated without NLTK: punctuation at the ends of words becomes its own
    token and is *kept* (``"a dog, running."`` → ``['a', 'dog', ',', 'running', '.']``), clitics split
    as PTB does, double quotes become `````` / ``''``; punctuation inside a word stays (``t-shirt``, ``3.5``)."""
    out: list[str] = []
    for word in sentence.lower().split():
        out.extend(_peel(word))
    return out


# ``fidelity.tokenizer`` -> tokeniser
TOKENIZERS = {"caption": tokenize, "official": tokenize_keep_punct}

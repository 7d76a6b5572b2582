"""The official preprocessing's tokeniser (``fidelity.tokenizer: official``), a module of its own: only the
instances that tokenise this way import it, so an edit here reruns them alone (the records name the modules an
instance imported)."""

from __future__ import annotations

import re

# The authors' preprocessing (im2txt's ``_process_caption``) runs NLTK 3.4.5's ``word_tokenize`` on the lower-cased
# caption: Punkt splits sentences, then the Treebank rules (with the four additions of NLTK 3.4's word_tokenize)
# split each. These are those rules, pass by pass, as NLTK 3.4.5 applies them to one line; a caption is one
# sentence, so Punkt's split (a model download) is not made: a line holding several sentences keeps the periods
# inside it attached ("dog. a" -> "dog." "a"), where NLTK would split them off.
_R = re.compile
_OPENING = [  # quotes opening a phrase
    (_R(r"([«“‘„]|`+)"), r" \1 "),
    (_R(r'^"'), "``"),
    (_R(r"(``)"), r" \1 "),
    (_R(r"""([ (\[{<])("|'')"""), r"\1 `` "),
    (_R(r"(?i)(')(?!re|ve|ll|m|t|s|d)(\w)\b"), r"\1 \2"),
]
_FINAL_PERIOD = r"""([^.])(\.)([\])}>"'»”’ ]*)\s*$"""  # a sentence's last period, before closing brackets/quotes
_PUNCT = [
    (_R(_FINAL_PERIOD), r"\1 \2 \3 "),
    (_R(r"([:,])([^\d])"), r" \1 \2"),  # 1,000 and 10:30 stay whole
    (_R(r"([:,])$"), r" \1 "),
    (_R(r"\.\.\."), " ... "),
    (_R(r"[;@#$%&]"), r" \g<0> "),
    (_R(r"""([^.])(\.)([\])}>"']*)\s*$"""), r"\1 \2\3 "),
    (_R(r"[?!]"), r" \g<0> "),
    (_R(r"([^'])' "), r"\1 ' "),
    (_R(r"[\]\[(){}<>]"), r" \g<0> "),
    (_R(r"--"), " -- "),
]
_CLOSING = [  # on the line padded with a space at both ends
    (_R(r"([»”’])"), r" \1 "),
    (_R(r'"'), " '' "),
    (_R(r"(\S)('')"), r"\1 \2 "),
    (_R(r"([^' ])('[sS]|'[mM]|'[dD]|') "), r"\1 \2 "),
    (_R(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) "), r"\1 \2 "),
]
# words Treebank splits in two (Robert MacIntyre's list): cannot -> can not, gonna -> gon na, ...
_TWO_WORDS = [_R(p) for p in (r"(?i)\b(can)(not)\b", r"(?i)\b(d)('ye)\b", r"(?i)\b(gim)(me)\b",
                              r"(?i)\b(gon)(na)\b", r"(?i)\b(got)(ta)\b", r"(?i)\b(lem)(me)\b",
                              r"(?i)\b(mor)('n)\b", r"(?i)\b(wan)(na)\s", r"(?i) ('t)(is)\b", r"(?i) ('t)(was)\b")]


def tokenize_keep_punct(sentence: str) -> list[str]:
    """The official preprocessing's tokens: NLTK 3.4.5 ``word_tokenize`` of the lower-cased sentence (im2txt
    ``_process_caption``), punctuation *kept* as tokens (``"a dog, running."`` → ``['a', 'dog', ',', 'running',
    '.']``), clitics and Treebank's two-part words split (``can't`` → ``ca n't``, ``cannot`` → ``can not``,
    ``gonna`` → ``gon na``), ``$``/``#``/``%`` their own tokens, ``1,000`` and ``e.g.`` whole, a final ``p.m.``
    → ``p.m`` ``.``, double quotes as ````` `` ````` / ``''``. Checked against NLTK 3.4.5 (tests/test_official_items.py)."""
    text = sentence.lower()
    for rx, rep in _OPENING + _PUNCT:
        text = rx.sub(rep, text)
    text = f" {text} "
    for rx, rep in _CLOSING:
        text = rx.sub(rep, text)
    for rx in _TWO_WORDS:
        text = rx.sub(r" \1 \2 ", text)
    return text.split()

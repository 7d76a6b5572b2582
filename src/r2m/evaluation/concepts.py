"""Concept recall: does a concepts-to-sentence translator say what it was given?

For each captioned image with ≥ 1 input concept, the share of its input concepts that its caption
names (a concept is named when it equals a caption token or a token's singular form), averaged over
those images (``concept_recall``), and the share of those captions naming at least one
(``concept_any``). Needs no references, so it also scores captions of your own images.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def named_words(caption: str) -> set[str]:
    from r2m.text.tokenize import tokenize

    tokens = tokenize(caption)
    return set(tokens) | set(_singular(tokens))


def _singular(tokens: Sequence[str]) -> list[str]:
    from r2m.text.dictionary import load_dictionary

    return list(load_dictionary().singulariser.singularise(tokens))


def concept_recall(captions: Mapping[str, str], concepts: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """``{"concept_recall", "concept_any", "concept_images", "per_image", "per_concept"}`` over the
    images present in both mappings with ≥ 1 concept; ``None`` values when there are none."""
    shares, anys = [], []
    per_image: dict[str, dict[str, Any]] = {}
    per_concept: dict[str, list[int]] = {}  # concept -> [given, named]
    for image_id, given in concepts.items():
        given = list(dict.fromkeys(given))
        if not given or image_id not in captions:
            continue
        words = named_words(captions[image_id])
        named = [c for c in given if c in words]
        shares.append(len(named) / len(given))
        anys.append(bool(named))
        per_image[image_id] = {"concepts": given, "named": named}
        for c in given:
            g = per_concept.setdefault(c, [0, 0])
            g[0] += 1
            g[1] += c in named
    n = len(shares)
    return {
        "concept_recall": sum(shares) / n if n else None,
        "concept_any": sum(anys) / n if n else None,
        "concept_images": n,
        "per_image": per_image,
        "per_concept": dict(sorted(per_concept.items(), key=lambda kv: (-kv[1][0], kv[0]))),
    }

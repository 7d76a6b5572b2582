"""Reading and validating the two evaluation inputs.

- results: COCO results JSON, a list of ``{"image_id", "caption"}`` (one caption per image);
- references: COCO caption-annotation JSON, ``{"images": [...], "annotations": [{"image_id", "caption"}]}``
  (read by :mod:`r2m.utils.coco`).

Image ids are strings everywhere in r2m; integer ids in user files are accepted and normalised to
their decimal string. Every error names the file and the record index.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r2m.utils import coco
from r2m.utils.io import read_json


class EvalInputError(ValueError):
    """Invalid evaluation input; the message names the file and the record."""


def normalise_id(value: Any, where: str) -> str:
    """An image id as r2m's canonical string (ints become their decimal string)."""
    return coco.normalise_id(value, where, EvalInputError)


def parse_results(data: Any, source: str = "<results>") -> dict[str, str]:
    """``[{"image_id", "caption"}, ...]`` -> ``{image_id: caption}``; duplicates are an error."""
    if not isinstance(data, list):
        raise EvalInputError(
            f"{source}: results must be a JSON list of {{image_id, caption}} records, got {type(data).__name__}"
        )
    out: dict[str, str] = {}
    first_seen: dict[str, int] = {}
    for i, rec in enumerate(data):
        where = f"{source}: record {i}"
        if not isinstance(rec, dict):
            raise EvalInputError(f"{where}: expected an object {{image_id, caption}}, got {type(rec).__name__}")
        if "image_id" not in rec:
            raise EvalInputError(f"{where}: missing key 'image_id'")
        image_id = normalise_id(rec["image_id"], where)
        caption = coco.caption_of(rec, where, EvalInputError)
        if image_id in out:
            raise EvalInputError(
                f"{where}: duplicate result for image_id {image_id!r} (first at record {first_seen[image_id]}); "
                "give exactly one caption per image"
            )
        out[image_id] = caption
        first_seen[image_id] = i
    return out


def parse_references(data: Any, source: str = "<references>") -> dict[str, list[str]]:
    """COCO caption annotations -> ``{image_id: [caption, ...]}`` (in file order;
    :mod:`r2m.utils.coco`)."""
    return coco.parse_coco_captions(data, source, EvalInputError).per_image()


def match(
    results: dict[str, str],
    references: dict[str, list[str]],
    results_source: str = "<results>",
    references_source: str = "<references>",
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Restrict the references to the captioned images; every captioned image needs references."""
    missing = [i for i in results if not references.get(i)]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5]) + (" …" if len(missing) > 5 else "")
        raise EvalInputError(
            f"{results_source}: {len(missing)} image id(s) have no reference captions in "
            f"{references_source}: {shown}"
        )
    if not results:
        raise EvalInputError(f"{results_source}: no results to evaluate")
    return results, {i: references[i] for i in results}


def reference_splits(data: Any) -> dict[str, str | None]:
    """``{image_id: split}`` of a references file's ``images`` (``None`` when it has no ``split``)."""
    images = data.get("images", []) if isinstance(data, dict) else []
    return {str(img["id"]): img.get("split") for img in images if isinstance(img, dict) and "id" in img}


def check_coverage(results: dict[str, str], references: dict[str, list[str]], splits: dict[str, str | None],
                   results_source: str = "<results>", references_source: str = "<references>") -> list[str]:
    """The reference images the results should cover but do not: every image (with captions) of
    each split the captioned images belong to (all of them when the file names no splits)."""
    wanted = {splits.get(i) for i in results}
    return sorted(i for i, caps in references.items() if caps and splits.get(i) in wanted and i not in results)


def partial_error(missing: list[str], n_results: int, results_source: str, references_source: str) -> EvalInputError:
    shown = ", ".join(repr(m) for m in missing[:5]) + (" …" if len(missing) > 5 else "")
    return EvalInputError(
        f"{results_source}: captions cover {n_results} of {n_results + len(missing)} images of "
        f"{references_source}; {len(missing)} image id(s) missing ({shown}); caption them all, or pass "
        "--allow-partial to score the subset")


@dataclass(frozen=True)
class ReferenceProblems:
    """What :func:`drop_empty_references` and :func:`duplicate_file_names` found (reported in the
    log and counted in ``eval.json``, never scored silently)."""

    empty_references: int  # empty (or blank) reference captions of the scored images, not scored
    empty_reference_ids: list[str]  # the scored images that had one
    duplicate_file_names: list[list[str]]  # [file_name, id, id, …] for each file named by several ids

    def counts(self) -> dict[str, Any]:
        return {"empty_references": self.empty_references,
                "duplicate_file_names": len(self.duplicate_file_names)}

    def lines(self, source: str) -> list[str]:
        out = []
        if self.empty_references:
            shown = ", ".join(repr(i) for i in self.empty_reference_ids[:5])
            out.append(f"{source}: {self.empty_references} empty reference caption(s) not scored "
                       f"(image id(s) {shown}{' …' if len(self.empty_reference_ids) > 5 else ''})")
        for name, *ids in self.duplicate_file_names[:5]:
            out.append(f"{source}: file_name {name!r} is named by {len(ids)} image ids ({', '.join(map(repr, ids))})")
        if len(self.duplicate_file_names) > 5:
            out.append(f"{source}: {len(self.duplicate_file_names) - 5} more file names named by several image ids")
        return out


def drop_empty_references(references: dict[str, list[str]]) -> tuple[dict[str, list[str]], dict[str, int]]:
    """The references without their empty (or blank: only spaces, controls, separators) captions,
    and ``{image_id: number dropped}``. An image left with none has no references."""
    kept: dict[str, list[str]] = {}
    dropped: dict[str, int] = {}
    for image_id, caps in references.items():
        good = [c for c in caps if one_line(c)]
        if len(good) != len(caps):
            dropped[image_id] = len(caps) - len(good)
        kept[image_id] = good
    return kept, dropped


def duplicate_file_names(data: Any) -> list[list[str]]:
    """``[file_name, id, id, …]`` for every ``file_name`` that several image records of a
    references file name (two ids for one picture: one of them cannot be the image's id)."""
    images = data.get("images", []) if isinstance(data, dict) else []
    by_name: dict[str, list[str]] = {}
    for img in images:
        if isinstance(img, dict) and img.get("file_name") and "id" in img:
            by_name.setdefault(str(img["file_name"]), []).append(str(img["id"]))
    return [[name, *ids] for name, ids in by_name.items() if len(ids) > 1]


def load_results(path: str | Path) -> dict[str, str]:
    return parse_results(read_json(path), str(path))


def load_references(path: str | Path) -> dict[str, list[str]]:
    return parse_references(read_json(path), str(path))


# --------------------------------------------------------------------------- one line per caption
def _breaks_line(ch: str) -> bool:
    """Characters the PTB tokeniser's Java line reader (or its lexer) may treat as a line or token
    boundary, or cannot carry in UTF-8: control and format characters (``\\r``, ``\\x0b``, ``\\x0c``,
    ``\\x1c``-``\\x1e``, ``\\x85``, …), line/paragraph separators (``\\u2028``, ``\\u2029``), every
    space separator, lone surrogates, unassigned and private-use code points."""
    return unicodedata.category(ch)[0] in "CZ"


def one_line(text: str) -> str:
    """``text`` as one tokeniser line: every character of :func:`_breaks_line` becomes a space, runs
    of spaces collapse, ends are stripped. Ordinary text (letters, digits, punctuation, single ASCII
    spaces) passes unchanged, so scores of ordinary captions are the same as before."""
    if text.isascii() and text.isprintable():  # the common case, fast: only ASCII spaces to collapse
        return " ".join(text.split())
    return " ".join("".join(" " if _breaks_line(ch) else ch for ch in text).split())

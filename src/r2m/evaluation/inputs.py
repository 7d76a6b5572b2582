"""Reading and validating the two evaluation inputs.

- results: COCO results JSON, a list of ``{"image_id", "caption"}`` (one caption per image);
- references: COCO caption-annotation JSON, ``{"images": [...], "annotations": [{"image_id", "caption"}]}``
  (read by :mod:`r2m.utils.coco`).

Image ids are strings everywhere in r2m; integer ids in user files are accepted and normalised to
their decimal string. Every error names the file and the record index.
"""

from __future__ import annotations

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


def load_results(path: str | Path) -> dict[str, str]:
    return parse_results(read_json(path), str(path))


def load_references(path: str | Path) -> dict[str, list[str]]:
    return parse_references(read_json(path), str(path))

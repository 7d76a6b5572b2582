"""The one reader of COCO caption-annotation JSON: ``{"images": [{"id", ...}], "annotations":
[{"image_id", "caption"}, ...]}`` → its image records and ``(image_id, caption)`` pairs in file order,
or per-image captions (:meth:`CocoCaptions.per_image`).

Image ids are strings everywhere in r2m; integer ids are accepted and normalised to their decimal
string. Every error names the file and the record; callers choose the error class (e.g.
:class:`r2m.evaluation.inputs.EvalInputError`). It sits in ``utils`` so that evaluation, datasets
and the supervised stages can all use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r2m.utils.io import read_json


def normalise_id(value: Any, where: str, error: type[Exception] = ValueError) -> str:
    """An image id as r2m's canonical string (ints become their decimal string)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise error(f"{where}: image_id must be a string or an integer, got {value!r}")
    text = str(value)
    if not text.strip():
        raise error(f"{where}: empty image_id")
    return text


def caption_of(record: dict[str, Any], where: str, error: type[Exception] = ValueError) -> str:
    """A record's ``caption`` string."""
    if "caption" not in record:
        raise error(f"{where}: missing key 'caption'")
    cap = record["caption"]
    if not isinstance(cap, str):
        raise error(f"{where}: caption must be a string, got {type(cap).__name__}")
    return cap


@dataclass(frozen=True)
class CocoCaptions:
    images: list[dict[str, Any]]  # the file's image records, "id" normalised
    annotations: list[tuple[str, str]]  # (image_id, caption), in file order

    def per_image(self) -> dict[str, list[str]]:
        """``{image_id: [caption, ...]}``: every listed image (in file order, possibly without
        captions), then images named only by annotations; captions in file order."""
        out: dict[str, list[str]] = {img["id"]: [] for img in self.images}
        for image_id, cap in self.annotations:
            out.setdefault(image_id, []).append(cap)
        return out

    def require_listed(self, source: str, error: type[Exception] = ValueError) -> None:
        """Every annotation's image is one of the image records (else an error naming the record)."""
        listed = {img["id"] for img in self.images}
        for i, (image_id, _) in enumerate(self.annotations):
            if image_id not in listed:
                raise error(f"{source}: annotations[{i}]: image_id {image_id!r} is not in 'images'")

    def split_of(self, default: str | None = None) -> dict[str, str | None]:
        """``{image_id: split}`` of the image records (``default`` when a record has none)."""
        return {img["id"]: img.get("split", default) for img in self.images}


def parse_coco_captions(data: Any, source: str, error: type[Exception] = ValueError) -> CocoCaptions:
    """Validate a loaded COCO caption-annotation document."""
    if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
        raise error(
            f"{source}: references must be COCO caption annotations "
            '({"images": [...], "annotations": [{"image_id", "caption"}, ...]})'
        )
    images = data.get("images", [])
    if not isinstance(images, list):
        raise error(f"{source}: 'images' must be a list")
    records = []
    first: dict[str, int] = {}  # image id -> the first record giving it
    for i, img in enumerate(images):
        if not isinstance(img, dict) or "id" not in img:
            raise error(f"{source}: images[{i}]: expected an object with key 'id'")
        records.append({**img, "id": normalise_id(img["id"], f"{source}: images[{i}]", error)})
        j = first.setdefault(records[-1]["id"], i)
        if j != i and (type(images[j]["id"]) is not type(img["id"]) or images[j].get("file_name") != img.get("file_name")):
            raise error(f"{source}: images[{i}]: id {img['id']!r} is the image id of images[{j}] too "
                        f"(id {images[j]['id']!r}{', file_name ' + repr(images[j].get('file_name')) if 'file_name' in images[j] else ''}); "
                        "ids are compared as text, so 7 and \"7\" are one id: give each image its own id")
    pairs = []
    for i, ann in enumerate(data["annotations"]):
        where = f"{source}: annotations[{i}]"
        if not isinstance(ann, dict):
            raise error(f"{where}: expected an object {{image_id, caption}}, got {type(ann).__name__}")
        if "image_id" not in ann:
            raise error(f"{where}: missing key 'image_id'")
        pairs.append((normalise_id(ann["image_id"], where, error), caption_of(ann, where, error)))
    return CocoCaptions(records, pairs)


def read_coco_captions(path: str | Path, error: type[Exception] = ValueError) -> CocoCaptions:
    return parse_coco_captions(read_json(path), str(path), error)

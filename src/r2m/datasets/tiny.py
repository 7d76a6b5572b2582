"""``tiny``: a seeded synthetic dataset of any size, for tests and large-scale benchmarks.

Each image is a small PNG with 1–3 drawn objects; every object class is a concept of the visual
dictionary (:data:`OBJECTS`), drawn with its own shape and colour, so a detector (or the
ground-truth ``detections.jsonl`` the recipe writes) can name it. Val/test images get 5
reference captions from a small grammar that mentions their concepts; train images get 5 paired
training captions (``train_references.json``, for the supervised baselines) from their own random
stream. The text corpus comes from the same grammar with independent random draws and never
repeats a reference or training caption; it is streamed to disk, so millions of sentences cost
no memory.

The captions are generated with the images, so they have no source apart from the recipe's
options: ``prepare`` keeps them in ``<prepared>/generated_references.json`` (not read by any other
stage) and the ``references`` stage (:func:`r2m.datasets.base.generated_references`) publishes them.

Image paths in ``images.parquet`` are relative to the prepared folder (``images/<id>.png``);
resolve them with :func:`r2m.datasets.base.resolve_image_path`.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r2m.datasets.base import (
    GENERATED,
    SPLITS,
    Recipe,
    generated_references,
    option,
    references_json,
    write_prepared,
)
from r2m.params import DatasetEntry
from r2m.utils.progress import progress


@dataclass(frozen=True)
class ObjectKind:
    label: str  # detector class name (OpenImages-v4 boxable)
    word: str  # dictionary word
    plural: str
    colour: tuple[int, int, int]
    colour_name: str
    shape: str


OBJECTS: tuple[ObjectKind, ...] = (
    ObjectKind("Dog", "dog", "dogs", (139, 90, 43), "brown", "ellipse"),
    ObjectKind("Cat", "cat", "cats", (40, 40, 40), "black", "triangle"),
    ObjectKind("Car", "car", "cars", (200, 30, 30), "red", "rectangle"),
    ObjectKind("Ball", "ball", "balls", (250, 200, 0), "yellow", "circle"),
    ObjectKind("Tree", "tree", "trees", (20, 130, 40), "green", "triangle_up"),
    ObjectKind("Person", "person", "people", (240, 170, 140), "pink", "tall_rect"),
    ObjectKind("Horse", "horse", "horses", (110, 60, 20), "dark", "wide_rect"),
    ObjectKind("Bird", "bird", "birds", (30, 120, 220), "blue", "diamond"),
    ObjectKind("Boat", "boat", "boats", (245, 245, 245), "white", "trapezoid"),
    ObjectKind("Chair", "chair", "chairs", (150, 75, 160), "purple", "chair"),
    ObjectKind("Bicycle", "bicycle", "bicycles", (0, 170, 170), "teal", "two_circles"),
    ObjectKind("Umbrella", "umbrella", "umbrellas", (255, 120, 0), "amber", "half_circle"),
)
PLACES = ("field", "street", "park", "room", "yard", "garden", "beach", "city")
TEMPLATES: dict[int, tuple[str, ...]] = {  # {a} {b} {c}: noun phrases with their article
    1: ("{a} in the {place}", "there is {a} in the {place}", "a photo of {a}",
        "a close up of {a} near the {place}", "{a} standing in a {place}", "two {as} in the {place}"),
    2: ("{a} next to {b}", "{a} and {b} in the {place}", "{a} near {b} on a sunny day",
        "there is {a} with {b}", "{b} beside {a} in a {place}", "two {as} and {b}"),
    3: ("{a} , {b} and {c}", "{a} with {b} and {c} in the {place}",
        "{a} near {b} and {c}", "there are {a} {b} and {c} in the {place}"),
}


def _phrase(kind: ObjectKind, rng: random.Random) -> str:
    words = f"{kind.colour_name} {kind.word}" if rng.random() < 0.4 else kind.word
    return ("an " if words[0] in "aeiou" else "a ") + words


def caption(kinds: list[ObjectKind], rng: random.Random) -> str:
    """One sentence of the grammar mentioning every one of ``kinds`` (1–3 object kinds)."""
    kinds = rng.sample(kinds, len(kinds))
    slots = {k: _phrase(kinds[i], rng) for i, k in enumerate("abc"[: len(kinds)])}
    template = rng.choice(TEMPLATES[len(kinds)])
    return template.format(**slots, **{"as": kinds[0].plural, "place": rng.choice(PLACES)})


# --------------------------------------------------------------------------- drawing
def _draw(draw: Any, shape: str, box: tuple[int, int, int, int], colour: tuple[int, int, int]) -> None:
    x1, y1, x2, y2 = box
    cx, cy, w, h = (x1 + x2) // 2, (y1 + y2) // 2, x2 - x1, y2 - y1
    polygons = {
        "triangle": [(x1, y2), (x2, y2), (cx, y1)],
        "triangle_up": [(cx, y1), (x2, y1 + h * 3 // 4), (x1, y1 + h * 3 // 4)],
        "diamond": [(cx, y1), (x2, cy), (cx, y2), (x1, cy)],
        "trapezoid": [(x1, cy), (x2, cy), (x2 - w // 5, y2), (x1 + w // 5, y2)],
    }
    if shape in polygons:
        draw.polygon(polygons[shape], fill=colour, outline=(0, 0, 0))
        if shape == "triangle_up":
            draw.rectangle([cx - w // 10, y1 + h * 3 // 4, cx + w // 10, y2], fill=(100, 60, 20))
    elif shape in ("ellipse", "circle"):
        draw.ellipse(list(box), fill=colour, outline=(0, 0, 0))
    elif shape == "half_circle":
        draw.pieslice([x1, y1, x2, y2 + h], 180, 360, fill=colour, outline=(0, 0, 0))
    elif shape == "two_circles":
        r = min(w // 4, h // 2)
        draw.ellipse([x1, cy - r, x1 + 2 * r, cy + r], outline=colour, width=3)
        draw.ellipse([x2 - 2 * r, cy - r, x2, cy + r], outline=colour, width=3)
        draw.line([x1 + r, cy, x2 - r, cy], fill=colour, width=3)
    elif shape == "chair":
        draw.rectangle([x1, y1, x1 + w // 5, y2], fill=colour)
        draw.rectangle([x1, cy, x2, cy + h // 6], fill=colour)
        draw.rectangle([x2 - w // 5, cy, x2, y2], fill=colour)
    else:  # rectangle, tall_rect, wide_rect: the box itself (its aspect carries the kind)
        draw.rectangle(list(box), fill=colour, outline=(0, 0, 0))


def _box(rng: random.Random, size: int, shape: str) -> tuple[int, int, int, int]:
    w = rng.randint(size // 4, size // 2)
    h = w
    if shape == "tall_rect":
        w = max(4, w // 2)
    elif shape in ("wide_rect", "rectangle", "two_circles"):
        h = max(4, h * 2 // 3)
    x1, y1 = rng.randint(0, size - w - 1), rng.randint(0, size - h - 1)
    return x1, y1, x1 + w, y1 + h


def _overlap(box: tuple[int, int, int, int], others: list[list[int]]) -> int:
    x1, y1, x2, y2 = box
    return sum(max(0, min(x2, o[2]) - max(x1, o[0])) * max(0, min(y2, o[3]) - max(y1, o[1])) for o in others)


def draw_image(path: Path, kinds: list[ObjectKind], size: int, rng: random.Random) -> list[list[int]]:
    """Draw ``kinds`` on a plain background into ``path`` (PNG); returns each object's box."""
    from PIL import Image, ImageDraw

    bg = tuple(rng.randint(170, 235) for _ in range(3))
    img = Image.new("RGB", (size, size), bg)
    draw = ImageDraw.Draw(img)
    boxes = []
    for kind in kinds:
        # a few tries to find a spot that does not overlap the objects already drawn
        box = min((_box(rng, size, kind.shape) for _ in range(8)), key=lambda b: _overlap(b, boxes))
        _draw(draw, kind.shape, box, kind.colour)
        boxes.append(list(box))
    img.save(path, format="PNG", optimize=False)
    return boxes


# --------------------------------------------------------------------------- recipe
# (default, minimum, maximum): a synthetic set this size draws in minutes on one core; far larger is a typo
# (1e12 images would run for ever, image_size 100000 fills the memory with one picture)
TINY_LIMITS = {"seed": (0, 0, None), "n_train_images": (8, 1, 100_000), "n_val_images": (8, 1, 100_000),
               "n_test_images": (8, 1, 100_000), "n_sentences": (600, 1, 10_000_000), "image_size": (96, 32, 1024)}


def _n(entry: DatasetEntry, key: str) -> int:
    default, minimum, maximum = TINY_LIMITS[key]
    value = option(entry, key, default)
    if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
            or (maximum is not None and value > maximum)):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"catalog entry (kind tiny): {key} must be an integer {bound}, got {value!r}")
    return value


def check(entry: DatasetEntry) -> None:
    """Every size option in range, up front (before any stage runs)."""
    for key in TINY_LIMITS:
        _n(entry, key)


def corpus_lines(n: int, seed: int, exclude: set[str]) -> Iterator[str]:
    """``n`` grammar sentences (independent draws, never one of ``exclude``), generated lazily."""
    rng = random.Random(f"tiny-corpus-{seed}")
    made = 0
    while made < n:
        kinds = rng.sample(OBJECTS, rng.randint(1, 3))
        s = caption(kinds, rng)
        if s in exclude:
            continue
        made += 1
        yield s


def tiny(entry: DatasetEntry, out: Path, log: logging.Logger) -> dict[str, Any]:
    import pandas as pd

    seed = _n(entry, "seed")
    counts = {s: _n(entry, f"n_{s}_images") for s in SPLITS}
    n_sentences = _n(entry, "n_sentences")
    size = _n(entry, "image_size")
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"tiny-images-{seed}")
    ref_rng = random.Random(f"tiny-refs-{seed}")
    train_rng = random.Random(f"tiny-train-captions-{seed}")  # its own stream: images/refs unchanged
    rows, images, captions = [], [], {}
    train_images, train_captions = [], {}
    n_total = sum(counts.values())
    with open(out / "detections.jsonl", "w", encoding="utf-8") as det, \
            progress(total=n_total, desc="tiny images", unit="img") as bar:
        for split in SPLITS:
            for _ in range(counts[split]):
                image_id = f"tiny{len(rows):06d}"
                kinds = rng.sample(OBJECTS, rng.randint(1, 3))
                name = f"{image_id}.png"
                boxes = draw_image(out / "images" / name, kinds, size, rng)
                for kind, box in zip(kinds, boxes, strict=True):
                    score = round(rng.uniform(0.8, 0.99), 3)
                    det.write(json.dumps({"image_id": image_id, "label": kind.label, "score": score, "box": box}) + "\n")
                if rng.random() < 0.5:  # a low-confidence false positive, below the 0.3 threshold
                    other = rng.choice([k for k in OBJECTS if k not in kinds])
                    det.write(json.dumps({"image_id": image_id, "label": other.label,
                                          "score": round(rng.uniform(0.05, 0.25), 3),
                                          "box": [0, 0, size // 4, size // 4]}) + "\n")
                rows.append({"image_id": image_id, "path": f"images/{name}", "split": split,
                             "concepts": " ".join(sorted(k.word for k in kinds))})
                if split != "train":
                    images.append({"id": image_id, "file_name": name, "split": split})
                    captions[image_id] = [caption(kinds, ref_rng) for _ in range(5)]
                else:
                    train_images.append({"id": image_id, "file_name": name, "split": split})
                    train_captions[image_id] = [caption(kinds, train_rng) for _ in range(5)]
                bar.update(1)
    refs = references_json(images, captions)
    train_refs = references_json(train_images, train_captions)
    # the corpus never repeats an evaluation reference or a paired training caption
    exclude = {c for cs in (*captions.values(), *train_captions.values()) for c in cs}
    manifest = {"recipe": "tiny", "seed": seed, "image_size": size,
                "objects": [k.word for k in OBJECTS], "paths": "relative to the prepared folder"}
    manifest = write_prepared(out, pd.DataFrame(rows), corpus_lines(n_sentences, seed, exclude), manifest)
    (out / GENERATED).write_text(json.dumps({"references": refs, "train_references": train_refs}))
    log.info("tiny: %s images, %d sentences", manifest["n_images"], manifest["n_sentences"])
    return manifest


RECIPE = Recipe(prepare=tiny, references=generated_references)  # the kind 'tiny' (r2m.catalogs.RECIPES)

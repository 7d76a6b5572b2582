"""How good are a detector's concepts? Precision and recall of the concepts an image gets (after the
consumers' rule: score ≥ threshold, de-duplicated, at most ``max_per_image``) against hand-written
concept lists — the demo's ``data/demo/photos.yaml`` ``concepts``.

``r2m bench concepts`` runs detector settings over the demo photos (read out of their installed
packages, nothing downloaded) and prints images with ≥ 1 concept, micro precision/recall and time.
Matching is exact on dictionary words ("person" does not match "woman").
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd

from r2m.text.dictionary import image_concepts
from r2m.utils.io import write_text

KIND = "bench:concepts"  # the ownership kind of the --json file (r2m.utils.owner)

# named detector settings compared by the benchmark: (backend, options)
SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "classifier+faces": ("offline", {"parts": ["classifier", "faces"]}),
    "regions2+faces": ("offline", {"parts": ["regions", "faces"], "regions": {"scales": [2]}}),
    "regions23+faces": ("offline", {"parts": ["regions", "faces"], "regions": {"scales": [2, 3]}}),
    "regions2w.8+faces": ("offline", {"parts": ["regions", "faces"],
                                      "regions": {"scales": [2], "crop_weight": 0.8}}),
    "regions23w.8+faces": ("offline", {"parts": ["regions", "faces"],
                                       "regions": {"scales": [2, 3], "crop_weight": 0.8}}),
    "regions3w.8+faces": ("offline", {"parts": ["regions", "faces"],
                                      "regions": {"scales": [3], "crop_weight": 0.8}}),  # the default
    "regions23w.9+faces": ("offline", {"parts": ["regions", "faces"],
                                       "regions": {"scales": [2, 3], "crop_weight": 0.9}}),
}


def concept_quality(detections: pd.DataFrame, truth: dict[str, list[str]], threshold: float = 0.3,
                    max_per_image: int = 5, dictionary: Any = None) -> dict[str, Any]:
    """Micro precision/recall of predicted concepts vs ``truth`` (image id -> words), over the
    images of ``truth``; also images with ≥ 1 concept and per-image lists. With a ``dictionary``,
    ``recall_dictionary`` counts only the true words that are dictionary concepts (the others no
    detector of this dictionary can name)."""
    got = image_concepts(detections, threshold, max_per_image)
    tp = n_pred = n_true = with_concept = 0
    tp_dict = n_true_dict = 0
    per_image = {}
    for image_id, words in truth.items():
        pred = [c for c, _ in got.get(image_id, [])]
        hits = sorted(set(pred) & set(words))
        tp += len(hits)
        n_pred += len(set(pred))
        n_true += len(set(words))
        with_concept += bool(pred)
        if dictionary is not None:
            in_dict = {w for w in words if dictionary.label_to_concept(w) == w}
            n_true_dict += len(in_dict)
            tp_dict += len(set(hits) & in_dict)
        per_image[image_id] = {"predicted": pred, "correct": hits}
    return {
        "images": len(truth), "images_with_concept": with_concept,
        "precision": tp / n_pred if n_pred else 0.0, "recall": tp / n_true if n_true else 0.0,
        "recall_dictionary": tp_dict / n_true_dict if n_true_dict else None,
        "predicted": n_pred, "correct": tp, "true": n_true, "true_in_dictionary": n_true_dict,
        "per_image": per_image,
    }


def demo_photos(folder: Path, source: Path | None = None) -> tuple[list[Path], dict[str, list[str]]]:
    """Write the demo photos into ``folder``; return their paths and concept lists (by photo id)."""
    from r2m.datasets.demo import DEFAULT_SOURCE, REPO_ROOT, load_photos, read_photo

    source = source or (REPO_ROOT / DEFAULT_SOURCE)
    paths, truth = [], {}
    for p in load_photos(source, extra=("concepts",)):
        f = folder / f"{p['id']}{Path(p['resource']).suffix.lower() or '.png'}"
        f.write_bytes(read_photo(p))
        paths.append(f)
        truth[p["id"]] = [str(w) for w in p.get("concepts", [])]
    return paths, truth


def main(argv: list[str]) -> int:
    import tempfile

    import torch

    from r2m.text.dictionary import load_dictionary
    from r2m.utils.cliargs import bench_parser as parser
    from r2m.utils.cliargs import float_in, int_in
    from r2m.utils.owner import claim, mark_file
    from r2m.vision.detectors.factory import detect_images

    p = parser("concepts", "concept precision/recall of detector settings on the demo photos")
    p.add_argument("--settings", nargs="*", choices=list(SETTINGS), default=list(SETTINGS),
                   help=f"of {', '.join(SETTINGS)}")
    p.add_argument("--threshold", type=float_in(0, 1), default=0.3)
    p.add_argument("--max-per-image", type=int_in(1, 1000), default=5)
    p.add_argument("--batch-size", type=int_in(1, 4096), default=8)
    p.add_argument("--json", default=None, help="also write the figures (and per-image concepts) here")
    p.add_argument("--dictionary", choices=("openimages", "coco80"), default="openimages")
    p.add_argument("--verbose", action="store_true", help="print each photo's concepts")
    a = p.parse_args(argv)
    if a.json is not None:  # the writer check, before any photo is read
        claim(a.json, KIND, "--json", folder=False)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = "cuda" if a.device == "auto" and torch.cuda.is_available() else ("cpu" if a.device == "auto" else a.device)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths, truth = demo_photos(Path(tmp))
        ids = [p.stem for p in paths]
        dictionary = load_dictionary(a.dictionary)
        print(f"{'setting':<22} {'≥1 concept':>10} {'precision':>13} {'recall':>13} {'recall(dict)':>12} {'s':>6}")
        for name in a.settings:
            backend, options = SETTINGS[name]
            t0 = time.perf_counter()
            df = detect_images(paths, backend, options, image_ids=ids, batch_size=a.batch_size, device=device)
            secs = time.perf_counter() - t0
            q = concept_quality(df, truth, a.threshold, a.max_per_image, dictionary)
            q["seconds"] = secs
            out[name] = q
            print(f"{name:<22} {q['images_with_concept']:>5}/{q['images']:<4} "
                  f"{q['precision']:>5.2f} ({q['correct']:>2}/{q['predicted']:<2}) {q['recall']:>5.2f} "
                  f"({q['correct']:>2}/{q['true']:<2}) {q['recall_dictionary']:>12.2f} {secs:>6.1f}")
            if a.verbose:
                for i, r in q["per_image"].items():
                    print(f"    {i:<13} {', '.join(r['predicted']) or '-':<50} ok: {', '.join(r['correct'])}")
    if a.json is not None:
        write_text(a.json, json.dumps(out, indent=1))
        mark_file(a.json, KIND)
    return 0

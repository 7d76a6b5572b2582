"""``Captioner``: a checkpoint ready to caption image files (``r2m caption IMAGES``): concept detection with
the checkpoint's recorded backend, (for ``no_concepts: image``) features, beam search — batched.

Apart from :mod:`r2m.captioning.captioner` so that the stages reusing its decoding (checkpoint selection in
training, the baselines) do not import the detector and feature backends (nor read them, as their records
show)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from r2m.captioning.captioner import (
    attention_record,
    caption_detections,
    check_vocab,
    load_checkpoint_model,
    words_of,
)
from r2m.text.vocab import END


class Captioner:
    """A checkpoint with its recorded settings (:mod:`r2m.captioning.settings`), ready to caption
    image files: detection, (for ``no_concepts: image``) features, beam search — batched. The detector
    (and feature extractor) is built once, so :meth:`chunks` can caption a long list a batch at a time."""

    def __init__(self, model_dir: str | Path, device: Any = "cpu", root: Path = Path("."), hint: str = ""):
        from r2m.captioning import settings

        self.model_dir = Path(model_dir)
        if not (self.model_dir / "model.pt").exists():
            raise FileNotFoundError(f"no checkpoint: {self.model_dir / 'model.pt'} is missing{hint}")
        self.model, self.ckpt, _ = load_checkpoint_model(self.model_dir, device)
        self.device = device
        self.settings = settings.load(self.model_dir, self.ckpt, root)
        self.itos: list[str] = self.settings["itos"]
        check_vocab(self.model, self.itos, self.model_dir, "recorded vocabulary")
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        self._detector: Any = None
        self._extractor: Any = None

    def caption(self, paths: list[Path], batch_size: int | None = None, beam: int | None = None,
                max_len: int | None = None, no_concepts: str | None = None,
                attention: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
        """Captions (in input order) of the readable images, and the bad ones ``{path, reason}``."""
        out: list[dict[str, Any]] = []
        bad: list[dict[str, str]] = []
        for good, skipped in self.chunks(paths, batch_size, beam, max_len, no_concepts, attention):
            out += good
            bad += skipped
        return out, bad

    def chunks(self, paths: list[Path], batch_size: int | None = None, beam: int | None = None,
               max_len: int | None = None, no_concepts: str | None = None, attention: bool = False
               ) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, str]]]]:
        """:meth:`caption` a batch of ``batch_size`` images at a time, in input order: each batch's captions
        and bad images as soon as they are made. The settings are checked before the first image is read."""
        from r2m.captioning import settings

        s = self.settings
        batch_size = batch_size or int(s["detect_concepts"].get("batch_size", 8))
        beam, max_len = beam or int(s["caption"]["beam"]), max_len or int(s["caption"]["max_len"])
        settings.beam_problem(beam, "beam")
        return (self._batch(paths[i: i + batch_size], batch_size, beam, max_len, no_concepts, attention)
                for i in range(0, len(paths), batch_size))

    def _batch(self, paths: list[Path], batch_size: int, beam: int, max_len: int, no_concepts: str | None,
               attention: bool) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
        import pandas as pd

        from r2m.vision.detectors.base import Env
        from r2m.vision.detectors.factory import build_detector

        s = self.settings
        det_p, cap, conc = s["detect_concepts"], s["caption"], s["concepts"]
        if self._detector is None:
            self._detector = build_detector(det_p["backend"], det_p.get("options") or {}, conc["dictionary"],
                                            self.device, det_p.get("floor"))
        ids = [str(p) for p in paths]
        det, bad_rows = self._detector.detect(pd.DataFrame({"image_id": ids, "file": ids}),
                                              Env(batch_size=batch_size, workers=0,
                                                  min_side=int(det_p.get("min_side", 1)), show=False))
        bad = {i: reason for i, _, reason in bad_rows}
        good = [i for i in ids if i not in bad]
        fid = s.get("fidelity") or {}
        res = caption_detections(
            self.model, self.ckpt, self.itos, good, det, threshold=float(conc["score_threshold"]),
            max_per_image=int(conc["max_per_image"]), dictionary=conc["dictionary"],
            no_concepts=no_concepts or cap.get("no_concepts", "empty"), image_concepts=fid.get("image_concepts"),
            concept_per_class=fid.get("concept_per_class"),
            decoding=fid.get("decoding"), ban_unk=fid.get("ban_unk"), ban_specials=fid.get("ban_specials"), beam=beam, max_len=max_len,
            batch_size=batch_size, device=self.device,
            features=lambda files: self._features(files, batch_size))  # asked only with an image projection
        scores = det.groupby(["image_id", "concept"])["score"].max() if len(det) else pd.Series(dtype=float)
        out = []
        for n, (i, toks) in enumerate(zip(good, res.tokens, strict=True)):
            rec: dict[str, Any] = {
                "path": i, "caption": words_of(toks, self.itos), "source": res.source[n],
                "concepts": [{"concept": w, "score": round(float(scores[(i, w)]), 4) if (i, w) in scores else None}
                             for w in res.words[n]],
            }
            if attention:
                rec["attention"] = attention_record(self.model, self.itos, res.concept_ids[n], [*toks, END][:max_len],
                                                    self.device, res.v[n])["steps"]
            out.append(rec)
        return out, [{"path": i, "reason": bad[i]} for i in ids if i in bad]

    def _features(self, files: list[str], batch_size: int) -> dict[str, Any]:
        from r2m.vision.extractors.compute import extract_arrays
        from r2m.vision.extractors.factory import build_extractor

        if self._extractor is None:
            fp = self.settings["extract_features"]
            self._extractor = build_extractor(fp["backend"], fp.get("options") or {})
        arrays, good, _ = extract_arrays(self._extractor, files, batch_size, self.device, show=False)
        return {files[g]: arrays["pooled"][n] for n, g in enumerate(good)}

"""Open-vocabulary backend ``owl`` on tiny randomly initialised OWLv2 / OWL-ViT models built here from
a config (with a small word-level tokenizer and the real image processors), saved to a folder and
loaded back offline. Checks that the cached text queries give the same logits as the model's own
forward, that batching does not change results, box conversion, NMS/limits and option errors.
Skipped, with the reason, when ``transformers`` (the optional extra ``owl``) is not installed."""

from __future__ import annotations

import sys

import pytest
import torch
from PIL import Image

from r2m.utils.options import MissingExtraError
from r2m.vision.detectors.factory import build_detector, detect_images
from r2m.vision.detectors.owl import boxes_to_pixels

LABELS = ["Cat", "Dog", "Bicycle wheel", "Coffee cup"]


def _transformers():
    return pytest.importorskip("transformers", reason="optional extra 'owl' not installed "
                               "(pip install -e '.[owl]' or make setup-owl)")


def _tiny(tr, folder, kind):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[PAD]", "[UNK]", "a", "photo", "of", "cat", "dog", "bicycle", "wheel", "coffee", "cup"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = tr.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    text = {"vocab_size": len(words), "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": 8,
            "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3}
    vision = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 8}
    torch.manual_seed(0)
    if kind == "owlv2":
        model = tr.Owlv2ForObjectDetection(tr.Owlv2Config(text_config=text, vision_config=vision, projection_dim=32))
        proc = tr.Owlv2ImageProcessor(size={"height": 32, "width": 32})
    else:
        model = tr.OwlViTForObjectDetection(tr.OwlViTConfig(text_config=text, vision_config=vision, projection_dim=32))
        proc = tr.OwlViTImageProcessor(size={"height": 32, "width": 32}, crop_size={"height": 32, "width": 32})
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    proc.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from skimage import data

    d = tmp_path_factory.mktemp("owlimg")
    paths = {}
    for name in ("chelsea", "coffee", "astronaut"):
        paths[name] = d / f"{name}.png"
        Image.fromarray(getattr(data, name)()).save(paths[name])
    (d / "broken.png").write_bytes(b"\x89PNG broken")
    paths["broken"] = d / "broken.png"
    return paths


def test_missing_transformers_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingExtraError) as err:
        build_detector("owl", {"model": "/nonexistent"})
    msg = str(err.value)
    assert "\n" not in msg and "'owl'" in msg and "pip install -e '.[owl]'" in msg


def test_options_are_validated():
    with pytest.raises(ValueError, match="unknown option"):
        build_detector("owl", {"treshold": 0.1})
    with pytest.raises(ValueError, match="prompt must contain"):
        build_detector("owl", {"prompt": "a photo"})
    with pytest.raises(ValueError, match="labels must be a list"):
        build_detector("owl", {"labels": "Cat"})


def test_boxes_to_pixels_padded_and_stretched():
    b = torch.tensor([[0.5, 0.25, 0.5, 0.5], [0.9, 0.9, 0.4, 0.4]])
    # OWLv2: coordinates relative to the padded square side max(w, h) = 200, clipped to 200 x 100
    assert boxes_to_pixels(b, 200, 100, True).tolist() == [[50, 0, 150, 100], [140, 100, 200, 100]]
    # OWL-ViT: relative to (w, h)
    assert boxes_to_pixels(b[:1], 200, 100, False).tolist() == [[50, 0, 150, 50]]


@pytest.mark.parametrize("kind", ["owlv2", "owlvit"])
def test_tiny_model_offline_matches_forward_and_batches(tmp_path, photos, kind):
    tr = _transformers()
    folder = _tiny(tr, tmp_path / kind, kind)
    opts = {"model": str(folder), "labels": LABELS, "floor": 0.0, "max_detections": 3}
    det = build_detector("owl", opts)
    assert det.padded_square == (kind == "owlv2")
    # the cached query embeddings give the model's own logits
    imgs = [Image.open(photos[n]).convert("RGB") for n in ("chelsea", "coffee")]
    pv = det.processor(images=imgs, return_tensors="pt")["pixel_values"]
    tok = det.tokenizer([det.cfg.prompt.format(x) for x in LABELS] * 2, padding="max_length", truncation=True,
                        max_length=8, return_tensors="pt")
    with torch.no_grad():
        ref = det.model(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"], pixel_values=pv)
    logits, boxes = det.raw_outputs(pv)
    assert torch.allclose(logits, ref.logits, atol=1e-4) and torch.allclose(boxes, ref.pred_boxes, atol=1e-5)

    ids = ["chelsea", "broken", "coffee", "astronaut"]
    together = detect_images([photos[i] for i in ids], "owl", opts, image_ids=ids, batch_size=4)
    alone = detect_images([photos["coffee"]], "owl", opts, image_ids=["coffee"], batch_size=1)
    assert [b[0] for b in together.attrs["bad_images"]] == ["broken"]
    assert together.groupby("image_id").size().to_dict() == {"astronaut": 3, "chelsea": 3, "coffee": 3}
    assert set(together.label) <= set(LABELS) and set(together.concept) <= {"cat", "dog", "wheel", "cup"}
    c = together[together.image_id == "coffee"].reset_index(drop=True)
    assert c[["label", "concept"]].equals(alone[["label", "concept"]])
    assert torch.allclose(torch.tensor(c.score.values), torch.tensor(alone.score.values), atol=1e-5)
    w, h = Image.open(photos["coffee"]).size
    assert (c.x1 >= 0).all() and (c.x2 <= w).all() and (c.y1 >= 0).all() and (c.y2 <= h).all()
    assert (c.x1 <= c.x2).all() and (c.y1 <= c.y2).all()


def test_missing_weights_say_how_to_get_them(tmp_path):
    _transformers()
    with pytest.raises(RuntimeError, match="allow_download"):
        build_detector("owl", {"model": "no-such-org/no-such-owl-model"})

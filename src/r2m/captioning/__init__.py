"""Captioning: batched beam search (:mod:`r2m.captioning.beam`), the captioning library (:mod:`r2m.captioning.captioner`,
:mod:`r2m.captioning.photos`) and the ``caption`` stage (:mod:`r2m.captioning.stage`); the decoder itself is the
model's (:mod:`r2m.models.r2m`)."""

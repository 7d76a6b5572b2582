"""Decoding: batched beam search (:mod:`r2m.decoding.beam`) and the ``caption`` stage (:mod:`r2m.decoding.stage`)."""

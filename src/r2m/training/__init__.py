"""R²M training: data streams (:mod:`.data`), the four stages (:mod:`.stages`), ``r2m bench train`` (:mod:`.bench`)."""

"""What one stage is and what it receives: the stage registry (:mod:`r2m.stage.registry`, its building blocks
in :mod:`r2m.stage.spec` and :mod:`r2m.stage.axes`), the :class:`~r2m.stage.context.StageContext` a stage's
entry is handed, and the record of what a run read (:mod:`r2m.stage.record`). Below every stage module;
the engines that run stages (:mod:`r2m.pipeline`) sit above them."""

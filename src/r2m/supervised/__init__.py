"""The supervised seed baselines (m-RNN, …) as DAG stages, shared by every supervised model.

``sup_vocab`` (per dataset) → ``train_sup`` → ``caption_sup`` → ``evaluate_sup``, and
``retrieval_sup`` (per dataset and model); ``retrieval_r2m`` scores R²M through its joint space.
A dataset without paired training captions (no ``references/train_references.json``) is not an
error: ``sup_vocab`` records why (``stats.json``: ``paired: false``, ``reason``) and every later
stage writes a small "skipped" output that the tables show as one line.
"""

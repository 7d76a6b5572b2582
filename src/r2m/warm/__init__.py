"""A warm start for ``r2m`` stage jobs: ``r2m warm -- snakemake ...`` runs a command while a server
holds torch, numpy, pandas, pyarrow and the stage modules already imported, and each ``r2m <stage>``
job the command starts runs in a fork of it instead of importing them again (about 2-3 CPU seconds
per job, for each of the DAG's jobs).

* :mod:`r2m.warm.client` — what the ``r2m`` console script does when ``R2M_WARM`` names a server:
  hand the job (arguments, working folder, environment, stdin/stdout/stderr) to it, forward
  SIGTERM/SIGINT/SIGHUP to the job, return its exit status. No server there: the job runs cold.
* :mod:`r2m.warm.server` — the ``r2m warm`` tool: the server, and the command it wraps.
* :mod:`r2m.warm.front` — the command (the workflow engine) in a session of its own, and how a stop signal
  stops the whole run: the jobs first (each saves its state), the engine by itself; a second signal kills.
* :mod:`r2m.warm.engine` — what a stopped Snakemake leaves (its lock, "incomplete" markers) and how the next
  ``r2m warm -- snakemake`` gets past it on its own.

A forked job runs the same code as a cold one on the same inputs: :func:`r2m.cli.main`, which ``r2m warm``
(:func:`r2m.cli.warm`) hands the server (the server imports nothing above the stage registry). Its
outputs are the same bytes (tests/test_warm.py compares them). The server never runs a stage nor
reads a project file itself, so nothing it holds depends on the workspace.
"""

"""The benchmarks behind ``r2m bench``: one module each, listed in :mod:`r2m.bench.registry`."""

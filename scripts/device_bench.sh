#!/usr/bin/env bash
# The lent-GPU measurements of scripts/device_bench.py, one section per process, each with its own
# time limit (seconds: FEATURES_S, SCHEDULE_S); results in $OUT/results.jsonl, the log in $OUT/log.txt.
# Run from a folder holding src/ and scripts/ (the repository root, or a carried copy of it).
set -u
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/r2m-device-bench}
mkdir -p "$OUT"
PY=${PY:-python3}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
  timeout 60 $PY scripts/device_bench.py env "$@"
  timeout "${FEATURES_S:-170}" $PY scripts/device_bench.py features "$@" || echo "# features: exit $?"
  timeout "${SCHEDULE_S:-150}" $PY scripts/device_bench.py schedule "$@" || echo "# schedule: exit $?"
} 2>&1 | tee -a "$OUT/log.txt"

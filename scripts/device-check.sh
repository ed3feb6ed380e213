#!/usr/bin/env bash
# The device check, on a GPU or Gaudi2 machine, in one call (details: scripts/device_check.py):
#   bash scripts/device-check.sh [cuda|h100|a100|gaudi2] [--plan] [--use-installed-torch] [--wheelhouse DIR]
# Reads the driver, makes a virtual environment of its own (never pip into the system Python) with the torch the tests
# run built for the CUDA the driver runs (or, with --use-installed-torch, the interpreter's own torch; with
# --wheelhouse, only from that folder), runs a smoke test and the published shape (large, bf16, batch 48) for workers
# 0/1/2 and the device decoders inside --budget seconds (default 480), prints the blog-comparable table, writes
# $OUT/device-check.json. --plan prints all of that and changes nothing. Exit 1: a configuration FAILED, left no
# record, or decoded its images on the host; 2: no environment can be made; 3: the device is absent (with the reason).
# Environment: PYTHON (the interpreter, default python3), OUT (results folder), BUDGET, STEPS.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "device-check: FAILED: $PYTHON is not a Python >= 3.10 (set PYTHON)" >&2
  exit 2
fi
exec "$PYTHON" "$HERE/device_check.py" --python "$(command -v "$PYTHON")" "$@"

#!/usr/bin/env bash
# The device check, on a fresh GPU or Gaudi2 machine with only pip access (details: scripts/device_check.py):
#   bash scripts/device-check.sh [cuda|h100|a100|gaudi2]     # default cuda: any NVIDIA card, recorded
# Prints the environment, stops with the adapter's reason (exit 3) where the device is absent, installs the extras
# matching the installed torch, runs the tiny matrix (loaders cpu, cpu-fast, device, dali x workers 0, 2 x fp32, bf16,
# plus hf-trainer), compare and bench-loader, writes $OUT/device-check.json, and exits 1 if any configuration FAILED.
# Environment: PYTHON (default python3), OUT (results folder), STEPS (default 20), NO_INSTALL=1 (use the env as is).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import suite, torch" 2>/dev/null; then
  if [ -n "${NO_INSTALL:-}" ]; then
    echo "device-check: FAILED: the suite is not installed in $PYTHON and NO_INSTALL is set" >&2
    exit 2
  fi
  echo "device-check: installing the suite (and torch) into $PYTHON"
  "$PYTHON" -m pip install --quiet -e "$HERE/.."
fi
exec "$PYTHON" "$HERE/device_check.py" ${NO_INSTALL:+--no-install} "$@"

#!/usr/bin/env bash
# One short device check on a machine with a GPU (or a Gaudi2): the tiny matrix on that device with the
# CPU loader and the on-device decoding loader, 0 and 2 workers, fp32 and bf16, then the results table.
#   scripts/device-check.sh            # the generic `cuda` adapter (any NVIDIA card; the card is recorded)
#   scripts/device-check.sh h100       # refuses any card that is not an H100; a100, gaudi2 likewise
# Needs a Python environment with this project and its extra for the device, e.g.
#   pip install -e '.[cuda,test]'      (torch with CUDA, torchvision for nvJPEG, nvidia-ml-py)
set -euo pipefail
DEVICE="${1:-cuda}"
OUT="${OUT:-suite-results/device-check-$(date +%Y%m%d-%H%M%S)}"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -m suite devices
"$PYTHON" -m suite run --device "$DEVICE" --loader cpu,cpu-fast,device --workers 0,2 --precision fp32,bf16 \
  --steps "${STEPS:-20}" --warmup-steps 3 --output "$OUT" --tracking-uri "sqlite:///$OUT/mlflow.db" --no-progress \
  || echo "device-check: some configurations failed (reasons above and in $OUT/results.json)"
"$PYTHON" -m suite compare "$OUT" --output "$OUT/plots" --tracking-uri "sqlite:///$OUT/mlflow.db"
"$PYTHON" -m suite bench-loader --num-workers 2 --rounds 2 --output "$OUT"  # -> $OUT/bench-loader.json
echo "device-check: results in $OUT"

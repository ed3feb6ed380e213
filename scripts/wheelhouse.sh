#!/usr/bin/env bash
# Gather, on a machine with network, the wheels the suite needs to run beside an existing torch, for an air-gapped
# accelerator box; then, there: bash scripts/device-check.sh DEVICE --use-installed-torch --wheelhouse DIR
#   bash scripts/wheelhouse.sh DIR [DEVICE] [--have FREEZE]   # DEVICE: cuda (default), h100, a100, gaudi2
# FREEZE: `pip freeze` of the box's Python: what it already has is left out (default: the packages a CUDA image
# ships beside torch: transformers, accelerate, numpy, pandas, pyarrow, pillow, pyyaml, psutil...). Wheels are for the
# box's Python and platform: TARGET_PYTHON (default 3.12), TARGET_PLATFORM (default manylinux_2_28_x86_64).
# Left out on purpose (the runs work without them, said by the check): MLflow, numba, arch. Prints each wheel's size
# and the total: the device tool carries at most 64 MiB with the tree.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DIR="${1:?usage: wheelhouse.sh DIR [DEVICE] [--have FREEZE]}"
shift
DEVICE="cuda"
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then DEVICE="$1"; shift; fi
HAVE=""
if [ "${1:-}" = "--have" ]; then HAVE="${2:?--have needs a pip freeze file}"; fi
PYTHON="${PYTHON:-python3}"
TARGET_PYTHON="${TARGET_PYTHON:-3.12}"
TARGET_PLATFORM="${TARGET_PLATFORM:-manylinux_2_28_x86_64}"
mkdir -p "$DIR"
needs="$("$PYTHON" "$HERE/device_check.py" "$DEVICE" --requirements)
setuptools>=68"  # what the suite's editable install is built with, offline
# what the box has: its pip freeze, else what a CUDA image with torch and transformers ships
if [ -n "$HAVE" ]; then
  have="$(sed -E 's/[ =<>!~;@].*//' "$HAVE" | tr 'A-Z_' 'a-z-')"
else
  have="torch torchvision transformers accelerate tokenizers huggingface-hub safetensors numpy pandas pyarrow pillow
pyyaml psutil filelock packaging requests regex tqdm python-dateutil pytz tzdata typing-extensions nvidia-ml-py"
fi
wanted=()
while IFS= read -r need; do
  name="$(printf '%s' "$need" | sed -E 's/[ =<>!~;\[].*//' | tr 'A-Z_' 'a-z-')"
  if ! printf '%s\n' $have | grep -qx "$name"; then wanted+=("$need"); fi
done <<< "$needs"
echo "wheelhouse: gathering ${wanted[*]} (and what they need that the box lacks) for Python $TARGET_PYTHON, $TARGET_PLATFORM"
"$PYTHON" -m pip download --quiet --only-binary=:all: --python-version "$TARGET_PYTHON" --implementation cp \
  --platform "$TARGET_PLATFORM" --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  --dest "$DIR" "${wanted[@]}"
# what the box has is not carried, even when a wanted package asked for it
for file in "$DIR"/*.whl; do
  name="$(basename "$file" | cut -d- -f1 | tr 'A-Z_' 'a-z-')"
  if printf '%s\n' $have | grep -qx "$name"; then rm -f "$file"; fi
done
du -k "$DIR"/*.whl | sort -n | awk '{printf "wheelhouse: %8.1f MiB  %s\n", $1/1024, $2}'
du -ck "$DIR"/*.whl | tail -1 | awk '{printf "wheelhouse: %8.1f MiB in all\n", $1/1024}'

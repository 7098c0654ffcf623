#!/usr/bin/env bash
# Downloads, on a machine with network, the Python 3.12 wheels that
# benchmarks/gpu_device_run.sh installs on a GPU machine without network (one H200, Python
# 3.12 with torch 2.11+cu130 already there, but no tornado, apache-tvm-ffi or cupti-python).
#
#   bash benchmarks/fetch_gpu_wheels.sh [DEST]      # DEST defaults to .gpu-wheels/ (ignored)
#
# Only what that machine lacks is fetched, with --no-deps: the server's tornado, the
# kcoral[gpu] extra (apache-tvm-ffi; cupti-python of CUDA 13.0, matching torch's
# nvidia-cuda-cupti 13.0 and cuda-bindings 13.0 there; nvidia-ml-py, pure Python, for the
# GPU state benchmark results carry) and pyelftools (cupti-python needs it).
# numpy, ml_dtypes, urllib3, cloudpickle, psutil, pytest, pytest-timeout, setuptools and
# wheel are in that image already. The device tool carries the folder (64 MiB for the whole
# working tree): this script fails when the wheels and the tree together would not fit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$ROOT/.gpu-wheels}
PYTHON=${PYTHON:-python3}
CARRY_LIMIT_BYTES=$((64 * 1024 * 1024))

WHEELS=(
    "tornado==6.6.1"
    "apache-tvm-ffi==0.1.15.post2"
    "cupti-python==13.0.1"
    "pyelftools==0.33"
    "nvidia-ml-py==13.615.71"
)

rm -rf "$DEST"
mkdir -p "$DEST"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 \
    -d "$DEST" "${WHEELS[@]}"

count=$(find "$DEST" -name '*.whl' | wc -l)
if [ "$count" -ne "${#WHEELS[@]}" ]; then
    echo "expected ${#WHEELS[@]} wheels in $DEST, found $count" >&2
    exit 1
fi
wheels_bytes=$(find "$DEST" -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
tree_bytes=$(cd "$ROOT" && git ls-files -co --exclude-standard -z \
    | xargs -0 -r stat -c '%s' 2>/dev/null | awk '{s += $1} END {print s + 0}')
total=$((wheels_bytes + tree_bytes))
ls -l "$DEST"
echo "wheels: $wheels_bytes bytes; working tree: $tree_bytes bytes; carried together: $total" \
    "of $CARRY_LIMIT_BYTES bytes"
if [ "$total" -gt "$CARRY_LIMIT_BYTES" ]; then
    echo "too large for the device tool's 64 MiB" >&2
    exit 1
fi

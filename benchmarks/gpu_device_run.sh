#!/usr/bin/env bash
# The GPU check in one command, for a rented GPU machine without network: one GPU (an H200
# here), 16 cores, Python 3.12 with torch 2.11+cu130 already installed (used as it is: no
# torch is installed), no tornado, apache-tvm-ffi or cupti-python, maybe no bubblewrap
# (everything runs with --sandbox none). It
#
#   1. records the machine (nvidia-smi, kernel, Python, torch, bwrap) in environment.txt;
#   2. installs the wheels carried in .gpu-wheels/ (made here, with network, by
#      `bash benchmarks/fetch_gpu_wheels.sh`) and the project itself, offline;
#   3. runs the GPU suite, `pytest tests/gpu -m "not slow"` (every `gpu` test plus the unit
#      tests of that folder), writing pytest-gpu.xml (JUnit);
#   4. runs `benchmarks/gpu_check.py`, writing gpu_check.md (the README table) and
#      gpu_check.json;
#   5. runs `benchmarks/back_to_back_cores.py` on all of the machine's CPUs, then on 2
#      (CPU mode: does issue 31's back-to-back miss on the 2-core VM follow the core
#      count?), writing its table to back_to_back_cores.md; its result does not change
#      the exit status;
#   6. keeps the servers' logs of the tests as server-logs.tar.gz and the exit codes in
#      summary.txt; everything printed is also in run.log.
#
# All within 7 minutes (each step has its own limit), into $OUT when set, else .gpu-run/.
# The device tool runs it from the repository root of a copy of this working tree:
#
#   run(command="bash benchmarks/gpu_device_run.sh", carry=[".gpu-wheels"], timeout_s=450)
#
# Here, first: `bash benchmarks/fetch_gpu_wheels.sh` (about 5 MB of wheels). PYTHON
# overrides the interpreter (default python3, the one holding torch there).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
OUT_DIR=${OUT:-$ROOT/.gpu-run}
mkdir -p "$OUT_DIR"
PYTHON=${PYTHON:-python3}
WHEELS=$ROOT/.gpu-wheels
SCRATCH=$(mktemp -d /tmp/kcoral-gpu-run.XXXXXX)
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
exec > >(tee -a "$OUT_DIR/run.log") 2>&1

INSTALL_SECONDS=${INSTALL_SECONDS:-60}
PYTEST_SECONDS=${PYTEST_SECONDS:-150}
CHECK_SECONDS=${CHECK_SECONDS:-140}
CORES_SECONDS=${CORES_SECONDS:-70}

step() { printf '\n== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

step "environment"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "kernel: $(uname -r)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "python: $(command -v "$PYTHON") $("$PYTHON" --version 2>&1)"
    echo "bwrap: $(command -v bwrap || echo 'not installed (tests use --sandbox none)')"
    echo "nvcc: $(command -v nvcc || echo 'not on PATH')"
    nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total \
        --format=csv 2>&1 || echo "nvidia-smi failed"
    find /proc/driver/nvidia/gpus -name information -exec cat {} + 2>&1 \
        | sed 's/^/proc: /' || true
    find /dev -maxdepth 1 -name 'nvidia*' 2>&1 | sed 's/^/device file: /'
    "$PYTHON" - <<'EOF' 2>&1
import importlib.metadata as m
for name in ("torch", "numpy", "ml_dtypes", "urllib3", "cloudpickle", "psutil", "pytest",
             "pytest-timeout", "setuptools", "wheel", "triton", "nvidia-cuda-cupti",
             "cuda-bindings", "cuda-pathfinder", "nvidia-ml-py", "tornado", "apache-tvm-ffi",
             "cupti-python"):
    try:
        print(f"{name}: {m.version(name)}")
    except m.PackageNotFoundError:
        print(f"{name}: not installed")
try:
    import torch
    print("cuda available:", torch.cuda.is_available(), "devices:", torch.cuda.device_count())
except Exception as exc:
    print("torch failed:", exc)
EOF
} | tee "$OUT_DIR/environment.txt"

step "install (offline)"
install_rc=0
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    timeout "$INSTALL_SECONDS" "$PYTHON" -m pip install --quiet --no-index --no-deps \
        --no-compile --no-cache-dir "$WHEELS"/*.whl || install_rc=$?
else
    echo "no wheels in $WHEELS: run benchmarks/fetch_gpu_wheels.sh here and carry .gpu-wheels"
    install_rc=3
fi
project_rc=0
timeout "$INSTALL_SECONDS" "$PYTHON" -m pip install --quiet --no-index --no-deps \
    --no-build-isolation --no-cache-dir -e . || project_rc=$?
if [ "$project_rc" -ne 0 ]; then
    # no hatchling, editables or hatch-jupyter-builder to build with offline: the import
    # names point into the checkout instead
    echo "editable install failed ($project_rc); using the checkout through PYTHONPATH"
    mkdir -p "$SCRATCH/site"
    ln -s "$ROOT/kcoral" "$SCRATCH/site/kcoral"
    ln -s "$ROOT/server/kcoral_server" "$SCRATCH/site/kcoral_server"
    ln -s "$ROOT/jupyter_ext/kcoral_jupyter" "$SCRATCH/site/kcoral_jupyter"
    export PYTHONPATH="$SCRATCH/site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PYTHON" - <<'EOF' 2>&1 | tee -a "$OUT_DIR/environment.txt"
import importlib
for module in ("kcoral", "kcoral_server", "tornado", "tvm_ffi", "cupti.cupti"):
    try:
        importlib.import_module(module)
        print(f"import {module}: ok")
    except Exception as exc:
        print(f"import {module}: {type(exc).__name__}: {exc}")
try:
    import cupti.cupti as cupti
    print("CUPTI loads: timestamp", cupti.get_timestamp())
except Exception as exc:
    print(f"CUPTI does not load: {type(exc).__name__}: {exc}")
try:  # the sandbox's device files by identity (SERVER §14), read on real hardware
    from kcoral_server.gpu.device_nodes import system_gpu_table
    print("gpu table:", system_gpu_table())
except Exception as exc:
    print(f"gpu table failed: {type(exc).__name__}: {exc}")
EOF

step "pytest tests/gpu (the GPU suite)"
timeout "$PYTEST_SECONDS" "$PYTHON" -m pytest tests/gpu -m "not slow" -p no:cacheprovider \
    -rs -v --timeout 300 --basetemp "$SCRATCH/pytest" --junitxml "$OUT_DIR/pytest-gpu.xml"
pytest_rc=$?

step "benchmarks/gpu_check.py"
timeout "$CHECK_SECONDS" "$PYTHON" benchmarks/gpu_check.py --tool-timeout 30 \
    --json "$OUT_DIR/gpu_check.json" --markdown "$OUT_DIR/gpu_check.md"
check_rc=$?

step "benchmarks/back_to_back_cores.py (issue 31, CPU mode)"
all_cpus=$("$PYTHON" -c 'import os; print(len(os.sched_getaffinity(0)))')
cores_configuration=default
command -v bwrap >/dev/null || cores_configuration=sandbox-none
timeout "$CORES_SECONDS" "$PYTHON" benchmarks/back_to_back_cores.py --cpus "$all_cpus,2" \
    --requests 90 --configuration "$cores_configuration" \
    | tee "$OUT_DIR/back_to_back_cores.md"
cores_rc=${PIPESTATUS[0]}

step "logs and summary"
(cd "$SCRATCH" && find . -name 'server.stderr' -o -name 'events.jsonl' | head -200 \
    | tar -czf "$OUT_DIR/server-logs.tar.gz" -T - 2>/dev/null) || true
{
    echo "wheels install: $install_rc"
    echo "project install: $project_rc"
    echo "pytest tests/gpu: $pytest_rc (124 = stopped at ${PYTEST_SECONDS} s)"
    echo "gpu_check.py: $check_rc (124 = stopped at ${CHECK_SECONDS} s)"
    echo "back_to_back_cores.py: $cores_rc (124 = stopped at ${CORES_SECONDS} s)"
} | tee "$OUT_DIR/summary.txt"
rm -rf "$SCRATCH"
status=0
[ "$pytest_rc" -eq 0 ] && [ "$check_rc" -eq 0 ] || status=1
exec >&- 2>&-
wait  # for tee to write the end of run.log
exit "$status"

#!/bin/sh
# Create the private interpreter that perf.py runs its Ray peer row in (benchmarks/.ray-venv).
#
# Ray is a benchmark peer, not a project dependency: it pins its own grpcio/protobuf, which
# the router needs at other versions, so it never goes into the project's .venv.
#
#     sh benchmarks/setup_ray.sh [VENV_DIR]      (default: benchmarks/.ray-venv)
#
# Uses $PYTHON (default python3) as the base interpreter and pip's ordinary index settings.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:-"$here/.ray-venv"}
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check ray
"$venv/bin/python" -c "import ray; print('ray', ray.__version__, 'in', '$venv')"

#!/usr/bin/env bash
# Builds the JupyterLab extension into ../jupyter_ext/labextension (committed, so that
# `pip install .` needs no node). Needs node, `npm ci` done here, and the Python package
# jupyterlab (for `jupyter labextension build`). The output folder is rebuilt from scratch
# so files of an older build never linger.
set -euo pipefail
cd "$(dirname "$0")"
out=../jupyter_ext/labextension
rm -rf lib tsconfig.tsbuildinfo "$out"
npx tsc -p tsconfig.json
jupyter labextension build .
cp install.json "$out/install.json"

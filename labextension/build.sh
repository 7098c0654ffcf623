#!/usr/bin/env bash
# Builds the JupyterLab extension into ../jupyter_ext/labextension (committed, so that
# `pip install .` needs no node). Needs node, `npm ci` done here, and the Python package
# jupyterlab (for `jupyter labextension build`).
#
# Webpack derives some module ids from absolute paths, so the build runs in one fixed
# staging folder: the committed assets then do not depend on where the repository is
# checked out (CI rebuilds in a fresh clone and compares). The output folder is replaced
# as a whole, so files of an older build never linger.
set -euo pipefail
cd "$(dirname "$0")"
here=$(pwd)
out=$(cd .. && pwd)/jupyter_ext/labextension
stage=${KCORAL_LABEXTENSION_STAGE:-/tmp/kcoral-labextension-build}
rm -rf "$stage"
mkdir -p "$stage/labextension"
cp -a package.json package-lock.json tsconfig.json install.json schema src style node_modules \
  "$stage/labextension/"
cd "$stage/labextension"
npx tsc -p tsconfig.json
jupyter labextension build .
rm -rf "$out"
cp -a "$stage/jupyter_ext/labextension" "$out"
cp "$here/install.json" "$out/install.json"
rm -rf "$stage"

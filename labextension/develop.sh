#!/usr/bin/env bash
# After `pip install -e .`: link the committed prebuilt extension into this environment's
# share/jupyter/labextensions in place of the copy the install put there (the wheel's
# shared-data), so that `npm run build` shows up in JupyterLab without reinstalling.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
prefix="$("$python" -c 'import sys; print(sys.prefix)')"
target="$prefix/share/jupyter/labextensions/kcoral-jupyterlab"
mkdir -p "$(dirname "$target")"
rm -rf "$target"
ln -s "$here/jupyter_ext/labextension" "$target"
echo "linked $target -> $here/jupyter_ext/labextension"

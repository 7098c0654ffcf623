#!/usr/bin/env bash
# After `pip install -e .`: link the committed prebuilt extension into this environment's
# share/jupyter/labextensions (what `pip install .` installs as data files). Needed because
# setuptools' editable wheels skip `data-files` (its editable_wheel asks the distribution
# for `has_data`, which does not exist, so install_data never runs).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
prefix="$("$python" -c 'import sys; print(sys.prefix)')"
target="$prefix/share/jupyter/labextensions/kcoral-jupyterlab"
mkdir -p "$(dirname "$target")"
rm -rf "$target"
ln -s "$here/jupyter_ext/labextension" "$target"
echo "linked $target -> $here/jupyter_ext/labextension"

#!/usr/bin/env bash
# CI check: rebuild the extension from the committed sources and lock file and fail when
# the result differs from the committed assets in ../jupyter_ext/labextension.
set -euo pipefail
cd "$(dirname "$0")"
out=../jupyter_ext/labextension
saved=$(mktemp -d)
trap 'rm -rf "$saved"' EXIT
if [ ! -d "$out" ]; then
  echo "check-built: $out is missing; run 'npm run build' in labextension/ and commit it" >&2
  exit 1
fi
cp -a "$out" "$saved/committed"
npm ci --no-audit --no-fund
bash build.sh
if ! diff -r "$saved/committed" "$out"; then
  echo "check-built: the committed labextension assets differ from a fresh build;" \
    "run 'npm run build' in labextension/ and commit jupyter_ext/labextension" >&2
  exit 1
fi
echo "check-built: the committed labextension assets match a fresh build"

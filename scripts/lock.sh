#!/usr/bin/env bash
# Rewrites constraints.txt from the packages of the set-up venv ($PYTHON): every distribution but
# torch (scripts/setup.sh pins or reuses it) and rmsnorm itself, at its installed version.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
header=$(sed -n '/^#/p' constraints.txt)
tmp=$(mktemp constraints.txt.XXXXXX)
trap 'rm -f "$tmp"' EXIT
{
  printf '%s\n' "$header"
  "$PY" -m pip --disable-pip-version-check list --format=freeze --exclude-editable \
    | grep -v -i -E '^(torch|rmsnorm)==' | grep ' @ ' -v | LC_ALL=C sort -f
} >"$tmp"
mv "$tmp" constraints.txt
trap - EXIT
echo "lock: wrote constraints.txt ($(grep -c '==' constraints.txt) packages)"

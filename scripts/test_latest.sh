#!/usr/bin/env bash
# make test-latest: the integration tests against the newest releases the package's ranges admit
# (transformers, kernels and the rest), in their own venv, without the lock. Writes to $OUT:
# drift.txt (each locked package whose newest release differs from constraints.txt) and, for a
# transformers version with no golden list yet, its list (hf_classes-transformers-<version>.txt).
# Exits with the tests' status: a new release that breaks a patched class fails here first.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV_LATEST:-.venv-latest}
OUT=${OUT:-latest}
PY=${PYTHON:-python3}

PYTHON=$PY VENV=$VENV CONSTRAINTS= bash scripts/setup.sh
pin=$(mktemp)
trap 'rm -f "$pin"' EXIT
# Upgrade everything but torch (a newer torch here would be a multi-GB CUDA download).
"$VENV/bin/python" -c 'import torch; print("torch==" + torch.__version__.split("+")[0])' >"$pin"
"$VENV/bin/python" -m pip --disable-pip-version-check install -q -U --upgrade-strategy eager \
  -c "$pin" -e ".[all,dev]"
mkdir -p "$OUT"
"$VENV/bin/python" - "$OUT/drift.txt" <<'PY'
import re, subprocess, sys
locked = {}
for line in open("constraints.txt"):
    m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line)
    if m:
        locked[m[1].lower().replace("_", "-")] = m[2]
frozen = subprocess.run(
    [sys.executable, "-m", "pip", "list", "--format=freeze", "--exclude-editable"],
    capture_output=True, text=True, check=True,
).stdout
now = {}
for line in frozen.splitlines():
    name, _, version = line.partition("==")
    now[name.lower().replace("_", "-")] = version
moved = [
    f"{name}: {locked[name]} -> {now.get(name, 'not installed')}"
    for name in sorted(locked) if now.get(name) != locked[name]
]
text = "\n".join(moved) if moved else "no locked package moved"
with open(sys.argv[1], "w") as f:
    f.write(text + "\n")
print(f"test-latest: {len(moved)} locked package(s) moved since constraints.txt")
print(text)
PY
RMSNORM_GOLDEN_OUT="$PWD/$OUT" "$VENV/bin/python" -m pytest tests/integrations -n 2 \
  --dist worksteal --timeout 900 -q

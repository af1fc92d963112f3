#!/usr/bin/env bash
# Create the separate virtualenv the MLServer interoperability test uses (.venv-mlserver).
#
# MLServer pins its own dependency versions, so it lives apart from the project's .venv.
# MLServer 1.7.1's inference-pool workers crash with uvloop >= 0.22: pin uvloop 0.21.0.
# The test model is a tiny pure-Python MLServer runtime shipped in tests/fixtures/mlserver
# (no weights to download), so scikit-learn and friends are not needed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MLSERVER_VENV:-$here/.venv-mlserver}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3
if [[ -x "$venv/bin/mlserver" ]]; then
  echo "mlserver env already at $venv"; exit 0
fi
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet "mlserver==1.7.1" "uvloop==0.21.0"
"$venv/bin/mlserver" --version
echo "mlserver env ready at $venv"

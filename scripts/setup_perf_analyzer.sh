#!/usr/bin/env bash
# Create the separate virtualenv that holds Triton's perf_analyzer (.venv-perf).
#
# perf_analyzer 2.41 ships as a binary inside the tritonclient==2.41.0 wheel (its data
# files: pip installs it as the venv's bin/perf_analyzer). It lives apart from the project's .venv so that the
# project's own tritonclient version is not disturbed. On Debian 12 the binary also needs
# libb64 (Debian's libb64-0d) and libcudart.so.12, which the nvidia-cuda-runtime-cu12 wheel
# provides; bench/perf_analyzer.py points LD_LIBRARY_PATH at that wheel's lib folder.
# Idempotent: a second run only checks that the binary starts.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${PERF_VENV:-$here/.venv-perf}"
python="${PYTHON:-python3}"

if ! ldconfig -p | grep -q 'libb64\.so\.0d'; then
  if command -v apt-get >/dev/null; then
    sudo=""; [[ "$(id -u)" == 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq libb64-0d
  else
    echo "libb64 (libb64.so.0d) is missing and apt-get is not available: install it" >&2
    exit 1
  fi
fi

if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
fi
if ! "$venv/bin/python" -c 'import tritonclient, nvidia.cuda_runtime' 2>/dev/null; then
  "$venv/bin/pip" install --quiet "tritonclient[all]==2.41.0" "nvidia-cuda-runtime-cu12"
fi

site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
pa="$venv/bin/perf_analyzer"
export LD_LIBRARY_PATH="$site/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$pa" --version >/dev/null 2>&1 || "$pa" --help >/dev/null 2>&1 || {
  echo "perf_analyzer at $pa does not start; missing libraries:" >&2
  ldd "$pa" | grep 'not found' >&2 || true
  exit 1
}
echo "perf_analyzer ready: $pa"

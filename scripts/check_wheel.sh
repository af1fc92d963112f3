#!/usr/bin/env bash
# The package works outside the checkout: build the wheel from a clean clone, install it in a
# fresh virtualenv (core install, no extras), then, from an empty directory, run
# `evenserve up examples/cluster-seed.yaml`, send one inference through the gateway and stop
# the cluster with SIGINT. Exit code 0 when every step worked.
#
#   bash scripts/check_wheel.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

git clone -q "$ROOT" "$TMP/src"
"$PYTHON" -m venv "$TMP/build-venv"
"$TMP/build-venv/bin/pip" -q --disable-pip-version-check install build
"$TMP/build-venv/bin/python" -m build -q --wheel --outdir "$TMP/dist" "$TMP/src" >/dev/null
WHEEL="$(ls "$TMP"/dist/*.whl)"
echo "built $(basename "$WHEEL")"

"$PYTHON" -m venv "$TMP/venv"
"$TMP/venv/bin/pip" -q --disable-pip-version-check install "$WHEEL"
echo "installed: $("$TMP/venv/bin/evenserve" --version)"

mkdir "$TMP/elsewhere"
cd "$TMP/elsewhere"
"$TMP/venv/bin/evenserve" up "$TMP/src/examples/cluster-seed.yaml" \
  --log-dir "$TMP/logs" --ready-file "$TMP/ready.json" >"$TMP/up.log" 2>&1 &
UP=$!
for _ in $(seq 1 120); do
  [ -f "$TMP/ready.json" ] && break
  kill -0 "$UP" 2>/dev/null || { cat "$TMP/up.log"; echo "evenserve up exited"; exit 1; }
  sleep 0.5
done
[ -f "$TMP/ready.json" ] || { cat "$TMP/up.log"; echo "evenserve up did not get ready"; exit 1; }

"$TMP/venv/bin/python" - "$TMP/ready.json" <<'EOF'
import json, sys, urllib.request
url = json.load(open(sys.argv[1]))["gateway"]["url"]
ones = [1] * 128
body = json.dumps({"inputs": [
    {"name": "input_ids", "datatype": "INT64", "shape": [1, 128], "data": ones},
    {"name": "attention_mask", "datatype": "INT64", "shape": [1, 128], "data": ones},
]}).encode()
req = urllib.request.Request(f"{url}/v2/models/bert-base/infer", data=body,
                             headers={"content-type": "application/json"})
with urllib.request.urlopen(req, timeout=10) as r:
    out = json.loads(r.read())["outputs"][0]
    print(f"gateway {url}: POST bert-base/infer -> {r.status}, backend "
          f"{r.headers['x-evenserve-backend']}, output {out['name']} {out['shape']}")
EOF

kill -INT "$UP"
wait "$UP"
echo "evenserve up stopped with exit code 0 from $TMP/elsewhere (outside the checkout)"

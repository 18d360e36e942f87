#!/usr/bin/env bash
# Wheels for the lent GPU machine, which has no network and no virtualenv: its python3 (3.12)
# holds torch, grpcio and protobuf of its own, at versions this checkout does not pick.
#
#   scripts/device_wheels.sh [DEST]      (default .whl; DEVICE_PYTHON_VERSION, default 3.12)
#
# DEST/gpu      FlashInfer for bench/gpu_check.py (0.6.18 takes fp8 MLA scales and has the
#               trtllm-gen MLA entry points)
# DEST/control  the control plane (server, audit store, client) at the versions this checkout's
#               .venv runs: the generated code in cgsvc/v1 refuses an older protobuf or grpcio
#               runtime, so the machine's own are shadowed, not used. psycopg is left out (no
#               PostgreSQL there); what the image already has (numpy, scipy, prometheus-client,
#               typing-extensions) is not carried; uvloop is, for the server's default loop.
#
# bench/device_run.sh installs and uses them there. Carry DEST with the run (`carry: [".whl"]`).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
PYVER=${DEVICE_PYTHON_VERSION:-3.12}
PY=${PY:-.venv/bin/python}
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
CONTROL=(grpcio grpcio-health-checking grpcio-reflection grpcio-status googleapis-common-protos protobuf
         sqlalchemy structlog cryptography cffi pycparser uvloop)
GPU=(flashinfer-python==0.6.18.post1 apache-tvm-ffi==0.1.15.post2)

pins=()
for name in "${CONTROL[@]}"; do
  pins+=("$name==$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
done
rm -rf "$DEST/control" "$DEST/gpu"
mkdir -p "$DEST/control" "$DEST/gpu"
echo "control plane for Python $PYVER: ${pins[*]}" >&2
"$PY" -m pip download -q --no-deps --only-binary :all: --python-version "$PYVER" "${PLATFORMS[@]}" \
  -d "$DEST/control" "${pins[@]}"
echo "GPU kernels for Python $PYVER: ${GPU[*]}" >&2
"$PY" -m pip download -q --no-deps --only-binary :all: --python-version "$PYVER" "${PLATFORMS[@]}" \
  -d "$DEST/gpu" "${GPU[@]}"
du -sh "$DEST/control" "$DEST/gpu" >&2

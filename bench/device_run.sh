#!/usr/bin/env bash
# The whole device check, as one prepared command for the lent GPU machine (16 cores, one H200,
# no network, no virtualenv; its python3 holds torch):
#
#   bash bench/device_run.sh OUT [SECONDS]     (SECONDS: the call's limit, default 600;
#                                                LOAD_SECONDS: each load row's seconds, default 5)
#
# with the wheels of scripts/device_wheels.sh carried as .whl. In order:
#
#   1. the durable path on more cores: bench/resolve_load.py on SQLite at 8 and 32 callers (the
#      trust issue's target; on two shared cores the 8-caller row is CPU-bound), ~80 s;
#   2. bench/gpu_check.py (the worker's GPU paths) with the time that is left, less a margin.
#
# Writes OUT/machine.txt, OUT/resolve_load.md and OUT/gpu-check/; a part that fails says so in
# OUT/summary.txt and the next part still runs. Without .whl (or on a machine whose python3 has
# the packages) it uses what python3 has.
set -uo pipefail
OUT=${1:?usage: bench/device_run.sh OUT [SECONDS]}
LIMIT=${2:-600}
cd "$(dirname "$0")/.."
start=$(date +%s)
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=$(mktemp -d)
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }

{ echo "cores: $(nproc)"; "$PY" --version; nvidia-smi -L 2>&1 || true; } > "$OUT/machine.txt" 2>&1

for set in control gpu; do
  if compgen -G ".whl/$set/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE/$set" .whl/$set/*.whl \
      || summary "installing .whl/$set failed"
  fi
done
[ -d "$SITE/control" ] || mkdir -p "$SITE/control"
[ -d "$SITE/gpu" ] || mkdir -p "$SITE/gpu"

# 1. The control plane's packages first on the path: cgsvc/v1 needs this checkout's protobuf and grpcio.
PYTHONPATH="$SITE/control:$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 240 "$PY" bench/resolve_load.py --backends sqlite \
  --seconds "${LOAD_SECONDS:-5}" --concurrency 8,32 > "$OUT/resolve_load.md" 2> "$OUT/resolve_load.err"
rc=$?
summary "resolve_load: rc=$rc ($(tail -1 "$OUT/resolve_load.md" 2>/dev/null))"

# 2. The GPU paths, with what is left of the limit less a minute for the transfers.
left=$(( LIMIT - ($(date +%s) - start) - 60 ))
if [ "$left" -lt 60 ]; then
  summary "gpu_check: skipped, ${left}s left"
  exit 0
fi
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc > /dev/null; then
  CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
  export CUDA_HOME
fi
# (service_launch starts a server and a client with the control plane's packages: CGSVC_CONTROL_SITE)
CGSVC_CONTROL_SITE="$SITE/control" PYTHONPATH="$SITE/gpu${PYTHONPATH:+:$PYTHONPATH}" timeout $(( left + 30 )) \
  "$PY" bench/gpu_check.py \
  --out "$OUT/gpu-check" --budget "$left" > "$OUT/gpu_check.log" 2>&1
summary "gpu_check: rc=$? (budget ${left}s; $OUT/gpu-check/gpu_check.md)"

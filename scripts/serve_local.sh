#!/usr/bin/env bash
# Start the four stage services (BentoML, ports 3001-3004) and the gRPC orchestrator (port 50051) on this
# machine, on CPU, and wait until the orchestrator reports SERVING. Ctrl-C (or SIGTERM) stops everything.
#
#   scripts/serve_local.sh                      # synthetic backends (no weights needed)
#   NEGT2I_BACKEND=rfdetr-seg-xl ... scripts/serve_local.sh   # or per stage: NEGT2I_DETECTOR_BACKEND=...
#   NEGT2I_DETECTOR_URL=http://127.0.0.1:9000 scripts/serve_local.sh   # an external detector: not started here
#
# A stage whose NEGT2I_<STAGE>_URL is set is not started: the orchestrator is pointed at that URL. Stages and
# orchestrator get the same NEGT2I_RULES (default current), so the constants the stages apply match.
# Environment: NEGT2I_BACKEND (all stages, default synthetic), NEGT2I_<STAGE>_BACKEND, NEGT2I_DEVICE (default cpu),
# NEGT2I_PORT_BASE (default 3000: stages on +1..+4), NEGT2I_PORT (orchestrator, default 50051), NEGT2I_LOG_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BENTOML=${BENTOML:-.venv/bin/bentoml}
base=${NEGT2I_PORT_BASE:-3000}
port=${NEGT2I_PORT:-50051}
logs=${NEGT2I_LOG_DIR:-$(mktemp -d -t negt2i-serve-XXXX)}
mkdir -p "$logs"
export NEGT2I_DEVICE=${NEGT2I_DEVICE:-cpu} NEGT2I_GPUS=${NEGT2I_GPUS:-0} BENTOML_DO_NOT_TRACK=true
export NEGT2I_RULES=${NEGT2I_RULES:-current}
stages=(detector segmenter attributes depth)
classes=(Detector Segmenter Attributes Depth)
pids=()
cleanup() {
    trap - EXIT INT TERM
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM
for i in 0 1 2 3; do
    stage=${stages[$i]}
    url_var="NEGT2I_${stage^^}_URL"
    if [ -n "${!url_var:-}" ]; then  # given: an external service (e.g. a swapped detector); not started here
        echo "$stage: external at ${!url_var}"
        continue
    fi
    var="NEGT2I_${stage^^}_BACKEND"
    export "$var=${!var:-${NEGT2I_BACKEND:-synthetic}}"
    stage_port=$((base + i + 1))
    # each service gets its own BentoML home: BentoML keeps (and wipes at start) its Prometheus files there
    BENTOML_HOME="$logs/bentoml-$stage" "$BENTOML" serve "services.$stage.service:${classes[$i]}" \
        --host 127.0.0.1 --port "$stage_port" >"$logs/$stage.log" 2>&1 &
    pids+=($!)
    export "NEGT2I_${stage^^}_URL=http://127.0.0.1:$stage_port"
    echo "$stage: ${!var} on http://127.0.0.1:$stage_port (log $logs/$stage.log)"
done
"$PY" -m orchestrator --host 127.0.0.1 --port "$port" >"$logs/orchestrator.log" 2>&1 &
pids+=($!)
echo "orchestrator: 127.0.0.1:$port (log $logs/orchestrator.log)"
for _ in $(seq 1 240); do
    if "$PY" - "$port" <<'PYEOF' 2>/dev/null; then break; fi
import sys
from negt2i.client import EvaluatorClient
with EvaluatorClient(f"127.0.0.1:{sys.argv[1]}") as c:
    sys.exit(0 if c.health() == "SERVING" else 1)
PYEOF
    for pid in "${pids[@]}"; do
        kill -0 "$pid" 2>/dev/null || { echo "a service exited; see $logs" >&2; exit 1; }
    done
    sleep 0.5
done
echo "SERVING: negt2i submit IMAGES --orchestrator 127.0.0.1:$port --out results.jsonl"
wait

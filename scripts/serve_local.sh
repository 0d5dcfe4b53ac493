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
# `scripts/serve_local.sh --help` lists the variables (usage below).
usage() {
    cat <<'EOF'
usage: scripts/serve_local.sh [--help]

Starts the four stage services (BentoML) and the gRPC orchestrator on 127.0.0.1, on CPU, and waits until the
orchestrator reports SERVING; Ctrl-C (or SIGTERM) stops everything. Settings, all from the environment:

  NEGT2I_BACKEND          backend of every stage (default synthetic: no weights needed)
  NEGT2I_<STAGE>_BACKEND  one stage's backend (STAGE: DETECTOR, SEGMENTER, ATTRIBUTES, DEPTH)
  NEGT2I_<STAGE>_URL      an external stage service at this URL: not started here, the orchestrator uses it
  NEGT2I_DEVICE           device of the stage backends (default cpu)
  NEGT2I_RULES            rule constants of stages and orchestrator (default current; or previous, or a file)
  NEGT2I_PORT_BASE        stage ports are PORT_BASE+1..+4 (default 3000: 3001-3004)
  NEGT2I_PORT             orchestrator port (default 50051)
  NEGT2I_LOG_DIR          log folder (default a new temporary folder)
  NEGT2I_SERVE_TIMEOUT    seconds to wait for SERVING before giving up (default 120)
  PYTHON, BENTOML         interpreter and bentoml command (default .venv/bin/python, .venv/bin/bentoml)

Every port must be free on 127.0.0.1; a busy one is named and nothing is started. BentoML also binds a few
ports of its own (chosen by the system) per service.
EOF
}
case "${1:-}" in
    -h | --help)
        usage
        exit 0
        ;;
    "") ;;
    *)
        usage >&2
        exit 2
        ;;
esac
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
timeout=${NEGT2I_SERVE_TIMEOUT:-120}
stages=(detector segmenter attributes depth)
classes=(Detector Segmenter Attributes Depth)

# Every port we will bind, checked before anything starts: a busy one is named with the variable that moves it.
port_busy() {
    "$PY" - "$1" <<'PYEOF'
import socket
import sys

with socket.socket() as s:
    try:
        s.bind(("127.0.0.1", int(sys.argv[1])))
    except OSError:
        sys.exit(0)
sys.exit(1)
PYEOF
}
wanted=("$port:orchestrator (NEGT2I_PORT)")
for i in 0 1 2 3; do
    url_var="NEGT2I_${stages[$i]^^}_URL"
    [ -n "${!url_var:-}" ] || wanted+=("$((base + i + 1)):${stages[$i]} (NEGT2I_PORT_BASE=$base + $((i + 1)))")
done
for entry in "${wanted[@]}"; do
    if port_busy "${entry%%:*}"; then
        echo "error: port ${entry%%:*} for the ${entry#*:} is already in use on 127.0.0.1; set NEGT2I_PORT_BASE" \
            "and NEGT2I_PORT to free ports (scripts/serve_local.sh --help)" >&2
        exit 1
    fi
done
pids=()
names=()  # names[j] started as pids[j]
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
    names+=("$stage")
    export "NEGT2I_${stage^^}_URL=http://127.0.0.1:$stage_port"
    echo "$stage: ${!var} on http://127.0.0.1:$stage_port (log $logs/$stage.log)"
done
"$PY" -m orchestrator --host 127.0.0.1 --port "$port" >"$logs/orchestrator.log" 2>&1 &
pids+=($!)
names+=(orchestrator)
echo "orchestrator: 127.0.0.1:$port (log $logs/orchestrator.log)"
serving=0
said=""
deadline=$((SECONDS + timeout))
while [ $SECONDS -lt $deadline ]; do
    # the status, and what the orchestrator says about each stage (health details: refused / down, and why)
    if now=$("$PY" -c '
import sys
from negt2i.client import EvaluatorClient
with EvaluatorClient(f"127.0.0.1:{sys.argv[1]}") as c:
    status, details = c.health_details()
print("; ".join(f"the {stage} is {text}" for stage, text in details.items()))
sys.exit(0 if status == "SERVING" else 1)
' "$port" 2>/dev/null); then
        said=$now
        serving=1
        break
    fi
    if [ -n "$now" ]; then
        said=$now  # the last thing the orchestrator said (it may stop answering)
    fi
    for j in "${!pids[@]}"; do
        if ! kill -0 "${pids[$j]}" 2>/dev/null; then
            echo "error: the ${names[$j]} exited; the end of $logs/${names[$j]}.log:" >&2
            tail -n 5 "$logs/${names[$j]}.log" >&2 || true
            exit 1
        fi
    done
    sleep 0.5
done
if [ "$serving" != 1 ]; then
    echo "error: the orchestrator on 127.0.0.1:$port did not report SERVING within $timeout s" \
        "(NEGT2I_SERVE_TIMEOUT)${said:+: $said}; logs in $logs" >&2
    exit 1
fi
[ -n "$said" ] && echo "warning: $said" >&2
echo "SERVING: negt2i submit IMAGES --orchestrator 127.0.0.1:$port --out results.jsonl"
wait

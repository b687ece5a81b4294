#!/usr/bin/env bash
# Multi-host Flower deployment with TLS and SuperNode authentication, checked end to end.
#
#   scripts/flower_deploy.sh [--loopback]
#
# Hosts: a SuperLink, an operator (runs `flwr`) and one host per SuperNode, each in its
# own network namespace (ip netns) on a private bridge 10.213.0.0/24 that nothing outside
# this machine can reach. Where namespaces cannot be created (not root, no iproute2) or with
# --loopback, the same checks run on 127.0.0.1 (said in one line).
#
# Checks (the script exits 1 at the first that fails, naming it):
#  1. TLS + auth: certificates (`fedclust flower certs`), SuperNode keys
#     (`fedclust flower keys`), keys registered with `flwr supernode register`;
#  2. a SuperNode whose key is not registered is refused and the runs are unaffected;
#  3. run A (k-FED): the result is bit-identical to the in-process `fedclust run`;
#  4. run C (k-FED, one device's replies tampered on its host): the reply is rejected by
#     name and the run completes with the others;
#  5. run B (distributed Lloyd, secure aggregation): a SuperNode killed in the middle of a
#     secure round is named failed and the run completes; the other rounds' sums are
#     unmasked; a failed run would end `fedclust flower run` with exit status 1.
# Every process is started here and killed by PID on exit, namespaces deleted.
# Env: FEDCLUST_BIN (folder with fedclust, flwr, flower-*; default .venv-flower/bin),
#      KEEP=1 keeps the work folder, DEPLOY_TIMEOUT (seconds per run, default 400).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=${1:-netns}
BIN=${FEDCLUST_BIN:-$ROOT/.venv-flower/bin}
[ -x "$BIN/flower-superlink" ] || { echo "no flower-superlink in $BIN: make .venv-flower (see docs/flower.md)" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fedclust-deploy.XXXXXX")
export PATH="$BIN:$PATH" FLWR_HOME="$WORK/flwr-home"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
mkdir -p "$FLWR_HOME"
N=3                      # SuperNodes with registered keys (one per device)
TAG="fc$$"               # namespace prefix, unique per run
PIDS=()
NAMESPACES=()
T0=$(date +%s)

source "$ROOT/scripts/flower_procs.sh"   # descendants, stop_pids
cleanup() {
    local rc=$? ns
    [ "${#PIDS[@]}" -gt 0 ] && stop_pids "${PIDS[@]}"
    for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    if [ "${KEEP:-0}" = 1 ] || [ "$rc" != 0 ]; then echo "work folder kept: $WORK" >&2; else rm -rf "$WORK"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "FAILED: $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# ---------------------------------------------------------------- hosts
ON=()  # ON[host] = command prefix that runs on that host
setup_netns() {
    local hosts=(br link op) i h
    for ((i = 0; i <= N; i++)); do hosts+=("n$i"); done
    for h in "${hosts[@]}"; do ip netns add "$TAG$h" 2>/dev/null || return 1; NAMESPACES+=("$TAG$h"); done
    ip netns exec "${TAG}br" ip link add br0 type bridge || return 1
    ip netns exec "${TAG}br" ip link set br0 up || return 1
    local k=0 ip
    for h in link op $(for ((i = 0; i <= N; i++)); do echo "n$i"; done); do
        k=$((k + 1))
        case $h in link) ip=10.213.0.1;; op) ip=10.213.0.2;; *) ip=10.213.0.$((10 + ${h#n}));; esac
        ip link add eth0 netns "$TAG$h" type veth peer name "p$k" netns "${TAG}br" || return 1
        ip netns exec "${TAG}br" ip link set "p$k" master br0 up || return 1
        ip netns exec "$TAG$h" ip addr add "$ip/24" dev eth0 || return 1
        ip netns exec "$TAG$h" ip link set eth0 up || return 1
        ip netns exec "$TAG$h" ip link set lo up || return 1
    done
}
if [ "$MODE" != "--loopback" ] && [ "$(id -u)" = 0 ] && command -v ip >/dev/null && setup_netns 2>"$WORK/netns.err"; then
    LINK_IP=10.213.0.1; LINK_PORT=8000; BIND=0.0.0.0
    on() { local h=$1; shift; ip netns exec "$TAG$h" "$@"; }
    node_port() { echo 9094; }
    echo "== hosts: SuperLink 10.213.0.1, operator 10.213.0.2, SuperNodes 10.213.0.10-$((10 + N)) (network namespaces $TAG*)"
else
    for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null || true; done; NAMESPACES=()
    why=$( [ "$MODE" = "--loopback" ] && echo "--loopback given" || (head -1 "$WORK/netns.err" 2>/dev/null || true) )
    echo "network namespaces unavailable (${why:-not root or no iproute2}): running the same checks on loopback 127.0.0.1"
    LINK_IP=127.0.0.1; LINK_PORT=$(free_port); BIND=127.0.0.1
    on() { shift; "$@"; }
    node_port() { free_port; }
fi

# ---------------------------------------------------------------- files
echo "== certificates, keys, data, apps, in-process references"
fedclust flower certs "$WORK/certs" --host "$LINK_IP" --loopback > /dev/null
fedclust flower keys "$WORK/keys" --nodes $((N + 1)) > /dev/null   # node-$N: never registered
fedclust flower split "$ROOT/scripts/flower_loopback.toml" --out "$WORK/data" > /dev/null
fedclust flower app "$WORK/appA" --config "$ROOT/scripts/flower_loopback.toml" --no-wheel \
    --result-dir "$WORK/resA" --no-faults > /dev/null
fedclust flower app "$WORK/appB" --config "$ROOT/scripts/flower_deploy_lloyd.toml" --no-wheel \
    --result-dir "$WORK/resB" --round-timeout 60 --no-faults > /dev/null
# run C loses one of 3 devices (2 local centers each): ask for 4 clusters, not 6
sed '/^\[algorithm\]/,/^\[/ s/^n_clusters = 6/n_clusters = 4/' "$ROOT/scripts/flower_loopback.toml" \
    > "$WORK/kfed4.toml"
fedclust flower app "$WORK/appC" --config "$WORK/kfed4.toml" --no-wheel \
    --result-dir "$WORK/resC" --no-faults > /dev/null
cat > "$WORK/appC/fedclust_app/apps.py" <<PY
"""Test app: device 1's host rewrites its replies (NaN centers) before they leave."""
import numpy as np
from fedclust.flower.apps import make_client_app, make_server_app


def _tamper(device_id, round_index, arrays):
    if device_id != 1:
        return arrays
    return {k: (np.full_like(v, np.nan) if v.dtype.kind == "f" else v) for k, v in arrays.items()}


server_app = make_server_app(result_root="$WORK/resC")
client_app = make_client_app(tamper=_tamper)
PY
fedclust run "$ROOT/scripts/flower_loopback.toml" --out "$WORK/refA" --no-plot > /dev/null
DEVICES=("$WORK"/data/dev-*.npz)
[ "${#DEVICES[@]}" = "$N" ] || fail "expected $N device files, got ${#DEVICES[@]}"

cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "federation"

[superlink.federation]
address = "$LINK_IP:$LINK_PORT"
root-certificates = "$WORK/certs/ca.crt"
TOML

# ---------------------------------------------------------------- SuperLink
echo "== SuperLink with TLS and SuperNode authentication on $LINK_IP:$LINK_PORT"
on link flower-superlink --ssl-ca-certfile "$WORK/certs/ca.crt" --ssl-certfile "$WORK/certs/server.pem" \
    --ssl-keyfile "$WORK/certs/server.key" --enable-supernode-auth \
    --disable-runtime-dependency-installation --host "$BIND" --port "$LINK_PORT" \
    > "$WORK/superlink.log" 2>&1 &
PIDS+=($!)
LINK_PID=$!
for i in $(seq 1 120); do
    on op flwr supernode ls federation > /dev/null 2>&1 && break
    kill -0 "$LINK_PID" 2>/dev/null || { tail -20 "$WORK/superlink.log" >&2; fail "the SuperLink died"; }
    [ "$i" = 120 ] && fail "the SuperLink did not answer over TLS within 60 s"
    sleep 0.5
done

for ((i = 0; i < N; i++)); do
    on op flwr supernode register "$WORK/keys/node-$i.pub" federation > "$WORK/register-$i.log" 2>&1 \
        || { cat "$WORK/register-$i.log" >&2; fail "registering node-$i.pub"; }
done
echo "   $N SuperNode public keys registered"

# ---------------------------------------------------------------- SuperNodes
declare -A NODE_PID
for ((i = 0; i < N; i++)); do
    on "n$i" flower-supernode --superlink "$LINK_IP:$LINK_PORT" --root-certificates "$WORK/certs/ca.crt" \
        --auth-supernode-private-key "$WORK/keys/node-$i" --port "$(node_port)" \
        --node-config "data-path='${DEVICES[$i]}'" > "$WORK/supernode-$i.log" 2>&1 &
    PIDS+=($!)
    NODE_PID[$i]=$!
done
echo "== intruder: a SuperNode whose key is not registered"
on "n$N" flower-supernode --superlink "$LINK_IP:$LINK_PORT" --root-certificates "$WORK/certs/ca.crt" \
    --auth-supernode-private-key "$WORK/keys/node-$N" --port "$(node_port)" --max-retries 2 \
    --node-config "data-path='${DEVICES[0]}'" > "$WORK/intruder.log" 2>&1 &
INTRUDER=$!
PIDS+=($INTRUDER)

run_app() {  # run_app NAME: fedclust flower run in the operator's host; exit status kept
    local rc=0
    on op timeout "${DEPLOY_TIMEOUT:-400}" fedclust flower run "$WORK/app$1" federation \
        > "$WORK/run-$1.log" 2>&1 || rc=$?
    return $rc
}

echo "== run A: k-FED over TLS, checked against the in-process run"
run_app A || { tail -20 "$WORK/run-A.log" >&2; fail "run A: fedclust flower run exited non-zero"; }
fedclust flower result "$WORK/resA" --compare "$WORK/refA/result.json" | sed 's/^/   /' \
    || fail "run A: centers differ from the in-process run"

for i in $(seq 1 60); do kill -0 "$INTRUDER" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$INTRUDER" 2>/dev/null; then fail "the unregistered SuperNode is still running"; fi
grep -q "Failed to activate SuperNode\|Exit Code: 305" "$WORK/intruder.log" \
    || { tail -20 "$WORK/intruder.log" >&2; fail "the unregistered SuperNode did not report its refusal"; }
LISTED=$(on op flwr supernode ls federation --format json 2>/dev/null | python3 -c \
    'import json,sys; t=sys.stdin.read(); print(len(json.loads(t[t.index("{"):])["nodes"]))' || echo "?")
[ "$LISTED" = "$N" ] || fail "the SuperLink lists $LISTED SuperNodes, expected the $N registered"
echo "   unregistered SuperNode refused (Flower exit code 305); the SuperLink lists only the $N registered"

echo "== run C: device 1's host tampers with its reply"
run_app C || { tail -20 "$WORK/run-C.log" >&2; fail "run C: fedclust flower run exited non-zero"; }
python3 - "$WORK/resC" <<'PY' || fail "run C: the tampered reply was not rejected by name"
import json, sys
log = json.load(open(sys.argv[1] + "/result.json"))["run_log"]
why = log["rejected"].get("1", "")
assert "device 1" in why and "finite" in why, log
assert log["participants"] == [0, 2], log
print(f"   rejected: {why}")
PY

echo "== run B: distributed Lloyd with secure aggregation; SuperNode 2 killed mid-round"
run_app B &
RUN_B=$!
KILLED=""
for i in $(seq 1 1200); do
    if grep -q "round 2 (lloyd) secure stage 'share'" "$WORK/run-B.log" 2>/dev/null; then
        stop_pids "${NODE_PID[2]}" >/dev/null 2>&1 || true
        KILLED=$(grep -o "round 2 (lloyd) secure stage 'share'.*" "$WORK/run-B.log" | head -1)
        break
    fi
    kill -0 "$RUN_B" 2>/dev/null || break
    sleep 0.2
done
wait "$RUN_B" || { tail -30 "$WORK/run-B.log" >&2; fail "run B: fedclust flower run exited non-zero"; }
[ -n "$KILLED" ] || fail "run B: never saw round 2's share stage to kill SuperNode 2 in"
echo "   killed SuperNode 2 after: $KILLED"
python3 - "$WORK/resB" <<'PY' || fail "run B: the killed SuperNode is not named or the run did not complete"
import json, sys
res = json.load(open(sys.argv[1] + "/result.json"))
log = res["run_log"]
assert "2" in log["failed"] and "final message" not in log["failed"]["2"], log
assert log["participants"] == [0, 1], log
print(f"   failed: {log['failed']['2']}; run completed with devices {log['participants']}")
PY
grep -E "secure stage 'unmask'" "$WORK/run-B.log" | tail -1 | sed 's/^.*fedclust:/   fedclust:/'
echo "deployment checks passed in $(( $(date +%s) - T0 )) s"
echo "OK"

#!/usr/bin/env bash
# Recovery of a Flower deployment (TLS, SuperNode authentication, SuperLink with --database),
# checked end to end on 127.0.0.1.
#
#   scripts/flower_recovery.sh
#
# Checks (exit 1 at the first that fails, naming it; what Flower does is printed):
#  1. ServerApp killed after its checkpoint of round 3: `fedclust flower run --resume` continues
#     after round 3 (the SuperNodes keep their state in a state-dir); result identical to the
#     in-process `fedclust run`, ledger without a lost release (the kill came at a round boundary
#     or inside a round: printed);
#  2. SuperLink killed and restarted on the same --database, SuperNode 0 killed with it: whether
#     the SuperNodes reconnect by themselves is measured and printed; those that do not are
#     restarted; then `--resume`: result identical (node 0 is back, its device takes part);
#  3. a SuperNode killed and restarted in the middle of a run: the run completes and the device
#     takes part again (it rejoins at a later round, or the restarted node answered the round in
#     flight); its node ids and the round it rejoined at are printed.
# Every SuperNode runs under a supervisor that starts it again when it exits, as docs/flower.md
# asks of a deployment; after each check the exits it saw are printed (with Flower's exit status).
# Env: FEDCLUST_BIN (folder with fedclust, flwr, flower-*; default .venv-flower/bin),
#      KEEP=1 keeps the work folder, DEPLOY_TIMEOUT (seconds per run, default 900).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${FEDCLUST_BIN:-$ROOT/.venv-flower/bin}
[ -x "$BIN/flower-superlink" ] || { echo "no flower-superlink in $BIN: make .venv-flower (see docs/flower.md)" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fedclust-recovery.XXXXXX")
export PATH="$BIN:$PATH" FLWR_HOME="$WORK/flwr-home" PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
mkdir -p "$FLWR_HOME"
N=3
PIDS=()
T0=$(date +%s)

source "$ROOT/scripts/flower_procs.sh"   # descendants, stop_pids
cleanup() {
    local rc=$?
    local i
    for i in "${!NODE_PID[@]}"; do stop_node "$i"; done
    [ "${#PIDS[@]}" -gt 0 ] && stop_pids "${PIDS[@]}"
    if [ "${KEEP:-0}" = 1 ] || [ "$rc" != 0 ]; then echo "work folder kept: $WORK" >&2; else rm -rf "$WORK"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "FAILED: $*" >&2; diagnose >&2; exit 1; }
diagnose() {  # after a failure: what each SuperNode did last, and what the ServerApps named
    local i f
    for ((i = 0; i < N; i++)); do
        f="$WORK/supernode-$i.log"; [ -f "$f" ] || continue
        echo "-- SuperNode $i ($(pgrep -P "${NODE_PID[$i]:-0}" > /dev/null && echo running || echo "not running"); exit statuses: $( (cat "$WORK/supernode-$i.exits" 2>/dev/null || true) | tr '\n' ' ')), the end of its log:"
        sed 's/\x1b\[[0-9;]*m//g' "$f" | grep -av '^[A-Z]*:\s*$' | tail -n 8 | cut -c1-160
    done
    echo "-- the ServerApps' warnings:"
    sed 's/\x1b\[[0-9;]*m//g' "$WORK"/run-*.log 2>/dev/null | grep -a "WARN\|ERROR" | tail -n 8 | cut -c1-200
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
LINK_IP=127.0.0.1; LINK_PORT=$(free_port)

echo "== certificates, keys, data, apps, the in-process reference"
fedclust flower certs "$WORK/certs" --host "$LINK_IP" > /dev/null
fedclust flower keys "$WORK/keys" --nodes $N > /dev/null
fedclust flower split "$ROOT/scripts/flower_recovery.toml" --out "$WORK/data" > /dev/null
for a in A B C; do
    fedclust flower app "$WORK/app$a" --config "$ROOT/scripts/flower_recovery.toml" --no-wheel \
        --result-dir "$WORK/res$a" --round-timeout 180 --no-faults > /dev/null
done
fedclust run "$ROOT/scripts/flower_recovery.toml" --out "$WORK/ref" --no-plot > /dev/null
DEVICES=("$WORK"/data/dev-*.npz)
[ "${#DEVICES[@]}" = "$N" ] || fail "expected $N device files, got ${#DEVICES[@]}"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "federation"

[superlink.federation]
address = "$LINK_IP:$LINK_PORT"
root-certificates = "$WORK/certs/ca.crt"
TOML

start_superlink() {
    flower-superlink --ssl-ca-certfile "$WORK/certs/ca.crt" --ssl-certfile "$WORK/certs/server.pem" \
        --ssl-keyfile "$WORK/certs/server.key" --enable-supernode-auth --database "$WORK/superlink.db" \
        --disable-runtime-dependency-installation --host "$LINK_IP" --port "$LINK_PORT" \
        >> "$WORK/superlink.log" 2>&1 &
    LINK_PID=$!
    PIDS+=($LINK_PID)
    local i
    for i in $(seq 1 120); do
        flwr supernode ls federation > /dev/null 2>&1 && return 0
        kill -0 "$LINK_PID" 2>/dev/null || { tail -20 "$WORK/superlink.log" >&2; fail "the SuperLink died"; }
        sleep 0.5
    done
    fail "the SuperLink did not answer over TLS within 60 s"
}
declare -A NODE_PID
start_node() {  # SuperNode $1 under a supervisor that starts it again whenever it exits
    # (docs/flower.md asks for one: systemd Restart=always, a container restart policy).
    # The run is checked against the in-process run with the same noise seed: these nodes'
    # owners allow a server-chosen seed (a real private deployment must not).
    (
        while :; do
            flower-supernode --superlink "$LINK_IP:$LINK_PORT" --root-certificates "$WORK/certs/ca.crt" \
                --auth-supernode-private-key "$WORK/keys/node-$1" --port "$(free_port)" \
                --node-config "data-path='${DEVICES[$1]}' policy-allow-noise-seed=true state-dir='$WORK/state-$1'" \
                >> "$WORK/supernode-$1.log" 2>&1 && rc=0 || rc=$?
            echo "$rc" >> "$WORK/supernode-$1.exits"
            sleep 1
        done
    ) &
    NODE_PID[$1]=$!
    PIDS+=($!)
    disown "$!"   # stopped on purpose: no job report from this shell
}
stop_node() {  # the supervisor first (so it starts nothing again), then SuperNode $1 itself
    local below; below=$(descendants "${NODE_PID[$1]}")
    kill -KILL "${NODE_PID[$1]}" 2>/dev/null || true
    [ -z "$below" ] || stop_pids $below
}
node_exits() {  # SuperNodes that exited since the last call and were started again
    local i n said=""
    for ((i = 0; i < N; i++)); do
        n=$( (cat "$WORK/supernode-$i.exits" 2>/dev/null || true) | wc -l)
        [ "$n" -gt "${EXITS_SEEN[$i]:-0}" ] && said="$said node $i: $((n - ${EXITS_SEEN[$i]:-0})) (exit statuses $(tail -n +$((${EXITS_SEEN[$i]:-0} + 1)) "$WORK/supernode-$i.exits" | tr '\n' ' ' | sed 's/ $//'));"
        EXITS_SEEN[$i]=$n
    done
    echo "   SuperNodes that exited and the supervisor started again:${said:- none}"
}
declare -A EXITS_SEEN
online() {  # how many SuperNodes the SuperLink lists as online
    flwr supernode ls federation --format json 2>/dev/null | "$BIN/python" -c '
import json, sys
t = sys.stdin.read()
try:
    nodes = json.loads(t[t.index("{"):])["nodes"]
except ValueError:
    print(0); sys.exit()
print(sum(1 for n in nodes if str(n.get("status", "")).lower() == "online"))' || echo 0
}
rounds_done() {  # rounds in the checkpoint of result folder $1 (0: none yet)
    "$BIN/python" -c 'import sys
from fedclust.core.checkpoint import load_checkpoint
s = load_checkpoint(sys.argv[1])
print(0 if s is None else s[0]["rounds"])' "$1/checkpoint" 2>/dev/null || echo 0
}
wait_rounds() {  # wait_rounds RESULT_DIR N RUN_PID
    local i
    for i in $(seq 1 2400); do
        [ "$(rounds_done "$1")" -ge "$2" ] && return 0
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.25
    done
    return 1
}
run_bg() {  # run_bg NAME [--resume]: fedclust flower run in the background, PID in RUN_PID
    timeout "${DEPLOY_TIMEOUT:-900}" fedclust flower run "$WORK/app$1" federation "${@:2}" \
        >> "$WORK/run-$1.log" 2>&1 &
    RUN_PID=$!
    PIDS+=($RUN_PID)
}
compare() {  # compare NAME: the result of app NAME against the in-process run
    fedclust flower result "$WORK/res$1" --compare "$WORK/ref/result.json" | sed 's/^/   /' \
        || fail "run $1: centers differ from the in-process run"
}
ledger() {
    "$BIN/python" - "$WORK/res$1/result.json" <<'PY'
import json, sys
led = json.load(open(sys.argv[1]))["run_log"].get("privacy_ledger", {})
lost = [e["round"] for e in led.get("lost_releases", [])]
print(f"   ledger: {led.get('rounds_released')} rounds released, lost releases {lost or 'none'}, "
      f"epsilon {led.get('epsilon_spent')}")
PY
}

echo "== SuperLink (TLS, SuperNode authentication, --database) on $LINK_IP:$LINK_PORT; $N SuperNodes"
start_superlink
for ((i = 0; i < N; i++)); do
    flwr supernode register "$WORK/keys/node-$i.pub" federation > "$WORK/register-$i.log" 2>&1 \
        || { cat "$WORK/register-$i.log" >&2; fail "registering node-$i.pub"; }
    start_node "$i"
done

echo "== 1. the ServerApp killed after round 3, then fedclust flower run --resume"
run_bg A
wait_rounds "$WORK/resA" 3 "$RUN_PID" || { tail -20 "$WORK/run-A.log" >&2; fail "run A never reached round 3"; }
SERVERAPP=""
for p in $(descendants "$LINK_PID"); do
    grep -q "flwr-serverapp" "/proc/$p/cmdline" 2>/dev/null && SERVERAPP="$SERVERAPP $p"
done
[ -n "$SERVERAPP" ] || fail "no flwr-serverapp process under the SuperLink"
kill -KILL $SERVERAPP
echo "   killed the ServerApp process (PID$SERVERAPP) with $(rounds_done "$WORK/resA") rounds checkpointed"
rc=0; for i in $(seq 1 240); do kill -0 "$RUN_PID" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$RUN_PID" 2>/dev/null; then
    echo "   flwr run still streaming 120 s after the ServerApp died: stopped"; stop_pids "$RUN_PID"
else
    wait "$RUN_PID" || rc=$?
    echo "   fedclust flower run exited $rc: $(grep -a 'fedclust: error' "$WORK/run-A.log" | tail -1)"
fi
run_bg A --resume
wait "$RUN_PID" || { tail -30 "$WORK/run-A.log" >&2; fail "run A: the resumed run did not complete"; }
compare A
ledger A
node_exits
STATE_FILES=$(ls "$WORK"/state-*/fedclust-state-*.npz 2>/dev/null | wc -l)
echo "   node state files (state-dir): $STATE_FILES"
[ "$STATE_FILES" -ge "$N" ] || fail "run A: the SuperNodes wrote no state file in their state-dir"

echo "== 2. the SuperLink killed after round 3 and restarted on its database"
run_bg B
wait_rounds "$WORK/resB" 3 "$RUN_PID" || { tail -20 "$WORK/run-B.log" >&2; fail "run B never reached round 3"; }
stop_pids "$LINK_PID"
echo "   SuperLink stopped with $(rounds_done "$WORK/resB") rounds checkpointed"
KILLED=$(pgrep -P "${NODE_PID[0]}" || true)   # the flower-supernode under node 0's supervisor
[ -n "$KILLED" ] || fail "SuperNode 0 is not running"
kill -KILL $KILLED
echo "   SuperNode 0 killed too (SIGKILL: no clean shutdown); its supervisor starts it again"
stop_pids "$RUN_PID" > /dev/null 2>&1 || true
start_superlink
T1=$(date +%s); ON=0
for i in $(seq 1 120); do ON=$(online); [ "$ON" = "$N" ] && break; sleep 0.5; done
echo "   after the restart: $ON of $N SuperNodes online within $(( $(date +%s) - T1 )) s"
node_exits
if [ "$ON" != "$N" ]; then
    for ((i = 0; i < N; i++)); do stop_node "$i" > /dev/null 2>&1 || true; start_node "$i"; done
    for i in $(seq 1 120); do ON=$(online); [ "$ON" = "$N" ] && break; sleep 0.5; done
    echo "   SuperNodes restarted (supervised restart): $ON of $N online"
fi
run_bg B --resume
wait "$RUN_PID" || { tail -30 "$WORK/run-B.log" >&2; fail "run B: the resumed run did not complete"; }
compare B
ledger B
node_exits

echo "== 3. SuperNode 1 killed after round 3 and restarted"
run_bg C
wait_rounds "$WORK/resC" 3 "$RUN_PID" || { tail -20 "$WORK/run-C.log" >&2; fail "run C never reached round 3"; }
stop_node 1
start_node 1
echo "   SuperNode 1 restarted at round $(rounds_done "$WORK/resC")"
wait "$RUN_PID" || { tail -30 "$WORK/run-C.log" >&2; fail "run C did not complete"; }
"$BIN/python" - "$WORK/resC" <<'PY' || fail "run C: device 1 did not take part again"
import json, sys
meta = json.load(open(sys.argv[1] + "/result.json"))
log, extra = meta["run_log"], meta["extra"]
print(f"   run completed; participants {log['participants']}; failed {log['failed'] or 'none'}")
for e in extra.get("rejoined", []):
    same = "kept its node id" if e['node'] == e.get('previous_node') else "a new node id"
    print(f"   device {e['device']} rejoined at round {e['round']} on node {e['node']} "
          f"(before: node {e.get('previous_node')}: {same} under node authentication; "
          f"missed: {e['missed']})")
print(f"   device 1 on node {extra['nodes'].get('1')} at the end")
sys.exit(0 if 1 in log["participants"] and "1" not in log["failed"] else 1)
PY
node_exits
echo "recovery checks passed in $(( $(date +%s) - T0 )) s"
echo "OK"

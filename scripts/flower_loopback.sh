#!/usr/bin/env bash
# Loopback deployment of a fedclust protocol on Flower (TLS + SuperNode authentication),
# checked against the in-process run.
#
#   scripts/flower_loopback.sh [CONFIG.toml]      (default: scripts/flower_loopback.toml, 3 devices)
#
# 1. `fedclust flower split`  -> one data file per device
#    `fedclust flower app`    -> a Flower app (pyproject.toml + fedclust_app/apps.py)
#    `fedclust run`           -> the in-process reference result.json
#    `fedclust flower certs` / `keys` -> CA + SuperLink certificate, SuperNode key pairs
# 2. flower-superlink with TLS and --enable-supernode-auth on 127.0.0.1 (free port), polled
#    on /health over TLS; each SuperNode's public key registered (`flwr supernode register`);
#    one flower-supernode per device (--root-certificates, --auth-supernode-private-key,
#    own port, node config data-path=...)
# 3. fedclust flower run APP loopback  (`flwr run --stream`; exit 1 unless the run completed)
# 4. `fedclust flower result RESULT --compare inprocess/result.json`: exit 1 unless the
#    cluster centers are bit-identical.
# Every process is started here and killed by PID on exit (trap), children included.
# Env: FEDCLUST_BIN (folder with fedclust, flwr, flower-*; default .venv-flower/bin),
#      KEEP=1 keeps the work folder, LOOPBACK_TIMEOUT (seconds for `flwr run`, default 300).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONFIG=$(realpath "${1:-$ROOT/scripts/flower_loopback.toml}")
BIN=${FEDCLUST_BIN:-$ROOT/.venv-flower/bin}
[ -x "$BIN/flower-superlink" ] || { echo "no flower-superlink in $BIN: make .venv-flower (see docs/flower.md)" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fedclust-loopback.XXXXXX")
export PATH="$BIN:$PATH" FLWR_HOME="$WORK/flwr-home" RAY_TMPDIR="$WORK/ray"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
mkdir -p "$FLWR_HOME" "$RAY_TMPDIR"
PIDS=()

source "$ROOT/scripts/flower_procs.sh"   # descendants, stop_pids
cleanup() {
    local rc=$? all=() pid i
    for pid in "${PIDS[@]}"; do all+=($(descendants "$pid") "$pid"); done
    for pid in "${all[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for i in $(seq 1 40); do  # SuperNodes take ~10 s to exit after SIGTERM
        alive=0
        for pid in "${all[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.5
    done
    for pid in "${all[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    if [ "${KEEP:-0}" = 1 ] || [ "$rc" != 0 ]; then echo "work folder kept: $WORK" >&2; else rm -rf "$WORK"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
now() { python3 -c 'import time; print(time.time())'; }
T_START=$(now)

echo "== preparing ($CONFIG)"
fedclust flower split "$CONFIG" --out "$WORK/data" > "$WORK/split.txt"
fedclust flower app "$WORK/app" --config "$CONFIG" --result-dir "$WORK/result" --no-wheel > /dev/null
fedclust flower certs "$WORK/certs" --host 127.0.0.1 --loopback > /dev/null
fedclust run "$CONFIG" --out "$WORK/inprocess" --no-plot > "$WORK/inprocess.txt"
DEVICES=("$WORK"/data/dev-*.npz)
fedclust flower keys "$WORK/keys" --nodes "${#DEVICES[@]}" > /dev/null
echo "   ${#DEVICES[@]} devices, app in $WORK/app"

LINK_PORT=$(free_port)
echo "== SuperLink on 127.0.0.1:$LINK_PORT (TLS, SuperNode authentication)"
flower-superlink --ssl-ca-certfile "$WORK/certs/ca.crt" --ssl-certfile "$WORK/certs/server.pem" \
    --ssl-keyfile "$WORK/certs/server.key" --enable-supernode-auth \
    --disable-runtime-dependency-installation --host 127.0.0.1 --port "$LINK_PORT" \
    > "$WORK/superlink.log" 2>&1 &
PIDS+=($!)
for i in $(seq 1 60); do
    python3 - "$LINK_PORT" "$WORK/certs/ca.crt" <<'PY' && break
import ssl, sys, urllib.request
try:
    urllib.request.urlopen(f"https://127.0.0.1:{sys.argv[1]}/health", timeout=1,
                           context=ssl.create_default_context(cafile=sys.argv[2]))
except Exception:
    sys.exit(1)
PY
    kill -0 "${PIDS[0]}" 2>/dev/null || { echo "SuperLink died:" >&2; tail -20 "$WORK/superlink.log" >&2; exit 1; }
    sleep 0.5
done

cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "loopback"

[superlink.loopback]
address = "127.0.0.1:$LINK_PORT"
root-certificates = "$WORK/certs/ca.crt"
TOML

echo "== ${#DEVICES[@]} SuperNodes (keys registered with the SuperLink)"
i=0
for f in "${DEVICES[@]}"; do
    id=$(basename "$f" .npz); id=${id#dev-}
    flwr supernode register "$WORK/keys/node-$i.pub" loopback > "$WORK/register-$i.log" 2>&1 || {
        echo "registering node-$i.pub failed:" >&2; cat "$WORK/register-$i.log" >&2; exit 1; }
    port=$(free_port)
    flower-supernode --superlink "127.0.0.1:$LINK_PORT" --root-certificates "$WORK/certs/ca.crt" \
        --auth-supernode-private-key "$WORK/keys/node-$i" --host 127.0.0.1 --port "$port" \
        --node-config "data-path='$f'" > "$WORK/supernode-$id.log" 2>&1 &
    PIDS+=($!)
    i=$((i + 1))
done

echo "== fedclust flower run"
T_RUN=$(now)
timeout "${LOOPBACK_TIMEOUT:-300}" fedclust flower run "$WORK/app" loopback > "$WORK/flwr-run.log" 2>&1 || {
    echo "fedclust flower run failed or timed out:" >&2; tail -30 "$WORK/flwr-run.log" >&2; exit 1; }
T_END=$(now)
grep -E "fedclust:" "$WORK/flwr-run.log" | sed 's/^/   /' || true

echo "== check against the in-process run"
fedclust flower result "$WORK/result" --compare "$WORK/inprocess/result.json"
python3 - "$T_START" "$T_RUN" "$T_END" "$WORK/result/result.json" <<'PY'
import json, sys
t0, t_run, t_end = map(float, sys.argv[1:4])
extra = json.load(open(sys.argv[4]))["extra"]["time_s"]
print(f"loopback deployment: flwr run {t_end - t_run:.1f} s (ServerApp {extra['total']:.1f} s: "
      f"waiting for nodes {extra['hello']:.1f} s, protocol {extra['rounds']:.1f} s); "
      f"whole script so far {t_end - t0:.1f} s")
PY
echo "OK"

# Process helpers shared by the Flower deployment checks (sourced, not run).
descendants() { local c; for c in $(pgrep -P "$1" 2>/dev/null || true); do descendants "$c"; echo "$c"; done; }
stop_pids() {  # TERM, wait up to 20 s, KILL: the given PIDs and everything below them
    local all=() pid i alive
    for pid in "$@"; do all+=($(descendants "$pid") "$pid"); done
    for pid in "${all[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for i in $(seq 1 40); do
        alive=0; for pid in "${all[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break; sleep 0.5
    done
    for pid in "${all[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

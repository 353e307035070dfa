# Sourced by the GPU scripts: `step NAME LIMIT_S COMMAND...` runs COMMAND with a time limit,
# its output in $S/NAME.log, then prints its exit status, its time and the log's last $TAIL lines.
step() {
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$S/$name.log" 2>&1
    echo "== $name: exit $? in $((SECONDS - t0)) s"; grep -v "FLA Backend" "$S/$name.log" | tail -${TAIL:-12}
}

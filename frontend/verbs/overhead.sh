#!/bin/sh
# The overhead of the libibverbs-compatible library (issue 14), in ONE run on ONE simulated
# host: Debian's unmodified perftest through `vrdma-exec` (libvrdma_verbs.so preloaded)
# against `vrdma-perf` (the vrdma API directly), the same two guests, the same sizes,
# iterations and TX depth, alternating, REPS times:
#
#   ib_send_lat -s 64   t_typical ÷ vrdma-perf send_lat --size 64      t_typical  (target ≤ 1.05)
#   ib_write_bw -s 65536 BW average ÷ vrdma-perf write_bw --size 65536 BW average (target ≥ 0.95)
#
#   frontend/verbs/overhead.sh
#
# Environment:
#   BIN      where the binaries are (default target/release; build them with
#            `cargo build --release -p vrdma-backend -p xen-platform -p vrdma-perf -p vrdma-verbs`)
#   POLL     busy (default: both perftest and vrdma-perf busy-poll, perftest's own way) or
#            yield (vrdma-perf --yield-poll, and the library yields the CPU after an empty
#            ibv_poll_cq: VRDMA_VERBS_POLL_YIELD=1 — for machines with fewer cores than
#            spinning threads)
#   SPIN_US  the backend's spin-before-sleep-us (default: the backend's)
#   LAT_ITERS, BW_ITERS, REPS   (default 2000, 20000, 5)
# It prints each run's figures, then the median ratio of the REPS pairs. Everything it starts
# is stopped and its directory removed at the end.
set -eu

BIN=${BIN:-target/release}
POLL=${POLL:-busy}
LAT_ITERS=${LAT_ITERS:-2000}
BW_ITERS=${BW_ITERS:-20000}
REPS=${REPS:-5}
for b in vrdma-simhost vrdma-backend vrdmactl vrdma-perf vrdma-exec libvrdma_verbs.so; do
    [ -e "$BIN/$b" ] || { echo "overhead.sh: no $BIN/$b (see the build line in $0)" >&2; exit 2; }
done
for t in ib_send_lat ib_write_bw; do
    command -v "$t" >/dev/null || { echo "overhead.sh: no $t: apt-get install perftest" >&2; exit 2; }
done
case "$POLL" in
    busy) PERF_POLL=""; export VRDMA_VERBS_POLL_YIELD=0 ;;
    yield) PERF_POLL="--yield-poll"; export VRDMA_VERBS_POLL_YIELD=1 ;;
    *) echo "overhead.sh: POLL is busy or yield" >&2; exit 2 ;;
esac
T=$(mktemp -d /tmp/vrdma-ovh-XXXXXX)
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; done
    for p in $PIDS; do wait "$p" 2>/dev/null || true; done
    rm -rf "$T"
}
trap cleanup EXIT INT TERM

H=$T/host
"$BIN/vrdma-simhost" serve --dir "$H" >"$T/simhost.log" 2>&1 &
PIDS="$PIDS $!"
i=0
until [ -S "$H/control.sock" ]; do
    i=$((i + 1)); [ $i -lt 200 ] || { echo "the host did not start" >&2; cat "$T/simhost.log" >&2; exit 1; }
    sleep 0.05
done
{
    echo 'address = ["127.0.0.1"]'
    [ -z "${SPIN_US:-}" ] || echo "spin-before-sleep-us = $SPIN_US"
} >"$T/backend.toml"
VRDMA_SIM=$H "$BIN/vrdma-backend" --config "$T/backend.toml" >"$T/backend.log" 2>&1 &
PIDS="$PIDS $!"
guest() {
    dom=$(VRDMA_SIM=$H "$BIN/vrdma-simhost" domain create --name "$1")
    i=0
    until VRDMA_SIM=$H "$BIN/vrdmactl" attach "$dom" >/dev/null 2>"$T/attach.err"; do
        i=$((i + 1)); [ $i -lt 100 ] || { cat "$T/attach.err" "$T/backend.log" >&2; exit 1; }
        sleep 0.1
    done
    echo "$dom"
}
D1=$(guest server)
D2=$(guest client)

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
listening() { # port
    hex=$(printf ':%04X' "$1")
    awk -v p="$hex" 'NR > 1 && substr($2, length($2) - 4) == p && $4 == "0A" { f = 1 } END { exit !f }' /proc/net/tcp /proc/net/tcp6
}
# The field $2 of the result row of size $1 in file $3.
field() {
    awk -v s="$1" -v f="$2" '$1 == s && $2 ~ /^[0-9]+$/ { v = $f } END { if (v == "") exit 1; print v }' "$3"
}

# Stops a server this script started (perf and tool run in command substitutions: their
# servers are not in PIDS, so a failing run must stop its own; the simulated host's gate
# process does not pass the signal on: the whole tree, children first).
stop() {
    for c in $(ps -o pid= --ppid "$1" 2>/dev/null || true); do stop "$c"; done
    kill "$1" 2>/dev/null || true
}

# vrdma-perf TEST SIZE ITERS -> its result file
perf() {
    out=$T/perf-$1-$r.out
    # A fresh file per run: the server's redirection happens in the child, after this shell
    # may already have read an old file's port.
    so=$T/perf-srv-$1-$r.out
    VRDMA_SIM=$H "$BIN/vrdma-simhost" run "$D1" -- \
        "$BIN/vrdma-perf" "$1" --port 0 $PERF_POLL >"$so" 2>"$T/perf-srv.err" &
    srv=$!
    i=0
    until port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$so" 2>/dev/null) && [ -n "$port" ]; do
        i=$((i + 1)); [ $i -lt 300 ] || { echo "vrdma-perf server did not start" >&2; cat "$T/perf-srv.err" >&2; stop "$srv"; exit 1; }
        sleep 0.05
    done
    VRDMA_SIM=$H "$BIN/vrdma-simhost" run "$D2" -- \
        "$BIN/vrdma-perf" "$1" 127.0.0.1 --port "$port" --size "$2" --iters "$3" --tx-depth 128 $PERF_POLL >"$out" 2>"$T/perf-cli.err" \
        || { echo "vrdma-perf $1 client failed" >&2; cat "$out" "$T/perf-cli.err" "$T/perf-srv.err" >&2; stop "$srv"; exit 1; }
    wait "$srv" || { echo "vrdma-perf $1 server failed" >&2; cat "$T/perf-srv.err" >&2; exit 1; }
    echo "$out"
}

# perftest TOOL SIZE ITERS -> its result file (the client's)
tool() {
    out=$T/tool-$1-$r.out
    port=$(free_port)
    "$BIN/vrdma-exec" --sim "$H" --domain "$D1" -- \
        "$1" -p "$port" -s "$2" -n "$3" >"$T/tool-srv.out" 2>"$T/tool-srv.err" &
    srv=$!
    i=0
    until listening "$port"; do
        i=$((i + 1)); [ $i -lt 600 ] || { echo "$1 server did not listen" >&2; cat "$T/tool-srv.out" "$T/tool-srv.err" >&2; stop "$srv"; exit 1; }
        sleep 0.05
    done
    "$BIN/vrdma-exec" --sim "$H" --domain "$D2" -- \
        "$1" -p "$port" -s "$2" -n "$3" 127.0.0.1 >"$out" 2>"$T/tool-cli.err" \
        || { echo "$1 client failed" >&2; cat "$out" "$T/tool-cli.err" "$T/tool-srv.out" "$T/tool-srv.err" >&2; stop "$srv"; exit 1; }
    wait "$srv" || { echo "$1 server failed" >&2; cat "$T/tool-srv.out" "$T/tool-srv.err" >&2; exit 1; }
    echo "$out"
}

cores=$(nproc)
echo "# one simulated host, guests $D1 (server) and $D2 (client); polling: $POLL; backend spin-before-sleep-us: ${SPIN_US:-default}; $cores cores; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$POLL" = busy ]; then
    echo "# spinning threads: client 1 + server 1 (send_lat; write_bw: client only, the server is passive) + the backend engine while work flows"
else
    echo "# spinning threads: client and server poll but yield after every empty poll (write_bw: the server is passive); the backend engine spins ${SPIN_US:-its default} us after work, then sleeps in epoll"
fi
LAT=""
BW=""
r=1
while [ $r -le "$REPS" ]; do
    f=$(perf send_lat 64 "$LAT_ITERS"); pl=$(field 64 5 "$f")
    f=$(tool ib_send_lat 64 "$LAT_ITERS"); tl=$(field 64 5 "$f")
    f=$(perf write_bw 65536 "$BW_ITERS"); pb=$(field 65536 4 "$f")
    f=$(tool ib_write_bw 65536 "$BW_ITERS"); tb=$(field 65536 4 "$f")
    # A figure that is not a positive number (perftest prints `inf` when its cycle-counter
    # calibration failed, seen under heavy load) leaves that pair out of the median.
    ratio() { echo "$1 $2" | awk '$1 ~ /^[0-9.]+$/ && $2 ~ /^[0-9.]+$/ && $1 > 0 && $2 > 0 { printf "%.3f", $1 / $2; ok = 1 } END { if (!ok) print "invalid" }'; }
    rl=$(ratio "$tl" "$pl")
    rb=$(ratio "$tb" "$pb")
    echo "run $r: send_lat 64 B t_typical: ib_send_lat $tl us, vrdma-perf $pl us, ratio $rl | write_bw 64 KiB BW average: ib_write_bw $tb MB/s, vrdma-perf $pb MB/s, ratio $rb"
    [ "$rl" = invalid ] || LAT="$LAT $rl"
    [ "$rb" = invalid ] || BW="$BW $rb"
    r=$((r + 1))
done
median() { echo "$@" | tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "ib_send_lat 64 B / vrdma-perf send_lat 64 B (t_typical): median $(median $LAT) over $(echo $LAT | wc -w) valid runs of $REPS ($LAT ) target <= 1.05"
echo "ib_write_bw 64 KiB / vrdma-perf write_bw 64 KiB (BW average): median $(median $BW) over $(echo $BW | wc -w) valid runs of $REPS ($BW ) target >= 0.95"

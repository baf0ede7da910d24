#!/bin/sh
# vrdma-perf between guests of two simulated hosts, as a user runs it: two `vrdma-simhost`s,
# a `vrdma-backend` process on each (host A at 127.0.0.2, host B at 127.0.0.3), one guest
# domain per host with a vrdma device (`vrdmactl attach`), the server in host B's guest and
# the client in host A's, both with --cm (the QPs connect through the two backends'
# connection managers; the traffic is iWARP over TCP between the two addresses). The client's
# --baseline then measures raw TCP between the same two addresses in the same run.
#
#   frontend/perf/two-hosts.sh TEST [client options ...]
#   e.g. frontend/perf/two-hosts.sh write_bw --size 65536,1048576 --iters 2000 --baseline
#
# Both sides get the same polling flag when the client options carry one (--events,
# --yield-poll) and the same --mode. Environment:
#   BIN      where the binaries are (default target/release; build them with
#            `cargo build --release -p vrdma-backend -p xen-platform -p vrdma-perf --bins`)
#   SPIN_US  the backends' spin-before-sleep-us (default: the backend's, 200)
#   CRC      the backends' [cm] crc: offer (default), require or decline
# Everything it starts is stopped and its directory removed at the end; last, it prints the
# CPU time each backend process used (set-up included).
set -eu

[ $# -ge 1 ] || { sed -n '2,18p' "$0"; exit 2; }
TEST=$1
shift
BIN=${BIN:-target/release}
for b in vrdma-simhost vrdma-backend vrdmactl vrdma-perf; do
    [ -x "$BIN/$b" ] || { echo "two-hosts.sh: no $BIN/$b (see the build line in $0)" >&2; exit 2; }
done
T=$(mktemp -d /tmp/vrdma-2h-XXXXXX)
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; done
    for p in $PIDS; do wait "$p" 2>/dev/null || true; done
    rm -rf "$T"
}
trap cleanup EXIT INT TERM

# Server-side flags copied from the client's options.
SRV_FLAGS=""
prev=""
for a in "$@"; do
    case "$a" in
        --events|-e|--yield-poll|-y) SRV_FLAGS="$SRV_FLAGS $a" ;;
    esac
    case "$prev" in
        --mode|-m) SRV_FLAGS="$SRV_FLAGS --mode $a" ;;
    esac
    prev=$a
done

start_host() { # name address
    d=$T/$1
    mkdir -p "$d"
    "$BIN/vrdma-simhost" serve --dir "$d/host" >"$d/simhost.log" 2>&1 &
    PIDS="$PIDS $!"
    i=0
    until [ -S "$d/host/control.sock" ]; do
        i=$((i + 1)); [ $i -lt 200 ] || { echo "host $1 did not start" >&2; cat "$d/simhost.log" >&2; exit 1; }
        sleep 0.05
    done
    {
        echo "address = [\"$2\"]"
        [ -z "${SPIN_US:-}" ] || echo "spin-before-sleep-us = $SPIN_US"
        echo "[cm]"
        echo "crc = \"${CRC:-offer}\""
    } >"$d/backend.toml"
    VRDMA_SIM=$d/host "$BIN/vrdma-backend" --config "$d/backend.toml" >"$d/backend.log" 2>&1 &
    PIDS="$PIDS $!"
    BACKEND=$!
    dom=$(VRDMA_SIM=$d/host "$BIN/vrdma-simhost" domain create --name "guest-$1")
    i=0
    until VRDMA_SIM=$d/host "$BIN/vrdmactl" attach "$dom" >/dev/null 2>"$d/attach.err"; do
        i=$((i + 1)); [ $i -lt 100 ] || { cat "$d/attach.err" "$d/backend.log" >&2; exit 1; }
        sleep 0.1
    done
    DOM=$dom
}

# CPU seconds (user, system) a backend process has used so far.
cpu() {
    awk -v hz="$(getconf CLK_TCK)" '{ printf "user %.2f s, system %.2f s", $14 / hz, $15 / hz }' "/proc/$1/stat"
}

start_host a 127.0.0.2
DA=$DOM
BA=$BACKEND
start_host b 127.0.0.3
DB=$DOM
BB=$BACKEND
echo "# two simulated hosts: guest-a (domain $DA) on host A, backend 127.0.0.2; guest-b (domain $DB) on host B, backend 127.0.0.3; backends spin ${SPIN_US:-200} us after work, MPA CRC ${CRC:-offer}"

# shellcheck disable=SC2086
VRDMA_SIM=$T/b/host "$BIN/vrdma-simhost" run "$DB" -- \
    "$BIN/vrdma-perf" "$TEST" --cm --port 0 $SRV_FLAGS >"$T/server.out" 2>"$T/server.err" &
SRV=$!
PIDS="$PIDS $SRV"
i=0
until PORT=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$T/server.out") && [ -n "$PORT" ]; do
    i=$((i + 1)); [ $i -lt 300 ] || { echo "the server did not start" >&2; cat "$T/server.err" >&2; exit 1; }
    sleep 0.05
done
VRDMA_SIM=$T/a/host "$BIN/vrdma-simhost" run "$DA" -- \
    "$BIN/vrdma-perf" "$TEST" 127.0.0.3 --port "$PORT" --cm "$@"
wait "$SRV" || { echo "the server failed:" >&2; cat "$T/server.out" "$T/server.err" >&2; exit 1; }
grep '^# connected' "$T/server.out" | sed 's/$/  [server]/'
echo "# backend CPU over the whole run: host A $(cpu "$BA"); host B $(cpu "$BB")"

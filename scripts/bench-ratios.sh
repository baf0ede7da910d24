#!/usr/bin/env bash
# The latency ratios of the targets table (docs/benchmarks.md) in one command, over several runs:
#
#   scripts/bench-ratios.sh [RUNS]          # default 5
#
# Runs `cargo bench -p vrdma-backend --bench device` (post->CQE ÷ floor, WRITE 1 MiB ÷ memcpy)
# and `cargo bench -p vrdma --bench roundtrip` (the same round trip through the library and the
# real daemon; mediated ÷ bypass) RUNS times, alternating, with the load average (`uptime`'s,
# from /proc/loadavg) before each run. Each run measures its own floor (bench-support's
# cache-line ping-pong, docs/benchmarks.md "The floor"); each ratio is value median ÷ floor
# median of that run. At the end, per ratio: its spread over the runs (min, p25, median, p75,
# max) and the median value and floor.
#
# Environment: BENCHES (default "device roundtrip"), DEVICE_ARGS (criterion options for the
# device bench, e.g. "--warm-up-time 1 --measurement-time 3"). Full logs stay in
# target/bench-ratios/<UTC time>/.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-5}
benches=${BENCHES:-device roundtrip}
dir=target/bench-ratios/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$dir"

cargo_args() {
    if [ "$1" = device ]; then
        echo "-p vrdma-backend --bench device"
    elif [ "$1" = roundtrip ]; then
        echo "-p vrdma --bench roundtrip"
    else
        echo "bench-ratios: unknown bench '$1' (device, roundtrip)" >&2
        exit 2
    fi
}
# The load average, as `uptime` prints it (1, 5 and 15 minutes).
load() {
    local one five fifteen rest
    read -r one five fifteen rest </proc/loadavg
    echo "load average: $one, $five, $fifteen"
}
bench_args() {
    if [ "$1" = device ]; then echo "${DEVICE_ARGS:-}"; fi
}

echo "building (release) ..."
for b in $benches; do
    cargo_args "$b" >/dev/null
    # shellcheck disable=SC2046  # word splitting of the argument lists is intended
    cargo bench -q $(cargo_args "$b") --no-run
done
cargo build -q --release -p bench-support --bin bench-spread

i=1
while [ "$i" -le "$runs" ]; do
    for b in $benches; do
        log=$dir/$b-$i.log
        l=$(load)
        {
            echo "# $(date -u +%H:%M:%SZ) $l"
            echo "# cargo bench $(cargo_args "$b") -- $(bench_args "$b")"
        } >"$log"
        # shellcheck disable=SC2046
        cargo bench -q $(cargo_args "$b") -- $(bench_args "$b") >>"$log" 2>&1
        echo "run $i/$runs $b: $l"
        grep '^bench-ratio ' "$log" | sed 's/^/    /' || echo "    (no bench-ratio line: see $log)"
    done
    let i+=1
done

echo
echo "over $runs runs (logs: $dir); at the end: $(load)"
cat "$dir"/*.log | cargo run -q --release -p bench-support --bin bench-spread

#!/usr/bin/env bash
# Runs the cargo-fuzz targets one after the other, each for SECONDS (default 60), and prints
# per target: runs, coverage (libFuzzer's final `cov`/`ft`), corpus size and crashes.
# Fails if any target finds a crash (the reproducer is left in <crate>/fuzz/artifacts/<target>).
#
#   scripts/fuzz.sh                  # every target, 60 s each
#   scripts/fuzz.sh 600 wqe control  # named targets, 10 minutes each
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz --locked`).
# FUZZ_NICE=19 runs the fuzzers at that niceness.  The corpora grow in <crate>/fuzz/corpus/
# (not committed); the committed regressions in <crate>/fuzz/regressions/<target>/ are replayed
# first on every run.
set -euo pipefail
cd "$(dirname "$0")/.."

# crate-dir:target, in the order they run.
ALL=(
    shared-ring/fuzz:control
    shared-ring/fuzz:wqe
    shared-ring/fuzz:page_dir
    frontend/fuzz:hostile_backend
    xenstore-proto/fuzz:codec
    xenstore-proto/fuzz:server
    iwarp-proto/fuzz:iwarp
)

secs=${1:-60}
shift || true
selected=()
for entry in "${ALL[@]}"; do
    if [ $# -eq 0 ]; then
        selected+=("$entry")
        continue
    fi
    for want in "$@"; do
        [ "${entry#*:}" = "$want" ] && selected+=("$entry")
    done
done
[ ${#selected[@]} -gt 0 ] || { echo "fuzz.sh: no such target: $*" >&2; exit 2; }

nice_cmd=()
[ -n "${FUZZ_NICE:-}" ] && nice_cmd=(nice -n "$FUZZ_NICE")
log_dir=${FUZZ_LOG_DIR:-target/fuzz-logs}
mkdir -p "$log_dir"
summary=()
failed=0
for entry in "${selected[@]}"; do
    dir=${entry%:*}
    t=${entry#*:}
    log="$log_dir/$t.log"
    echo "--- fuzzing $t ($dir) for ${secs}s, log in $log"
    mkdir -p "$dir/corpus/$t"
    seeds=()
    [ -d "$dir/regressions/$t" ] && seeds=("regressions/$t")
    status=0
    (cd "$dir" && "${nice_cmd[@]}" cargo +nightly fuzz run -O "$t" "corpus/$t" "${seeds[@]}" -- \
        -max_total_time="$secs" -print_final_stats=1) >"$log" 2>&1 || status=$?
    runs=$(grep -oE '^Done [0-9]+ runs' "$log" | grep -oE '[0-9]+' | tail -1 || true)
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
    corpus=$(find "$dir/corpus/$t" -type f | wc -l)
    crashes=$(find "$dir/artifacts/$t" -type f 2>/dev/null | wc -l)
    if [ "$status" -ne 0 ] || [ "$crashes" -ne 0 ] || [ -z "$runs" ]; then
        failed=1
        tail -40 "$log" >&2
        line="$t: FAILED (exit $status), runs ${runs:-?}, ${cov:-cov ?}, crashes $crashes"
    else
        line="$t: ${secs}s, $runs runs, $cov, corpus $corpus, crashes 0"
    fi
    echo "$line"
    summary+=("$line")
done
echo "--- fuzz summary"
printf '  %s\n' "${summary[@]}"
exit "$failed"

#!/bin/bash
# The Xen lab lane of scripts/test-all.sh: builds (or reuses) the images, builds the project's
# binaries the scenarios need, and boots one lab per scenario. Exit 0 iff all pass.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
"$HERE/build-images.sh"

fail=0
run() {
    local scen=$1; shift
    echo "=== xen-lab scenario $scen"
    if "$HERE/run-lab.sh" "$scen" "$@" > "$ROOT/target/xen-lab/last-$scen.out" 2>&1; then
        tail -n 2 "$ROOT/target/xen-lab/last-$scen.out"
    else
        grep -E 'LAB:|\[labU|run-lab' "$ROOT/target/xen-lab/last-$scen.out" | tail -n 80
        fail=1
    fi
}

run smoke
exit $fail

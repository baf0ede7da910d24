#!/bin/bash
# run-perf.sh: the Xen lab's comparison scenario (opt-in: it boots once but measures for several
# minutes under TCG, so scripts/test-all.sh does not run it). Builds the images (or reuses them),
# the release vrdma binaries, the static lab-perf helper (TCP and libxenvchan, lab-only), takes
# the bridge/netback/netfront modules from the images' kernel, boots the `perf` scenario and
# prints its table. Exit 0 iff every step measured something.
#
# Environment: LAB_BUILD (images, default target/xen-lab), LAB_TIMEOUT (default 3600 s).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
B=${LAB_BUILD:-$ROOT/target/xen-lab}
export LAB_BUILD=$B
"$HERE/build-images.sh"

cd "$ROOT"
BIN=$ROOT/target/xen-lab-perf/bin
rm -rf "$BIN" && mkdir -p "$BIN"
# The same cargo command as run-all.sh (same features, so one build serves both lanes).
cargo build --release -q -p xenstore-proto --example xs-probe -p xen-platform --example platform-probe \
    -p vrdma-backend --bin vrdma-backend --bin vrdmactl -p vrdma-tests --bin vrdma-guest \
    -p vrdma-perf --bin vrdma-perf
for b in vrdma-backend vrdmactl vrdma-perf; do strip -o "$BIN/$b" "target/release/$b"; done
# libxenvchan is the thing we compare against: linked into this lab-only helper, never into vrdma.
gcc -O2 -Wall -static -o "$BIN/lab-perf" "$HERE/probe/lab-perf.c" \
    -lxenvchan -lxenstore -lxengnttab -lxenevtchn -lxentoollog -lxentoolcore -lpthread 2>&1 |
    grep -v -E 'statically linked|getaddrinfo|dlopen' || true
[ -x "$BIN/lab-perf" ] || { echo "could not build lab-perf (needs libxen-dev)" >&2; exit 1; }
KVER=$(ls "$B/root/lib/modules" | head -n1)
for m in net/llc/llc net/802/stp net/bridge/bridge drivers/net/xen-netback/xen-netback drivers/net/xen-netfront; do
    cp "$B/root/lib/modules/$KVER/kernel/$m.ko" "$BIN/"
done

echo "=== xen-lab scenario perf ($(uptime))"
OUT=$B/last-perf.out
rc=0
LAB_TIMEOUT=${LAB_TIMEOUT:-3600} "$HERE/run-lab.sh" perf "$BIN"/* > "$OUT" 2>&1 || rc=$?
grep -E 'LAB: (step|uptime|placement|vrdma-backend \()' "$OUT" | sed 's/^\[ *[0-9.]*\] //'
echo
sed -n 's/^\[ *[0-9.]*\] PERF: //p' "$OUT"
echo "=== host after the run: $(uptime)"
tail -n 2 "$OUT"
exit $rc

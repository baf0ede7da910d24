#!/bin/bash
# run-lab.sh SCENARIO [FILE...]: boots Xen 4.17 + a Debian PV dom0 under QEMU (TCG), whose init
# runs tests/xen-lab/scenarios/SCENARIO/dom0.sh; the scenario starts PV domUs that run
# scenarios/SCENARIO/domU.sh. FILEs (binaries, test programs) are put on PATH in both:
# in dom0 through the 9p share (/mnt/lab/bin), in the domUs through a cpio appended to
# their ramdisk (/lab/bin). Prints the serial log with timestamps; exit 0 iff PASS.
#
# Environment: LAB_BUILD (images, default target/xen-lab), LAB_TIMEOUT (hard limit for QEMU,
# default 900 s: about 60 s are needed on an idle machine, several times that on a busy one), LAB_MEM (MiB, default 1536), LAB_SMP (default 2), LAB_CPU (default
# Haswell-noTSX-IBRS: models with SMAP crash a PV dom0 under TCG).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
B=${LAB_BUILD:-$ROOT/target/xen-lab}
SCEN=${1:?usage: run-lab.sh SCENARIO [FILE...]}; shift
SDIR=$HERE/scenarios/$SCEN
[ -f "$SDIR/dom0.sh" ] || { echo "no scenario $SDIR/dom0.sh" >&2; exit 2; }
for f in xen vmlinux dom0.cpio; do
    [ -f "$B/$f" ] || { echo "missing $B/$f: run tests/xen-lab/build-images.sh first" >&2; exit 2; }
done
command -v qemu-system-x86_64 >/dev/null || { echo "qemu-system-x86_64 missing (apt-get install qemu-system-x86)" >&2; exit 2; }

CPU=${LAB_CPU:-Haswell-noTSX-IBRS}
MEM=${LAB_MEM:-1536}
SMP=${LAB_SMP:-2}
TIMEOUT=${LAB_TIMEOUT:-900}

# The share: scenario, binaries for dom0, the domUs' extra cpio, out/ for results.
SHARE=$B/share-$SCEN
rm -rf "$SHARE" && mkdir -p "$SHARE/scenario" "$SHARE/bin" "$SHARE/out"
cp "$SDIR/dom0.sh" "$SHARE/scenario/dom0.sh"
echo "$SCEN" > "$SHARE/scenario/name"
EXTRA=$(mktemp -d)
trap 'rm -rf "$EXTRA"' EXIT
mkdir -p "$EXTRA/lab/bin"
[ -f "$SDIR/domU.sh" ] && cp "$SDIR/domU.sh" "$EXTRA/lab/domU.sh"
for f in "$@"; do
    cp -a "$f" "$SHARE/bin/"
    cp -a "$f" "$EXTRA/lab/bin/"
done
(cd "$EXTRA" && find lab | LC_ALL=C sort | cpio -o -H newc --quiet) > "$SHARE/domU-extra.cpio"

# spec-ctrl=no / mitigations=off: mitigations cost a lot under TCG (they halve the boot
# time); eager-fpu must stay on, or guest processes randomly segfault under TCG.
XEN_CMDLINE="console=com1 com1=115200,8n1 loglvl=all guest_loglvl=all dom0_mem=512M,max:512M dom0_max_vcpus=$SMP spec-ctrl=no,eager-fpu"
DOM0_CMDLINE="console=hvc0 earlyprintk=xen quiet loglevel=3 panic=-1 mitigations=off"

LOG=$B/lab-$SCEN-$(date +%Y%m%d-%H%M%S).log
echo "run-lab: scenario=$SCEN cpu=$CPU mem=${MEM}M smp=$SMP files=[$*] log=$LOG"
TS_PY='
import sys, time, re
t0 = float(sys.argv[1]); log = open(sys.argv[2], "w")
for raw in sys.stdin.buffer:
    line = raw.decode(errors="replace").rstrip("\r\n")
    line = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]|\x1bc", "", line)
    out = "[%7.2f] %s" % (time.time() - t0, line)
    print(out, flush=True); log.write(out + "\n"); log.flush()
'
T0=$(date +%s.%N)
set +e
timeout --kill-after=10 "$TIMEOUT" qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu "$CPU" -m "$MEM" -smp "$SMP" \
    -nodefaults -no-reboot -display none -monitor none -serial stdio \
    -kernel "$B/xen" -append "$XEN_CMDLINE" \
    -initrd "$B/vmlinux $DOM0_CMDLINE,$B/dom0.cpio" \
    -virtfs "local,path=$SHARE,mount_tag=lab,security_model=none,id=lab" \
    < /dev/null 2>&1 | python3 -u -c "$TS_PY" "$T0" "$LOG"
QRC=${PIPESTATUS[0]}
set -e
T1=$(date +%s.%N)
echo "run-lab: qemu exit code $QRC$( [ "$QRC" = 124 ] && echo ' (timed out)') after $(python3 -c "print(round($T1-$T0,1))") s"
if grep -q 'LAB: RESULT: PASS' "$LOG"; then
    echo "run-lab: $SCEN PASS"; exit 0
fi
echo "run-lab: $SCEN FAIL (log $LOG, guest consoles in $SHARE/out)"; exit 1

#!/bin/bash
# build-siw.sh: builds Linux's Soft-iWARP driver for the lab's kernel (Debian does not ship it:
# `# CONFIG_RDMA_SIW is not set`), out of tree, from Debian's linux-source-6.1 against the lab
# kernel's own headers (linux-headers-<ABI>, the exact ABI of the images' kernel). Two modules:
#   $LAB_BUILD/siw/siw.ko      siw as upstream builds it: MPA rev 2, CRC not asked for
#   $LAB_BUILD/siw/siw-crc.ko  "siw made to ask for CRC": the same source with the compile-time
#                              constant `mpa_crc_required` (siw_main.c) set to true, so its MPA
#                              request/reply sets the C bit and every FPDU carries a CRC32c
# Both are stripped of debug info (5 MB -> ~300 KB). Cached: rebuilt only when this script or
# the kernel changes (about 30 s). Needs on the host: make, gcc and linux-headers-<ABI> (installed
# here with apt-get when missing), and the images (build-images.sh) for the kernel's ABI.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
B=${LAB_BUILD:-$ROOT/target/xen-lab}
[ -d "$B/root/lib/modules" ] || { echo "build-siw: no images in $B (run build-images.sh)" >&2; exit 2; }
KVER=$(ls "$B/root/lib/modules" | head -n1)
KPKGVER=$(dpkg-deb -f "$(ls "$B"/debs/linux-image-"$KVER"_*.deb | head -n1)" Version)
S=$B/siw
STAMP_NOW="$KVER $KPKGVER $(sha256sum "$HERE/build-siw.sh" | cut -d' ' -f1)"
if [ -f "$S/stamp" ] && [ "$(cat "$S/stamp")" = "$STAMP_NOW" ] && [ -f "$S/siw.ko" ] && [ -f "$S/siw-crc.ko" ]; then
    echo "build-siw: cached siw.ko and siw-crc.ko in $S are current ($KVER)"
    exit 0
fi
mkdir -p "$S/src"
HDR=/usr/src/linux-headers-$KVER
if [ ! -f "$HDR/Makefile" ] || ! command -v make >/dev/null; then
    timeout 300 apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends \
        make "linux-headers-$KVER=$KPKGVER"
fi
# The source of the same Debian kernel version (~140 MB .deb, kept beside the images).
SRCDEB=$(ls "$S"/src/linux-source-6.1_"$KPKGVER"_all.deb 2>/dev/null | head -n1 || true)
if [ -z "$SRCDEB" ]; then
    timeout 300 apt-get update -qq || true
    (cd "$S/src" && timeout 900 apt-get -o APT::Sandbox::User=root download "linux-source-6.1=$KPKGVER")
    SRCDEB=$(ls "$S"/src/linux-source-6.1_"$KPKGVER"_all.deb | head -n1)
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
dpkg-deb --fsys-tarfile "$SRCDEB" | tar -x -C "$W" ./usr/src/linux-source-6.1.tar.xz
tar -xJf "$W/usr/src/linux-source-6.1.tar.xz" -C "$W" --wildcards 'linux-source-6.1/drivers/infiniband/sw/siw/*'
SIW=$W/linux-source-6.1/drivers/infiniband/sw/siw
# siw's MPA settings are constants, not module parameters (siw_main.c):
#   const bool mpa_crc_required;   /* We try to negotiate CRC on, if true */
grep -q '^const bool mpa_crc_required;$' "$SIW/siw_main.c" || {
    echo "build-siw: siw_main.c no longer has 'const bool mpa_crc_required;'" >&2; exit 1; }
cp -a "$SIW" "$W/siw-crc"
sed -i 's/^const bool mpa_crc_required;$/const bool mpa_crc_required = true;/' "$W/siw-crc/siw_main.c"
for v in siw siw-crc; do
    d=$SIW; [ $v = siw ] || d=$W/siw-crc
    make -s -C "$HDR" M="$d" CONFIG_RDMA_SIW=m modules >"$W/$v.make.log" 2>&1 ||
        { cat "$W/$v.make.log" >&2; echo "build-siw: $v build failed" >&2; exit 1; }
    strip --strip-debug -o "$S/$v.ko" "$d/siw.ko"
done
# Both are the same module (name "siw"): only one is loaded at a time.
modinfo -F vermagic "$S/siw.ko" | grep -q "^$KVER " || { echo "build-siw: vermagic is not $KVER" >&2; exit 1; }
echo "$STAMP_NOW" > "$S/stamp"
ls -la "$S"/*.ko
echo "build-siw: done ($KVER, linux-source-6.1 $KPKGVER)"

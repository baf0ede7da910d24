#!/bin/bash
# Builds the Xen lab's images from Debian packages (idempotent, cached):
#   $LAB_BUILD/xen        Xen 4.17 hypervisor (Debian's xen-4.17-amd64.gz, gunzipped: QEMU's
#                         multiboot loader cannot read the .gz)
#   $LAB_BUILD/vmlinux    Debian 6.1 kernel as a raw ELF (dom0 and domUs; no xz under TCG)
#   $LAB_BUILD/dom0.cpio  dom0 initramfs: busybox, the Xen toolstack and libraries, modules,
#                         the domU kernel and initramfs, the lab library
#   $LAB_BUILD/domU.cpio  domU initramfs: busybox, xenstore tools, modules, xenlab-probe, and
#                         the unmodified verbs tools (rping, ibv_devinfo, ibv_devices,
#                         ibv_rc_pingpong, perftest's ib_*) with their libraries, for
#                         vrdma-exec (a scenario brings it and libvrdma_verbs.so)
# dom0.cpio also carries RDMA (not loaded at boot; a scenario loads it, see scenarios/siw): the
# kernel's rdma modules (listed in /etc/lab-rdma-modules) and rdma-core user space (libibverbs
# with the siw and rxe providers, librdmacm, rping, ibv_devinfo, perftest, iproute2's ip and
# rdma, tcpdump). siw itself is not in Debian's kernel: build-siw.sh builds it.
# LAB_BUILD defaults to <project>/target/xen-lab. Nothing is installed into the host except
# build tools (cpio, kmod, gcc, libc6-dev, libxen-dev). The images are rebuilt when this
# script or a guest file changes (a stamp holds their checksum).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
B=${LAB_BUILD:-$ROOT/target/xen-lab}
mkdir -p "$B/debs"
cd "$B"

STAMP_NOW=$(cat "$HERE/build-images.sh" "$HERE"/guest/* "$HERE/probe/xenlab-probe.c" | sha256sum | cut -d' ' -f1)
if [ -f stamp ] && [ "$(cat stamp)" = "$STAMP_NOW" ] && [ -f dom0.cpio ] && [ -f xen ]; then
    echo "build-images: cached images in $B are current"
    exit 0
fi

XENVER=4.17
PKGS=(xen-hypervisor-4.17-amd64 xen-utils-4.17 xen-utils-common xenstore-utils
      libxenmisc4.17 libxenstore4 libxengnttab1 libxenevtchn1 libxencall1
      libxenforeignmemory1 libxentoollog1 libxentoolcore1 libxendevicemodel1
      libxenhypfs1 libyajl2 linux-image-amd64 busybox-static)
# RDMA user space for dom0 (and the libraries they need that a minimal host may lack).
RDMA_PKGS=(libibverbs1 ibverbs-providers librdmacm1 rdmacm-utils ibverbs-utils perftest iproute2
      tcpdump libpcap0.8 libnl-3-200 libnl-route-3-200 libibumad3 libpci3 libmnl0 libbsd0 libcap2
      libbpf1 libelf1 libmd0 libdbus-1-3 libxtables12)
RDMA_MODS=(ib_core ib_uverbs iw_cm ib_cm configfs rdma_cm rdma_ucm dummy crc32c_generic libcrc32c
      crc32_generic udp_tunnel ip6_udp_tunnel rdma_rxe)

need_host=()
for t in cpio:cpio depmod:kmod gcc:gcc; do command -v "${t%%:*}" >/dev/null || need_host+=("${t##*:}"); done
[ -f /usr/include/xen/sys/gntalloc.h ] || need_host+=(libxen-dev)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || need_host+=(libc6-dev)
if [ ${#need_host[@]} -gt 0 ]; then
    timeout 300 apt-get update -qq
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends "${need_host[@]}"
fi

# 1. Fetch the .debs (not installed: the kernel/xen postinst hooks want grub/initramfs-tools).
if ! ls debs/linux-image-6.*-amd64_*.deb >/dev/null 2>&1 || ! ls debs/xen-hypervisor-*.deb >/dev/null 2>&1; then
    timeout 300 apt-get update -qq || true
    KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
    (cd debs && timeout 600 apt-get -o APT::Sandbox::User=root download "${PKGS[@]/linux-image-amd64/$KPKG}")
fi
# Per package: a name added to RDMA_PKGS is fetched into an existing cache too.
missing=()
for p in "${RDMA_PKGS[@]}"; do ls debs/"${p}"_*.deb >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    timeout 300 apt-get update -qq || true
    (cd debs && timeout 600 apt-get -o APT::Sandbox::User=root download "${missing[@]}")
fi
if [ ! -d root ] || [ debs -nt root ]; then
    rm -rf root && mkdir root
    for d in debs/*.deb; do dpkg-deb -x "$d" root; done
fi
KVER=$(ls root/lib/modules | head -n1)
echo "build-images: kernel $KVER"
depmod -b root "$KVER"

zcat root/boot/xen-$XENVER-amd64.gz > xen
# Raw ELF vmlinux (what extract-vmlinux gives): Xen (dom0 build) and libxenguest (domU
# build) would otherwise xz-decompress the bzImage payload under emulation (~23 s).
python3 - "root/boot/vmlinuz-$KVER" vmlinux <<'PY'
import lzma, sys
b = open(sys.argv[1], 'rb').read()
i = b.find(b'\xfd7zXZ\x00')
assert i > 0, 'no xz payload in bzImage'
out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(b[i:])
assert out[:4] == b'\x7fELF'
open(sys.argv[2], 'wb').write(out)
PY

# 2. The lab's own probe (static: it needs no libraries in the guests).
gcc -O2 -Wall -static -o xenlab-probe "$HERE/probe/xenlab-probe.c"

LIBPATH="$B/root/usr/lib/x86_64-linux-gnu:$B/root/lib/x86_64-linux-gnu"

# copy_bin <staging-dir> <file> <dest path>: a binary and every shared library it needs
# (resolved against the extracted packages first).
copy_bin() {
    local st=$1 src=$2 dst=$3
    install -D -m 0755 "$src" "$st$dst"
    LD_LIBRARY_PATH=$LIBPATH ldd "$src" 2>/dev/null | awk '/=> \//{print $3} /^[ \t]*\//{print $1}' | while read -r lib; do
        local dest=$lib
        case $lib in "$B/root"/*) dest=${lib#"$B/root"} ;; esac
        [ -e "$st$dest" ] || install -D -m 0755 "$(readlink -f "$lib")" "$st$dest"
    done
}

# add_modules <staging-dir> <module names...>: modules + dependencies, and /etc/lab-modules
# (relative paths in dependency order) for the init scripts; LIST=name writes /etc/name instead.
add_modules() {
    local st=$1 list=${LIST:-lab-modules}; shift
    local dep=root/lib/modules/$KVER/modules.dep order=()
    resolve() {
        local path
        path=$(awk -F: -v m="/$1.ko" '{ if (substr($1, length($1)-length(m)+1) == m) { print $1; exit } }' "$dep")
        [ -n "$path" ] || { echo "module $1 not found" >&2; exit 1; }
        local deps
        deps=$(awk -F: -v p="$path" '$1==p {print $2}' "$dep")
        for d in $deps; do resolve "$(basename "$d" .ko)"; done
        case " ${order[*]-} " in *" $path "*) ;; *) order+=("$path") ;; esac
    }
    for m in "$@"; do resolve "$m"; done
    mkdir -p "$st/etc"
    : > "$st/etc/$list"
    for p in "${order[@]}"; do
        install -D -m 0644 "root/lib/modules/$KVER/$p" "$st/lib/modules/$p"
        echo "$p" >> "$st/etc/$list"
    done
}

base_tree() {
    local st=$1
    rm -rf "$st"
    mkdir -p "$st"/{bin,sbin,etc,proc,sys,dev,run,tmp,var,lab,usr/bin,usr/sbin}
    install -m 0755 root/bin/busybox "$st/bin/busybox"
    for a in $(root/bin/busybox --list); do
        [ -e "$st/bin/$a" ] || ln -s busybox "$st/bin/$a"
    done
    install -m 0755 xenlab-probe "$st/usr/bin/xenlab-probe"
    copy_bin "$st" root/usr/bin/xenstore /usr/bin/xenstore
    for t in xenstore-read xenstore-write xenstore-ls xenstore-list xenstore-rm xenstore-chmod xenstore-watch xenstore-exists; do
        cp -a root/usr/bin/$t "$st/usr/bin/"
    done
    # glibc dlopen()s libgcc_s for pthread_cancel (ldd does not show it); Rust binaries link it.
    install -D -m 0644 "$(readlink -f /lib/x86_64-linux-gnu/libgcc_s.so.1)" "$st/lib/x86_64-linux-gnu/libgcc_s.so.1"
    # Rust binaries built on this Debian 12 host need glibc's loader and libc/libm.
    for l in /lib64/ld-linux-x86-64.so.2 /lib/x86_64-linux-gnu/libc.so.6 /lib/x86_64-linux-gnu/libm.so.6; do
        [ -e "$st$l" ] || install -D -m 0755 "$(readlink -f "$l")" "$st$l"
    done
}

XMODS=(xen-evtchn xenfs xen-privcmd xen-gntdev xen-gntalloc)

# Unmodified verbs programs, run in a domU through vrdma-exec (libvrdma_verbs.so preloaded; both
# come with a scenario's files): rdma-core's and perftest's binaries and the libraries they link
# (libibverbs, librdmacm, libmlx5/libefa for perftest, ...). No provider and no kernel rdma
# module: the preloaded library answers every device call. In dom0 the same tools are in
# /usr/lib/lab-rdma (off PATH); in a domU they are on PATH.
VERBS_TOOLS=(rping ibv_devinfo ibv_devices ibv_rc_pingpong ib_send_lat ib_send_bw ib_write_lat
      ib_write_bw ib_read_lat ib_read_bw)

# 3. domU initramfs
S=$B/stage-domU
base_tree "$S"
add_modules "$S" "${XMODS[@]}"
for b in "${VERBS_TOOLS[@]}"; do copy_bin "$S" "root/usr/bin/$b" "/usr/bin/$b"; done
install -m 0755 "$HERE/guest/init-domU.sh" "$S/init"
(cd "$S" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) > domU.cpio

# 4. dom0 initramfs
S=$B/stage-dom0
base_tree "$S"
XB=/usr/lib/xen-$XENVER/bin
for b in xl xenstored xenconsoled xen-init-dom0 xenconsole libxl-save-helper; do
    copy_bin "$S" "root$XB/$b" "$XB/$b"
done
mkdir -p "$S/etc/xen" "$S/var/lib/xen" "$S/var/log/xen"
printf 'autoballoon="off"\n' > "$S/etc/xen/xl.conf"
add_modules "$S" "${XMODS[@]}" virtio_pci 9pnet_virtio 9p
# RDMA: modules in /etc/lab-rdma-modules (a scenario insmods them in order), user space.
LIST=lab-rdma-modules add_modules "$S" "${RDMA_MODS[@]}"
for b in "${VERBS_TOOLS[@]/#//usr/bin/}" /usr/bin/rdma /bin/ip /usr/bin/tcpdump; do
    copy_bin "$S" "root$b" "/usr/lib/lab-rdma/$(basename "$b")"   # not on PATH by default:
done                                                             # busybox's ip stays the default
for p in siw rxe; do
    copy_bin "$S" "root/usr/lib/x86_64-linux-gnu/libibverbs/lib$p-rdmav34.so" "/usr/lib/x86_64-linux-gnu/libibverbs/lib$p-rdmav34.so"
    install -D -m 0644 "root/etc/libibverbs.d/$p.driver" "$S/etc/libibverbs.d/$p.driver"
done
# A preload that delays a program's second and later rdma_connect (guest/connect-delay.c: Debian's
# perftest crashes when its second connect is refused; scenarios/siw, vrdma as server).
gcc -O2 -Wall -shared -fPIC -o "$S/usr/lib/lab-rdma/connect-delay.so" "$HERE/guest/connect-delay.c"
cp -a root/etc/iproute2 "$S/etc/"
install -m 0755 "$HERE/guest/init-dom0.sh" "$S/init"
install -m 0644 "$HERE/guest/lab-lib.sh" "$S/lab/lab-lib.sh"
install -m 0644 "$HERE/guest/domU.cfg.in" "$S/lab/domU.cfg.in"
cp vmlinux "$S/lab/vmlinux"
cp domU.cpio "$S/lab/domU.cpio"
(cd "$S" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) > dom0.cpio

echo "$STAMP_NOW" > stamp
ls -la xen vmlinux dom0.cpio domU.cpio
echo "build-images: done"

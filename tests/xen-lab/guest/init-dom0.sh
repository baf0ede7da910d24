#!/bin/sh
# /init of the lab's dom0 initramfs (busybox sh): brings up the Xen toolstack by hand (what
# xencommons would do), then runs the scenario from the 9p share (/mnt/lab/scenario/dom0.sh,
# with /lab/lab-lib.sh sourced) and powers off. Lines run-lab.sh looks for start with "LAB:".
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:/usr/lib/xen-4.17/bin:/mnt/lab/bin
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu

. /lab/lab-lib.sh

finish() {
    dmesg | grep -iE 'segfault|general protection|BUG:|Oops' | sed 's/^/dom0 dmesg: /'
    lab_log "RESULT: $1"
    sync
    [ -d /mnt/lab/out ] && { echo "$1" > /mnt/lab/out/result; sync; }
    poweroff -f
    sleep 5
}

mkdir -p /proc /sys /dev /run /tmp /var /mnt/lab
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
ln -sfn /run /var/run   # xenstored puts its socket in /var/run/xenstored
mkdir -p /var/lib/xen /var/log/xen/console /run/xen /run/xenstored /run/lock /var/lock /run/lab
lab_log "DOM0-USERSPACE-UP kernel $(uname -r)"

while read -r m; do
    [ -n "$m" ] || continue
    insmod "/lib/modules/$m" 2>/tmp/insmod.err || echo "insmod $m failed: $(cat /tmp/insmod.err)"
done < /etc/lab-modules
mkdir -p /proc/xen
mount -t xenfs xenfs /proc/xen || lab_log "WARN mount xenfs failed"
lab_log "dom0 /dev/xen: $(ls /dev/xen | tr '\n' ' ')"

if grep -q 9p /proc/filesystems && mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 lab /mnt/lab 2>/tmp/9p.err; then
    mkdir -p /mnt/lab/out
    lab_log "9p share mounted: $(ls /mnt/lab | tr '\n' ' ')"
else
    finish "FAIL no 9p share ($(cat /tmp/9p.err 2>/dev/null))"
fi

xenstored --pid-file /run/xenstored.pid || finish "FAIL xenstored"
xen-init-dom0 || finish "FAIL xen-init-dom0"
xenconsoled --pid-file=/run/xenconsoled.pid --log=guest --log-dir=/var/log/xen/console || finish "FAIL xenconsoled"
lab_log "xenstored+xenconsoled running"
xl info | grep -E '^(release|xen_version|xen_caps|total_memory|free_memory|nr_cpus)' | sed 's/^/  xl info: /'

if [ ! -f /mnt/lab/scenario/dom0.sh ]; then
    finish "FAIL no scenario in the share (/mnt/lab/scenario/dom0.sh)"
fi
lab_log "scenario $(cat /mnt/lab/scenario/name 2>/dev/null) start"
( . /mnt/lab/scenario/dom0.sh )
RC=$?
lab_log "scenario done rc=$RC"
lab_collect_consoles
if [ "$RC" = 0 ]; then finish PASS; else finish "FAIL (scenario rc=$RC)"; fi

#!/bin/sh
# /init of a lab domU (busybox sh). Its console (hvc0) is logged by xenconsoled in dom0, which
# copies it onto the serial log as "[<name>] ...". Runs /lab/domU.sh <name> <domid> (packed
# into the domU's ramdisk by the scenario), publishes its exit status as data/result
# ("ok" or "fail rc=N"), waits for dom0's /lab/ack/<name>, then powers off.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:/lab/bin
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu
up() { cut -d' ' -f1 /proc/uptime; }

mkdir -p /proc /sys /dev /run /tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
echo "DOMU-USERSPACE-UP kernel $(uname -r) uptime $(up)s"
while read -r m; do
    [ -n "$m" ] && { insmod "/lib/modules/$m" 2>/tmp/e || echo "insmod $m failed: $(cat /tmp/e)"; }
done < /etc/lab-modules
mkdir -p /proc/xen && mount -t xenfs xenfs /proc/xen

DOMID=$(xenstore-read domid)
NAME=$(xenstore-read name)
echo "domU $NAME is domid $DOMID; /dev/xen: $(ls /dev/xen | tr '\n' ' ')"
RESULT="fail no-scenario"
if [ -f /lab/domU.sh ]; then
    sh /lab/domU.sh "$NAME" "$DOMID"
    RC=$?
    if [ "$RC" = 0 ]; then RESULT=ok; else RESULT="fail rc=$RC"; fi
fi
xenstore-write data/result "$RESULT"
i=0
until xenstore-read "/lab/ack/$NAME" >/dev/null 2>&1; do
    i=$((i+1)); [ $i -gt 300 ] && { echo "domU: no ack from dom0"; break; }
    sleep 0.2
done
dmesg | grep -iE 'segfault|general protection|BUG:|Oops' | sed 's/^/domU dmesg: /'
echo "DOMU-DONE $NAME result=$RESULT uptime $(up)s"
sleep 0.3
poweroff -f

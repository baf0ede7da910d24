# Sourced by the lab's dom0 init and scenarios (busybox sh). Helpers to start domUs, follow
# their consoles, and collect their results. Every exec costs 0.1-0.3 s under TCG: poll with
# xenstore-read and sleeps, never with xl in a loop.

lab_up() { cut -d' ' -f1 /proc/uptime; }
lab_log() { echo "LAB: $* (dom0 uptime $(lab_up)s)"; }

# lab_start_domU NAME [MEM_MB]: creates a PV domU whose ramdisk is the base domU.cpio plus
# the share's domU-extra.cpio (the scenario's /lab/domU.sh and binaries). Prints nothing;
# the domid is then in /run/lab/NAME.domid (see lab_domid).
lab_start_domU() {
    name=$1; mem=${2:-160}
    cp /lab/domU.cpio "/run/lab/$name.cpio"
    [ -f /mnt/lab/domU-extra.cpio ] && cat /mnt/lab/domU-extra.cpio >> "/run/lab/$name.cpio"
    sed -e "s/@NAME@/$name/g" -e "s/@MEM@/$mem/g" /lab/domU.cfg.in > "/run/lab/$name.cfg"
    lab_log "xl create $name start"
    xl create "/run/lab/$name.cfg" || { lab_log "xl create $name FAILED"; return 1; }
    xl domid "$name" > "/run/lab/$name.domid"
    lab_log "xl create $name done: domid $(cat /run/lab/$name.domid)"
    conlog=/var/log/xen/console/guest-$name.log
    ( tail -F "$conlog" 2>/dev/null | while IFS= read -r l; do echo "[$name] $l"; done ) &
    return 0
}

lab_domid() { cat "/run/lab/$1.domid"; }

# lab_wait_result NAME TIMEOUT_S: waits for the domU's data/result; prints it.
lab_wait_result() {
    id=$(lab_domid "$1"); t=$2; i=0
    while [ $i -lt $((t*2)) ]; do
        r=$(xenstore-read "/local/domain/$id/data/result" 2>/dev/null) && { echo "$r"; return 0; }
        xenstore-exists "/local/domain/$id" || { echo "gone"; return 1; }
        sleep 0.5; i=$((i+1))
    done
    echo "timeout"; return 1
}

# lab_ack NAME: lets the domU power off.
lab_ack() {
    id=$(lab_domid "$1")
    xenstore-write "/lab/ack/$1" 1
    xenstore-chmod "/lab/ack/$1" n0 "r$id"
}

# lab_wait_gone NAME: waits (up to 20 s) for the domU to power off, else destroys it.
lab_wait_gone() {
    id=$(lab_domid "$1"); i=0
    while [ $i -lt 40 ] && xenstore-exists "/local/domain/$id"; do sleep 0.5; i=$((i+1)); done
    xenstore-exists "/local/domain/$id" && { lab_log "$1 still there, destroying"; xl destroy "$1"; }
    return 0
}

# lab_share_readable PATH DOMID...: PATH readable by the listed domUs, owned by dom0.
lab_share_readable() {
    p=$1; shift
    perms="n0"
    for d in "$@"; do perms="$perms r$d"; done
    xenstore-chmod "$p" $perms
}

lab_collect_consoles() {
    [ -d /mnt/lab/out ] && cp /var/log/xen/console/guest-*.log /mnt/lab/out/ 2>/dev/null
    return 0
}

# lab_bridge: a bridge from dom0 to the domUs over netback/netfront (the perf and rxe
# scenarios): insmods llc, stp, bridge and xen-netback from the share (/mnt/lab/bin; run-all.sh
# and run-perf.sh take them from the image's kernel), makes xenbr0 with dom0 at 10.0.0.1/24
# (an address inside the lab only), writes the vif hotplug script and adds the vif to the
# domUs' config template, so every domU started afterwards gets an eth0 on the bridge.
# Returns 1 (having said why) when a step fails.
lab_bridge() {
    for m in llc stp bridge xen-netback; do
        [ -d "/sys/module/$(echo $m | tr - _)" ] && continue    # loaded already
        insmod "/mnt/lab/bin/$m.ko" || { lab_log "lab_bridge: insmod $m FAILED"; return 1; }
    done
    brctl addbr xenbr0 && ifconfig xenbr0 10.0.0.1 netmask 255.255.255.0 up ||
        { lab_log "lab_bridge: xenbr0 FAILED"; return 1; }
    # libxl runs a vif's hotplug script with $vif and $XENBUS_PATH: the vif joins the bridge,
    # and hotplug-status must say connected or the domain's vif hangs.
    cat > /run/lab/vif-lab <<'HOTPLUG'
#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu
case "$1" in
online|add)
    ifconfig "$vif" up
    brctl addif xenbr0 "$vif"
    xenstore-write "$XENBUS_PATH/hotplug-status" connected ;;
esac
exit 0
HOTPLUG
    chmod +x /run/lab/vif-lab
    # lab_start_domU builds each domU's config from this template (in dom0's RAM).
    echo "vif = [ 'bridge=xenbr0,script=/run/lab/vif-lab' ]" >> /lab/domU.cfg.in
}

# platform scenario, dom0 side (sourced by init-dom0.sh; lab-lib.sh loaded). Needs on PATH:
# xs-probe (xenstore-proto example) and platform-probe (xen-platform example).
ROUNDS=200
fail=0
# xen-platform's real-device tests (grant to self, read-only map, event loopback, unmap-notify).
xen-platform-real-xen-tests --ignored --test-threads=1 || { lab_log "real_xen tests FAILED in dom0"; fail=1; }
xs-probe --socket /run/xenstored/socket selftest /local/domain/0/data/xs-probe-socket || fail=1
xs-probe --xenbus selftest /local/domain/0/data/xs-probe-xenbus || fail=1

lab_start_domU labU1 || exit 1
lab_start_domU labU2 || exit 1
D1=$(lab_domid labU1); D2=$(lab_domid labU2)
xenstore-write /lab/secret "not-for-domU" /lab/rounds "$ROUNDS"
lab_share_readable /lab "$D1" "$D2"
lab_share_readable /lab/rounds "$D1" "$D2"
xenstore-chmod /lab/secret n0

# dom0 -> labU1: dom0 shares a page and a port; labU1 maps and ping-pongs.
platform-probe offer "$D1" /run/lab/pp-offer "$ROUNDS" > /run/lab/pp-offer.log 2>&1 &
OFFER=$!
i=0; until [ -s /run/lab/pp-offer ] || [ $i -gt 100 ]; do sleep 0.2; i=$((i+1)); done
xenstore-write /lab/pp-offer "$(cat /run/lab/pp-offer)"
lab_share_readable /lab/pp-offer "$D1"
xenstore-write /lab/ready 1
lab_share_readable /lab/ready "$D1" "$D2"
lab_log "offered $(cat /run/lab/pp-offer) to labU1"

# labU2 -> dom0: labU2 publishes its offer in its own data/pp-offer; dom0 maps it.
i=0
until o=$(xenstore-read "/local/domain/$D2/data/pp-offer" 2>/dev/null); do
    i=$((i+1)); [ $i -gt 300 ] && break; sleep 0.5
done
if [ -n "$o" ]; then
    echo "$o" > /run/lab/pp-from-labU2
    platform-probe map /run/lab/pp-from-labU2 "$ROUNDS" || { lab_log "map of labU2's grant FAILED"; fail=1; }
else
    lab_log "labU2 never offered"; fail=1
fi
wait $OFFER || { lab_log "offer to labU1 FAILED"; fail=1; }
cat /run/lab/pp-offer.log
for name in labU1 labU2; do
    r=$(lab_wait_result $name 180)
    lab_log "$name result: $r"
    [ "$r" = ok ] || fail=1
    lab_ack $name
done
lab_wait_gone labU1
lab_wait_gone labU2
exit $fail

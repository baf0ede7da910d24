# Smoke scenario (sourced by the lab's dom0 init, lab-lib.sh loaded): the lab itself works.
# Two PV domUs; XenStore permissions between domains; dom0 -> domU grant + event channel
# (backend grants queue pages) and domU -> dom0 (frontend grants memory), with xenlab-probe.
lab_start_domU labU1 || exit 1
lab_start_domU labU2 || exit 1
D1=$(lab_domid labU1); D2=$(lab_domid labU2)

xenstore-write /lab/hello "hello-domU-from-dom0" /lab/secret "not-for-domU"
lab_share_readable /lab "$D1" "$D2"
lab_share_readable /lab/hello "$D1" "$D2"
xenstore-chmod /lab/secret n0
for name in labU1 labU2; do
    id=$(lab_domid $name)
    xenlab-probe offer "$id" "/run/lab/offer-$name.txt" 90 > "/run/lab/offer-$name.log" 2>&1 &
    echo $! > "/run/lab/offer-$name.pid"
    i=0; until [ -s "/run/lab/offer-$name.txt" ] || [ $i -gt 50 ]; do sleep 0.1; i=$((i+1)); done
    gref=$(sed -n 's/.*gref=\([0-9]*\).*/\1/p' "/run/lab/offer-$name.txt")
    port=$(sed -n 's/.*port=\([0-9]*\).*/\1/p' "/run/lab/offer-$name.txt")
    xenstore-write "/lab/offer/$name/gref" "$gref" "/lab/offer/$name/port" "$port"
    lab_share_readable "/lab/offer/$name" "$id"
    lab_share_readable "/lab/offer/$name/gref" "$id"
    lab_share_readable "/lab/offer/$name/port" "$id"
done
xenstore-write /lab/ready 1
lab_share_readable /lab/ready "$D1" "$D2"
lab_log "keys and grants offered"

# Map each domU's grant when it appears (the frontend -> backend direction).
fail=0
for name in labU1 labU2; do
    id=$(lab_domid $name); i=0
    until g=$(xenstore-read "/local/domain/$id/data/gref" 2>/dev/null); do
        i=$((i+1)); [ $i -gt 240 ] && break; sleep 0.5
    done
    p=$(xenstore-read "/local/domain/$id/data/port" 2>/dev/null)
    if [ -n "$g" ] && [ -n "$p" ]; then
        xenlab-probe map "$id" "$g" "$p" || { lab_log "map of $name's grant FAILED"; fail=1; }
    else
        lab_log "$name never offered a grant"; fail=1
    fi
done
for name in labU1 labU2; do
    r=$(lab_wait_result $name 120)
    lab_log "$name result: $r"
    [ "$r" = ok ] || fail=1
    wait "$(cat /run/lab/offer-$name.pid)" || { lab_log "offer to $name FAILED"; fail=1; }
    cat "/run/lab/offer-$name.log"
    lab_ack $name
done
lab_wait_gone labU1
lab_wait_gone labU2
exit $fail

# split scenario, dom0 side (sourced by init-dom0.sh; lab-lib.sh loaded). Needs on PATH:
# vrdma-backend, vrdmactl (backend crate) and, in the domUs, vrdma-guest (tests crate).
fail=0
RUST_LOG=info vrdma-backend > /run/lab/backend.log 2>&1 &
BACKEND=$!
lab_start_domU labU1 || exit 1
lab_start_domU labU2 || exit 1
D1=$(lab_domid labU1); D2=$(lab_domid labU2)
for d in $D1 $D2; do
    vrdmactl attach "$d" --timeout 60 || { lab_log "vrdmactl attach $d FAILED"; fail=1; }
done
vrdmactl list
xenstore-write /lab/ready 1
lab_share_readable /lab "$D1" "$D2"
lab_share_readable /lab/ready "$D1" "$D2"

# Relay a key from one domU's data/ to the other as /lab/relay/<key>/<from> (domUs cannot read
# each other's directories): endpoints per mode, then labU1's "done" so labU2 keeps its QP until
# labU1 has all its completions.
relay() {
    from=$1; to=$2; key=$3
    i=0
    until v=$(xenstore-read "/local/domain/$(lab_domid $from)/data/$key" 2>/dev/null); do
        i=$((i+1)); [ $i -gt 600 ] && { lab_log "no $key from $from"; return 1; }
        sleep 0.5
    done
    xenstore-write "/lab/relay/$key/$from" "$v"
    lab_share_readable "/lab/relay/$key/$from" "$(lab_domid $to)"
    lab_log "relayed $from's $key to $to: $v"
}
for mode in bypass mediated; do
    relay labU1 labU2 vrdma-ep-$mode || fail=1
    relay labU2 labU1 vrdma-ep-$mode || fail=1
    relay labU1 labU2 vrdma-done-$mode || fail=1
done
# labU2's process is killed while holding resources: its counters must come back to zero.
relay labU2 labU1 vrdma-killed || fail=1
i=0
while :; do
    held=$(xenstore-read "/local/domain/0/vrdma-stats/$D2/0/channels" 2>/dev/null)
    [ "$held" = 0 ] && break
    i=$((i+1)); [ $i -gt 120 ] && { lab_log "labU2's killed process not reclaimed (channels=$held)"; fail=1; break; }
    sleep 0.5
done
for k in channels pds mrs mr-pages cqs qps; do
    v=$(xenstore-read "/local/domain/0/vrdma-stats/$D2/0/$k" 2>/dev/null)
    [ "$v" = 0 ] || { lab_log "after the kill, stats/$k = '$v'"; fail=1; }
done
lab_log "labU2's killed process reclaimed: $(vrdmactl stats "$D2" | tr -s ' ' | tr '\n' ';')"
# Only now may the domUs open channels again (a new channel would count in stats/channels).
xenstore-write /lab/reclaim-checked 1
lab_share_readable /lab/reclaim-checked "$D1" "$D2"

# The backend killed with SIGKILL under traffic (labU1 WRITEs in a loop, labU2 waits), then
# started again: both must see "device lost" (not hang), reopen, reconnect and verify data.
wait_key() { # NAME KEY TIMEOUT_S: waits for the domU's data/KEY (polled every 0.1 s)
    i=0
    until xenstore-read "/local/domain/$(lab_domid $1)/data/$2" >/dev/null 2>&1; do
        i=$((i+1)); [ $i -gt $(($3 * 10)) ] && { lab_log "no $2 from $1 in $3 s"; return 1; }
        sleep 0.1
    done
}
relay labU1 labU2 vrdma-ep-restart || fail=1
relay labU2 labU1 vrdma-ep-restart || fail=1
for n in labU1 labU2; do wait_key $n vrdma-traffic 300 || fail=1; done
sleep 1
t0=$(lab_up)
kill -9 "$BACKEND"
wait "$BACKEND" 2>/dev/null
lab_log "vrdma-backend killed (SIGKILL) under traffic"
for n in labU1 labU2; do
    # TCG time: the design's "about a second" is for real hardware; 30 s only guards a hang.
    if wait_key $n vrdma-lost 30; then
        lab_log "$n saw device lost $(awk "BEGIN { print $(lab_up) - $t0 }") s after the kill"
    else
        lab_log "$n did not see device lost: hung"; fail=1
    fi
done
echo "---- the killed backend's log ----"; tail -n 20 /run/lab/backend.log
RUST_LOG=info vrdma-backend >> /run/lab/backend.log 2>&1 &
BACKEND=$!
xenstore-write /lab/restarted 1
lab_share_readable /lab/restarted "$D1" "$D2"
lab_log "vrdma-backend started again"
relay labU1 labU2 vrdma-ep-again || fail=1
relay labU2 labU1 vrdma-ep-again || fail=1
relay labU1 labU2 vrdma-done-again || fail=1
for name in labU1 labU2; do
    r=$(lab_wait_result $name 300)
    lab_log "$name result: $r"
    [ "$r" = ok ] || fail=1
done
vrdmactl stats || fail=1
for d in $D1 $D2; do
    vrdmactl detach "$d" --timeout 60 || { lab_log "vrdmactl detach $d FAILED"; fail=1; }
done
vrdmactl list
for name in labU1 labU2; do lab_ack $name; done
lab_wait_gone labU1
lab_wait_gone labU2
kill "$BACKEND"
wait "$BACKEND" || { lab_log "vrdma-backend exited with an error"; fail=1; }
echo "---- vrdma-backend log ----"; tail -n 60 /run/lab/backend.log
grep -q -i "panic" /run/lab/backend.log && { lab_log "backend panicked"; fail=1; }
exit $fail

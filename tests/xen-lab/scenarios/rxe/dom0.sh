# rxe scenario, dom0 side (sourced by init-dom0.sh; lab-lib.sh loaded): the verbs device on
# Soft-RoCE. Needs on PATH: vrdma-backend, vrdmactl, verbs_device (backend's test binary) and,
# in the domUs, vrdma-guest. rdma-core's tools are the image's, in /usr/lib/lab-rdma.
fail=0
R=/usr/lib/lab-rdma    # iproute2's ip by full path: busybox's ip applet wins otherwise
while read -r m; do insmod "/lib/modules/$m" 2>/dev/null; done < /etc/lab-rdma-modules
$R/ip link set lo up && $R/ip addr add 10.77.0.1/24 dev dummy0 && $R/ip link set dummy0 up
$R/rdma link add rxe0 type rxe netdev dummy0 || { lab_log "rdma link add rxe0 FAILED"; exit 1; }
lab_log "rxe0: $($R/rdma link show | tr '\n' ' ')"

# `rdma resource show`'s summary of rxe0: "pd N cq N qp N cm_id N mr N ...".
res_count() { $R/rdma resource show | sed -n "s/.* $1 \([0-9]*\) .*/\1/p" | head -n1; }
res_line() { $R/rdma resource show | tr -s ' ' | tr '\n' ' '; }
# stats KEY DOMID: the backend's published counter of the domain's device 0.
stats() { xenstore-read "/local/domain/0/vrdma-stats/$2/0/$1" 2>/dev/null; }

# The backend's tests on the real device (they print NOT RUN and pass when they find none:
# here that is a failure). They run while the domUs boot.
( VRDMA_TEST_IBDEV=rxe0 timeout 300 verbs_device --test-threads=1 > /run/lab/vd.log 2>&1
  echo $? > /run/lab/vd.rc ) &
VD=$!

RUST_LOG=info vrdma-backend --device verbs:rxe0 > /run/lab/backend.log 2>&1 &
BACKEND=$!
lab_start_domU labU1 320 || exit 1
lab_start_domU labU2 320 || exit 1
D1=$(lab_domid labU1); D2=$(lab_domid labU2)
for d in $D1 $D2; do
    vrdmactl attach "$d" --timeout 60 || { lab_log "vrdmactl attach $d FAILED"; fail=1; }
done
xenstore-write /lab/ready 1
lab_share_readable /lab "$D1" "$D2"
lab_share_readable /lab/ready "$D1" "$D2"

wait $VD
sed 's/^/  verbs_device: /' /run/lab/vd.log
if [ "$(cat /run/lab/vd.rc)" != 0 ] || grep -q 'NOT RUN' /run/lab/vd.log ||
    ! grep -q 'test result: ok' /run/lab/vd.log; then
    lab_log "verbs_device tests on rxe0 FAILED (rc $(cat /run/lab/vd.rc))"; fail=1
else
    lab_log "verbs_device tests on rxe0 passed: $(grep 'test result' /run/lab/vd.log)"
fi
lab_log "rdma resources with the backend idle: $(res_line)"

# Relay a key from one domU's data/ to the other as /lab/relay/<key>/<from> (domUs cannot read
# each other's directories).
wait_key() { # NAME KEY TIMEOUT_S: waits for the domU's data/KEY (polled every 0.1 s)
    i=0
    until xenstore-read "/local/domain/$(lab_domid $1)/data/$2" >/dev/null 2>&1; do
        i=$((i+1)); [ $i -gt $(($3 * 10)) ] && { lab_log "no $2 from $1 in $3 s"; return 1; }
        sleep 0.1
    done
}
relay() {
    from=$1; to=$2; key=$3
    wait_key "$from" "$key" 300 || return 1
    v=$(xenstore-read "/local/domain/$(lab_domid $from)/data/$key")
    xenstore-write "/lab/relay/$key/$from" "$v"
    lab_share_readable "/lab/relay/$key/$from" "$(lab_domid $to)"
    lab_log "relayed $from's $key to $to: $v"
}
# Zero-copy: both domains moved payload (bytes > 0) and the backend copied none of it.
zero_copy() {
    for d in $D1 $D2; do
        i=0
        # Counters are republished every 2 s: wait for the traffic to show.
        while [ "$(stats bytes $d)" = 0 ] || [ -z "$(stats bytes $d)" ]; do
            i=$((i+1)); [ $i -gt 100 ] && break
            sleep 0.1
        done
        b=$(stats bytes $d); c=$(stats copied-bytes $d)
        if [ -n "$b" ] && [ "$b" != 0 ] && [ "$c" = 0 ]; then
            lab_log "zero-copy $1, domain $d: bytes $b, copied-bytes $c"
        else
            lab_log "zero-copy $1, domain $d FAILED: bytes '$b', copied-bytes '$c'"; fail=1
        fi
    done
}

# 1. Guest to guest through rxe0, bypass then mediated: READ, WRITE, SEND, data verified.
for mode in bypass mediated; do
    relay labU1 labU2 vrdma-ep-$mode || fail=1
    relay labU2 labU1 vrdma-ep-$mode || fail=1
    relay labU1 labU2 vrdma-done-$mode || fail=1
done
zero_copy "after the bypass and mediated rounds"
vrdmactl stats "$D1" | sed 's/^/  stats: /'

# 2. labU2's process killed while labU1 WRITEs into its memory.
relay labU1 labU2 vrdma-ep-victim || fail=1
relay labU2 labU1 vrdma-ep-victim || fail=1
wait_key labU2 vrdma-victim-ready 300 || fail=1
wait_key labU1 vrdma-looping 300 || fail=1
VQP=$(xenstore-read "/lab/relay/vrdma-ep-victim/labU2" | sed -n 's|^[^/]*/\([0-9]*\) .*|\1|p')
mr0=$(res_count mr); pd0=$(res_count pd); qp0=$(res_count qp)
lab_log "labU1 WRITE-looping into labU2 (labU2's QP $VQP): $(res_line)"
$R/rdma resource show qp lqpn "$VQP" | grep -q "lqpn $VQP" ||
    { lab_log "labU2's QP $VQP not in rdma resource show qp"; fail=1; }
relay labU1 labU2 vrdma-looping || fail=1
wait_key labU2 vrdma-killed 300 || fail=1
i=0
until [ "$(stats channels $D2)" = 0 ]; do
    i=$((i+1)); [ $i -gt 600 ] && { lab_log "labU2's killed process not reclaimed (channels=$(stats channels $D2))"; fail=1; break; }
    sleep 0.1
done
for k in channels pds mrs mr-pages cqs qps; do
    v=$(stats $k $D2)
    [ "$v" = 0 ] || { lab_log "after the kill, labU2's stats/$k = '$v'"; fail=1; }
done
# The HCA's objects: labU2's MR, PD and QP are gone (its CQ goes when the relay next wakes;
# not counted); labU1 still holds its own.
i=0
while [ "$(res_count mr)" != $((mr0 - 1)) ] || [ "$(res_count pd)" != $((pd0 - 1)) ] ||
    [ "$(res_count qp)" != $((qp0 - 1)) ]; do
    i=$((i+1)); [ $i -gt 100 ] && break
    sleep 0.1
done
mr1=$(res_count mr); pd1=$(res_count pd); qp1=$(res_count qp)
if [ "$mr1" = $((mr0 - 1)) ] && [ "$pd1" = $((pd0 - 1)) ] && [ "$qp1" = $((qp0 - 1)) ] &&
    ! $R/rdma resource show qp lqpn "$VQP" | grep -q "lqpn $VQP"; then
    lab_log "labU2's HCA resources released: mr $mr0 -> $mr1, pd $pd0 -> $pd1, qp $qp0 -> $qp1, QP $VQP gone"
else
    lab_log "labU2's HCA resources NOT released: mr $mr0 -> $mr1, pd $pd0 -> $pd1, qp $qp0 -> $qp1; $(res_line)"
    $R/rdma resource show qp | sed 's/^/  qp: /'
    fail=1
fi
if wait_key labU1 vrdma-peer-failed 120; then
    lab_log "labU1's QP failed: $(xenstore-read "/local/domain/$D1/data/vrdma-peer-failed")"
else
    fail=1
fi
xenstore-write /lab/victim-checked 1
lab_share_readable /lab/victim-checked "$D1" "$D2"

# 3. The backend killed with SIGKILL under traffic, then started again on rxe0: both guests see
# "device lost", reopen, reconnect and verify SEND and WRITE data.
relay labU1 labU2 vrdma-ep-restart || fail=1
relay labU2 labU1 vrdma-ep-restart || fail=1
zero_copy "before the backend's kill (labU1 self-talk and the victim step included)"
lab_log "the backend's pinned pages (HCA registrations): $(grep -E 'VmPin' /proc/$BACKEND/status | tr -s ' \t' ' ')"
for n in labU1 labU2; do wait_key $n vrdma-traffic 300 || fail=1; done
sleep 1
t0=$(lab_up)
kill -9 "$BACKEND"
wait "$BACKEND" 2>/dev/null
lab_log "vrdma-backend killed (SIGKILL) under traffic: $(res_line)"
# The kill must not leave the kernel's page tables to tear down gntdev mappings that an HCA
# registration still pinned (the registration keeper releases them first: backend/src/device/
# verbs/keeper.rs). Without it dom0 logs "BUG: Bad page map ... file:gntdev" for every page of
# every registered MR and the new backend's reg_mr fails (ENOMEM: NoResources in the guest).
i=0
while [ "$(res_count mr)" != 0 ] && [ $i -lt 100 ]; do i=$((i+1)); sleep 0.1; done
if dmesg | grep -q -E 'Bad page map|Bad rss-counter'; then
    lab_log "the backend's death corrupted dom0's page tables: $(dmesg | grep -c 'Bad page map') bad page maps, $(dmesg | grep -c 'Bad rss-counter') bad rss counters"
    dmesg | grep -E 'Bad page map|Bad rss-counter' | tail -n 3
    fail=1
else
    lab_log "no bad page map in dom0 after the kill; registrations released: $(res_line)"
fi
for n in labU1 labU2; do
    if wait_key $n vrdma-lost 30; then
        lab_log "$n saw device lost $(awk "BEGIN { print $(lab_up) - $t0 }") s after the kill"
    else
        lab_log "$n did not see device lost: hung"; fail=1
    fi
done
echo "---- the killed backend's log ----"; tail -n 20 /run/lab/backend.log
RUST_LOG=info vrdma-backend --device verbs:rxe0 > /run/lab/backend2.log 2>&1 &
BACKEND=$!
xenstore-write /lab/restarted 1
lab_share_readable /lab/restarted "$D1" "$D2"
lab_log "vrdma-backend started again"
relay labU1 labU2 vrdma-ep-again || fail=1
relay labU2 labU1 vrdma-ep-again || fail=1
relay labU1 labU2 vrdma-done-again || fail=1
grep -E 'WARN|ERROR' /run/lab/backend2.log | sed 's/^/  restarted backend: /'
for name in labU1 labU2; do
    r=$(lab_wait_result $name 300)
    lab_log "$name result: $r"
    [ "$r" = ok ] || fail=1
done
zero_copy "after the restart (the new backend's counters)"
lab_log "the new backend's pinned pages: $(grep -E 'VmPin' /proc/$BACKEND/status | tr -s ' \t' ' ')"
echo "---- the restarted backend's log ----"; tail -n 30 /run/lab/backend2.log
cp /run/lab/backend.log /run/lab/backend2.log /mnt/lab/out/ 2>/dev/null
if [ $fail != 0 ]; then
    echo "---- dmesg ----"; dmesg | tail -n 40
fi
for d in $D1 $D2; do
    vrdmactl detach "$d" --timeout 60 || { lab_log "vrdmactl detach $d FAILED"; fail=1; }
done
for name in labU1 labU2; do lab_ack $name; done
lab_wait_gone labU1
lab_wait_gone labU2
kill "$BACKEND"
wait "$BACKEND" || { lab_log "vrdma-backend exited with an error"; fail=1; }
lab_log "after the backend's stop: $(res_line)"
grep -q -i "panic" /run/lab/backend.log /run/lab/backend2.log && { lab_log "backend panicked"; fail=1; }
exit $fail

# verbsping (scratch): stock rping on rxe0 in dom0 <-> vrdma-rping in labU1 through
# `vrdma-backend --device verbs:rxe0` (rdma_cm on librdmacm in the backend), both directions.
fail=0
R=/usr/lib/lab-rdma
ADDR=10.77.0.1
TO=150
while read -r m; do
    [ -n "$m" ] || continue
    insmod "/lib/modules/$m" 2>/tmp/insmod.err || { lab_log "insmod $m FAILED: $(cat /tmp/insmod.err)"; exit 1; }
done < /etc/lab-rdma-modules
$R/ip link set lo up && $R/ip addr add $ADDR/24 dev dummy0 && $R/ip link set dummy0 up || { lab_log "dummy0 FAILED"; exit 1; }
$R/rdma link add rxe0 type rxe netdev dummy0 || { lab_log "rxe0 FAILED"; exit 1; }
lab_log "rxe0 on dummy0 $ADDR"
# 1. backend/tests/verbs_cm.rs on rxe0.
VRDMA_TEST_IBDEV=rxe0 RUST_BACKTRACE=1 timeout 300 /mnt/lab/bin/verbs_cm --test-threads=1 > /tmp/verbs_cm.out 2>&1
rc=$?
sed 's/^/  verbs_cm: /' /tmp/verbs_cm.out
lab_log "verbs_cm exit $rc"
[ "$rc" = 0 ] || fail=1
# 2. stock rping <-> vrdma-rping through vrdma-backend --device verbs:rxe0.
# listening PORT: waits (up to 30 s) for an rdma_cm listener on PORT.
listening() {
    i=0
    until $R/rdma res show cm_id 2>/dev/null | grep LISTEN | grep -q ":$1 "; do
        i=$((i+1)); [ $i -gt 150 ] && { $R/rdma res show cm_id | sed 's/^/  cm_id: /'; return 1; }
        sleep 0.2
    done
}
BACKEND=
D1=
put() { xenstore-write "$1" "$2" && lab_share_readable "$1" "$D1"; }
STEP=0
vstep() { STEP=$((STEP+1)); put "/lab/step/$STEP" "$*"; put /lab/cur "$STEP"; }
vwait() {
    i=0
    while :; do
        d=$(xenstore-read "/local/domain/$D1/data/done" 2>/dev/null)
        case $d in "$STEP "*) break ;; esac
        i=$((i+1)); [ $i -gt $((TO * 5 + 300)) ] && { lab_log "labU1 never finished step $STEP"; VRC=timeout; VPINGS=0; return 1; }
        xenstore-exists "/local/domain/$D1" || { lab_log "labU1 died"; VRC=died; VPINGS=0; return 1; }
        sleep 0.2
    done
    set -- $d; VRC=$2; VPINGS=$3
}
# labU1 is domain 1: it may reach 10.77.0.1 only and listen on 7175 only ([cm] policy).
printf '[cm.domain.1]\nallowed-peers = ["10.77.0.1/32"]\nallowed-ports = [7175]\n' > /run/lab/backend.toml
RUST_LOG=info vrdma-backend --device verbs:rxe0 --config /run/lab/backend.toml > /run/lab/backend.log 2>&1 &
BACKEND=$!
i=0
until grep -q 'page budgets' /run/lab/backend.log 2>/dev/null; do
    i=$((i+1)); [ $i -gt 300 ] && { lab_log "vrdma-backend did not start"; fail=1; break; }
    kill -0 "$BACKEND" 2>/dev/null || { lab_log "vrdma-backend exited: $(tail -n 5 /run/lab/backend.log)"; fail=1; break; }
    sleep 0.2
done
grep -E 'rdma_cm|verbs' /run/lab/backend.log | sed 's/^/  backend: /'
VOPT="-C 5 -S 64 -v -V -t $((TO - 20))"
if [ $fail = 0 ]; then
    lab_start_domU labU1 320 || fail=1
    D1=$(lab_domid labU1)
    vrdmactl attach "$D1" --timeout 60 || { lab_log "vrdmactl attach $D1 FAILED"; fail=1; }
    xenstore-write /lab 1 && lab_share_readable /lab "$D1"
    put /lab/ready 1
fi
if [ $fail = 0 ]; then
    # vrdma initiator: stock rping -s on rxe0, vrdma-rping -c in labU1.
    port=7174
    timeout $TO $R/rping -s -v -V -a $ADDR -p $port -C 5 -S 64 > /run/lab/server.log 2>&1 &
    sp=$!
    listening $port || lab_log "rping -s: no listener seen on $port"
    vstep vrdma-rping -c -a $ADDR -p $port $VOPT
    vwait
    wait $sp; src=$?
    seen=$(grep -c 'server ping data' /run/lab/server.log)
    lab_log "verbs-client: rping -s (rxe0) rc=$src saw $seen pings; vrdma-rping -c (labU1) rc=$VRC printed $VPINGS pings"
    sed 's/^/  rping -s: /' /run/lab/server.log | tail -n 8
    [ "$src" = 0 ] && [ "$seen" = 5 ] && [ "$VRC" = 0 ] && [ "$VPINGS" = 5 ] || fail=1
    # vrdma responder: vrdma-rping -s in labU1 (a listener of the backend on rxe0), stock rping -c.
    port=7175
    vstep vrdma-rping -s -a $ADDR -p $port $VOPT
    listening $port || lab_log "vrdma-rping -s: no listener seen on $port"
    timeout $TO $R/rping -c -v -V -a $ADDR -p $port -C 5 -S 64 > /run/lab/client.log 2>&1
    crc=$?
    vwait
    seen=$(grep -c '^ping data' /run/lab/client.log)
    lab_log "verbs-server: rping -c (rxe0) rc=$crc verified $seen pings; vrdma-rping -s (labU1) rc=$VRC printed $VPINGS pings"
    sed 's/^/  rping -c: /' /run/lab/client.log | tail -n 8
    [ "$crc" = 0 ] && [ "$seen" = 5 ] && [ "$VRC" = 0 ] && [ "$VPINGS" = 5 ] || fail=1
    # The [cm] policy on the verbs device: a peer outside allowed-peers and a port outside
    # allowed-ports are refused (NotPermitted); the step succeeds iff the tool failed saying so.
    vstep "vrdma-rping -c -a 10.77.0.9 -p 7174 -C 1 -t 20 2>&1 | tee /tmp/p.out; grep -q 'allowed-peers' /tmp/p.out && ! grep -q 'ping data' /tmp/p.out"
    vwait
    lab_log "verbs-policy-peer: vrdma-rping -c to 10.77.0.9 (not an allowed peer of labU1): step rc=$VRC (0 = refused by policy)"
    [ "$VRC" = 0 ] || fail=1
    vstep "vrdma-rping -s -a 10.77.0.1 -p 7176 -C 1 -t 20 2>&1 | tee /tmp/p.out; grep -q 'allowed-ports' /tmp/p.out && ! grep -q 'listening on' /tmp/p.out"
    vwait
    lab_log "verbs-policy-port: vrdma-rping -s on port 7176 (not an allowed port of labU1): step rc=$VRC (0 = refused by policy)"
    [ "$VRC" = 0 ] || fail=1
fi
if [ -n "$D1" ]; then
    put /lab/cur end
    r=$(lab_wait_result labU1 120)
    lab_log "labU1 result: $r"
    [ "$r" = ok ] || fail=1
    vrdmactl detach "$D1" --timeout 60 || fail=1
    lab_ack labU1
    lab_wait_gone labU1
fi
if [ -n "$BACKEND" ]; then
    kill "$BACKEND"; wait "$BACKEND" || { lab_log "vrdma-backend exited with an error"; fail=1; }
    grep -iE 'warn|error|panic|rdma_cm|connect' /run/lab/backend.log | tail -n 30 | sed 's/^/  backend: /'
    grep -q -i panic /run/lab/backend.log && { lab_log "backend panicked"; fail=1; }
fi
$R/rdma resource show 2>&1 | sed 's/^/  rdma: /'
exit $fail

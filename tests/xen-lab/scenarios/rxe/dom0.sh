# rxe scenario, dom0 side (sourced by init-dom0.sh; lab-lib.sh loaded): the verbs device on
# Soft-RoCE. Needs on PATH: vrdma-backend, vrdmactl, verbs_device and verbs_cm (backend's test
# binaries) and, in the domUs, vrdma-guest and vrdma-rping. rdma-core's tools are the image's,
# in /usr/lib/lab-rdma.
fail=0
R=/usr/lib/lab-rdma    # iproute2's ip by full path: busybox's ip applet wins otherwise
ADDR=10.77.0.1         # rxe0's address (dummy0): the backend's rdma_cm address too
TO=150                 # bound of one stock-tool step (dom0 and guest ends)
while read -r m; do insmod "/lib/modules/$m" 2>/dev/null; done < /etc/lab-rdma-modules
$R/ip link set lo up && $R/ip addr add $ADDR/24 dev dummy0 && $R/ip link set dummy0 up
$R/rdma link add rxe0 type rxe netdev dummy0 || { lab_log "rdma link add rxe0 FAILED"; exit 1; }
lab_log "rxe0: $($R/rdma link show | tr '\n' ' ')"

# A bridge to the domUs (netback/netfront, modules from the share as in the perf scenario):
# ibv_rc_pingpong exchanges QP numbers, PSNs and GIDs over TCP before it moves its QP to RTR.
# dom0 is 10.0.0.1 on xenbr0, labU1 10.0.0.11, labU2 10.0.0.12 (lab-internal addresses).
NET=0
if [ -f /mnt/lab/bin/xen-netback.ko ]; then
    if lab_bridge; then
        NET=1
    else
        lab_log "the bridge to the domUs FAILED"
    fi
else
    lab_log "no xen-netback.ko in the share: the ibv_rc_pingpong steps will NOT run"
fi

# `rdma resource show`'s summary of rxe0: "pd N cq N qp N cm_id N mr N ...".
res_count() { $R/rdma resource show | sed -n "s/.* $1 \([0-9]*\) .*/\1/p" | head -n1; }
res_line() { $R/rdma resource show | tr -s ' ' | tr '\n' ' '; }
# stats KEY DOMID: the backend's published counter of the domain's device 0.
stats() { xenstore-read "/local/domain/0/vrdma-stats/$2/0/$1" 2>/dev/null; }

# The backend's tests on the real device (they print NOT RUN and pass when they find none:
# here that is a failure). They run while the domUs boot.
# verbs_cm: two channels' QPs connected through rdma_cm on rxe0 (SEND/WRITE/READ verified),
# refused and rejected connects, a disallowed peer refused both ways.
( VRDMA_TEST_IBDEV=rxe0 timeout 300 verbs_device --test-threads=1 > /run/lab/vd.log 2>&1
  echo $? > /run/lab/vd.rc
  VRDMA_TEST_IBDEV=rxe0 timeout 300 verbs_cm --test-threads=1 > /run/lab/vcm.log 2>&1
  echo $? > /run/lab/vcm.rc ) &
VD=$!

# labU1 is domain 1 (the first domU): it may reach $ADDR only, and listen on 7175 and
# perftest's 18515 only ([cm] policy; the guest-to-guest rounds pair QPs by number, no CM).
printf '[cm.domain.1]\nallowed-peers = ["%s/32"]\nallowed-ports = [7175, 18515]\n' $ADDR > /run/lab/backend.toml
BLOG=/run/lab/backend.log
RUST_LOG=info vrdma-backend --device verbs:rxe0 --config /run/lab/backend.toml > $BLOG 2>&1 &
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

[ "$D1" = 1 ] || { lab_log "labU1 is domain $D1, not 1: the [cm.domain.1] policy misses it"; fail=1; }

wait $VD
for t in vd:verbs_device vcm:verbs_cm; do
    f=${t%%:*}; n=${t#*:}
    sed "s/^/  $n: /" /run/lab/$f.log
    if [ "$(cat /run/lab/$f.rc)" != 0 ] || grep -q 'NOT RUN' /run/lab/$f.log ||
        ! grep -q 'test result: ok' /run/lab/$f.log; then
        lab_log "$n tests on rxe0 FAILED (rc $(cat /run/lab/$f.rc))"; fail=1
    else
        lab_log "$n tests on rxe0 passed: $(grep 'test result' /run/lab/$f.log)"
    fi
done
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
zero_copy() { zero_copy_dom "$1" $D1 $D2; }
zero_copy_dom() {
    what=$1; shift
    for d in "$@"; do
        i=0
        # Counters are republished every 2 s: wait for the traffic to show.
        while [ "$(stats bytes $d)" = 0 ] || [ -z "$(stats bytes $d)" ]; do
            i=$((i+1)); [ $i -gt 100 ] && break
            sleep 0.1
        done
        b=$(stats bytes $d); c=$(stats copied-bytes $d)
        if [ -n "$b" ] && [ "$b" != 0 ] && [ "$c" = 0 ]; then
            lab_log "zero-copy $what, domain $d: bytes $b, copied-bytes $c"
        else
            lab_log "zero-copy $what, domain $d FAILED: bytes '$b', copied-bytes '$c'"; fail=1
        fi
    done
}

# 0. labU1 against stock rdma-core tools on rxe0 in dom0 (unmodified, /usr/lib/lab-rdma):
# dom0 writes a command line to /lab/steps/labU1/N and N to /lab/steps/labU1/cur; labU1 runs
# it and answers data/done = "N RC PINGS". labU2 waits in the same loop, without a channel,
# until dom0 tells it "end" after these steps (the backend is restarted meanwhile).
put() { xenstore-write "$1" "$2" && lab_share_readable "$1" "$D1" "$D2"; }
STEP=0
vstep() { STEP=$((STEP+1)); put "/lab/steps/labU1/$STEP" "$*"; put /lab/steps/labU1/cur "$STEP"; }
vwait() {
    i=0
    while :; do
        d=$(xenstore-read "/local/domain/$D1/data/done" 2>/dev/null)
        case $d in "$STEP "*) break ;; esac
        i=$((i+1)); [ $i -gt $((TO * 5 + 300)) ] && { lab_log "labU1 never finished step $STEP"; VRC=timeout; VPINGS=0; return 1; }
        sleep 0.2
    done
    set -- $d; VRC=$2; VPINGS=$3
}
# listening PORT: waits (up to 30 s) for an rdma_cm listener on PORT.
listening() {
    i=0
    until $R/rdma res show cm_id 2>/dev/null | grep LISTEN | grep -q ":$1 "; do
        i=$((i+1)); [ $i -gt 150 ] && { $R/rdma res show cm_id | sed 's/^/  cm_id: /'; return 1; }
        sleep 0.2
    done
}
# The [cm] policy from the guest: a peer outside allowed-peers and a port outside
# allowed-ports are refused (NotPermitted); the step succeeds iff the tool failed saying so.
vstep "vrdma-rping -c -a 10.77.0.9 -p 7174 -C 1 -t 20 2>&1 | tee /tmp/p.out; grep -q 'allowed-peers' /tmp/p.out && ! grep -q 'ping data' /tmp/p.out"
vwait
lab_log "policy-peer: vrdma-rping -c to 10.77.0.9 (not an allowed peer of labU1): step rc=$VRC (0 = refused by policy)"
[ "$VRC" = 0 ] || fail=1
vstep "vrdma-rping -s -a $ADDR -p 7176 -C 1 -t 20 2>&1 | tee /tmp/p.out; grep -q 'allowed-ports' /tmp/p.out && ! grep -q 'listening on' /tmp/p.out"
vwait
lab_log "policy-port: vrdma-rping -s on port 7176 (not an allowed port of labU1): step rc=$VRC (0 = refused by policy)"
[ "$VRC" = 0 ] || fail=1
# The guest sees rxe0's real GID table (QueryGid): Debian's ibv_devinfo -v through vrdma-exec
# lists as many GIDs as rxe0 has non-zero ones, GID 0 the backend's address ::ffff:10.77.0.1
# (not rxe0's index 0, the default link-local GID), a link-local one after it, RoCE v2.
NGIDS=$(cat /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null | grep -vc '^0000:0000:0000:0000:0000:0000:0000:0000$')
vstep "vrdma-exec -- ibv_devinfo -v > /tmp/d.out 2>&1; r=\$?; grep -F -e 'GID[' -e hca_id /tmp/d.out; [ \$r = 0 ] && [ \$(grep -cF 'GID[' /tmp/d.out) = $NGIDS ] && grep -F 'GID[  0]' /tmp/d.out | grep -qF '::ffff:10.77.0.1, RoCE v2' && grep -F 'GID[' /tmp/d.out | grep -qF 'fe80:'"
vwait
lab_log "guest-gids: vrdma-exec -- ibv_devinfo -v (labU1): step rc=$VRC (0 = $NGIDS GIDs as rxe0 has, GID 0 ::ffff:10.77.0.1 RoCE v2, a link-local one after it); rxe0: $(cat /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null | grep -v '^0000:0000:0000:0000:0000:0000:0000:0000$' | tr '\n' ' ')"
[ "$VRC" = 0 ] || fail=1
# perftest over rdma_cm (-R), unmodified, SEND, WRITE and READ: the servers in dom0 with the
# guest (Debian's tool through `vrdma-exec`, libvrdma_verbs.so preloaded) as client, then the
# guest as server and dom0's tool as client. The same send_lat and write_bw also run natively,
# both ends in dom0 on rxe0: the guest's figure over the native one is the overhead (TCG: only
# the ratio means anything). perftest -R connects twice (its own exchange, then the test QPs);
# a client whose second connect comes before the server listens again fails (docs/verbs.md):
# dom0's stock clients run with guest/connect-delay.c preloaded, and a failed pair is run once
# more.
# Iterations: few. Under TCG a round trip through the relay costs a scheduling hand-off between
# the domU's and dom0's vCPUs (about 0.6 s a round trip at host load 20: 500 iterations of
# ib_send_lat did not end in 150 s); the ratio is of the same counts.
PN=20                   # iterations (latency tools)
PB=20                   # iterations of ib_write_bw (64 KiB each)
iters() { case $1 in *_bw) echo $PB ;; *) echo $PN ;; esac; }
# finite ROW1 ROW2: ROW1 unless it has no number (perftest prints inf when its cycles-to-usec
# sampling fails, as it does now and then under TCG on either end), else ROW2.
finite() { case "$1" in *inf*|*nan*|"") echo "$2" ;; *) echo "$1" ;; esac; }
# srow_or TOOL ROW: ib_read_lat's passive end prints no result row (only the reader measures).
srow_or() { [ "$1" = ib_read_lat ] && echo "(none: the passive end)" || echo "$2"; }
# row FILE: perftest's result row (the line after "#bytes"), blanks squeezed.
row() { sed -n '/^ *#bytes/{n;p;q}' "$1" | tr -s ' \t' ' ' | sed 's/^ //'; }
# figure TOOL ROW: t_typical (latency tools, usec) or BW average (bandwidth tools, MB/s).
figure() { case $1 in *_bw) echo "$2" | awk '{print $4}' ;; *) echo "$2" | awk '{print $5}' ;; esac; }
pt_native() { # TOOL: both ends in dom0 on rxe0; sets NROW
    tool=$1; n=$(iters $tool); NROW=
    for try in 1 2; do
        timeout 120 $R/$tool -R -F -d rxe0 -n $n -p 18516 > /run/lab/pt-ns.log 2>&1 &
        sp=$!
        listening 18516
        # The client's second connect waits 3 s (guest/connect-delay.c: perftest's own race).
        LD_PRELOAD=$R/connect-delay.so timeout 120 $R/$tool -R -F -d rxe0 -n $n -p 18516 $ADDR > /run/lab/pt-nc.log 2>&1; c=$?
        wait $sp; sr=$?
        NROW=$(finite "$(row /run/lab/pt-ns.log)" "$(row /run/lab/pt-nc.log)")
        [ $c = 0 ] && [ $sr = 0 ] && [ -n "$NROW" ] && [ -n "$(row /run/lab/pt-nc.log)" ] && break
        lab_log "native $tool try $try: client rc=$c, server rc=$sr; again"
        tail -n 3 /run/lab/pt-nc.log /run/lab/pt-ns.log | sed 's/^/  /'
        NROW=
    done
    lab_log "native $tool (dom0 <-> dom0 on rxe0): server row '${NROW:-FAILED}', client row '$(row /run/lab/pt-nc.log)'"
    [ -n "$NROW" ] || fail=1
}
pt_guest_client() { # TOOL: the server in dom0, labU1 the client; sets GROW (dom0's row)
    tool=$1; n=$(iters $tool); GROW=
    for try in 1 2; do
        t0=$(lab_up)
        timeout $TO $R/$tool -R -F -d rxe0 -n $n -p 18515 > /run/lab/pt-s.log 2>&1 &
        sp=$!
        listening 18515
        vstep vrdma-exec -- $tool -R -F -n $n -p 18515 $ADDR
        vwait
        # A client that ended without its report (perftest under TCG: "Correlation coefficient
        # r^2 < 0.9, Can't produce a report") leaves the server waiting: 30 s, then it goes.
        i=0
        while kill -0 $sp 2>/dev/null && [ $i -lt 150 ]; do i=$((i+1)); sleep 0.2; done
        kill $sp 2>/dev/null
        wait $sp; sr=$?
        GROW=$(xenstore-read "/local/domain/$D1/data/row" | sed -n "s/^$STEP //p")
        [ "$GROW" = none ] && GROW=
        srow=$(srow_or $tool "$(row /run/lab/pt-s.log)")
        lab_log "stock-$tool-server: $tool -R (rxe0) rc=$sr row '$srow'; vrdma-exec -- $tool -R -c (labU1) rc=$VRC row '$GROW' ($(awk "BEGIN { print $(lab_up) - $t0 }") s)"
        # The figure: dom0's end's row, else the guest's (both measure the same ping-pong;
        # perftest's cycles-to-usec sampling fails now and then under TCG, printing "inf").
        [ $sr = 0 ] && [ "$VRC" = 0 ] && [ -n "$GROW" ] && [ -n "$srow" ] && { GROW=$(finite "$srow" "$GROW"); return 0; }
        tail -n 4 /run/lab/pt-s.log | sed 's/^/  server: /'
        GROW=
    done
    fail=1
}
pt_guest_server() { # TOOL: labU1 the server (a listener of the backend), the client in dom0
    tool=$1; n=$(iters $tool)
    for try in 1 2; do
        t0=$(lab_up)
        vstep timeout 100 vrdma-exec -- $tool -R -F -n $n -p 18515
        listening 18515
        LAB_CONNECT_DELAY_MS=5000 LD_PRELOAD=$R/connect-delay.so timeout 100 $R/$tool -R -F -d rxe0 -n $n -p 18515 $ADDR > /run/lab/pt-c.log 2>&1; c=$?
        vwait
        grow=$(xenstore-read "/local/domain/$D1/data/row" | sed -n "s/^$STEP //p")
        [ "$grow" = none ] && grow=
        grow=$(srow_or $tool "$grow")
        crow=$(row /run/lab/pt-c.log)
        lab_log "stock-$tool-client: $tool -R (rxe0) rc=$c row '$crow'; vrdma-exec -- $tool -R -s (labU1) rc=$VRC row '$grow' ($(awk "BEGIN { print $(lab_up) - $t0 }") s)"
        [ $c = 0 ] && [ "$VRC" = 0 ] && [ -n "$grow" ] && [ -n "$crow" ] && return 0
        tail -n 4 /run/lab/pt-c.log | sed 's/^/  client: /'
    done
    fail=1
}
# ratio NAME TOOL GUEST_ROW NATIVE_ROW
ratio() {
    g=$(figure $2 "$3"); nv=$(figure $2 "$4")
    # Both ends printed inf (perftest's clock sampling): no ratio (awk would read inf as 0).
    # A figure of 0 (write_bw when the guest's clock sampling failed) is none either.
    if ! usable $2 "$3" || ! usable $2 "$4"; then lab_log "RATIO $1: no figure (guest '$g', native '$nv': perftest's clock sampling failed)"; return; fi
    case $2 in
        *_bw) target=">= 0.9"; ok=$(awk "BEGIN { print ($g / $nv >= 0.9) ? \"met\" : \"missed\" }") ;;
        *) target="<= 1.2"; ok=$(awk "BEGIN { print ($g / $nv <= 1.2) ? \"met\" : \"missed\" }") ;;
    esac
    lab_log "RATIO $1: guest $g / native $nv = $(awk "BEGIN { printf \"%.2f\", $g / $nv }") (target $target: $ok)"
}
# backend_restart CONFIG LOG [CPUMASK]: the backend killed (SIGKILL, as in step 3; no channel
# is open: labU1 is between steps, labU2 has opened none yet) and started again with CONFIG,
# its threads on dom0's CPUs CPUMASK (taskset) when given; the new one takes the devices over.
backend_restart() {
    kill -9 "$BACKEND"; wait "$BACKEND" 2>/dev/null
    if [ -n "$3" ]; then
        RUST_LOG=info taskset "$3" vrdma-backend --device verbs:rxe0 --config "$1" > "$2" 2>&1 &
    else
        RUST_LOG=info vrdma-backend --device verbs:rxe0 --config "$1" > "$2" 2>&1 &
    fi
    BACKEND=$!; BLOG=$2
    i=0
    until grep -q 'watching' "$2" 2>/dev/null; do
        i=$((i+1)); [ $i -gt 300 ] && { lab_log "vrdma-backend ($1) did not start"; fail=1; return 1; }
        sleep 0.2
    done
    sleep 2
    lab_log "vrdma-backend restarted (pid $BACKEND, $1, CPUs ${3:-any}): $(grep 'verbs device open' "$2" | head -n1 | cut -c1-60)"
}
# guest_done: labU1 finished the current step.
guest_done() { case $(xenstore-read "/local/domain/$D1/data/done" 2>/dev/null) in "$STEP "*) return 0 ;; esac; return 1; }
# The isolated configuration (ratio_isolated, below): NI iterations of each tool, and the
# dom0 server of a pair, on dom0's CPU 0 with the spinning end (dom0's client, or the relay):
# ib_send_lat's sleeps on CQ events (-e; its wake-up preempts the spinner inside dom0's
# kernel, no Xen hand-off), ib_write_bw's (which has no -e: "Events feature not available on
# WRITE verb") polls only for the final exchange, at nice 19 (~1.5% of the CPU beside a
# nice-0 spinner).
NI=200
isrv() { # TOOL PORT LOG: starts the isolated pair's dom0 server; sets sp
    case $1 in
        ib_send_lat) taskset 1 timeout $TO $R/$1 -R -F -e -d rxe0 -n $NI -p $2 > $3 2>&1 & ;;
        *) sh -c "renice -n 19 -p \$\$ > /dev/null; exec taskset 1 timeout $TO $R/$1 -R -F -d rxe0 -n $NI -p $2" > $3 2>&1 & ;;
    esac
    sp=$!
}
# usable TOOL ROW: the row has a positive, finite figure (perftest's clock sampling fails
# now and then under TCG, more in a domU: "Correlation coefficient r^2 < 0.9", then inf
# latencies and 0.00 MB/s).
usable() { awk -v f="$(figure $1 "$2")" 'BEGIN { exit !(f ~ /^[0-9.]+$/ && f + 0 > 0) }'; }
# pti_native TOOL: both ends in dom0 on CPU 0 (isrv; the client busy-polls, perftest's
# default); sets NROW. A pair whose ends exit 0 passes; it is run again (3 tries in all) while
# neither end printed a usable figure (perftest's clock sampling; then RATIO says "no figure").
pti_native() {
    tool=$1; NROW=; ok=0
    for try in 1 2 3; do
        isrv $tool 18516 /run/lab/pti-ns.log
        listening 18516
        LD_PRELOAD=$R/connect-delay.so taskset 1 timeout 120 $R/$tool -R -F -d rxe0 -n $NI -p 18516 $ADDR > /run/lab/pti-nc.log 2>&1; c=$?
        wait $sp; sr=$?
        NROW=$(finite "$(row /run/lab/pti-ns.log)" "$(row /run/lab/pti-nc.log)")
        if [ $c = 0 ] && [ $sr = 0 ] && [ -n "$NROW" ]; then
            ok=1
            usable $tool "$NROW" && break
            lab_log "isolated: native $tool try $try: no usable figure (row '$NROW': perftest's clock sampling); again"
        else
            lab_log "isolated: native $tool try $try: client rc=$c, server rc=$sr, row '$NROW'; again"
            tail -n 3 /run/lab/pti-nc.log /run/lab/pti-ns.log | sed 's/^/  /'
        fi
    done
    lab_log "isolated: native $tool (dom0 <-> dom0 on rxe0, -n $NI): server row '$(row /run/lab/pti-ns.log)', client row '$(row /run/lab/pti-nc.log)'"
    [ $ok = 1 ] || fail=1
}
# pti_guest TOOL: the server in dom0 as in pti_native, labU1 the client; sets GROW; passes and
# is tried again as pti_native. While the pair runs dom0 does not poll XenStore (an exec costs
# 0.1-0.3 s of dom0's CPU under TCG): it waits for its server, looking at labU1's answer every
# 10 s only.
pti_guest() {
    tool=$1; GROW=; ok=0
    for try in 1 2 3; do
        t0=$(lab_up)
        isrv $tool 18515 /run/lab/pti-s.log
        listening 18515
        vstep vrdma-exec -- $tool -R -F -n $NI -p 18515 $ADDR
        i=0; gd=
        while kill -0 $sp 2>/dev/null; do
            sleep 1; i=$((i+1))
            [ $((i % 10)) = 0 ] || continue
            [ -z "$gd" ] && guest_done && gd=$i
            # A client that ended without its report leaves the server waiting: 30 s.
            [ -n "$gd" ] && [ $((i - gd)) -ge 30 ] && { kill $sp; break; }
        done
        wait $sp; sr=$?
        vwait
        GROW=$(xenstore-read "/local/domain/$D1/data/row" | sed -n "s/^$STEP //p")
        [ "$GROW" = none ] && GROW=
        srow=$(row /run/lab/pti-s.log)
        lab_log "isolated: $tool -R (rxe0) rc=$sr row '$srow'; vrdma-exec -- $tool -R -c (labU1) rc=$VRC row '$GROW' ($(awk "BEGIN { print $(lab_up) - $t0 }") s)"
        GROW=$(finite "$srow" "$GROW")
        if [ $sr = 0 ] && [ "$VRC" = 0 ] && [ -n "$GROW" ] && [ -n "$srow" ]; then
            ok=1
            usable $tool "$GROW" && return 0
            lab_log "isolated: guest $tool try $try: no usable figure (perftest's clock sampling); again"
        else
            tail -n 4 /run/lab/pti-s.log | sed 's/^/  server: /'
        fi
    done
    [ $ok = 1 ] || fail=1
}
# The ratios again with the relay's scheduling taken out as far as 2 emulated CPUs allow: the
# backend restarted with spin-before-sleep-us = 10 s (its relay thread polls the guests' rings
# and the HCA CQs without sleeping while a test runs: no kick, no wake-up) and its threads on
# dom0's CPU 0; dom0's two vCPUs pinned to physical CPU 0, labU1's alone on physical CPU 1,
# labU2 paused. Spinning threads: native, the dom0 client (pCPU0); guest, labU1's client
# (pCPU1) and the relay (pCPU0); the dom0 server beside the spinner on CPU 0 (isrv). What
# differs between the two pairs is the relay (guest ring -> HCA QP -> guest CQ) and the
# crossing between the two physical CPUs.
ratio_isolated() {
    { echo "spin-before-sleep-us = 10000000"; cat /run/lab/backend.toml; } > /run/lab/backend-spin.toml
    backend_restart /run/lab/backend-spin.toml /run/lab/backend-spin.log 1 || return
    xl pause labU2
    xl vcpu-pin 0 all 0; xl vcpu-pin labU1 0 1
    lab_log "isolated: placement $(xl vcpu-list | tail -n +2 | awk '{printf "%s/v%s@p%s(%s) ", $1, $3, $4, $7}')"
    # The relay spins for 10 s after its start: the native pairs come after that (it sleeps
    # then: no channel is open), the guest's after them.
    sleep 10
    for tool in ib_send_lat ib_write_bw; do pti_native $tool; eval "N_$tool=\"\$NROW\""; done
    for tool in ib_send_lat ib_write_bw; do
        pti_guest $tool
        eval "nv=\"\$N_$tool\""
        ratio "isolated: $tool, relay spinning (labU1 client <-> dom0 server ÷ dom0 client <-> dom0 server)" $tool "$GROW" "$nv"
    done
    zero_copy_dom "in the isolated ratio runs (the restarted backend's counters)" "$D1"
    xl vcpu-pin 0 all all; xl vcpu-pin labU1 0 all
    xl unpause labU2
    backend_restart /run/lab/backend.toml /run/lab/backend-dflt.log
}
# Address-vector connects (no rdma_cm): Debian's ibv_rc_pingpong in labU1 (through vrdma-exec)
# against ibv_rc_pingpong on rxe0 in dom0, both unmodified, each buffer checked by the tool's
# own -c; QP numbers, PSNs and GIDs go over TCP on the bridge, then each end moves its QP to
# RTR and RTS itself (labU1's through the backend's ConnectAv onto its HCA QP). labU1's GID 0
# is the backend's address ::ffff:10.77.0.1, which is rxe0's GID $GIDX: dom0 runs -g $GIDX.
# tcp_listening PORT: dom0 has a TCP listener on PORT.
tcp_listening() { grep -q "^ *[0-9]*: [0-9A-F]*:$(printf '%04X' "$1") [0-9A-F:]* 0A" /proc/net/tcp; }
# gid_index PATTERN: the first index of rxe0's GID table whose GID matches PATTERN.
gid_index() {
    for f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
        case "$(cat "$f" 2>/dev/null)" in $1) basename "$f"; return ;; esac
    done
}
# pp_client_retry OUT ARGS...: dom0's ibv_rc_pingpong client, tried again (up to 60 s) while
# labU1's server is not listening yet (its TCP connect refused).
pp_client_retry() {
    out=$1; shift
    i=0
    while :; do
        timeout $TO $R/ibv_rc_pingpong "$@" > "$out" 2>&1; PPC=$?
        grep -q "Couldn't connect to" "$out" || break
        i=$((i+1)); [ $i -gt 60 ] && break
        sleep 1
    done
}
pingpong_steps() {
    if [ "$NET" != 1 ]; then
        lab_log "ibv_rc_pingpong steps did NOT run (no bridge to the domUs)"; fail=1; return
    fi
    GIDX=$(gid_index '0000:0000:0000:0000:0000:ffff:0a4d:0001')
    LLIDX=$(gid_index 'fe80:*')
    lab_log "rxe0's GIDs: $(cat /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null | grep -v '^0000:0000:0000:0000:0000:0000:0000:0000$' | tr '\n' ' ')(::ffff:10.77.0.1 at $GIDX, link-local at $LLIDX)"
    [ -n "$GIDX" ] || { lab_log "no ::ffff:10.77.0.1 in rxe0's GID table"; fail=1; return; }
    PPN=50
    # labU1 the client of dom0's server.
    t0=$(lab_up)
    timeout $TO $R/ibv_rc_pingpong -d rxe0 -g "$GIDX" -p 18517 -n $PPN -s 4096 -c > /run/lab/pp-s.log 2>&1 &
    sp=$!
    i=0; until tcp_listening 18517; do i=$((i+1)); [ $i -gt 150 ] && break; sleep 0.2; done
    vstep "VRDMA_VERBS_LOG=1 vrdma-exec -- ibv_rc_pingpong -g 0 -p 18517 -n $PPN -s 4096 -c 10.0.0.1"
    vwait
    wait $sp; src=$?
    sed 's/^/  ibv_rc_pingpong server (dom0): /' /run/lab/pp-s.log
    lab_log "stock-ibv_rc_pingpong-server: ibv_rc_pingpong -g $GIDX -c (rxe0) rc=$src; vrdma-exec -- ibv_rc_pingpong -g 0 -c (labU1, client) rc=$VRC ($(awk "BEGIN { print $(lab_up) - $t0 }") s)"
    if [ "$src" = 0 ] && [ "$VRC" = 0 ] && grep -q "$PPN iters in" /run/lab/pp-s.log &&
        [ "$(grep -c 'GID ::ffff:10.77.0.1' /run/lab/pp-s.log)" = 2 ]; then
        lab_log "address-vector connect, labU1 as client: PASS ($PPN exchanges of 4096 B, checked by -c)"
    else
        lab_log "address-vector connect, labU1 as client FAILED"; fail=1
    fi
    # labU1 the server, dom0's client.
    t0=$(lab_up)
    vstep "VRDMA_VERBS_LOG=1 vrdma-exec -- ibv_rc_pingpong -g 0 -p 18518 -n $PPN -s 4096 -c"
    pp_client_retry /run/lab/pp-c.log -d rxe0 -g "$GIDX" -p 18518 -n $PPN -s 4096 -c 10.0.0.11
    vwait
    sed 's/^/  ibv_rc_pingpong client (dom0): /' /run/lab/pp-c.log
    lab_log "stock-ibv_rc_pingpong-client: ibv_rc_pingpong -g $GIDX -c (rxe0) rc=$PPC; vrdma-exec -- ibv_rc_pingpong -g 0 -c (labU1, server) rc=$VRC ($(awk "BEGIN { print $(lab_up) - $t0 }") s)"
    if [ "$PPC" = 0 ] && [ "$VRC" = 0 ] && grep -q "$PPN iters in" /run/lab/pp-c.log; then
        lab_log "address-vector connect, labU1 as server: PASS ($PPN exchanges of 4096 B, checked by -c)"
    else
        lab_log "address-vector connect, labU1 as server FAILED"; fail=1
    fi
    # Refused: dom0's client announces its link-local GID (fe80::..., outside labU1's
    # allowed-peers 10.77.0.1/32): labU1's connect is NotPermitted, the tool says so. That
    # GID is one of rxe0's, so it is in the guest's GID table (QueryGid) and the library
    # connects towards it as towards any own GID: in the background from the move to RTR
    # (a pairing may wait for the other guest), the refusal reported by the move to RTS.
    if [ -z "$LLIDX" ]; then
        lab_log "rxe0 has no link-local GID: the refused-RTR step did NOT run"; fail=1; return
    fi
    vstep "VRDMA_VERBS_LOG=1 vrdma-exec -- ibv_rc_pingpong -g 0 -p 18519 -n 5 -c > /tmp/p.out 2>&1; cat /tmp/p.out; grep -q 'allowed-peers' /tmp/p.out && grep -qE 'Failed to modify QP to (RTR|RTS)' /tmp/p.out"
    pp_client_retry /run/lab/pp-r.log -d rxe0 -g "$LLIDX" -p 18519 -n 5 -c 10.0.0.11
    vwait
    sed 's/^/  ibv_rc_pingpong client (dom0, link-local GID): /' /run/lab/pp-r.log
    seen=$(grep -c 'may not connect to GID fe80' /run/lab/backend.log)
    lab_log "refused-rtr: labU1's RTR towards GID $LLIDX of rxe0 (link-local, not an allowed peer): step rc=$VRC (0 = refused by policy), backend logged $seen refusals"
    [ "$VRC" = 0 ] && [ "$seen" -ge 1 ] || fail=1
}
tools=$(xenstore-read "/local/domain/$D1/data/tools" 2>/dev/null)
lab_log "labU1's stock tools: $tools"
case " $tools " in
    *" ib_send_lat "*" vrdma-exec "*)
        # Debian's rping in the guest (through vrdma-exec), both ways, 5 pings of 64 B: the
        # client compares what came back (-V), so the data is checked in both directions.
        t0=$(lab_up)
        timeout $TO $R/rping -s -v -V -a $ADDR -p 7174 -C 5 -S 64 > /run/lab/rping-s2.log 2>&1 &
        sp=$!
        listening 7174
        vstep vrdma-exec -- rping -c -v -V -a $ADDR -p 7174 -C 5 -S 64
        vwait
        wait $sp; src=$?
        seen=$(grep -c 'server ping data' /run/lab/rping-s2.log)
        lab_log "stock-rping-server/exec: rping -s (rxe0) rc=$src saw $seen pings; vrdma-exec -- rping -c -V (labU1) rc=$VRC printed $VPINGS pings ($(awk "BEGIN { print $(lab_up) - $t0 }") s)"
        [ "$src" = 0 ] && [ "$seen" = 5 ] && [ "$VRC" = 0 ] && [ "$VPINGS" = 5 ] || fail=1
        t0=$(lab_up)
        vstep vrdma-exec -- rping -s -v -V -a $ADDR -p 7175 -C 5 -S 64
        listening 7175
        timeout $TO $R/rping -c -v -V -a $ADDR -p 7175 -C 5 -S 64 > /run/lab/rping-c2.log 2>&1
        crc=$?
        vwait
        seen=$(grep -c '^ping data' /run/lab/rping-c2.log)
        lab_log "stock-rping-client/exec: rping -c -V (rxe0) rc=$crc verified $seen pings; vrdma-exec -- rping -s (labU1) rc=$VRC printed $VPINGS pings ($(awk "BEGIN { print $(lab_up) - $t0 }") s)"
        [ "$crc" = 0 ] && [ "$seen" = 5 ] && [ "$VRC" = 0 ] && [ "$VPINGS" = 5 ] || fail=1
        pingpong_steps
        for tool in ib_send_lat ib_write_bw ib_read_lat; do
            pt_guest_client $tool
            eval "G_$tool=\"\$GROW\""
        done
        # The guest as perftest server, dom0's stock client (connect-delay.so preloaded).
        for tool in ib_send_lat ib_write_bw ib_read_lat; do pt_guest_server $tool; done
        # The ratios in the default configuration (relay spin-before-sleep 200 µs, every vCPU
        # floating, labU2 running its own polling loop).
        for tool in ib_send_lat ib_write_bw; do
            pt_native $tool
            eval "g=\"\$G_$tool\""
            [ -n "$g" ] && [ -n "$NROW" ] && ratio "default: $tool (labU1 client <-> dom0 server ÷ dom0 client <-> dom0 server)" $tool "$g" "$NROW"
        done
        zero_copy_dom "after the stock-tool steps" "$D1"
        ratio_isolated
        ;;
    *) lab_log "labU1's image has no stock verbs tools (rping, perftest) or no vrdma-exec: the guest-side stock-tool steps did NOT run"; fail=1 ;;
esac
put /lab/steps/labU1/cur end
# labU2 opens its first channel only now (its round 1): no channel of it was open when the
# backend was restarted for the isolated ratios.
put /lab/steps/labU2/cur end

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
# labU1's per-QP counters (what the relay passed on; vrdmactl stats' qp rows, published every
# 2 s): its looping QP has done work. qp_ops: the most ops of one of labU1's QPs.
qp_ops() {
    vrdmactl stats "$D1" | awk '$1 == "qp" { q = 1; for (i = 2; i <= NF; i++) if ($i == "ops") c = i; next }
        q && $1 !~ /^[0-9]+$/ { q = 0 }
        q && c && $c + 0 > m { m = $c + 0 }
        END { print m + 0 }'
}
i=0
until [ "$(qp_ops)" -gt 0 ]; do
    i=$((i+1)); [ $i -gt 100 ] && break
    sleep 0.2
done
QOPS=$(qp_ops)
lab_log "labU1's per-QP counters during the WRITE loop (vrdmactl stats, qp rows): most ops of a QP $QOPS"
[ "$QOPS" -gt 0 ] || { vrdmactl stats "$D1" | sed 's/^/  stats: /'; fail=1; }
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
echo "---- the killed backend's log ----"; tail -n 20 $BLOG
RUST_LOG=info vrdma-backend --device verbs:rxe0 --config /run/lab/backend.toml > /run/lab/backend2.log 2>&1 &
BACKEND=$!
xenstore-write /lab/restarted 1
lab_share_readable /lab/restarted "$D1" "$D2"
lab_log "vrdma-backend started again"
relay labU1 labU2 vrdma-ep-again || fail=1
relay labU2 labU1 vrdma-ep-again || fail=1
relay labU1 labU2 vrdma-done-again || fail=1
grep -E 'WARN|ERROR' /run/lab/backend2.log | sed 's/^/  restarted backend: /'
# HCA async events: with labU1's channel open (it says data/vrdma-ev-ready), rxe0's port goes
# down and up with dummy0 (rxe sends PORT_ERR, then PORT_ACTIVE); the backend reads them from
# the context's async fd and forwards them to every channel as PortError / PortActive
# (docs/protocol.md, "Device events"): labU1 must see both on its event ring, and the
# backend's log shows them.
if wait_key labU1 vrdma-ev-ready 300; then
    sleep 1
    $R/ip link set dummy0 down; sleep 2; $R/ip link set dummy0 up
    grep 'device event' /run/lab/backend2.log | sed 's/^/  backend: /'
    if wait_key labU1 vrdma-port-events 150; then
        ev=$(xenstore-read "/local/domain/$D1/data/vrdma-port-events")
        lab_log "async events: labU1's event ring after rxe0's port went down and up: $ev"
        case "$ev" in
            *PortError:0:1*PortActive:0:1*) ;;
            *) lab_log "async events: labU1 did not get PortError then PortActive"; fail=1 ;;
        esac
    else
        fail=1
    fi
    grep -q 'device event: All { kind: PortError' /run/lab/backend2.log &&
        grep -q 'device event: All { kind: PortActive' /run/lab/backend2.log ||
        { lab_log "async events: the backend did not log rxe0's port events"; fail=1; }
else
    fail=1
fi
for name in labU1 labU2; do
    r=$(lab_wait_result $name 300)
    lab_log "$name result: $r"
    [ "$r" = ok ] || fail=1
done
zero_copy "after the restart (the new backend's counters)"
lab_log "the new backend's pinned pages: $(grep -E 'VmPin' /proc/$BACKEND/status | tr -s ' \t' ' ')"
echo "---- the restarted backend's log ----"; tail -n 30 /run/lab/backend2.log
cp /run/lab/backend*.log /mnt/lab/out/ 2>/dev/null
if [ $fail != 0 ]; then
    echo "---- dmesg ----"; dmesg | tail -n 40
fi
top -b -n 1 | head -n 14 | sed 's/^/  top: /'
t0=$(lab_up)
vrdmactl --help > /dev/null 2>&1
lab_log "vrdmactl --help took $(awk "BEGIN { print $(lab_up) - $t0 }") s (clock $(date -u +%H:%M:%S))"
for d in $D1 $D2; do
    t0=$(lab_up)
    RUST_LOG=debug vrdmactl detach "$d" --timeout 60 > /run/lab/detach.log 2>&1 || { lab_log "vrdmactl detach $d FAILED"; fail=1; }
    lab_log "vrdmactl detach $d took $(awk "BEGIN { print $(lab_up) - $t0 }") s (clock $(date -u +%H:%M:%S))"
    sed 's/^/  detach: /' /run/lab/detach.log | tail -n 20
done
grep -E 'detach|closed|reclaim|Closed|Closing' /run/lab/backend2.log | tail -n 12 | sed 's/^/  backend: /'
for name in labU1 labU2; do lab_ack $name; done
lab_wait_gone labU1
lab_wait_gone labU2
t0=$(lab_up)
kill "$BACKEND"
wait "$BACKEND" || { lab_log "vrdma-backend exited with an error"; fail=1; }
lab_log "vrdma-backend stopped (SIGTERM) in $(awk "BEGIN { print $(lab_up) - $t0 }") s"
lab_log "after the backend's stop: $(res_line)"
grep -q -i "panic" /run/lab/backend*.log && { lab_log "backend panicked"; fail=1; }
exit $fail

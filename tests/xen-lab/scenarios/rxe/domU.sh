# rxe scenario, domU side: sh /lab/domU.sh NAME DOMID; exit 0 = pass. The backend in dom0 runs
# on rxe0 (`--device verbs:rxe0`), so every transfer below is rxe's RoCE v2 between the HCA QPs
# of the two guests. labU1 is the active side (READ, then WRITE followed by SEND), labU2 the
# passive one. dom0 relays endpoints (/lab/relay/<key>/<peer>) and checks counters and
# `rdma resource show` between the steps.
NAME=$1; DOMID=$2
# TCG on a busy host is slow: give each handshake step and control answer a minute.
export VRDMA_GUEST_TIMEOUT_S=60
PEER=labU2; [ "$NAME" = labU2 ] && PEER=labU1
i=0
until xenstore-read /lab/ready >/dev/null 2>&1; do
    i=$((i+1)); [ $i -gt 1500 ] && { echo "$NAME: timed out waiting for /lab/ready"; exit 1; }
    sleep 0.2
done
# vrdma-guest as a coprocess: one command line in, one "ok ..."/"err ..." line out.
start_guest() {
    rm -f /tmp/g.in /tmp/g.out
    mkfifo /tmp/g.in /tmp/g.out
    vrdma-guest < /tmp/g.in > /tmp/g.out 2>/tmp/g.err &
    GUEST=$!
    # Opening a FIFO blocks until its other end opens; a SIGCHLD meanwhile makes busybox sh
    # fail the redirection (EINTR) instead of retrying: open again (docs/xen-lab.md,
    # "Scenarios"). `command` keeps a failed exec from ending the script.
    n=0
    while :; do
        if { command exec 3>/tmp/g.in 4</tmp/g.out; } 2>/dev/null; then break; fi
        n=$((n + 1))
        [ $n -gt 20 ] && { echo "$NAME: cannot open vrdma-guest's pipes"; return 1; }
    done
}
stop_guest() {
    echo exit >&3
    exec 3>&- 4<&-
    wait $GUEST
}
cmd() {
    echo "$*" >&3
    if ! read -r REPLY <&4; then echo "$NAME: vrdma-guest died on '$*': $(cat /tmp/g.err)"; return 1; fi
    case $REPLY in
        ok*) REPLY=${REPLY#ok}; REPLY=${REPLY# }; return 0 ;;
        *) echo "$NAME: '$*' -> $REPLY"; return 1 ;;
    esac
}
# remote_at "addr:len:rkey" OFFSET -> the same region seen from OFFSET on (fields in hex).
remote_at() {
    a=${1%%:*}; rest=${1#*:}; l=${rest%%:*}; k=${rest#*:}
    printf '%x:%x:%s\n' $((0x$a + $2)) $((0x$l - $2)) "$k"
}
K=65536
round() {
    mode=$1
    start_guest || return 1
    cmd open "$mode" || return 1
    echo "$NAME: $mode channel: $REPLY"
    cmd cq c 64 && cmd qp q c c 64 64 || return 1
    EP=$REPLY
    cmd mr m 1048576 || return 1
    MR=$REPLY
    if [ "$NAME" = labU2 ]; then
        cmd fill m 5 $((8 * K)) $K && cmd recv q m 0 $K 1 || return 1
    fi
    xenstore-write "data/vrdma-ep-$mode" "$EP $MR"
    i=0
    until peer=$(xenstore-read "/lab/relay/vrdma-ep-$mode/$PEER" 2>/dev/null); do
        i=$((i+1)); [ $i -gt 1500 ] && { echo "$NAME: no $mode endpoint from $PEER"; return 1; }
        sleep 0.2
    done
    PEP=${peer% *}; PMR=${peer#* }
    cmd connect q "$PEP" || return 1
    if [ "$NAME" = labU1 ]; then
        cmd read q m 0 $K "$(remote_at "$PMR" $((8 * K)))" 11 && cmd poll c 1 10000 || return 1
        echo "$NAME: $mode READ completion: $REPLY"
        cmd check m 5 0 $K || return 1
        cmd fill m 9 $K $K && cmd write q m $K $K "$(remote_at "$PMR" $((4 * K)))" 12 || return 1
        cmd fill m 7 $((2 * K)) $K && cmd send q m $((2 * K)) $K 13 || return 1
        cmd poll c 2 10000 || return 1
        echo "$NAME: $mode WRITE+SEND completions: $REPLY"
        case $REPLY in *Success*Success*) ;; *) echo "$NAME: completions not successful"; return 1 ;; esac
        xenstore-write "data/vrdma-done-$mode" 1
    else
        cmd wait c 1 20000 || return 1
        echo "$NAME: $mode RECV completion: $REPLY"
        case $REPLY in *Success*) ;; *) echo "$NAME: receive not successful"; return 1 ;; esac
        cmd check m 7 0 $K || return 1
        cmd check m 9 $((4 * K)) $K || return 1
        echo "$NAME: $mode SEND and WRITE data verified"
        # Keep the QP until the peer has all its completions.
        i=0
        until xenstore-read "/lab/relay/vrdma-done-$mode/$PEER" >/dev/null 2>&1; do
            i=$((i+1)); [ $i -gt 1500 ] && { echo "$NAME: $PEER never finished"; return 1; }
            sleep 0.2
        done
    fi
    stop_guest
    echo "$NAME: $mode round PASS"
}
# A guest talking to itself: two QPs of one process connected to each other (both Connects in
# flight at once), SEND and RDMA WRITE between them, data verified. Here: labU1 after its peer
# was killed, through the same backend.
self_talk() {
    start_guest || return 1
    cmd open bypass && cmd cq c 64 && cmd qp a c c 64 64 || return 1
    EA=$REPLY
    cmd qp b c c 64 64 || return 1
    EB=$REPLY
    cmd mr m 262144 || return 1
    MR=$REPLY
    cmd connect a "$EB" b "$EA" || return 1
    cmd recv b m $K $K 1 && cmd fill m 3 0 $K && cmd send a m 0 $K 2 || return 1
    cmd poll c 2 10000 || return 1
    cmd check m 3 $K $K || return 1
    cmd fill m 4 $((2 * K)) $K && cmd write a m $((2 * K)) $K "$(remote_at "$MR" $((3 * K)))" 3 || return 1
    cmd poll c 1 10000 && cmd check m 4 $((3 * K)) $K || return 1
    stop_guest
    echo "$NAME: self-talk PASS"
}
# Waits for dom0's relay of the peer's KEY; prints it.
wait_relay() {
    i=0
    until v=$(xenstore-read "/lab/relay/$1/$PEER" 2>/dev/null); do
        i=$((i+1)); [ $i -gt 1500 ] && { echo "$NAME: no $1 from $PEER" >&2; return 1; }
        sleep 0.2
    done
    echo "$v"
}
# A guest killed mid-transfer: labU1 RDMA WRITEs in a loop into labU2's MR (rxe0 DMAs into
# labU2's pages), then labU2's process is killed with SIGKILL. dom0 checks that the backend
# released labU2's HCA objects (`rdma resource show`); labU1's QP must fail (its WRITEs reach a
# QP that is gone: retries exhausted), and the backend must keep serving labU1 (self_talk).
victim() {
    start_guest || return 1
    cmd open bypass && cmd cq c 64 && cmd qp q c c 64 64 || return 1
    EP=$REPLY
    cmd mr m 262144 || return 1
    xenstore-write data/vrdma-ep-victim "$EP $REPLY"
    peer=$(wait_relay vrdma-ep-victim) || return 1
    cmd connect q "${peer% *}" || return 1
    if [ "$NAME" = labU1 ]; then
        echo "loop q c m 4096 ${peer#* }" >&3
        read -r REPLY <&4
        [ "$REPLY" = "ok looping" ] || { echo "$NAME: loop -> $REPLY"; return 1; }
        xenstore-write data/vrdma-looping 1
        # The loop ends only on a failed completion: the peer's QP went with its process.
        if ! read -r REPLY <&4; then echo "$NAME: vrdma-guest died: $(cat /tmp/g.err)"; return 1; fi
        echo "$NAME: WRITE loop after the peer's kill: $REPLY"
        case $REPLY in
            "err completion failed"*) xenstore-write data/vrdma-peer-failed "$REPLY" ;;
            *) return 1 ;;
        esac
        i=0
        until xenstore-read /lab/victim-checked >/dev/null 2>&1; do
            i=$((i+1)); [ $i -gt 1500 ] && { echo "$NAME: dom0 never checked the victim"; return 1; }
            sleep 0.2
        done
        stop_guest
        echo "$NAME: peer killed mid-transfer: our QP failed"
    else
        xenstore-write data/vrdma-victim-ready 1
        wait_relay vrdma-looping >/dev/null || return 1
        # labU1's WRITEs are landing in our pages right now.
        kill -9 $GUEST
        wait $GUEST 2>/dev/null
        exec 3>&- 4<&-
        echo "$NAME: vrdma-guest killed mid-transfer"
        xenstore-write data/vrdma-killed 1
    fi
}
# The backend killed with SIGKILL under traffic and started again (DESIGN §8): labU1 RDMA
# WRITEs in a loop (spinning on its CQ), labU2 is blocked in a wait; both must end with
# "device lost" (dom0 times it), then reopen the device in the same process, reconnect to
# each other through the new backend on rxe0 and verify SEND and WRITE data.
restart() {
    # dom0 first checks that the killed process's resources were released.
    i=0
    until xenstore-read /lab/victim-checked >/dev/null 2>&1; do
        i=$((i+1)); [ $i -gt 1200 ] && { echo "$NAME: dom0 never checked the reclaim"; return 1; }
        sleep 0.1
    done
    start_guest || return 1
    cmd open bypass && cmd cq c 64 && cmd qp q c c 64 64 || return 1
    EP=$REPLY
    cmd mr m 262144 || return 1
    xenstore-write data/vrdma-ep-restart "$EP $REPLY"
    peer=$(wait_relay vrdma-ep-restart) || return 1
    cmd connect q "${peer% *}" || return 1
    if [ "$NAME" = labU1 ]; then
        echo "loop q c m 4096 ${peer#* }" >&3
        read -r REPLY <&4
        [ "$REPLY" = "ok looping" ] || { echo "$NAME: loop -> $REPLY"; return 1; }
    else
        echo "wait c 1 600000" >&3
    fi
    xenstore-write data/vrdma-traffic 1
    # dom0 kills the backend now: the loop and the wait must end with "device lost".
    if ! read -r REPLY <&4; then echo "$NAME: vrdma-guest died: $(cat /tmp/g.err)"; return 1; fi
    case $REPLY in
        *"device lost"*) xenstore-write data/vrdma-lost 1; echo "$NAME: backend killed: $REPLY" ;;
        *) echo "$NAME: after the backend's kill: $REPLY"; return 1 ;;
    esac
    i=0
    until xenstore-read /lab/restarted >/dev/null 2>&1; do
        i=$((i+1)); [ $i -gt 1500 ] && { echo "$NAME: no new backend"; return 1; }
        sleep 0.2
    done
    cmd open bypass || return 1
    echo "$NAME: reopened after the backend restart: channel $REPLY"
    cmd cq c 64 && cmd qp q c c 64 64 || return 1
    EP=$REPLY
    cmd mr m 262144 || return 1
    MR=$REPLY
    if [ "$NAME" = labU2 ]; then cmd recv q m 0 $K 1 || return 1; fi
    xenstore-write data/vrdma-ep-again "$EP $MR"
    peer=$(wait_relay vrdma-ep-again) || return 1
    cmd connect q "${peer% *}" || return 1
    if [ "$NAME" = labU1 ]; then
        cmd fill m 21 0 $K && cmd write q m 0 $K "$(remote_at "${peer#* }" $((2 * K)))" 1 || return 1
        cmd fill m 22 $K $K && cmd send q m $K $K 2 && cmd poll c 2 20000 || return 1
        case $REPLY in *Success*Success*) ;; *) echo "$NAME: completions after the restart: $REPLY"; return 1 ;; esac
        xenstore-write data/vrdma-done-again 1
    else
        cmd wait c 1 60000 || return 1
        case $REPLY in *Success*) ;; *) echo "$NAME: receive after the restart: $REPLY"; return 1 ;; esac
        cmd check m 22 0 $K && cmd check m 21 $((2 * K)) $K || return 1
        wait_relay vrdma-done-again >/dev/null || return 1
    fi
    stop_guest
    echo "$NAME: backend restart PASS (device lost, reopened, data verified)"
}
# HCA async events (labU1, after the restart): a channel open while dom0 takes rxe0's port
# down and up; its event ring must get PortError then PortActive (handle 0, detail port 1).
port_events() {
    start_guest
    cmd open bypass || return 1
    xenstore-write data/vrdma-ev-ready 1
    i=0
    while :; do
        cmd events || return 1
        case $REPLY in *PortError*PortActive*) break ;; esac
        i=$((i+1)); [ $i -gt 600 ] && { echo "$NAME: no port events: '$REPLY'"; return 1; }
        sleep 0.2
    done
    echo "$NAME: port events: $REPLY"
    xenstore-write data/vrdma-port-events "$REPLY"
    stop_guest
}
# Step 0: the command lines dom0 writes to /lab/steps/NAME/N (/lab/steps/NAME/cur = N): the
# guest's end of a stock-tool pair; answers data/done = "N RC PINGS". cur = end: go on.
steps() {
    last=0
    src=0
    while :; do
        i=0
        while :; do
            s=$(xenstore-read /lab/steps/$NAME/cur 2>/dev/null) && [ "$s" != "$last" ] && break
            i=$((i+1)); [ $i -gt 9000 ] && { echo "$NAME: dom0 sent no step for 30 min"; return 1; }
            sleep 0.2
        done
        [ "$s" = end ] && return $src
        last=$s
        c=$(xenstore-read "/lab/steps/$NAME/$s")
        echo "$NAME: step $s: $c"
        timeout 300 sh -c "$c" > /tmp/step.out 2>&1
        r=$?
        sed "s/^/$NAME:   /" /tmp/step.out
        n=$(grep -c 'ping data:' /tmp/step.out)
        echo "$NAME: step $s: rc=$r, $n pings"
        [ "$r" = 0 ] || src=1
        # perftest's result row (the line after its "#bytes" header), for dom0's figures.
        row=$(sed -n '/^ *#bytes/{n;p;q}' /tmp/step.out | tr -s ' \t' ' ')
        xenstore-write data/row "$s ${row:-none}"
        xenstore-write data/done "$s $r $n"
    done
}
# netfront (when dom0 shares the module): labU1 10.0.0.11, labU2 10.0.0.12 on dom0's bridge,
# for ibv_rc_pingpong's TCP exchange with dom0 (10.0.0.1).
if [ -f /lab/bin/xen-netfront.ko ]; then
    insmod /lab/bin/xen-netfront.ko || echo "$NAME: insmod xen-netfront failed"
    IP=10.0.0.11; [ "$NAME" = labU2 ] && IP=10.0.0.12
    i=0
    until ifconfig eth0 "$IP" netmask 255.255.255.0 up 2>/dev/null; do
        i=$((i+1)); [ $i -gt 100 ] && { echo "$NAME: no eth0"; break; }
        sleep 0.2
    done
    ifconfig lo 127.0.0.1 up
    i=0
    until ping -c 1 -W 1 10.0.0.1 >/dev/null 2>&1; do
        i=$((i+1)); [ $i -gt 60 ] && { echo "$NAME: dom0 (10.0.0.1) unreachable over the bridge"; break; }
    done
    echo "$NAME: eth0 $IP"
fi
# Which stock tools this image has (the domU image carries rping and perftest, run through
# vrdma-exec with libvrdma_verbs.so preloaded).
t=""
for b in rping ib_send_lat ib_write_bw ib_read_lat vrdma-exec libvrdma_verbs.so; do
    command -v $b >/dev/null 2>&1 || [ -f /lab/bin/$b ] && t="$t $b"
done
xenstore-write data/tools "${t# }"
rc=0
steps || rc=1
round bypass || rc=1
round mediated || rc=1
victim || rc=1
if [ "$NAME" = labU1 ]; then
    self_talk || rc=1
fi
restart || rc=1
if [ "$NAME" = labU1 ]; then
    port_events || rc=1
fi
exit $rc

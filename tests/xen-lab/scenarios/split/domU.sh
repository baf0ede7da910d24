# split scenario, domU side: sh /lab/domU.sh NAME DOMID; exit 0 = pass. labU1 is the active side
# (READ, then WRITE followed by SEND), labU2 the passive one (serves the READ, receives).
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
    # Opening a FIFO blocks until its other end opens. A SIGCHLD meanwhile (the echo of a
    # background pipeline ending, as in churn) interrupts it, and busybox sh then fails the
    # redirection ("can't open /tmp/g.out: Interrupted system call") instead of retrying:
    # open again. `command` keeps a failed exec from ending the script.
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
# flight at once), SEND and RDMA WRITE between them, data verified.
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
# A guest process killed while it holds a channel, a PD, an MR, a CQ and a QP: the backend must
# reclaim everything (dom0 checks the counters with vrdmactl and tells us via /lab/reclaimed).
killed_process() {
    start_guest || return 1
    cmd open bypass && cmd cq c 64 && cmd qp q c c 64 64 && cmd mr m 262144 || return 1
    xenstore-write data/vrdma-holding 1
    kill -9 $GUEST
    wait $GUEST 2>/dev/null
    exec 3>&- 4<&-
    echo "$NAME: vrdma-guest killed while holding resources"
    xenstore-write data/vrdma-killed 1
}
# A short vrdma-perf run between two processes of this domU (two channels to the backend in
# dom0; the endpoint exchange uses TCP over the domU's loopback). TCG time is not real time:
# only the mediated ÷ bypass ratio means anything. No --baseline: its two-thread cache-line
# ping-pong on a 1-vCPU guest would only measure the scheduler.
perf() {
    ifconfig lo 127.0.0.1 up 2>/dev/null || ip link set lo up
    for mode in bypass mediated; do
        vrdma-perf send_lat -m $mode -s 64 -n 300 -y -p 18515 > /tmp/perf-server.log 2>&1 &
        SP=$!
        sleep 1
        echo "$NAME: vrdma-perf send_lat $mode (client):"
        vrdma-perf send_lat 127.0.0.1 -m $mode -s 64 -n 300 -y -p 18515 || { cat /tmp/perf-server.log; return 1; }
        wait $SP || { cat /tmp/perf-server.log; return 1; }
    done
    echo "$NAME: vrdma-perf PASS"
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
# The backend killed with SIGKILL under traffic and started again (DESIGN §8): labU1 RDMA
# WRITEs in a loop (spinning on its CQ), labU2 is blocked in a wait; both must end with
# "device lost" (dom0 times it), then reopen the device in the same process, reconnect to
# each other through the new backend and verify SEND and WRITE data.
restart() {
    # dom0 first checks that the killed process's channel was reclaimed to zero.
    i=0
    until xenstore-read /lab/reclaim-checked >/dev/null 2>&1; do
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
# Channels opened and closed back to back by two processes of this domU at once (indexes
# reused as soon as they are free): none may be refused by the ghost of an earlier one.
churn() {
    echo "cycle 25 mediated" | vrdma-guest > /tmp/cycle2.out 2>/tmp/cycle2.err &
    C2=$!
    start_guest || { wait $C2; return 1; }
    cmd cycle 25 bypass || { stop_guest; wait $C2; return 1; }
    stop_guest
    wait $C2
    [ "$(head -n1 /tmp/cycle2.out)" = "ok 25" ] ||
        { echo "$NAME: second process: $(cat /tmp/cycle2.out) $(tail -n 5 /tmp/cycle2.err)"; return 1; }
    echo "$NAME: 50 back-to-back channels of two processes PASS"
}
rc=0
round bypass || rc=1
round mediated || rc=1
if [ "$NAME" = labU1 ]; then
    self_talk || rc=1
    perf || rc=1
else
    killed_process || rc=1
fi
restart || rc=1
churn || rc=1
exit $rc

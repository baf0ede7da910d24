# split scenario, domU side: sh /lab/domU.sh NAME DOMID; exit 0 = pass. labU1 is the active side
# (READ, then WRITE followed by SEND), labU2 the passive one (serves the READ, receives).
NAME=$1; DOMID=$2
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
    exec 3>/tmp/g.in 4</tmp/g.out
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
    start_guest
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
rc=0
round bypass || rc=1
round mediated || rc=1
exit $rc

# perf scenario, domU side: sh /lab/domU.sh NAME DOMID. dom0 conducts: for each step it writes
# /lab/step/N/{srv,cli} (shell commands) and /lab/cur = N. labU2 runs the server command,
# writes data/ready = N once it listens, and data/srvdone = N when it exits; labU1 waits for
# /lab/go = N, runs the client command and publishes what it measured in data/res, then
# data/done = N. /lab/cur = end stops both.
NAME=$1; DOMID=$2
export VRDMA_GUEST_TIMEOUT_S=60
wait_key() { # KEY [VALUE]: waits (0.2 s polls, 30 min guard) until /lab/KEY exists (= VALUE)
    i=0
    while :; do
        v=$(xenstore-read "/lab/$1" 2>/dev/null) && { [ -z "$2" ] || [ "$v" = "$2" ]; } && { echo "$v"; return 0; }
        i=$((i+1)); [ $i -gt 9000 ] && { echo "$NAME: timed out waiting for /lab/$1 $2" >&2; return 1; }
        sleep 0.2
    done
}
wait_key ready >/dev/null || exit 1
# netfront: the vif dom0's bridge connects us through (10.0.0.0/24 exists only inside the lab).
insmod /lab/bin/xen-netfront.ko || { echo "$NAME: insmod xen-netfront failed"; exit 1; }
IP=10.0.0.11; PEER=10.0.0.12
[ "$NAME" = labU2 ] && { IP=10.0.0.12; PEER=10.0.0.11; }
i=0
until ifconfig eth0 "$IP" netmask 255.255.255.0 up 2>/dev/null; do
    i=$((i+1)); [ $i -gt 100 ] && { echo "$NAME: no eth0"; exit 1; }
    sleep 0.2
done
ifconfig lo 127.0.0.1 up
# vchan's 1 MiB rings each way are 512 granted pages; gntalloc's default limit is 1024.
echo 16384 > /sys/module/xen_gntalloc/parameters/limit
i=0
until ping -c 1 -W 1 "$PEER" >/dev/null 2>&1; do
    i=$((i+1)); [ $i -gt 120 ] && { echo "$NAME: $PEER unreachable over the bridge"; exit 1; }
done
echo "$NAME: $IP reaches $PEER over netfront/netback"
xenstore-write data/net-up 1

# parse FILE: what a client printed, as "k=v ..." (lab-perf's RESULT line, or vrdma-perf's
# tables: send_lat's one-way t_typical/t_min doubled into a round trip, write_bw's averages).
parse() {
    r=$(sed -n 's/^RESULT //p' "$1")
    [ -n "$r" ] && { echo "$r"; return; }
    awk '
        /# vrdma-perf/ { bw = ($0 ~ /_bw/) }
        $1 ~ /^[0-9]+$/ && NF >= 5 {
            if (!bw && $1 == 64) printf "rtt64_med_us=%.1f rtt64_min_us=%.1f ", 2 * $5, 2 * $3
            if (bw && $1 == 65536) printf "bw64k_MBps=%s ", $4
            if (bw && $1 == 1048576) printf "bw1m_MBps=%s ", $4
        }' "$1"
}

last=0
while :; do
    i=0
    while :; do
        s=$(xenstore-read /lab/cur 2>/dev/null) && [ "$s" != "$last" ] && break
        i=$((i+1)); [ $i -gt 9000 ] && { echo "$NAME: dom0 went quiet"; exit 1; }
        sleep 0.2
    done
    [ "$s" = end ] && break
    last=$s
    if [ "$NAME" = labU2 ]; then
        cmd=$(xenstore-read "/lab/step/$s/srv")
        if [ "$cmd" = - ]; then
            xenstore-write data/ready "$s"; xenstore-write data/srvdone "$s"; continue
        fi
        timeout 330 sh -c "$cmd" > /tmp/srv.out 2>&1 &
        SP=$!
        i=0
        until grep -qi listening /tmp/srv.out; do
            kill -0 $SP 2>/dev/null || break
            i=$((i+1)); [ $i -gt 600 ] && break
            sleep 0.1
        done
        xenstore-write data/ready "$s"
        wait $SP || { echo "$NAME: step $s server '$cmd' failed:"; tail -n 5 /tmp/srv.out; }
        xenstore-write data/srvdone "$s"
    else
        wait_key go "$s" >/dev/null || exit 1
        cmd=$(xenstore-read "/lab/step/$s/cli")
        echo "$NAME: step $s: $cmd"
        if timeout 300 sh -c "$cmd" > /tmp/cli.out 2>&1; then
            res=$(parse /tmp/cli.out)
        else
            res="failed"; echo "$NAME: step $s client failed:"; tail -n 5 /tmp/cli.out
        fi
        [ -n "$res" ] || { res="unparsed"; cat /tmp/cli.out; }
        echo "$NAME: step $s: $res"
        xenstore-write data/res "$res"
        xenstore-write data/done "$s"
    fi
done
echo "$NAME: all steps done"

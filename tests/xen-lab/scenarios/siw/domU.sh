# siw scenario, domU side: sh /lab/domU.sh NAME DOMID. dom0 conducts: for each step it writes
# /lab/step/N (a vrdma-rping command line) and /lab/cur = N; this domU runs it, prints its
# output on the console and answers data/done = "N RC PINGS" (PINGS: the "ping data:" lines it
# printed). /lab/cur = end stops it. The vrdma device is attached by dom0 (vrdmactl); the
# backend in dom0 does the TCP to siw1, this domU has no network.
NAME=$1; DOMID=$2
wait_key() { # KEY: waits (0.2 s polls, 30 min guard) until /lab/KEY exists; prints it
    i=0
    until v=$(xenstore-read "/lab/$1" 2>/dev/null); do
        i=$((i+1)); [ $i -gt 9000 ] && { echo "$NAME: timed out waiting for /lab/$1" >&2; return 1; }
        sleep 0.2
    done
    echo "$v"
}
wait_key ready >/dev/null || exit 1
rc=0
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
    cmd=$(xenstore-read "/lab/step/$s")
    echo "$NAME: step $s: $cmd"
    timeout 300 sh -c "$cmd" > /tmp/step.out 2>&1
    r=$?
    sed "s/^/$NAME:   /" /tmp/step.out
    n=$(grep -c 'ping data:' /tmp/step.out)
    echo "$NAME: step $s: rc=$r, $n pings"
    [ "$r" = 0 ] || rc=1
    xenstore-write data/done "$s $r $n"
done
exit $rc

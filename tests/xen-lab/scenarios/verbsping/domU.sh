# verbsping (scratch), domU side: runs the vrdma-rping command lines dom0 writes to
# /lab/step/N (/lab/cur = N), answers data/done = "N RC PINGS"; /lab/cur = end stops it.
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

# siw scenario, domU side: sh /lab/domU.sh NAME DOMID. dom0 conducts: for each step it writes
# /lab/step/N (a command line: vrdma-rping, or a perftest tool through vrdma-exec) and
# /lab/cur = N; this domU runs it, prints its output on the console and answers data/done =
# "N RC PINGS ITERS CM LQPN RQPN" (PINGS: the "ping data:" lines it printed; the rest
# perftest's: its first result row's iterations, 1 if it used rdma_cm, its QP number and its
# peer's). /lab/cur = end stops it. The vrdma device is attached by dom0 (vrdmactl); the
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
    n=$(grep -c 'ping data:' /tmp/step.out)
    # perftest (through vrdma-exec): the #iterations of its first result row, whether it used
    # rdma_cm, its own and its peer's QP number ("-" when absent).
    it=$(awk '/^ *#bytes/ {h=1; next} h && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {print $2; exit}' /tmp/step.out)
    cm=0; grep -q 'Data ex. method : rdma_cm' /tmp/step.out && cm=1
    lq=$(sed -n 's/^ *local address:.*QPN \(0x[0-9a-fA-F]*\).*/\1/p' /tmp/step.out | head -n1)
    rq=$(sed -n 's/^ *remote address:.*QPN \(0x[0-9a-fA-F]*\).*/\1/p' /tmp/step.out | head -n1)
    [ "$r" = 0 ] || rc=1
    # The answer first: every console line costs under TCG, dom0 need not wait for them.
    xenstore-write data/done "$s $r $n ${it:--} $cm ${lq:--} ${rq:--}"
    sed "s/^/$NAME:   /" /tmp/step.out
    echo "$NAME: step $s: rc=$r, $n pings, perftest iters ${it:--} rdma_cm $cm QPN ${lq:--} peer ${rq:--}"
done
exit $rc

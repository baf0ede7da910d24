# apps scenario, domU side: sh /lab/domU.sh NAME DOMID. dom0 conducts: for each step it writes
# /lab/step/NAME/N (a command line, run with `sh -c "exec CMD"`) and /lab/cur/NAME = N; this
# domU runs it (output on the console) and answers data/done = "N RC PINGS SUM ITERS CM LQPN
# RQPN HCA ACTIVE REJ" (see summary below); /lab/kill/NAME = N ends step N early (SIGTERM, then
# SIGKILL), /lab/cur/NAME = end stops the loop. The vrdma device is attached by dom0
# (vrdmactl); this domU has no network: rdma_cm goes through vrdma to the backend's address.
NAME=$1; DOMID=$2
wait_key() { # KEY: waits (0.2 s polls, 30 min guard) until /lab/KEY exists
    i=0
    until xenstore-read "/lab/$1" >/dev/null 2>&1; do
        i=$((i+1)); [ $i -gt 9000 ] && { echo "$NAME: timed out waiting for /lab/$1" >&2; return 1; }
        sleep 0.2
    done
}
# summary FILE: what dom0 checks, one word each ("-" when absent):
#  PINGS  lines with rping's "ping data: " (client) / "server ping data: " (server)
#  SUM    md5 (8 hex digits) of those lines' text after "ping data: ", one per line
#  ITERS  the #iterations column of perftest's first result row
#  CM     1 if perftest says "Data ex. method : rdma_cm"
#  LQPN RQPN  perftest's "local address: ... QPN 0x..." / "remote address: ..." QP numbers
#  HCA    the first "hca_id:" of ibv_devinfo; ACTIVE: how many PORT_ACTIVE lines
#  REJ    1 if a perftest client failed on a refused rdma_cm connect (its own second-connect
#         race, docs/verbs.md): dom0 may then start the pair again
summary() {
    f=$1
    pings=$(grep -c 'ping data: ' "$f")
    if [ "$pings" -gt 0 ]; then
        sum=$(sed -n 's/.*ping data: //p' "$f" | md5sum | cut -c1-8)
    else
        sum=-
    fi
    iters=$(awk '/^ *#bytes/ {h=1; next} h && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {print $2; exit}' "$f")
    cm=0; grep -q 'Data ex. method : rdma_cm' "$f" && cm=1
    lq=$(sed -n 's/^ *local address:.*QPN \(0x[0-9a-fA-F]*\).*/\1/p' "$f" | head -n1)
    rq=$(sed -n 's/^ *remote address:.*QPN \(0x[0-9a-fA-F]*\).*/\1/p' "$f" | head -n1)
    hca=$(sed -n 's/^hca_id:[[:space:]]*\([^[:space:]]*\).*/\1/p' "$f" | head -n1)
    act=$(grep -c 'PORT_ACTIVE' "$f")
    rej=0; grep -q -E 'Failed to connect RDMA CM events|Failed to resolve RDMA CM address|REJECTED' "$f" && rej=1
    echo "$pings $sum ${iters:--} $cm ${lq:--} ${rq:--} ${hca:--} $act $rej"
}
# The library logs what failed (one stderr line per failed call): a failed step shows it.
export VRDMA_VERBS_LOG=1
# threads PID: where each thread of a step dom0 ends was (a hang's diagnosis): its name,
# state, kernel wait channel and system call (/proc/PID/task/*/syscall: number, arguments).
threads() {
    for t in /proc/$1/task/*; do
        echo "thread ${t##*/} $(cat $t/comm 2>/dev/null) $(awk '{print $3}' $t/stat 2>/dev/null) wchan=$(cat $t/wchan 2>/dev/null) syscall=$(cut -d' ' -f1-3 $t/syscall 2>/dev/null)"
    done
}
wait_key ready || exit 1
last=0
while :; do
    i=0
    while :; do
        s=$(xenstore-read "/lab/cur/$NAME" 2>/dev/null) && [ "$s" != "$last" ] && break
        i=$((i+1)); [ $i -gt 9000 ] && { echo "$NAME: dom0 went quiet"; exit 1; }
        sleep 0.2
    done
    [ "$s" = end ] && break
    last=$s
    cmd=$(xenstore-read "/lab/step/$NAME/$s")
    echo "$NAME: step $s: $cmd"
    out=/tmp/step-$s.out
    # `exec`: the pid is the tool's (vrdma-exec execs it), so a kill reaches it.
    sh -c "exec $cmd" > "$out" 2>&1 &
    pid=$!
    n=0
    while kill -0 $pid 2>/dev/null; do
        n=$((n+1))
        if [ $((n % 5)) = 0 ] && [ "$(xenstore-read "/lab/kill/$NAME" 2>/dev/null)" = "$s" ]; then
            echo "$NAME: step $s: dom0 ends it"
            threads $pid | sed "s/^/$NAME:   /"
            kill -TERM $pid 2>/dev/null; sleep 2; kill -KILL $pid 2>/dev/null
            break
        fi
        # 600 s: a guard only (dom0 bounds every step itself, far below this).
        [ $n -gt 3000 ] && { echo "$NAME: step $s ran 600 s: killed"; kill -KILL $pid; break; }
        sleep 0.2
    done
    wait $pid
    r=$?
    sm=$(summary "$out")
    # The answer first: every console line costs under TCG, dom0 need not wait for them.
    xenstore-write data/done "$s $r $sm"
    # Every console line costs under TCG: a passed step shows what identifies its result, a
    # failed one all it printed.
    if [ "$r" = 0 ]; then
        grep -E 'hca_id|transport:|GID\[|vrdma[0-9]|ping data: rdma-ping-(0|9):|Data ex. method|(local|remote) address:|^ *#bytes|^ *[0-9]+ +[0-9]+ ' "$out"
    else
        cat "$out"
    fi | sed "s/^/$NAME:   /"
    echo "$NAME: step $s: rc=$r, summary $sm"
done
# Each step's exit status is dom0's to judge (data/done); this domU passes if it followed dom0.
exit 0

# apps scenario, dom0 side (sourced by init-dom0.sh; lab-lib.sh loaded): Debian's unmodified
# verbs tools between two PV domUs through vrdma. dom0 runs vrdma-backend (software device,
# address 127.0.0.1 on dom0's lo: rdma_cm between two guests of one backend pairs them on the
# intra-host path, no TCP) and attaches a vrdma device to labU1 and labU2 (vrdmactl); in the
# domUs every tool runs through `vrdma-exec -- TOOL ...` (libvrdma_verbs.so preloaded, the
# tools are the domU image's Debian binaries):
#  1. `ibv_devinfo -v` in both (the vrdma device, its port active), `ibv_devices` in labU1;
#  2. `rping -s -v -C 10` in labU1, `rping -c -v -V -C 10` in labU2: both exit 0, the client
#     verified every ping it got back (-V) and both printed rping's ten ping strings exactly
#     (dom0 compares an md5 of them with the strings rping generates);
#  3. `ib_write_bw -R` (server labU2, client labU1) and `ib_send_lat -R` (server labU1, client
#     labU2), -n 100, -F (TCG's clock fails perftest's cycle calibration now and then:
#     without -F it then exits "Can't produce a report" after the test): both ends exit 0,
#     use rdma_cm, name each other's QP and print a result row of 100 iterations. perftest -R connects twice (its exchange, then the test QP); a
#     client whose second connect comes before the server listens again is refused and
#     perftest gives up (docs/verbs.md): only then is the pair started again (at most twice,
#     logged);
#  4. vrdmactl detach of both (clean), SIGTERM to the backend (exit 0), no panic in its log.
# Needs on PATH (the share; in the domUs /lab/bin): vrdma-backend, vrdmactl, vrdma-exec and
# libvrdma_verbs.so beside it.
fail=0
ADDR=127.0.0.1
TO=240   # seconds any one tool may run: a hang guard (TCG on a host at load 17 needed 140)

ifconfig lo 127.0.0.1 up || { lab_log "lo FAILED"; exit 1; }
printf 'address = ["%s"]\n' "$ADDR" > /run/lab/backend.toml
RUST_LOG=info vrdma-backend --config /run/lab/backend.toml > /run/lab/backend.log 2>&1 &
BACKEND=$!
lab_start_domU labU1 || exit 1
lab_start_domU labU2 || exit 1
D1=$(lab_domid labU1); D2=$(lab_domid labU2)
i=0
until grep -q 'page budgets' /run/lab/backend.log 2>/dev/null; do
    i=$((i+1)); [ $i -gt 300 ] && { lab_log "vrdma-backend did not start"; exit 1; }
    kill -0 "$BACKEND" 2>/dev/null || { lab_log "vrdma-backend exited: $(tail -n 5 /run/lab/backend.log)"; exit 1; }
    sleep 0.2
done
lab_log "vrdma-backend (pid $BACKEND) at $ADDR"
for d in $D1 $D2; do
    vrdmactl attach "$d" --timeout 60 || { lab_log "vrdmactl attach $d FAILED"; fail=1; }
done
vrdmactl list
xenstore-write /lab 1 && lab_share_readable /lab "$D1" "$D2"
put() { xenstore-write "$1" "$2" && lab_share_readable "$1" "$D1" "$D2"; }
put /lab/ready 1

# step NAME CMD...: gives NAME's domU its next command line (its number in /run/lab/NAME.step).
step() {
    n=$1; shift
    s=$(( $(cat /run/lab/$n.step 2>/dev/null || echo 0) + 1 ))
    echo $s > /run/lab/$n.step
    put "/lab/step/$n/$s" "$*" && put "/lab/cur/$n" "$s"
}
# done_of NAME TIMEOUT_S: waits for NAME's answer to its last step; sets RC PINGS SUM ITERS CM
# LQPN RQPN HCA ACTIVE REJ (domU.sh's summary). A step still running at the timeout is ended
# (/lab/kill) and fails.
now() { read -r up _ < /proc/uptime; echo "${up%.*}"; }
done_of() {
    n=$1; s=$(cat /run/lab/$n.step); id=$(lab_domid $n); killed=0
    t0=$(now); tk=$((t0 + $2)); te=$((t0 + $2 + 30))   # seconds of dom0 uptime (each poll
    while :; do                                        # costs execs: count time, not polls)
        d=$(xenstore-read "/local/domain/$id/data/done" 2>/dev/null)
        case $d in "$s "*) break ;; esac
        t=$(now)
        if [ $killed = 0 ] && [ $t -ge $tk ]; then
            lab_log "$n: step $s still running after $2 s: ending it"; put "/lab/kill/$n" "$s"; killed=1
        fi
        [ $t -ge $te ] && { lab_log "$n never answered step $s"; RC=timeout; return 1; }
        xenstore-exists "/local/domain/$id" || { lab_log "$n died"; RC=died; return 1; }
        sleep 0.2
    done
    set -- $d
    RC=$2 PINGS=$3 SUM=$4 ITERS=$5 CM=$6 LQPN=$7 RQPN=$8 HCA=$9
    shift 9
    ACTIVE=$1 REJ=$2
    [ $killed = 0 ] || RC="killed($RC)"
}
# listening PORT: waits (up to 60 s) for the backend's listener on $ADDR:PORT (a guest's
# rdma_listen binds the port on the backend's address: a TCP listener in dom0).
listening() {
    hex=$(printf '%04X' "$1"); i=0
    until awk -v p="0100007F:$hex" '$2 == p && $4 == "0A" {f=1} END {exit !f}' /proc/net/tcp; do
        i=$((i+1)); [ $i -gt 300 ] && return 1
        sleep 0.2
    done
}
# The strings rping's client sends (default size 64: 63 characters; rping.c's pattern): the md5
# (8 hex digits) of COUNT of them, one per line, as domU.sh sums what a tool printed.
rping_sum() {
    awk -v n="$1" 'BEGIN { for (i = 0; i < n; i++) { s = "rdma-ping-" i ": "; c = 65 + i % 58
        while (length(s) < 63) { s = s sprintf("%c", c); c = (c >= 122) ? 65 : c + 1 }; print s } }' |
        md5sum | cut -c1-8
}
X=vrdma-exec

# 1. The device as the tools see it.
for n in labU1 labU2; do step $n $X -- ibv_devinfo -v; done
for n in labU1 labU2; do
    done_of $n 90
    lab_log "$n: vrdma-exec -- ibv_devinfo -v: rc=$RC hca_id=$HCA, $ACTIVE port(s) PORT_ACTIVE"
    [ "$RC" = 0 ] && case $HCA in vrdma*) true ;; *) false ;; esac && [ "$ACTIVE" -ge 1 ] || fail=1
done
step labU1 $X -- ibv_devices
done_of labU1 90
lab_log "labU1: vrdma-exec -- ibv_devices: rc=$RC"
[ "$RC" = 0 ] || fail=1

# 2. rping, 10 pings, the client validating (-V).
T0=$(lab_up)
step labU1 $X -- rping -s -v -C 10 -a $ADDR -p 7471
if listening 7471; then
    step labU2 $X -- rping -c -v -V -C 10 -a $ADDR -p 7471
    done_of labU2 $TO; CRC=$RC CP=$PINGS CS=$SUM
else
    lab_log "rping -s (labU1) never listened on $ADDR:7471"; CRC=no-listener CP=0 CS=-
fi
# The server ends when its client has disconnected: 60 s are plenty once the client is done.
done_of labU1 60; SRC=$RC SP=$PINGS SS=$SUM
WANT=$(rping_sum 10)
lab_log "rping: server (labU1) rc=$SRC printed $SP pings (md5 $SS), client (labU2) rc=$CRC printed $CP verified pings (md5 $CS); rping's strings: md5 $WANT; $T0-$(lab_up) s"
[ "$SRC" = 0 ] && [ "$CRC" = 0 ] && [ "$SP" = 10 ] && [ "$CP" = 10 ] && [ "$SS" = "$WANT" ] && [ "$CS" = "$WANT" ] ||
    { lab_log "rping FAILED"; fail=1; }

# 3. perftest through rdma_cm. perf_pair TOOL PORT SERVER CLIENT: both ends exit 0, use
# rdma_cm, name each other's QP, print a row of $N iterations.
N=100
perf_pair() {
    tool=$1; port=$2; sn=$3; cn=$4; round=1
    while :; do
        T0=$(lab_up)
        step $sn $X -- $tool -R -F -p $port -n $N
        if listening $port; then
            step $cn $X -- $tool -R -F -p $port -n $N $ADDR
            done_of $cn $TO; CRC=$RC CI=$ITERS CC=$CM CL=$LQPN CR=$RQPN CREJ=$REJ
        else
            lab_log "$tool -R server ($sn) never listened on $ADDR:$port"; CRC=no-listener CREJ=0
        fi
        if [ "$CRC" != 0 ]; then
            # The server waits for a client that gave up: end it.
            put "/lab/kill/$sn" "$(cat /run/lab/$sn.step)"
        fi
        done_of $sn 60; SRC=$RC SI=$ITERS SC=$CM SL=$LQPN SR=$RQPN
        lab_log "$tool -R: server ($sn) rc=$SRC rdma_cm=$SC QPN $SL peer $SR iters $SI; client ($cn) rc=$CRC rdma_cm=$CC QPN $CL peer $CR iters $CI; round $round, $T0-$(lab_up) s"
        if [ "$SRC" = 0 ] && [ "$CRC" = 0 ]; then
            [ "$SC" = 1 ] && [ "$CC" = 1 ] && [ "$SL" != - ] && [ "$SL" = "$CR" ] && [ "$CL" = "$SR" ] &&
                [ "$SI" = $N ] && [ "$CI" = $N ] && return 0
            lab_log "$tool -R: the ends ran but their reports do not match"; return 1
        fi
        if [ "$CREJ" = 1 ] && [ $round -lt 3 ]; then
            lab_log "$tool -R: the client's connect was refused (perftest's second-connect race, docs/verbs.md): the pair again"
            round=$((round+1)); port=$((port+10)); continue
        fi
        return 1
    done
}
perf_pair ib_write_bw 18515 labU2 labU1 || { lab_log "ib_write_bw -R FAILED"; fail=1; }
perf_pair ib_send_lat 18516 labU1 labU2 || { lab_log "ib_send_lat -R FAILED"; fail=1; }

# 4. Clean ends.
for n in labU1 labU2; do put "/lab/cur/$n" end; done
for n in labU1 labU2; do
    r=$(lab_wait_result $n 120)
    lab_log "$n result: $r"
    [ "$r" = ok ] || fail=1
done
vrdmactl stats "$D1" | grep -E 'channels|qps|bytes'
# Both detaches at once (each is a XenStore round trip through the backend: slow under TCG).
vrdmactl detach "$D1" --timeout 60 & P1=$!
vrdmactl detach "$D2" --timeout 60 & P2=$!
wait $P1 || { lab_log "vrdmactl detach $D1 FAILED"; fail=1; }
wait $P2 || { lab_log "vrdmactl detach $D2 FAILED"; fail=1; }
lab_log "both devices detached"
vrdmactl list
for n in labU1 labU2; do lab_ack $n; done
lab_wait_gone labU1
lab_wait_gone labU2
kill "$BACKEND"
wait "$BACKEND" || { lab_log "vrdma-backend exited with an error"; fail=1; }
echo "---- vrdma-backend log (warnings, errors) ----"
grep -iE 'warn|error|panic' /run/lab/backend.log | tail -n 30
cp /run/lab/backend.log /mnt/lab/out/vrdma-backend.log 2>/dev/null
grep -q -i panic /run/lab/backend.log && { lab_log "backend panicked"; fail=1; }
exit $fail

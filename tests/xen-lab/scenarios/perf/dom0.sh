# perf scenario, dom0 side (sourced by init-dom0.sh; lab-lib.sh loaded): vrdma between two
# domUs beside TCP over netfront/netback (a bridge in dom0) and libxenvchan, in one boot, then
# the 64 B round trip again with the scheduling knobs turned: the engine's spin-before-sleep,
# a vchan between dom0 and a domU (what one event-channel hop into dom0 and back costs), and
# vCPU placement (dom0 alone on one physical CPU, both domUs on the other). Prints the table
# (lines "PERF: ...") and exits 0 iff every step measured something.
# Needs on PATH (the share): vrdma-backend, vrdmactl, vrdma-perf, lab-perf, and the modules
# llc.ko stp.ko bridge.ko xen-netback.ko (dom0) and xen-netfront.ko (domUs).
# N round trips per latency step (after 10 warm-up ones for lab-perf), NB messages per
# bandwidth size (NB in flight for vrdma), the same for every method. Every step's processes
# run under `timeout` in the domUs: a stuck method fails its step, not the boot.
fail=0
BIN=/mnt/lab/bin
N=100; NB=32
lab_log "perf: $N round trips, $NB messages per bandwidth size; dom0 vCPUs $(grep -c ^processor /proc/cpuinfo)"

# The bridge to the domUs (lab-lib.sh): dom0 10.0.0.1 on xenbr0, each domU's vif on it.
lab_bridge || exit 1

# The backend with a given engine spin-before-sleep (µs); restarted with SIGKILL between
# configurations (no channel is open then; a new backend takes the devices over).
BACKEND=
backend() {
    if [ -n "$BACKEND" ]; then kill -9 "$BACKEND"; wait "$BACKEND" 2>/dev/null; fi
    printf 'spin-before-sleep-us = %s\n' "$1" > /run/lab/backend.toml
    RUST_LOG=info vrdma-backend --config /run/lab/backend.toml >> /run/lab/backend.log 2>&1 &
    BACKEND=$!
    i=0
    until grep -q "page budgets" /run/lab/backend.log 2>/dev/null && [ "$(grep -c 'page budgets' /run/lab/backend.log)" -ge "$2" ]; do
        i=$((i+1)); [ $i -gt 300 ] && { lab_log "vrdma-backend did not start"; return 1; }
        sleep 0.2
    done
    sleep 2
    SPIN=$1
    lab_log "vrdma-backend (pid $BACKEND) with spin-before-sleep-us = $1"
}
backend 200 1 || exit 1
lab_start_domU labU1 200 || exit 1
lab_start_domU labU2 200 || exit 1
D1=$(lab_domid labU1); D2=$(lab_domid labU2)
for d in $D1 $D2; do
    vrdmactl attach "$d" --timeout 60 || { lab_log "vrdmactl attach $d FAILED"; exit 1; }
done
put() { xenstore-write "$1" "$2" && lab_share_readable "$1" "$D1" "$D2"; }
put /lab 1
put /lab/ready 1
for n in labU1 labU2; do
    i=0
    until xenstore-read "/local/domain/$(lab_domid $n)/data/net-up" >/dev/null 2>&1; do
        i=$((i+1)); [ $i -gt 1500 ] && { lab_log "$n's network never came up"; exit 1; }
        xenstore-exists "/local/domain/$(lab_domid $n)" || { lab_log "$n died"; exit 1; }
        sleep 0.2
    done
done
lab_log "both domUs on the bridge: $(ls /sys/class/net/xenbr0/brif | tr '\n' ' ')"

# Placement: "spread" = labU1 on pCPU0, labU2 on pCPU1, dom0's vCPUs float (the first
# measurement's); "engine-alone" = dom0 on pCPU0, both domUs on pCPU1.
place() {
    case $1 in
    spread) xl vcpu-pin 0 all all; xl vcpu-pin labU1 0 0; xl vcpu-pin labU2 0 1 ;;
    engine-alone) xl vcpu-pin 0 all 0; xl vcpu-pin labU1 0 1; xl vcpu-pin labU2 0 1 ;;
    esac
    PLACE=$1
    lab_log "placement $1: $(xl vcpu-list | tail -n +2 | awk '{printf "%s/v%s@p%s(%s) ", $1, $3, $4, $7}')"
}

wait_dom() { # NAME KEY VALUE: waits for the domU's data/KEY = VALUE
    i=0
    until [ "$(xenstore-read "/local/domain/$(lab_domid $1)/data/$2" 2>/dev/null)" = "$3" ]; do
        i=$((i+1)); [ $i -gt 6000 ] && { lab_log "no $2 = $3 from $1"; return 1; }
        xenstore-exists "/local/domain/$(lab_domid $1)" || { lab_log "$1 died"; return 1; }
        sleep 0.2
    done
}
STEP=0
: > /run/lab/results
# step LABEL SERVER_CMD CLIENT_CMD [DOM0_SERVER_CMD]: labU2 serves ("-": nothing), labU1 is
# the client; the optional fourth runs in dom0 as the server instead.
step() {
    STEP=$((STEP+1)); s=$STEP
    put "/lab/step/$s/srv" "$2"; put "/lab/step/$s/cli" "$3"
    DP=
    if [ -n "$4" ]; then
        sh -c "$4" > /run/lab/dom0-srv.out 2>&1 &
        DP=$!
        i=0
        until grep -q LISTENING /run/lab/dom0-srv.out; do
            i=$((i+1)); [ $i -gt 300 ] && break; sleep 0.1
        done
    fi
    put /lab/cur "$s"
    wait_dom labU2 ready "$s" || return 1
    put /lab/go "$s"
    wait_dom labU1 done "$s" || return 1
    wait_dom labU2 srvdone "$s" || return 1
    [ -n "$DP" ] && { wait "$DP" || { lab_log "dom0 server failed: $(tail -n 3 /run/lab/dom0-srv.out)"; }; }
    res=$(xenstore-read "/local/domain/$D1/data/res")
    lab_log "step $s [$1] $res"
    case $res in *=*) ;; *) fail=1 ;; esac
    echo "$1|$PLACE|$SPIN|$res" >> /run/lab/results
}
P=18600
tcp() { P=$((P+1)); step "$1" "lab-perf tcp-server $P $N $NB" "lab-perf tcp-client 10.0.0.12 $P $N $NB"; }
vchan() { step "$1" "lab-perf vchan-server $D1 /local/domain/$D2/data/vchan$STEP $N $NB $2" \
                    "lab-perf vchan-client $D2 /local/domain/$D2/data/vchan$STEP $N $NB $2"; }
vchan0() { step "$1" - "lab-perf vchan-client 0 /lab/vchan0-$STEP $N $NB $2" \
                       "timeout 300 lab-perf vchan-server $D1 /lab/vchan0-$STEP $N $NB $2"; }
# vrdma LABEL TEST MODE POLLING(events|busy): vrdma-perf server in labU2, client in labU1.
vrdma() {
    P=$((P+1))
    o="-m $3 -p $P"; [ "$4" = events ] && o="$o -e"
    case $2 in send_lat) o="$o -n $N -s 64" ;; write_bw) o="$o -n $NB -t $NB -s 65536,1048576" ;; esac
    step "$1" "vrdma-perf $2 $o" "vrdma-perf $2 10.0.0.12 $o"
}

place spread
uptime | sed 's/^/LAB: uptime (dom0): /'
# The comparison, 64 B round trips first (the part the knobs are about), then bandwidth.
vchan "vchan blocking" blocking
vchan "vchan busy" busy
for m in bypass mediated; do
    for p in events busy; do vrdma "vrdma $m $p" send_lat $m $p; done
done
# Knobs, 64 B round trip: one hop into dom0 and back, without the engine.
vchan0 "vchan dom0-labU1 blocking" blocking
vchan0 "vchan dom0-labU1 busy" busy
# The engine's spin-before-sleep: 0 (every post kicks, every hop wakes the engine), 10 s
# (the engine never sleeps while the runs last: no kicks).
backend 0 2
vrdma "vrdma bypass events" send_lat bypass events
vrdma "vrdma bypass busy" send_lat bypass busy
backend 10000000 3
vrdma "vrdma bypass events" send_lat bypass events
vrdma "vrdma bypass busy" send_lat bypass busy
# Placement: dom0 (the engine, never sleeping) alone on pCPU0, both domUs on pCPU1.
place engine-alone
vrdma "vrdma bypass events" send_lat bypass events
vrdma "vrdma mediated events" send_lat mediated events
vchan "vchan blocking" blocking
# Back to the first configuration for bandwidth, and TCP last.
place spread
backend 200 4
for m in bypass mediated; do
    for p in events busy; do vrdma "vrdma $m $p" write_bw $m $p; done
done
tcp "TCP netfront/bridge"
put /lab/cur end
uptime | sed 's/^/LAB: uptime (dom0): /'

# The table: one row per (method, placement, engine spin); ratios against vchan blocking's
# round trip and TCP's bandwidth of the first (spread, 200 µs) rows.
awk -F'|' '
    function get(s, k,   a, i, n) { n = split(s, a, " "); for (i = 1; i <= n; i++) if (index(a[i], k "=") == 1) return substr(a[i], length(k) + 2); return "" }
    { key = $1 "|" $2 "|" $3; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
      for (f = 1; f <= 4; f++) { k = (f == 1 ? "rtt64_med_us" : f == 2 ? "rtt64_min_us" : f == 3 ? "bw64k_MBps" : "bw1m_MBps"); v = get($4, k); if (v != "") val[key, f] = v } }
    END {
        vb = val["vchan blocking|spread|200", 1]; tcp64 = val["TCP netfront/bridge|spread|200", 3]; tcp1m = val["TCP netfront/bridge|spread|200", 4]
        printf "PERF: | method | placement | engine spin µs | 64 B RTT median µs | RTT min µs | ÷ vchan blocking | 64 KiB MB/s | ÷ TCP | 1 MiB MB/s | ÷ TCP |\n"
        printf "PERF: |---|---|---|---|---|---|---|---|---|---|\n"
        for (i = 1; i <= n; i++) {
            k = order[i]; split(k, p, "|")
            r = val[k, 1]; b1 = val[k, 3]; b2 = val[k, 4]
            printf "PERF: | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p[1], p[2], p[3], r, val[k, 2],
                (r != "" && vb > 0) ? sprintf("%.2f", r / vb) : "",
                b1, (b1 != "" && tcp64 > 0) ? sprintf("%.2f", b1 / tcp64) : "",
                b2, (b2 != "" && tcp1m > 0) ? sprintf("%.2f", b2 / tcp1m) : ""
        }
    }' /run/lab/results
cp /run/lab/results /mnt/lab/out/results 2>/dev/null

for name in labU1 labU2; do
    r=$(lab_wait_result $name 120)
    lab_log "$name result: $r"
    [ "$r" = ok ] || fail=1
done
for d in $D1 $D2; do vrdmactl detach "$d" --timeout 60 || fail=1; done
for name in labU1 labU2; do lab_ack $name; done
lab_wait_gone labU1
lab_wait_gone labU2
kill "$BACKEND"; wait "$BACKEND"
grep -q -i panic /run/lab/backend.log && { lab_log "backend panicked"; fail=1; }
exit $fail

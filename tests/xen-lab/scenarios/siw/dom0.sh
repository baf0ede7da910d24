# siw scenario, dom0 side (sourced by init-dom0.sh; lab-lib.sh loaded): Linux's Soft-iWARP in
# dom0, the reference our iWARP wire is compared to. For each MPA CRC mode — siw.ko (siw's
# default: CRC not asked for) and siw-crc.ko (the same source asking for CRC, see
# build-siw.sh) — it loads siw, binds siw1 to a dummy netdev with 10.78.0.1/24, and runs stock
# rdma-core tools on siw1, server and client both in dom0, while tcpdump captures the TCP
# traffic (to a local address it goes over lo): rping with data validation, perftest's
# ib_write_bw, ib_read_lat and ib_send_lat over rdma_cm (-R). The captures and each tool's
# output go to the share's out/ (out/siw-<mode>-<tool>.pcap, .log). Exits 0 iff every tool
# exited 0, rping verified its data and every capture holds packets.
# Needs on PATH (the share): siw.ko and siw-crc.ko (build-siw.sh). The rdma modules and user
# space are in the dom0 image (/etc/lab-rdma-modules, /usr/lib/lab-rdma).
# SIW_MODES (default "nocrc crc") and SIW_TOOLS may be set by a later step that reuses the
# functions below (phase_setup / phase_teardown / run_pair) — e.g. a vrdma guest in a domU
# against the same siw1 (not yet: see the TODO at the end).
fail=0
R=/usr/lib/lab-rdma
OUT=/mnt/lab/out
ADDR=10.78.0.1
BIN=/mnt/lab/bin
TO=120   # seconds, per tool process (TCG on a busy host is slow; an idle one needs ~2 s)

# tcpdump drops privileges to a user it looks up: give it root.
[ -f /etc/passwd ] || echo 'root:x:0:0:root:/:/bin/sh' > /etc/passwd
[ -f /etc/group ] || echo 'root:x:0:' > /etc/group

while read -r m; do
    [ -n "$m" ] || continue
    insmod "/lib/modules/$m" 2>/tmp/insmod.err || { lab_log "insmod $m FAILED: $(cat /tmp/insmod.err)"; exit 1; }
done < /etc/lab-rdma-modules
# dummy.ko made dummy0 on load. lo carries the traffic (10.78.0.1 to itself): bring it up.
$R/ip link set lo up && $R/ip addr add $ADDR/24 dev dummy0 && $R/ip link set dummy0 up || { lab_log "dummy0 FAILED"; exit 1; }
lab_log "rdma modules loaded; dummy0 $ADDR/24 up"

# listening PORT: waits (up to 30 s) for a TCP listener on PORT (iw_cm's listen is a kernel
# socket, in /proc/net/tcp like any other).
listening() {
    hex=$(printf '%04X' "$1"); i=0
    until awk -v p=":$hex" '$2 ~ p"$" && $4 == "0A" {f=1} END {exit !f}' /proc/net/tcp; do
        i=$((i+1)); [ $i -gt 150 ] && return 1
        sleep 0.2
    done
}

phase_setup() {
    mode=$1; ko=siw.ko; [ "$mode" = crc ] && ko=siw-crc.ko
    insmod "$BIN/$ko" 2>/tmp/insmod.err || { lab_log "insmod $ko FAILED: $(cat /tmp/insmod.err)"; return 1; }
    $R/rdma link add siw1 type siw netdev dummy0 || { lab_log "rdma link add siw1 FAILED"; return 1; }
    lab_log "siw ($ko) on dummy0: $($R/rdma link show siw1/1 2>&1)"
    $R/ibv_devinfo -d siw1 | grep -E 'hca_id|transport|fw_ver|state|active_mtu' | sed "s/^/  $mode ibv_devinfo: /"
}
phase_teardown() {
    $R/rdma link delete siw1 || { lab_log "rdma link delete siw1 FAILED"; return 1; }
    rmmod siw || { lab_log "rmmod siw FAILED"; return 1; }
}

# run_pair MODE NAME PORT SERVER_CMD... -- CLIENT_CMD...: tcpdump on lo (TCP, PORT's
# connections), the server, then (once it listens) the client; both must exit 0.
run_pair() {
    mode=$1; name=$2; port=$3; shift 3
    srv=; while [ "$1" != -- ]; do srv="$srv $1"; shift; done; shift
    cli="$*"
    tag=siw-$mode-$name
    $R/tcpdump -i lo -U -Z root -c 4000 -w "/run/lab/$tag.pcap" "tcp port $port" > "/run/lab/$tag.tcpdump" 2>&1 &
    tp=$!
    i=0; until grep -q 'listening on lo' "/run/lab/$tag.tcpdump" 2>/dev/null; do
        i=$((i+1))
        if [ $i -gt 100 ] || ! kill -0 $tp 2>/dev/null; then
            lab_log "$tag: tcpdump did not start: $(cat /run/lab/$tag.tcpdump)"; return 1
        fi
        sleep 0.2
    done
    t0=$(lab_up)
    timeout $TO $srv > "/run/lab/$tag.server.log" 2>&1 &
    sp=$!
    if ! listening "$port"; then
        lab_log "$tag: server never listened on $port"; kill $sp $tp 2>/dev/null; wait $sp $tp; return 1
    fi
    timeout $TO $cli > "/run/lab/$tag.client.log" 2>&1
    crc=$?
    wait $sp; src=$?
    t1=$(lab_up)
    sleep 0.5
    kill -INT $tp 2>/dev/null; wait $tp
    for f in pcap server.log client.log tcpdump; do cp "/run/lab/$tag.$f" "$OUT/"; done
    pk=$(sed -n 's/^\([0-9]*\) packets captured.*/\1/p' "/run/lab/$tag.tcpdump")
    lab_log "$tag: server rc=$src client rc=$crc, $pk packets captured ($(wc -c < /run/lab/$tag.pcap) bytes), $t0-$t1 s"
    [ "$src" = 0 ] && [ "$crc" = 0 ] && [ "${pk:-0}" -gt 0 ]
}

for mode in ${SIW_MODES:-nocrc crc}; do
    phase_setup $mode || { fail=1; break; }
    # rping: 5 pings of 64 B, the client verifies every one it gets back (-V).
    if run_pair $mode rping 7174 $R/rping -s -v -V -a $ADDR -C 5 -S 64 -- $R/rping -c -v -V -a $ADDR -C 5 -S 64; then
        grep -c 'ping data' "/run/lab/siw-$mode-rping.client.log" | grep -qx 5 ||
            { lab_log "siw-$mode-rping: the client did not print 5 pings"; fail=1; }
        sed -n '1,2p' "/run/lab/siw-$mode-rping.client.log" | sed "s/^/  /"
    else
        fail=1; sed 's/^/  /' /run/lab/siw-$mode-rping.*.log | tail -n 20
    fi
    for t in "ib_write_bw 18515 -s 4096 -n 20" "ib_read_lat 18516 -s 64 -n 20" "ib_send_lat 18517 -s 64 -n 20"; do
        set -- $t; tool=$1; port=$2; shift 2
        if run_pair $mode $tool $port $R/$tool -R -d siw1 -p $port -F "$@" -- $R/$tool -R -d siw1 -p $port -F "$@" $ADDR; then
            grep -E '^ *[0-9]+ +[0-9]+ ' "/run/lab/siw-$mode-$tool.client.log" | head -n 1 | sed "s/^/  $mode $tool: /"
        else
            fail=1; sed 's/^/  /' /run/lab/siw-$mode-$tool.*.log | tail -n 30
        fi
    done
    phase_teardown || { fail=1; break; }
done
# TODO (issue 12, later): a vrdma guest in a domU against siw1 — the backend in dom0 bridging
# the guest's QP to siw's tools (vrdma initiator to `rping -s`, `rping -c` to a vrdma guest
# listening), in both CRC modes, within phase_setup/phase_teardown above.
dmesg | grep -iE 'siw|iw_cm|rdma' | tail -n 20 | sed 's/^/  dmesg: /'
exit $fail

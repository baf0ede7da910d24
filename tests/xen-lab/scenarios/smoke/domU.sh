# Smoke scenario, domU side: sh /lab/domU.sh NAME DOMID; exit 0 = pass.
NAME=$1; DOMID=$2
i=0
until xenstore-read /lab/ready >/dev/null 2>&1; do
    i=$((i+1)); [ $i -gt 600 ] && { echo "$NAME: timed out waiting for /lab/ready"; exit 1; }
    sleep 0.2
done
rc=0
HELLO=$(xenstore-read /lab/hello 2>&1)
[ "$HELLO" = hello-domU-from-dom0 ] || { echo "$NAME: /lab/hello -> '$HELLO'"; rc=1; }
if xenstore-read /lab/secret >/dev/null 2>&1; then
    echo "$NAME: could read /lab/secret (permissions not enforced)"; rc=1
else
    echo "$NAME: /lab/secret refused, as it should be"
fi
if xenstore-read /lab/offer/labU1/gref >/dev/null 2>&1 && [ "$NAME" = labU2 ]; then
    echo "$NAME: could read labU1's offer (permissions not enforced)"; rc=1
fi
GREF=$(xenstore-read "/lab/offer/$NAME/gref")
PORT=$(xenstore-read "/lab/offer/$NAME/port")
xenlab-probe map 0 "$GREF" "$PORT" || rc=1
# Reverse direction: we grant a page to dom0 and publish it in our own directory.
xenlab-probe offer 0 /tmp/offer.txt 90 > /tmp/offer.log 2>&1 &
OP=$!
i=0; until [ -s /tmp/offer.txt ] || [ $i -gt 50 ]; do sleep 0.1; i=$((i+1)); done
G2=$(sed -n 's/.*gref=\([0-9]*\).*/\1/p' /tmp/offer.txt)
P2=$(sed -n 's/.*port=\([0-9]*\).*/\1/p' /tmp/offer.txt)
xenstore-write data/gref "$G2" data/port "$P2"
wait $OP || rc=1
cat /tmp/offer.log
exit $rc

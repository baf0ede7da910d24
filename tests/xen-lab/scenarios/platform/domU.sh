# platform scenario, domU side: sh /lab/domU.sh NAME DOMID; exit 0 = pass.
NAME=$1; DOMID=$2
i=0
until xenstore-read /lab/ready >/dev/null 2>&1; do
    i=$((i+1)); [ $i -gt 900 ] && { echo "$NAME: timed out waiting for /lab/ready"; exit 1; }
    sleep 0.2
done
ROUNDS=$(xenstore-read /lab/rounds)
rc=0
xen-platform-real-xen-tests --ignored --test-threads=1 || rc=1
# 40 children: a domU node (children names included) must fit xenstored's 2048-byte quota.
xs-probe --xenbus selftest data/xs-probe --children 40 --denied /lab/secret || rc=1
case $NAME in
labU1)
    xenstore-read /lab/pp-offer > /tmp/pp-offer || { echo "$NAME: cannot read /lab/pp-offer"; exit 1; }
    platform-probe map /tmp/pp-offer "$ROUNDS" || rc=1 ;;
labU2)
    platform-probe offer 0 /tmp/pp-offer "$ROUNDS" > /tmp/pp-offer.log 2>&1 &
    OP=$!
    i=0; until [ -s /tmp/pp-offer ] || [ $i -gt 100 ]; do sleep 0.2; i=$((i+1)); done
    xenstore-write data/pp-offer "$(cat /tmp/pp-offer)"
    wait $OP || rc=1
    cat /tmp/pp-offer.log ;;
esac
exit $rc

#!/usr/bin/env bash
# Checks deploy/frr/frr.conf.example against the installed FRR (scripts/install-frr.sh):
# vtysh parses it (dry run), and in two network namespaces made here (a hub running zebra,
# bgpd and bfdd with the example, and a LAN router) the router learns by eBGP the
# blackhole route pepd would write to table 200, learns it with the prepended path once
# it moves to table 201, and loses it when the tables are emptied. Root; the namespaces
# and daemons go on exit. Exit status 0 when every step holds.
set -euo pipefail
example="$(cd "$(dirname "$0")/.." && pwd)/deploy/frr/frr.conf.example"
hub=pepd-frrchk-hub-$$
rtr=pepd-frrchk-rtr-$$
dir=$(mktemp -d /tmp/pepd-frrchk.XXXXXX)
chown frr:frr "$dir"
cleanup() {
    for p in "$dir"/*/*.pid; do
        [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true
    done
    sleep 0.5
    ip netns del "$hub" 2>/dev/null || true
    ip netns del "$rtr" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

echo "vtysh dry run of $example"
vtysh -C -f "$example" || fail "vtysh does not take the example"

ip netns add "$hub"
ip netns add "$rtr"
ip link add frrchk-h$$ netns "$hub" type veth peer name frrchk-r$$ netns "$rtr"
ip -n "$hub" addr add 198.18.3.11/24 dev frrchk-h$$
ip -n "$rtr" addr add 198.18.3.254/24 dev frrchk-r$$
for ns in "$hub" "$rtr"; do ip -n "$ns" link set lo up; done
ip -n "$hub" link set frrchk-h$$ up
ip -n "$rtr" link set frrchk-r$$ up
ip -n "$hub" route replace blackhole 198.18.40.0/24 table 200

cat >"$dir/router.conf" <<'CONF'
router bgp 65000
 bgp router-id 198.18.3.254
 no bgp ebgp-requires-policy
 neighbor 198.18.3.11 remote-as 65011
 neighbor 198.18.3.11 timers 1 3
 neighbor 198.18.3.11 bfd
exit
CONF
for side in hub rtr; do
    ns=$hub; [ $side = rtr ] && ns=$rtr
    mkdir -p "$dir/$side"
    chown frr:frr "$dir/$side"
    for d in zebra bgpd bfdd; do
        ip netns exec "$ns" /usr/lib/frr/$d -d -f /dev/null -A 127.0.0.1 \
            -i "$dir/$side/$d.pid" -z "$dir/$side/zserv.api" --vty_socket "$dir/$side" \
            -u frr -g frr --log "file:$dir/$side/$d.log"
    done
done
sleep 2
ip netns exec "$hub" vtysh --vty_socket "$dir/hub" -f "$example" || fail "the hub's FRR refuses the example"
ip netns exec "$rtr" vtysh --vty_socket "$dir/rtr" -f "$dir/router.conf"

# The router's kernel route to the prefix, learned by BGP, and its AS path.
learned() { ip -n "$rtr" -4 route show 198.18.40.0/24 proto bgp; }
path() {
    ip netns exec "$rtr" vtysh --vty_socket "$dir/rtr" -c 'show bgp ipv4 unicast 198.18.40.0/24 json' |
        python3 -c 'import json,sys; p=json.load(sys.stdin).get("paths",[]); print(p[0]["aspath"]["string"] if p else "")'
}
wait_for() { # what, expected, seconds
    for _ in $(seq 1 $((${3} * 4))); do
        [ "$($1)" = "$2" ] && return 0
        sleep 0.25
    done
    fail "$1: wanted '$2', got '$($1)'"
}
wait_for path "65011" 20
echo "served (table 200): router has '$(learned)', AS path $(path)"
ip -n "$hub" -batch - <<'BATCH'
route replace blackhole 198.18.40.0/24 table 201
route del 198.18.40.0/24 table 200
BATCH
wait_for path "65011 65011 65011 65011" 10
echo "in an outage (table 201): router has '$(learned)', AS path $(path)"
ip -n "$hub" route flush table 201
wait_for learned "" 10
echo "tables emptied: the router has no route to 198.18.40.0/24"
echo "ok"

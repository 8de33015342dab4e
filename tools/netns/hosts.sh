#!/usr/bin/env bash
# Separate network hosts on one machine, for multi-host tests and for a person to try a
# multi-machine launch: each "host" is a Linux network namespace with its own loopback,
# interfaces, addresses and routes. A switch namespace holds a bridge that joins them.
#
#   bash tools/netns/hosts.sh up NAME N     make N hosts: NAME-h0 .. NAME-h<N-1>
#   bash tools/netns/hosts.sh down NAME     remove them (and the switch), whatever state
#   bash tools/netns/hosts.sh exec NAME I CMD...   run CMD on host I
#   bash tools/netns/hosts.sh cut NAME I    take host I's cluster link down (a lost host)
#   bash tools/netns/hosts.sh mend NAME I   bring it back up
#   bash tools/netns/hosts.sh kill NAME I   SIGKILL every process running on host I
#
# Host I has two interfaces, made in this order:
#   eth0  10.214.0.(10+I)/24  a management network that reaches nobody (its peer is down):
#         the first interface, so a launcher that takes "the first non-loopback interface"
#         picks the wrong one, as on real clusters;
#   eth1  10.213.0.(10+I)/24  the cluster network, bridged to every other host.
# Every address lives only inside namespaces this script made (the switch too), so nothing
# is routed to or from the machine's own network. Needs root and iproute2.
set -euo pipefail

CLUSTER_NET=10.213.0
MGMT_NET=10.214.0
FIRST_HOST=10

usage() { sed -n '2,13p' "$0" >&2; exit 2; }

host_ns() { echo "$1-h$2"; }
switch_ns() { echo "$1-sw"; }

up() {
  local name=$1 count=$2 sw
  sw=$(switch_ns "$name")
  down "$name" 2>/dev/null || true
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < count; i++)); do
    local ns
    ns=$(host_ns "$name" "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # eth0: the dead management network (its switch-side peer is up and bridged to nothing)
    ip link add eth0 netns "$ns" type veth peer name "m$i" netns "$sw"
    ip -n "$ns" addr add "$MGMT_NET.$((FIRST_HOST + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$sw" link set "m$i" up  # carrier on, but bridged to nothing
    # eth1: the cluster network
    ip link add eth1 netns "$ns" type veth peer name "c$i" netns "$sw"
    ip -n "$sw" link set "c$i" master br0
    ip -n "$sw" link set "c$i" up
    ip -n "$ns" addr add "$CLUSTER_NET.$((FIRST_HOST + i))/24" dev eth1
    ip -n "$ns" link set eth1 up
  done
}

down() {
  local name=$1 ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$name-(h[0-9]+|sw)$" || true); do
    # processes still running inside (a test that failed) go first
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns"
  done
}

cmd=${1:-}; shift || true
case "$cmd" in
  up) [[ $# -eq 2 ]] || usage; up "$1" "$2" ;;
  down) [[ $# -eq 1 ]] || usage; down "$1" ;;
  exec) [[ $# -ge 3 ]] || usage; ns=$(host_ns "$1" "$2"); shift 2; exec ip netns exec "$ns" "$@" ;;
  cut) [[ $# -eq 2 ]] || usage; ip -n "$(host_ns "$1" "$2")" link set eth1 down ;;
  mend) [[ $# -eq 2 ]] || usage; ip -n "$(host_ns "$1" "$2")" link set eth1 up ;;
  kill) [[ $# -eq 2 ]] || usage; ip netns pids "$(host_ns "$1" "$2")" | xargs -r kill -9 ;;
  *) usage ;;
esac

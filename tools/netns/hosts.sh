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
#   bash tools/netns/hosts.sh private NAME  give every host a filesystem of its own (below)
#   bash tools/netns/hosts.sh pexec NAME I CMD...  run CMD on host I, in its own filesystem
#   bash tools/netns/hosts.sh store NAME    give the switch's bridge 10.213.0.2/24: a server
#                                           run in NAME-sw there is on the cluster network
#
# Host I has two interfaces, made in this order:
#   eth0  10.214.0.(10+I)/24  a management network that reaches nobody (its peer is down):
#         the first interface, so a launcher that takes "the first non-loopback interface"
#         picks the wrong one, as on real clusters;
#   eth1  10.213.0.(10+I)/24  the cluster network, bridged to every other host.
# Every address lives only inside namespaces this script made (the switch too), so nothing
# is routed to or from the machine's own network. Needs root and iproute2.
#
# `private`: the namespaces share the machine's files; after it, host I also has a mount
# namespace of its own (kept in /run/accel-hosts/NAME-hI) in which / is read-only, and /tmp
# and /dev/shm are empty tmpfs that only host I sees, kept from one `pexec` to the next as a
# real host keeps its disk. `pexec` runs in /tmp/work with HOME, TMPDIR and the XDG, torch
# and triton caches in /tmp/home, so the code (the repository, the interpreter) stays
# readable and everything a run writes is on the host's own /tmp (or reaches it over the
# network). Needs util-linux's unshare and nsenter.
set -euo pipefail

CLUSTER_NET=10.213.0
MGMT_NET=10.214.0
FIRST_HOST=10

STORE_ADDR=$CLUSTER_NET.2
PRIVATE_DIR=/run/accel-hosts

usage() { sed -n '2,16p' "$0" >&2; exit 2; }

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

# A host's own filesystem: a mount namespace kept by a bind mount of its nsfs file.
private() {
  local name=$1 ns
  mkdir -p "$PRIVATE_DIR"
  # an nsfs file may only be bind-mounted below a mount that does not propagate
  if ! findmnt -rn "$PRIVATE_DIR" >/dev/null; then
    mount --bind "$PRIVATE_DIR" "$PRIVATE_DIR"
  fi
  mount --make-private "$PRIVATE_DIR"
  for ns in $(host_names "$name"); do
    touch "$PRIVATE_DIR/$ns"
    unshare --mount="$PRIVATE_DIR/$ns" --propagation private sh -c '
      mount -o remount,bind,ro / &&
      mount -t tmpfs -o mode=1777,size=2g tmpfs /tmp &&
      mount -t tmpfs -o mode=1777,size=1g tmpfs /dev/shm &&
      mkdir -p /tmp/work /tmp/home'
  done
}

pexec() {
  local name=$1 i=$2 ns
  ns=$(host_ns "$name" "$i")
  shift 2
  [[ -e "$PRIVATE_DIR/$ns" ]] || { echo "host $ns has no filesystem of its own: run \`$0 private $name\` first" >&2; exit 2; }
  # the mount namespace first: `ip netns exec` then makes a child of it with this host's /sys
  exec nsenter --mount="$PRIVATE_DIR/$ns" ip netns exec "$ns" env \
    HOME=/tmp/home TMPDIR=/tmp XDG_CONFIG_HOME=/tmp/home/.config \
    XDG_CACHE_HOME=/tmp/home/.cache XDG_DATA_HOME=/tmp/home/.local/share \
    XDG_STATE_HOME=/tmp/home/.local/state XDG_RUNTIME_DIR=/tmp/home/.run \
    TORCHINDUCTOR_CACHE_DIR=/tmp/home/.cache/torchinductor \
    TRITON_CACHE_DIR=/tmp/home/.cache/triton TORCH_HOME=/tmp/home/.cache/torch \
    HF_HOME=/tmp/home/.cache/huggingface PYTHONDONTWRITEBYTECODE=1 \
    sh -c 'cd /tmp/work && exec "$@"' "$ns" "$@"
}

host_names() {
  ip netns list | awk '{print $1}' | grep -E "^$1-h[0-9]+$" || true
}

down() {
  local name=$1 ns
  # the hosts' filesystems first (each holds a copy of /run/netns, so their network
  # namespaces live on until it goes)
  for ns in $(ls "$PRIVATE_DIR" 2>/dev/null | grep -E "^$name-h[0-9]+$" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    umount "$PRIVATE_DIR/$ns" 2>/dev/null || true
    rm -f "$PRIVATE_DIR/$ns"
  done
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
  private) [[ $# -eq 1 ]] || usage; private "$1" ;;
  pexec) [[ $# -ge 3 ]] || usage; pexec "$@" ;;
  store) [[ $# -eq 1 ]] || usage; ip -n "$(switch_ns "$1")" addr replace "$STORE_ADDR/24" dev br0 ;;
  *) usage ;;
esac

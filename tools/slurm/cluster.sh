#!/usr/bin/env bash
# A real SLURM cluster on loopback, for tests: one controller and two slurmd "nodes" on this
# host, authenticated by a private munged. Everything (configuration, munge key and socket,
# spool, state, logs, pid files) lives under one directory.
#
#   tools/slurm/cluster.sh start   # install slurm + munge when missing, start, print the env
#   tools/slurm/cluster.sh stop    # stop the daemons started by `start` (by their pid files)
#   tools/slurm/cluster.sh status  # sinfo, or exit 1 when the cluster is not up
#
# ACCEL_SLURM_DIR: the directory (default /tmp/accel-slurm). `start` writes $DIR/env, which
# clients source (it sets SLURM_CONF); tests look for it there. ACCEL_SLURM_PORT: the
# controller's port (default 16817; the nodes take the next two). `start` is idempotent: a
# cluster that answers is left running. The daemons run as root (SlurmUser=root), which is
# what a CI machine gives; apt installs the Debian packages when the commands are missing.
#
# The nodes are named 127.0.0.1 and 127.0.0.2: node names must resolve for a rendezvous on
# the first host of SLURM_JOB_NODELIST (as on a real cluster), these do without touching
# /etc/hosts, and SLURM gives `localhost` a meaning of its own (this host's name).
#
# ACCEL_SLURM_NETNS=NAME: the nodes are separate network hosts instead, the first two hosts
# that `tools/netns/hosts.sh up NAME N` made: each slurmd runs in its host's namespace, named
# by that host's cluster address (10.213.0.10, 10.213.0.11), and the controller runs on the
# first one. Clients must run there too: `ip netns exec NAME-h0 sbatch ...` (the env file
# says so in ACCEL_SLURM_CLIENT_NETNS).
set -euo pipefail

DIR="${ACCEL_SLURM_DIR:-/tmp/accel-slurm}"
PORT="${ACCEL_SLURM_PORT:-16817}"
CPUS_PER_NODE=4 # declared, not counted: tasks are tiny (SlurmdParameters=config_overrides)

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}

install_packages() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v srun \
    >/dev/null && command -v munged >/dev/null && return 0
  [ "$(id -u)" = 0 ] || die "slurm and munge are not installed; as root this script installs
them with apt (apt-get install slurmctld slurmd slurm-client munge)"
  command -v apt-get >/dev/null || die "slurm and munge are not installed and there is no
apt-get: install slurmctld, slurmd, the slurm client commands and munge"
  echo "cluster.sh: installing slurmctld slurmd slurm-client munge" >&2
  local pkgs=(slurmctld slurmd slurm-client munge)
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q --no-install-recommends "${pkgs[@]}" >"$DIR/apt.log" 2>&1; then
    apt-get update -q >>"$DIR/apt.log" 2>&1 || true
    apt-get install -y -q --no-install-recommends "${pkgs[@]}" >>"$DIR/apt.log" 2>&1 ||
      die "apt-get install ${pkgs[*]} failed; see $DIR/apt.log"
  fi
}

alive() { # pid file -> 0 when its process runs
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

NETNS="${ACCEL_SLURM_NETNS:-}"
if [ -n "$NETNS" ]; then
  NODES="10.213.0.10 10.213.0.11"
  CONTROLLER=10.213.0.10
  # nsenter switches the network namespace alone: `ip netns exec` also mounts a fresh /sys,
  # without the cgroup file system that slurmd needs
  ON_CONTROLLER=(nsenter "--net=/var/run/netns/$NETNS-h0")
else
  NODES="127.0.0.1 127.0.0.2"
  CONTROLLER=127.0.0.1
  ON_CONTROLLER=()
fi

on_node() { # node name -> the command prefix that runs on it
  if [ -n "$NETNS" ]; then
    echo "nsenter --net=/var/run/netns/$NETNS-h$((${1##*.} - 10))"
  fi
}

write_config() {
  local n1="$1" n2="$2" a1="$1" a2="$2"
  [ -n "$NETNS" ] || a1=127.0.0.1 a2=127.0.0.1
  cat >"$DIR/slurm.conf" <<EOF
ClusterName=accel
SlurmctldHost=localhost($CONTROLLER)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# a job that becomes eligible later (a requeued one) starts at the next full pass (default 60 s)
SchedulerParameters=sched_interval=1
MpiDefault=none
SwitchType=switch/none
# salloc's shell runs as an interactive step on the first node, as on most clusters
LaunchParameters=use_interactive_step
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=30
# finished jobs stay visible to scontrol show job for 5 minutes
MinJobAge=300
InactiveLimit=0
Waittime=0
NodeName=$n1 NodeAddr=$a1 Port=$((PORT + 1)) CPUs=$CPUS_PER_NODE State=UNKNOWN
NodeName=$n2 NodeAddr=$a2 Port=$((PORT + 2)) CPUs=$CPUS_PER_NODE State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  printf 'export SLURM_CONF=%s\n' "$DIR/slurm.conf" >"$DIR/env"
  [ -z "$NETNS" ] || printf 'export ACCEL_SLURM_CLIENT_NETNS=%s\n' "$NETNS-h0" >>"$DIR/env"
}

start_munge() {
  alive "$DIR/run/munged.pid" && return 0
  [ -s "$DIR/munge/munge.key" ] ||
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$DIR/munge/munge.key"
  rm -f "$DIR/munge/munge.socket" "$DIR/munge/munge.socket.lock"
  munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munged.seed" ||
    die "munged did not start; see $DIR/log/munged.log"
}

wait_idle() { # until every node answers (idle, or running jobs already)
  local states=""
  for _ in $(seq 1 150); do
    states="$(SLURM_CONF="$DIR/slurm.conf" "${ON_CONTROLLER[@]}" sinfo -h -N -o '%t' 2>/dev/null |
      sort -u | xargs)"
    if [ -n "$states" ] && ! tr ' ' '\n' <<<"$states" | grep -qvE '^(idle|mix|alloc)$'; then
      return 0
    fi
    sleep 0.2
  done
  die "the nodes did not come up (sinfo: ${states:-no answer}); see $DIR/log/"
}

start() {
  mkdir -p "$DIR"/{munge,state,spool,run,log}
  chmod 0700 "$DIR/munge"
  install_packages
  if [ -s "$DIR/env" ] && alive "$DIR/run/slurmctld.pid" &&
    SLURM_CONF="$DIR/slurm.conf" "${ON_CONTROLLER[@]}" sinfo -h >/dev/null 2>&1; then
    cat "$DIR/env"
    return 0
  fi
  stop quiet
  # shellcheck disable=SC2086
  write_config $NODES
  start_munge
  export SLURM_CONF="$DIR/slurm.conf"
  # -i: recover nothing from an earlier run's state (its jobs and node states are stale)
  "${ON_CONTROLLER[@]}" slurmctld -i || die "slurmctld did not start; see $DIR/log/slurmctld.log"
  local node
  for node in $NODES; do
    mkdir -p "$DIR/spool/$node"
    # shellcheck disable=SC2046
    $(on_node "$node") slurmd -N "$node" ||
      die "slurmd -N $node did not start; see $DIR/log/slurmd-$node.log"
  done
  wait_idle
  cat "$DIR/env"
}

stop() {
  local pidfile pid jobs
  if alive "$DIR/run/slurmctld.pid"; then # end the jobs first, so no task outlives its slurmd
    jobs="$(SLURM_CONF="$DIR/slurm.conf" "${ON_CONTROLLER[@]}" timeout 10 squeue -h -o %A \
      2>/dev/null | xargs)" || true
    [ -z "$jobs" ] || SLURM_CONF="$DIR/slurm.conf" "${ON_CONTROLLER[@]}" timeout 10 scancel $jobs \
      2>/dev/null || true
  fi
  for pidfile in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid" "$DIR/run/munged.pid"; do
    [ -s "$pidfile" ] || continue
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  done
  [ "${1:-}" = quiet ] || echo "cluster.sh: stopped the cluster in $DIR" >&2
}

status() {
  [ -s "$DIR/env" ] || die "no cluster in $DIR (run: $0 start)"
  SLURM_CONF="$DIR/slurm.conf" "${ON_CONTROLLER[@]}" sinfo
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
*) die "usage: $0 start|stop|status (ACCEL_SLURM_DIR=$DIR)" ;;
esac

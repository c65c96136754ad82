#!/bin/bash
# A one-node SLURM cluster on this machine (slurmctld, slurmd and munge from Debian's packages), for the tests:
#   scripts/engines/slurm.sh start     prints its folder; then export SLURM_CONF=<folder>/slurm.conf for sbatch
#   scripts/engines/slurm.sh stop <folder>
# Root only (slurmd starts jobs as their users). With KILN_INSTALL_ENGINES=1 (or CI=true) it installs the
# packages with apt-get where they are missing. Exit 3: it cannot run here (not root, no SLURM), saying why.
set -euo pipefail
why() { echo "$1" >&2; exit 3; }
case "${1:-}" in
  start)
    [ "$(id -u)" = 0 ] || why "a SLURM cluster of its own needs root (slurmd starts jobs as their users)"
    if ! command -v slurmctld > /dev/null && [ "${KILN_INSTALL_ENGINES:-0}" = 1 -o "${CI:-}" = true ] \
      && command -v apt-get > /dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge > /dev/null 2>&1 || true
    fi
    for tool in slurmctld slurmd munged sbatch; do
      command -v "$tool" > /dev/null || why "no $tool here: apt-get install slurm-wlm munge (Debian, Ubuntu)"
    done
    dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-slurm.XXXXXX")
    chmod 755 "$dir"
    fail() { "$0" stop "$dir"; why "$1"; }  # what started is stopped, the folder removed
    mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2> /dev/null
    chmod 400 "$dir/munge/munge.key"
    munged --force --socket="$dir/munge/socket" --key-file="$dir/munge/munge.key" --pid-file="$dir/munge/pid" \
      --log-file="$dir/munge/log" --seed-file="$dir/munge/seed" || fail "munged did not start: $(tail -1 "$dir/munge/log")"
    ports=$(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
    read -r ctld_port d_port <<< "$ports"
    host=$(hostname -s)
    cat > "$dir/slurm.conf" <<CONF
ClusterName=kiln
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=10
# the cores, not OMP_NUM_THREADS, which GNU nproc prints where it is set (1 under make test)
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -i -f "$SLURM_CONF" || fail "slurmctld did not start: $(tail -2 "$dir/slurmctld.log" 2> /dev/null)"
    slurmd -f "$SLURM_CONF" || fail "slurmd did not start: $(tail -2 "$dir/slurmd.log" 2> /dev/null)"
    for _ in $(seq 60); do
      if sinfo -h -o %t 2> /dev/null | grep -qE '^(idle|mix|alloc)'; then echo "$dir"; exit 0; fi
      sleep 0.5
    done
    fail "the node did not come up within 30 s"
    ;;
  stop)
    dir=${2:?usage: $0 stop <folder>}
    if [ -f "$dir/slurmctld.pid" ]; then  # its jobs first: their slurmstepd outlives slurmd
      jobs=$(SLURM_CONF="$dir/slurm.conf" squeue -h -o %A 2> /dev/null || true)
      [ -z "$jobs" ] || SLURM_CONF="$dir/slurm.conf" scancel $jobs 2> /dev/null || true
      for _ in $(seq 20); do
        [ -z "$(SLURM_CONF="$dir/slurm.conf" squeue -h 2> /dev/null)" ] && break
        sleep 0.5
      done
    fi
    # what its jobs left (a cancelled job's orphans outlive SLURM's kill): the processes that carry this cluster's
    # SLURM_CONF, as its daemons and its jobs do; never another's, nor this script or what called it
    keep=" $$ " p=$$
    while p=$(ps -o ppid= -p "$p" | tr -d ' ') && [ "${p:-1}" -gt 1 ]; do keep="$keep$p "; done
    for env in /proc/[0-9]*/environ; do
      pid=${env#/proc/} && pid=${pid%/environ}
      case "$keep" in *" $pid "*) continue ;; esac
      if { tr '\0' '\n' < "$env"; } 2> /dev/null | grep -qxF "SLURM_CONF=$dir/slurm.conf"; then
        kill -KILL "$pid" 2> /dev/null || true  # scancel asked them to end already
      fi
    done
    for pid in slurmd.pid slurmctld.pid munge/pid; do
      [ -f "$dir/$pid" ] && kill "$(cat "$dir/$pid")" 2> /dev/null || true
    done
    sleep 1
    rm -rf "$dir"
    ;;
  *)
    echo "usage: $0 start | stop <folder>" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# A one-node Slurm cluster with job accounting on this machine, for tests/test_slurm.py (and by hand):
#   sudo bash tests/cluster/slurm_up.sh      # install if missing, start, wait until the node is idle
#   sudo bash tests/cluster/slurm_down.sh    # stop every daemon this script started (by PID)
# Debian 12 packages slurm-wlm, slurmdbd, mariadb-server, munge; no systemd needed. Daemons: munged (default
# socket), mariadbd (accounting database, no TCP), slurmdbd, slurmctld, slurmd (node `localhost`, its CPUs and
# memory from `slurmd -C`, one GRES `gpu` on /dev/null so `--gpus=1` is schedulable and accounted without a GPU).
# Writes /etc/slurm/{slurm,slurmdbd,gres}.conf (refuses to replace files it did not write) and keeps state,
# logs and PID files in $R2M_SLURM_DIR (default /tmp/r2m-slurm). Idempotent: a running cluster is left as is.
# Exit 0: up ("started" or "already up" on stdout); otherwise one line on stderr saying why, exit 2.
set -uo pipefail
DIR=${R2M_SLURM_DIR:-/tmp/r2m-slurm}
ETC=/etc/slurm
MARK="# written by r2m tests/cluster/slurm_up.sh"
CLUSTER=r2m
ACCOUNT=${R2M_SLURM_ACCOUNT:-r2m}
PARTITION=${R2M_SLURM_PARTITION:-debug}
PACKAGES=(slurm-wlm slurmdbd mariadb-server munge)

die() { echo "slurm_up: $*" >&2; exit 2; }
alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
wait_for() {  # wait_for SECONDS WHAT COMMAND...: poll COMMAND until it succeeds
    local t=$1 what=$2; shift 2
    for ((i = 0; i < t * 4; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
    die "$what did not come up within ${t}s (logs: $DIR)"
}
node_idle() { [[ "$(sinfo -h -n localhost -o %T 2>/dev/null)" == idle* ]]; }

[[ $(id -u) == 0 ]] || die "needs root (starts munged, mariadbd and the Slurm daemons); run it with sudo"
if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" && alive "$DIR/slurmdbd.pid" && node_idle; then
    echo "already up"; exit 0
fi
if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null \
    || ! command -v munged >/dev/null; then
    command -v apt-get >/dev/null || die "no apt-get: install ${PACKAGES[*]} (Slurm with slurmdbd, MariaDB, munge) yourself"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${PACKAGES[@]}"; } \
        >"${TMPDIR:-/tmp}/r2m-slurm-apt.log" 2>&1 \
        || die "apt-get install ${PACKAGES[*]} failed (log: ${TMPDIR:-/tmp}/r2m-slurm-apt.log)"
fi
for f in slurm.conf slurmdbd.conf gres.conf; do
    [[ ! -e $ETC/$f ]] || head -1 "$ETC/$f" | grep -qxF "$MARK" \
        || die "$ETC/$f exists and was not written by this script: this machine has a Slurm setup of its own"
done

mkdir -p "$DIR"/{ctld,spool} /run/munge /run/mysqld /run/slurm "$ETC"
chown slurm:slurm "$DIR" "$DIR/ctld" /run/slurm
chown munge:munge /run/munge
chown mysql:mysql /run/mysqld
chmod 755 "$DIR"

# munge on its default socket, so every client finds it
if ! alive /run/munge/munged.pid; then
    [[ -s /etc/munge/munge.key ]] || { runuser -u munge -- mungekey -c -f >/dev/null 2>&1 || die "cannot create /etc/munge/munge.key"; }
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid >>"$DIR/munged.out" 2>&1 \
        || die "munged failed to start (log: $DIR/munged.out)"
fi
wait_for 10 munged munge -n

# the accounting database (unix socket only)
if ! alive /run/mysqld/mariadbd.pid; then
    [[ -d /var/lib/mysql/mysql ]] || mariadb-install-db --user=mysql >>"$DIR/mariadbd.out" 2>&1 \
        || die "mariadb-install-db failed (log: $DIR/mariadbd.out)"
    mariadbd --user=mysql --skip-networking --pid-file=/run/mysqld/mariadbd.pid >>"$DIR/mariadbd.out" 2>&1 &
fi
wait_for 30 mariadbd mariadb-admin ping
mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'r2m-test';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" || die "cannot create the accounting database"

# configuration: the node as slurmd sees it
node=$(slurmd -C | head -1 | sed -e 's/^NodeName=[^ ]* //')
cat >"$ETC/slurmdbd.conf" <<CONF
$MARK
AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
PidFile=$DIR/slurmdbd.pid
LogFile=$DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=r2m-test
StorageLoc=slurm_acct_db
CONF
chown slurm:slurm "$ETC/slurmdbd.conf"; chmod 600 "$ETC/slurmdbd.conf"
cat >"$ETC/slurm.conf" <<CONF
$MARK
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# finished jobs stay visible to squeue for a day (the profile's status command, see README "Scaling out")
MinJobAge=86400
KillWait=10
# a job's processes get the nice value of the sbatch that submitted it (the tests' background DAG runs under nice 5)
PropagatePrioProcess=1
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageEnforce=associations
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 $node Gres=gpu:1 State=UNKNOWN
PartitionName=$PARTITION Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
cat >"$ETC/gres.conf" <<CONF
$MARK
NodeName=localhost Name=gpu File=/dev/null
CONF

if ! alive "$DIR/slurmdbd.pid"; then
    slurmdbd >>"$DIR/slurmdbd.out" 2>&1 || die "slurmdbd failed to start (log: $DIR/slurmdbd.log)"
fi
wait_for 30 slurmdbd sacctmgr -n show cluster
sacctmgr -n show cluster format=cluster | grep -qw "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null \
    || die "sacctmgr add cluster failed"
sacctmgr -n show account format=account | grep -qw "$ACCOUNT" \
    || sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" Description=r2m Organization=r2m >/dev/null \
    || die "sacctmgr add account failed"
sacctmgr -n show assoc format=user,account where user=root | grep -qw "$ACCOUNT" \
    || sacctmgr -i add user root Account="$ACCOUNT" DefaultAccount="$ACCOUNT" >/dev/null \
    || die "sacctmgr add user failed"

if ! alive "$DIR/slurmctld.pid"; then
    slurmctld >>"$DIR/slurmctld.out" 2>&1 || die "slurmctld failed to start (log: $DIR/slurmctld.log)"
fi
if ! alive "$DIR/slurmd.pid"; then
    slurmd -N localhost >>"$DIR/slurmd.out" 2>&1 || die "slurmd failed to start (log: $DIR/slurmd.log)"
fi
wait_for 30 "the node (sinfo: idle)" node_idle
echo "started"

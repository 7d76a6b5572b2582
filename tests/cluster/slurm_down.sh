#!/usr/bin/env bash
# Stop the cluster tests/cluster/slurm_up.sh started: cancel its jobs, then each daemon by the PID it recorded
# (SIGTERM, SIGKILL after 15 s), then remove the /etc/slurm files slurm_up.sh wrote (marked on their first line;
# anyone else's are kept). A slurm.conf left behind with no controller running makes every `scontrol` wait ~9 s,
# and the Slurm executor plugin runs `scontrol show config` whenever snakemake starts. Keeps the accounting
# database for the next start.
set -uo pipefail
DIR=${R2M_SLURM_DIR:-/tmp/r2m-slurm}
[[ $(id -u) == 0 ]] || { echo "slurm_down: needs root" >&2; exit 2; }

stop() {  # stop PIDFILE NAME
    [[ -s $1 ]] || return 0
    local pid; pid=$(cat "$1")
    if kill -0 "$pid" 2>/dev/null && [[ $(ps -o comm= -p "$pid") == "$2"* ]]; then
        kill -TERM "$pid"
        for ((i = 0; i < 60; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$1"
}

if [[ -s $DIR/slurmctld.pid ]] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
    jobs=$(squeue -h -o %i 2>/dev/null)
    if [[ -n $jobs ]]; then
        scancel $jobs 2>/dev/null
        for ((i = 0; i < 60; i++)); do [[ -z $(squeue -h -t R,CG,PD -o %i 2>/dev/null) ]] && break; sleep 0.25; done
    fi
fi
stop "$DIR/slurmd.pid" slurmd
stop "$DIR/slurmctld.pid" slurmctld
stop "$DIR/slurmdbd.pid" slurmdbd
stop /run/mysqld/mariadbd.pid mariadbd
stop /run/munge/munged.pid munged
MARK="# written by r2m tests/cluster/slurm_up.sh"
for f in slurm.conf slurmdbd.conf gres.conf; do
    [[ -e /etc/slurm/$f ]] && head -1 "/etc/slurm/$f" | grep -qxF "$MARK" && rm -f "/etc/slurm/$f"
done
echo "stopped"

#!/usr/bin/env bash
# Stop the cluster tests/cluster/slurm_up.sh started: cancel its jobs, then each daemon by the PID it recorded
# (SIGTERM, SIGKILL after 15 s; in three groups, each group's daemons at once: ~7 s instead of ~11), then remove the /etc/slurm files slurm_up.sh wrote (marked on their first line;
# anyone else's are kept). A slurm.conf left behind with no controller running makes every `scontrol` wait ~9 s,
# and the Slurm executor plugin runs `scontrol show config` whenever snakemake starts. Keeps the accounting
# database for the next start.
set -uo pipefail
DIR=${R2M_SLURM_DIR:-/tmp/r2m-slurm}
[[ $(id -u) == 0 ]] || { echo "slurm_down: needs root" >&2; exit 2; }

stop() {  # stop PIDFILE NAME [PIDFILE NAME ...]: SIGTERM to each at once, then wait for all (SIGKILL after 15 s)
    local pids=() pid i
    while (($#)); do
        if [[ -s $1 ]]; then
            pid=$(cat "$1")
            if kill -0 "$pid" 2>/dev/null && [[ $(ps -o comm= -p "$pid") == "$2"* ]]; then
                kill -TERM "$pid" && pids+=("$pid")
            fi
            rm -f "$1"
        fi
        shift 2
    done
    for pid in "${pids[@]}"; do
        for ((i = 0; i < 150; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    done
    return 0
}

if [[ -s $DIR/slurmctld.pid ]] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
    jobs=$(squeue -h -o %i 2>/dev/null)
    if [[ -n $jobs ]]; then
        scancel $jobs 2>/dev/null
        for ((i = 0; i < 60; i++)); do [[ -z $(squeue -h -t R,CG,PD -o %i 2>/dev/null) ]] && break; sleep 0.25; done
    fi
fi
# the node and the controller together, then the accounting daemon (the controller hands it the last records),
# then the database under it and munge
stop "$DIR/slurmd.pid" slurmd "$DIR/slurmctld.pid" slurmctld
stop "$DIR/slurmdbd.pid" slurmdbd
stop /run/mysqld/mariadbd.pid mariadbd /run/munge/munged.pid munged
MARK="# written by r2m tests/cluster/slurm_up.sh"
for f in slurm.conf slurmdbd.conf gres.conf; do
    [[ -e /etc/slurm/$f ]] && head -1 "/etc/slurm/$f" | grep -qxF "$MARK" && rm -f "/etc/slurm/$f"
done
echo "stopped"

# Thin entry point: the rules are built from the r2m stage registry (src/r2m/stage/registry.py),
# the same registry that generates dvc.yaml. See workflow/rules/stages.smk.
#   snakemake --cores 8 reports/table1.csv
#   snakemake --cores 2 --config 'datasets=["tiny"]' all

configfile: "params.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/stages.smk"


rule all:
    input:
        "reports/table1.csv",
        "reports/table2.csv",
        "reports/table3.csv",
        "reports/claims.csv",
        "reports/baselines.csv",
        "reports/retrieval.csv",
        "reports/index.html",
        # the done file of every instance those need: one whose record is stale (an output removed too) reruns
        done_targets(PARAMS, ALL_TARGETS),
    default_target: True


onerror:
    # a failed Slurm job's reason (memory, time limit, scancel) in one line (r2m.pipeline.slurm)
    import sys
    from r2m.pipeline.slurm import failure_reasons

    for _line in failure_reasons(log):
        print(f"r2m: {_line}", file=sys.stderr)


onstart:
    # every planned job's outputs are checked against the ownership rules before the first job starts (a folder
    # holding a file r2m did not write, another command's output: one line each, r2m.pipeline.snake.output_refusals;
    # each job checks again itself); a job Snakemake was told to run (--forcerun, -F) forgets its record, so it
    # recomputes instead of finding itself current
    import sys
    from r2m.pipeline.snake import forget_forced, output_refusals, snakemake_planned

    _refused = output_refusals(snakemake_planned(workflow.dag))
    if _refused:
        for _line in _refused:
            print(f"r2m: {_line}", file=sys.stderr)
        sys.exit(1)  # Snakemake releases its lock; no job was started
    forget_forced(workflow.dag)

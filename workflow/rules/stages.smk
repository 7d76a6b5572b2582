# One Snakemake rule per registry stage. Paths, commands, logs and the params each stage reads
# all come from the registry; nothing here is specific to a stage. Everything a rule needs from
# the loop variable is bound at definition time (params/defaults), since Snakemake evaluates
# `shell:` lazily, after the loop has moved on.
# A stage with a `fanout` and `--config shards='{<stage>: N}'` (N > 1) also gets a `<stage>_shard`
# rule: N parallel jobs (e.g. cluster jobs) whose results the stage's own job merges.
# A folder output with key files (Out.members) declares them as outputs too, and its consumers ask for
# them (not the folder): a finished folder missing one is rebuilt (snake.rule_inputs / rule_outputs).
# Every rule declares the registry's resources (gpu, mem_mb): `--resources gpu=N` caps concurrent
# GPU jobs on one box; the SLURM executor requests `--gpus`/`--mem` from them. Its `priority` (Stage.priority)
# starts the long chains first among the ready jobs.
# What a job read at its last run (modules, files, params keys: its record, r2m.stage.record) reaches
# Snakemake through its stamp input `.params/<stage>/<instance>.json`, written while the DAG is built: mtime 0
# when nothing it read changed, the time now when something did (Snakemake's mtime check reruns it).
# The job's shell `exec`s r2m (killing the shell kills r2m) and every path is quoted ({log:q}). Its
# `--params` file is this invocation's, content-addressed (common.smk): outside the compared `cmd`.


for _stage in S.STAGES:
    _n = SHARDS.get(_stage.name, 1)

    rule:
        name:
            _stage.name
        input:
            **rule_inputs(_stage, PARAMS),
            **({"shards": shard_inputs(_stage, _n)} if _n > 1 else {}),
            stamp=plan_input(_stage, PLANNER),
        output:
            **rule_outputs(_stage, directory),
        log:
            snake_template(_stage.log),
        params:
            cmd=lambda wc, _s=_stage, _k=_n: merge_command(R2M, _s, wc, None, _k),
            **({"external": external_param(_stage, PARAMS)} if _stage.external else {}),  # files outside the DAG
        threads: 1
        priority: _stage.priority
        resources:
            **_stage.resources.snakemake(),
        message:
            f"{_stage.name}: {_stage.help}"
        conda:
            "../envs/r2m.yaml"
        shell:
            "R2M_THREADS=${{R2M_THREADS:-{threads}}} exec {params.cmd} --params {R2M_PARAMS_ARG} --no-log-file > {log:q} 2>&1"

    if _n > 1:

        rule:
            name:
                f"{_stage.name}_shard"
            input:
                **{k: v for k, v in rule_inputs(_stage, PARAMS).items() if isinstance(_stage.deps[k], str)},
                stamp=plan_input(_stage, PLANNER),
            output:
                shard=directory(shard_output(_stage)),
            log:
                shard_log(_stage),
            params:
                cmd=lambda wc, _s=_stage, _k=_n: shard_command(R2M, _s, wc, None, _k),
            threads: 1
            priority: _stage.priority
            resources:
                **_stage.resources.snakemake(),
            message:
                f"{_stage.name} (one shard of {_n}): {_stage.help}"
            conda:
                "../envs/r2m.yaml"
            shell:
                "R2M_THREADS=${{R2M_THREADS:-{threads}}} exec {params.cmd} --params {R2M_PARAMS_ARG} --no-log-file > {log:q} 2>&1"

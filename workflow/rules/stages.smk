# One Snakemake rule per registry stage. Paths, commands, logs and the params each stage reads
# all come from the registry; nothing here is specific to a stage. Everything a rule needs from
# the loop variable is bound at definition time (params/defaults), since Snakemake evaluates
# `shell:` lazily, after the loop has moved on.
# A stage with a `fanout` and `--config shards='{<stage>: N}'` (N > 1) also gets a `<stage>_shard`
# rule: N parallel jobs (e.g. cluster jobs) whose results the stage's own job merges.
# What Snakemake sees of an instance is its done file `.r2m/done/<stage>/<instance>` (its output) and the done
# files of the instances that wrote what it reads (its inputs); a summary stage over the whole run also declares
# its report files (the targets people name). The outputs themselves are r2m's: Snakemake never deletes them, so
# a job whose inputs came back byte-identical finds its record current and exits at once (early cutoff).
# Every rule declares the registry's resources (gpu, mem_mb): `--resources gpu=N` caps concurrent
# GPU jobs on one box; the SLURM executor requests `--gpus`/`--mem` from them. Its `priority` (Stage.priority)
# starts the long chains first among the ready jobs.
# What a job read at its last run (modules, files, params keys: its record, r2m.stage.record) reaches
# Snakemake through its stamp input `.stamps/<stage>/<instance>.json`, written while the DAG is built: mtime 0
# when nothing it read changed, the time now when something did (Snakemake's mtime check reruns it).
# The job's shell `exec`s r2m (killing the shell kills r2m) and every path is quoted ({log:q}). The r2m
# program and the `--params` file (this invocation's, content-addressed: common.smk) are in the shell template,
# outside the compared `cmd`: a moved checkout or a rebuilt .venv reruns nothing. Threads and device come from
# r2m.runtime under both engines (one torch thread unless R2M_THREADS says).


for _stage in S.STAGES:
    _n = SHARDS.get(_stage.name, 1)

    rule:
        name:
            _stage.name
        input:
            **rule_inputs(_stage, PARAMS, PRODUCERS),
            **({"shards": shard_inputs(_stage, _n)} if _n > 1 else {}),
            stamp=plan_input(_stage, PLANNER),
        output:
            **rule_outputs(_stage),
        log:
            snake_template(_stage.log),
        params:
            cmd=lambda wc, _s=_stage, _k=_n: merge_command("", _s, wc, None, _k),
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
            "exec {R2M} {params.cmd} --params {R2M_PARAMS_ARG} --no-log-file > {log:q} 2>&1"

    # the instance's files and folders a user may name as targets (snakemake results/…/eval.json,
    # snakemake models/…/train_xe): each a rule of its own, its inputs the done file (ancient: it runs only when
    # the path is missing, after the instance rebuilt it) and the instance's stamp (a stale instance is rebuilt
    # even while the old path is still there: Snakemake looks no further up than a target that is current, so a
    # done file removed by a failed or cancelled job would otherwise leave the old folder standing); `update`
    # keeps Snakemake from deleting what the instance just wrote before this job checks it
    _targets = {"file": [update(_p) for _p in target_files(_stage)],
                "folder": [update(directory(_p)) for _p in target_folders(_stage)]}
    for _kind, _outs in _targets.items():
        for _i, _out in enumerate(_outs):

            rule:
                name:
                    f"{_stage.name}_{_kind}{_i}"
                input:
                    ancient(done_file(_stage)),
                    plan_input(_stage, PLANNER),
                output:
                    _out,
                log:
                    f"logs/{_stage.name}/{_stage.key()}.{_kind}{_i}.log",
                localrule: True
                shell:
                    "test -e {output:q} > {log:q} 2>&1"

    if _n > 1:

        rule:
            name:
                f"{_stage.name}_shard"
            input:
                **{k: v for k, v in rule_inputs(_stage, PARAMS, PRODUCERS).items() if isinstance(_stage.deps[k], str)},
                stamp=plan_input(_stage, PLANNER),
            output:
                shard=directory(shard_output(_stage)),
            log:
                shard_log(_stage),
            params:
                cmd=lambda wc, _s=_stage, _k=_n: shard_command("", _s, wc, None, _k),
            threads: 1
            priority: _stage.priority
            resources:
                **_stage.resources.snakemake(),
            message:
                f"{_stage.name} (one shard of {_n}): {_stage.help}"
            conda:
                "../envs/r2m.yaml"
            shell:
                "exec {R2M} {params.cmd} --params {R2M_PARAMS_ARG} --no-log-file > {log:q} 2>&1"

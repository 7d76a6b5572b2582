# One Snakemake rule per registry stage. Paths, commands, logs and the params each stage reads
# all come from the registry; nothing here is specific to a stage. Everything a rule needs from
# the loop variable is bound at definition time (params/defaults), since Snakemake evaluates
# `shell:` lazily, after the loop has moved on.


for _stage in S.STAGES:

    rule:
        name:
            _stage.name
        input:
            **{
                k: (expand_gather(v, PARAMS) if not isinstance(v, str) else snake_template(v))
                for k, v in _stage.deps.items()
            },
        output:
            **{
                k: (directory(snake_template(o.path)) if o.directory else snake_template(o.path))
                for k, o in _stage.outs.items()
            },
        log:
            snake_template(_stage.log),
        params:
            cmd=lambda wc, _s=_stage: stage_command(R2M, _s, wc, R2M_PARAMS),
            resolved=lambda wc, _s=_stage: rule_params(PARAMS, _s, wc),
        threads: 1
        message:
            f"{_stage.name}: {_stage.help}"
        conda:
            "../envs/r2m.yaml"
        shell:
            "{params.cmd} --no-log-file > {log} 2>&1"

# Validate the configuration with the project's typed schema and hand the merged config to the
# r2m commands (so `--config key=value` reaches them exactly as DVC's `-S key=value` does).
# Snakemake-only runtime keys (`shards`, `r2m_command`) are split off first: they say how to run,
# not what to compute, and never reach params; they come from the command line's --config only (a config
# file holding one is refused), and `r2m_command` must name an executable file (quoted, never a shell line).
# Snakemake's --delete-all-output / --delete-temp-output are refused (they would delete a user's file too).
import shlex
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from r2m import params as P  # noqa: E402
from r2m.pipeline import validate as V  # noqa: E402
from r2m.stage import registry as S  # noqa: E402
from r2m.stage.record import Planner, remove_old_stamps  # noqa: E402
from r2m.pipeline.resolved import ALL_TARGETS  # noqa: E402
from r2m.pipeline.snake import (  # noqa: E402
    Producers,
    done_file,
    done_targets,
    external_param,
    merge_command,
    r2m_command,
    rule_inputs,
    rule_outputs,
    plan_input,
    shard_command,
    shard_counts,
    shard_inputs,
    shard_log,
    shard_output,
    snake_template,
    split_config,
    target_files,
    target_folders,
    wildcard_constraints_for,
    write_merged_params,
)

try:
    _params_cfg, _runtime_cfg = split_config(config, workflow.config_settings.config)
    for _f in workflow.configfiles:  # Snakemake's own YAML reading keeps the last of a duplicate key
        try:
            P.yaml_load(P.read_text(Path(_f)))
        except yaml.YAMLError as err:  # name the file (a duplicate key, an alias bomb)
            raise ValueError(f"{_f}: not valid YAML: {' '.join(str(err).split())}") from None
    PARAMS = V.validate(_params_cfg, "config (params.yaml + --config)")
    SHARDS = shard_counts(_runtime_cfg)
    # the r2m beside the Python running Snakemake (works without activating .venv), else PATH's
    _r2m_here = Path(sys.executable).parent / "r2m"
    R2M = r2m_command(_runtime_cfg, shlex.quote(str(_r2m_here)) if _r2m_here.exists() else "r2m")
except (P.ParamsError, ValueError, yaml.YAMLError) as err:
    raise WorkflowError(str(err))

# checks each job's record and writes its stamp (r2m.stage.record), once per job, while the DAG is built
PLANNER = Planner(PARAMS, Path("."))
remove_old_stamps(Path("."))  # a workspace made before the stamps moved to .stamps/: its old .params/
PRODUCERS = Producers(PARAMS)  # which instance writes a path: a job's inputs are their done files

# this invocation's params, named by their content and never rewritten: a job reads the file of the
# invocation that started it, whatever a later `snakemake -n --config …` writes (its own file)
R2M_PARAMS = write_merged_params(_params_cfg, ".snakemake/r2m/params")
R2M_PARAMS_ARG = shlex.quote(R2M_PARAMS)  # appended by each rule's shell, not part of its compared `cmd`


def _refuse_deleting(*args, **kwargs):
    """Snakemake's --delete-all-output / --delete-temp-output: refused before anything is deleted (a declared
    output folder may hold a file r2m did not write; r2m replaces a folder only while it holds its files)."""
    print("r2m: snakemake --delete-all-output and --delete-temp-output are refused: they delete whole output "
          "folders, a file of yours in one included; remove an r2m output folder by hand, or rebuild it with "
          "--forcerun", file=sys.stderr)
    sys.exit(1)


workflow.delete_output = _refuse_deleting  # what both flags call, after the DAG is built and before deleting


wildcard_constraints:
    **wildcard_constraints_for(PARAMS),

# Validate the configuration with the project's typed schema and hand the merged config to the
# r2m commands (so `--config key=value` reaches them exactly as DVC's `-S key=value` does).
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from r2m import params as P  # noqa: E402
from r2m.pipeline import stages as S  # noqa: E402
from r2m.pipeline.snake import (  # noqa: E402
    expand_gather,
    rule_params,
    snake_template,
    stage_command,
    wildcard_constraints_for,
    write_merged_params,
)

try:
    PARAMS = P.validate(config, "config (params.yaml + --config)")
except P.ParamsError as err:
    raise WorkflowError(str(err))

R2M_PARAMS = write_merged_params(config, ".snakemake/r2m/params.yaml")
# the r2m beside the Python running Snakemake (works without activating .venv), else PATH's
_r2m_here = Path(sys.executable).parent / "r2m"
R2M = config.get("r2m_command", str(_r2m_here) if _r2m_here.exists() else "r2m")


wildcard_constraints:
    **wildcard_constraints_for(PARAMS),

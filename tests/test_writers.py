"""Every module that writes a file or folder, and through which check it writes. The inventory below is read
from the source (writes found by their calls) and kept by hand: a new writer fails this test until it is
listed with how its writes are checked. The behaviour of each command's writes is probed in
:mod:`test_writer_probes` (a user's file, another command's folder, a workspace's own files); the stages'
outputs in :mod:`test_ownership` and :mod:`test_user_files`.
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "r2m"
WRITES = re.compile(r"\.write_text\(|\bwrite_text\(|\.write_bytes\(|open\([^)]*[\"'](?:w|a|x)b?[\"']|write_json\("
                    r"|write_parquet\(|atomic_path\(|\.mkdir\(|rmtree\(|\.unlink\(|os\.replace\(|to_csv\(|savefig\("
                    r"|save_torch\(|torch\.save\(|mark_owned\(|mark_file\(|shutil\.copy|\.rename\(|\.touch\("
                    r"|\.save\(|np\.save|write_table\(|ParquetWriter\(|File\([^)]*[\"'](?:w|a)[\"']")

# the kinds of writer (what checks their paths):
STAGE = "stage"  # runs inside `r2m <stage>`: the runner checks every declared output (owner.write_problem) first
COMMAND = "command"  # a command's own output option: owner.claim / write_problem before any work
STATE = "state"  # r2m's own state and caches (.r2m/, .stamps/, .snakemake/r2m/, ~/.cache/r2m), never a user's path
SCRATCH = "scratch"  # a temporary folder the module made itself (tempfile), removed when done
HELPER = "helper"  # the write helpers every writer above goes through (atomic writes, markers, checkpoints)

INVENTORY = {
    "datasets/base.py": STAGE, "datasets/benchmarks.py": STAGE, "datasets/demo.py": STAGE,
    "datasets/inputs.py": STAGE, "datasets/rehearsal.py": STAGE, "datasets/stage.py": STAGE,
    "datasets/tiny.py": STAGE, "captioning/settings.py": STAGE, "captioning/stage.py": STAGE,
    "evaluation/per_image.py": STAGE, "evaluation/stage.py": COMMAND, "reports/baselines.py": STAGE,
    "reports/claims.py": STAGE, "reports/figures.py": STAGE, "reports/html.py": STAGE, "reports/tables.py": STAGE, "reports/plots.py": STAGE,
    "supervised/caption.py": STAGE, "supervised/finetune.py": STAGE, "supervised/inspect.py": STAGE,
    "supervised/inspect_sat.py": STAGE, "supervised/retrieval.py": STAGE, "supervised/scores.py": STAGE,
    "supervised/skip.py": STAGE, "supervised/train.py": STAGE, "supervised/vocab.py": STAGE,
    "text/stages.py": STAGE, "text/vocab.py": STAGE, "training/loop.py": STAGE, "training/stages.py": STAGE,
    "vision/detect.py": STAGE, "vision/feature_store.py": STAGE, "vision/images.py": STAGE,
    "stage/context.py": STAGE,
    "reports/gallery.py": COMMAND, "bench/scale.py": COMMAND, "bench/plan.py": COMMAND,
    "bench/concepts.py": COMMAND, "pipeline/dag.py": COMMAND, "reports/browser.py": COMMAND,
    "stage/record.py": STATE, "utils/reads.py": STATE, "utils/digest.py": STATE, "utils/resume.py": STATE, "evaluation/paraphrase.py": STATE,
    "evaluation/meteor.py": STATE, "warm/engine.py": STATE, "vision/weights.py": STATE, "warm/server.py": STATE, "pipeline/snake.py": STATE,
    "evaluation/coco.py": SCRATCH, "bench/evaluate.py": SCRATCH, "bench/features.py": SCRATCH,
    "utils/io.py": HELPER, "utils/owner.py": HELPER, "utils/checkpoint.py": HELPER,
}


def writers() -> set[str]:
    return {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py") if WRITES.search(p.read_text())}


def test_every_writer_is_listed_with_its_check():
    found = writers()
    missing = sorted(found - set(INVENTORY))
    assert not missing, f"modules that write but are not in the inventory (say how their paths are checked): {missing}"
    stale = sorted(set(INVENTORY) - found)
    assert not stale, f"listed as writers but write nothing: {stale}"


def test_every_commands_writer_checks_its_path_before_the_work():
    for rel, kind in INVENTORY.items():
        if kind == COMMAND:
            text = (SRC / rel).read_text()
            assert re.search(r"\bclaim\(|\bwrite_problem\(", text), f"{rel} writes a command's output unchecked"


def test_the_writer_inventory_finds_a_planted_writer(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text("from pathlib import Path\nPath('out.txt').write_text('x')\n")
    assert WRITES.search(planted.read_text())
    assert not WRITES.search("print(Path('x').read_text())\n")


def test_stage_outputs_go_through_the_writer_check():
    """The runner asks the writer check for every declared output (the stage's kind), as Snakemake's onstart does."""
    context = (SRC / "stage/context.py").read_text()
    snake = (SRC / "pipeline/snake.py").read_text()
    assert "write_problem(path, stage_kind(self.stage.name)" in context
    assert "write_problem(path, stage_kind(stage)" in snake

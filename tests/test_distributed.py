"""Data-parallel training (torch DDP, gloo on CPU): two processes with the same global batch follow
the loss curve of one process; rank 0 alone writes the outputs; --nproc parsing."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from r2m.training import distributed
from test_training import ctx_for, make_params, make_synthetic

STEPS = {"train_xe": {"steps": 6, "eval_every": 3, "checkpoint_every": 3},
         "train_s": {"steps": 3, "eval_every": 3, "checkpoint_every": 3},
         "train_m": {"steps": 3, "eval_every": 3, "checkpoint_every": 3}}
STAGES = ("train_xe", "train_s", "train_m")


def _train(root: Path) -> None:
    from r2m.training.stages import train

    params = make_params(**STEPS)
    for stage in STAGES:  # train_m: in-batch hardest negatives over the global batch
        train(ctx_for(root, stage, params))


def _worker(rank: int, world: int, root: str, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        _train(Path(root))
    finally:
        distributed.teardown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _out(root: Path, stage: str, key: str) -> Path:
    return Path(ctx_for(root, stage, make_params(**STEPS)).outs[key])


@pytest.fixture(scope="module")
def one_and_two(tmp_path_factory) -> tuple[Path, Path]:
    """The same stages on the same data in one process and in two gloo processes (shared by the tests)."""
    root = tmp_path_factory.mktemp("ddp")
    one, two = root / "one", root / "two"
    make_synthetic(one)
    shutil.copytree(one, root / "fresh")  # untouched data for the resume test
    shutil.copytree(one, two)
    torch.set_num_threads(1)
    _train(one)
    mp.spawn(_worker, args=(2, str(two), _free_port()), nprocs=2, join=True)
    return one, two


def assert_same_loss_curve(one: str, many: str, what: str) -> None:
    """Two ``loss.tsv`` texts: the same rows (step, split) and columns, every loss within float summation
    order (rel 1e-4) of the other, and a curve that moves."""
    a, b = one.splitlines(), many.splitlines()
    assert a[0] == b[0] and len(a) == len(b) > 3, what
    ra = [[float(x) for x in r.split("\t")[2:] if x] for r in a[1:]]
    rb = [[float(x) for x in r.split("\t")[2:] if x] for r in b[1:]]
    assert [r.split("\t")[:2] for r in a[1:]] == [r.split("\t")[:2] for r in b[1:]], what
    for x, y in zip(ra, rb, strict=True):
        assert y == pytest.approx(x, rel=1e-4, abs=1e-6), what
    assert len({round(r[0], 4) for r in ra}) > 2, what  # the curve moves


def test_two_gloo_processes_follow_the_single_process_loss_curve(one_and_two) -> None:
    one, two = one_and_two
    for stage in STAGES:
        assert_same_loss_curve(_out(one, stage, "loss").read_text(), _out(two, stage, "loss").read_text(), stage)


def test_shard_splits_global_batch_and_rejects_uneven() -> None:
    from r2m.training.data import ImageBatch

    b = ImageBatch(torch.arange(8).reshape(4, 2), torch.ones(4), torch.zeros(4, 3), ["a", "b", "c", "d"])
    d = distributed.Dist(rank=1, world=2)
    s = d.shard(b)
    assert s.image_ids == ["c", "d"] and s.concepts.tolist() == [[4, 5], [6, 7]]
    assert distributed.Dist().shard(b) is b
    assert [len(distributed.Dist(rank=r, world=3).shard(b)) for r in range(3)] == [1, 1, 2]
    with pytest.raises(ValueError, match="fewer"):
        distributed.Dist(rank=0, world=5).shard(b)


def test_strip_nproc() -> None:
    assert distributed.strip_nproc(["--dataset", "x", "--nproc", "4", "--fresh"]) == (4, ["--dataset", "x", "--fresh"])
    assert distributed.strip_nproc(["--nproc=2"]) == (2, [])
    assert distributed.strip_nproc(["--dataset", "x"]) == (1, ["--dataset", "x"])
    with pytest.raises(ValueError):
        distributed.strip_nproc(["--nproc", "0"])


def test_claim_gpu_gives_concurrent_processes_different_gpus(tmp_path: Path) -> None:
    import subprocess
    import sys

    from r2m import runtime

    assert runtime.claim_gpu(3, str(tmp_path)) == 0
    assert runtime.claim_gpu(3, str(tmp_path)) == 0  # the same process keeps its GPU
    code = f"from r2m import runtime; print(runtime.claim_gpu(3, {str(tmp_path)!r}))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == "1"  # GPU 0 is held by this process


def test_cli_nproc_relaunches_under_torchrun_and_rank0_writes(tmp_path: Path) -> None:
    """`r2m train_xe … --nproc 2` (gloo on CPU): one loss.tsv / model.pt, the same curve as the
    in-process single-process run of the same params."""
    import subprocess
    import sys

    import yaml

    make_synthetic(tmp_path)
    params = make_params(**STEPS)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False))
    env = {**os.environ, "R2M_THREADS": "1", "R2M_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "r2m.cli", "train_xe", "--dataset", "syn", "--variant", "r2m",
                        "--device", "cpu", "--nproc", "2", "--no-log-file"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = _out(tmp_path, "train_xe", "loss").read_text().splitlines()
    assert (_out(tmp_path, "train_xe", "model") / "model.pt").exists()

    one = tmp_path / "one"
    make_synthetic(one)
    from r2m.training.stages import train

    torch.set_num_threads(1)
    train(ctx_for(one, "train_xe", params))
    want = _out(one, "train_xe", "loss").read_text().splitlines()
    assert len(got) == len(want) > 3
    for a, b in zip(want[1:], got[1:], strict=True):
        assert float(b.split("\t")[2]) == pytest.approx(float(a.split("\t")[2]), rel=1e-4)


# --------------------------------------------------------------------------- DDP resume
def _resume_worker(rank: int, world: int, root: str, port: int, fault: str) -> None:
    from r2m.training.stages import train
    from r2m.utils.resume import Preempted

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if fault:
        os.environ["R2M_FAULT"] = fault
    else:
        os.environ.pop("R2M_FAULT", None)
    torch.set_num_threads(1)
    try:
        train(ctx_for(Path(root), "train_xe", make_params(**STEPS)))
    except Preempted:
        pass  # stopped at the step boundary after rank 0 saved last.pt
    finally:
        distributed.teardown()


def test_ddp_resume_after_sigterm_is_bit_identical(one_and_two) -> None:
    """Two gloo processes stopped by SIGTERM at step 4 (off the checkpoint interval), then rerun: they
    resume from rank 0's last.pt at step 4 and end with the weights of the uninterrupted two-process run."""
    _, full = one_and_two
    cut = full.parent / "fresh"
    mp.spawn(_resume_worker, args=(2, str(cut), _free_port(), "train_xe@4:TERM"), nprocs=2, join=True)
    last = cut / ".r2m/resume/train_xe/syn-r2m-0/last.pt"
    assert torch.load(last, weights_only=True)["step"] == 4
    assert not (cut / "models/syn/r2m/s0/train_xe").exists()
    mp.spawn(_resume_worker, args=(2, str(cut), _free_port(), ""), nprocs=2, join=True)
    assert not last.exists()
    a = torch.load(full / "models/syn/r2m/s0/train_xe/model.pt", weights_only=True)["state_dict"]
    b = torch.load(cut / "models/syn/r2m/s0/train_xe/model.pt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _out(full, "train_xe", "loss").read_text() == _out(cut, "train_xe", "loss").read_text()


def test_a_slurm_step_of_several_tasks_gives_rank_world_and_rendezvous() -> None:
    """Under `srun -n 2` each task's rank, world size, local rank and rendezvous come from Slurm's step
    variables; a batch script (no srun: no SLURM_STEP_NUM_TASKS) or torchrun's own variables are left alone."""
    env = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2",
           "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "123456"}
    assert distributed.adopt_slurm(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("1", "2", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("gpu07", "23456")  # 20000 + 123456 mod 20000
    batch = {"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_JOB_ID": "7"}  # sbatch --ntasks=2, outside srun
    assert not distributed.adopt_slurm(batch) and "WORLD_SIZE" not in batch
    one = {"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}  # Snakemake's job step: srun -n1
    assert not distributed.adopt_slurm(one) and "RANK" not in one
    torchrun = {"WORLD_SIZE": "4", "RANK": "3", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"}
    assert not distributed.adopt_slurm(torchrun) and torchrun["RANK"] == "3"
    given = {**env, "MASTER_PORT": "4242"}
    given.pop("WORLD_SIZE")
    distributed.adopt_slurm(given)
    assert given["MASTER_PORT"] == "4242"
    assert [distributed.first_node(x) for x in ("node[03-05,07],gpu1", "a1,b2", "localhost", "")] == \
        ["node03", "a1", "localhost", "127.0.0.1"]

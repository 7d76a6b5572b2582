"""The DAG on a real Slurm cluster: one node with job accounting and a GRES ``gpu`` on /dev/null, started by
tests/cluster/slurm_up.sh (as root; installs the Debian packages when missing) and stopped again by
slurm_down.sh. The tiny DAG up to Table 1 runs through Snakemake's SLURM executor with the project's profile
(workflow/profiles/slurm, the pinned plugin of requirements-cluster.lock): every job a Slurm job with the
registry's resources, the tables those of the local run; a training job cancelled with ``scancel`` is reported
and resumes bit-identically; a job over its memory limit fails with Slurm's one-line reason; DDP as one job of
two ``srun`` tasks follows the single-process loss curve; ``r2m warm -- snakemake`` as one Slurm job stops
within Slurm's kill wait when its time limit comes (SIGTERM to every process of the job, at each moment of
tests/stop_runs.py, and once at a real time limit) and its next run resumes bit-identically. Skipped, with one
line saying why, when the cluster cannot be started (not root, no packages) or the plugin is not installed
(``make setup-cluster``)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import stop_runs as SR
from conftest import tiny_dag_env
from r2m.stage.registry import BY_NAME
from slurm_background import CLUSTER, PROFILE, TABLE1, SlurmDagRun, plugin_missing, snakemake_cmd
from test_distributed import assert_same_loss_curve

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TABLE1_RULES = sorted(["inputs", "prepare", "references", "detect_concepts", "extract_features", "corpus_concepts",
                       "build_vocab", "train_xe", "train_s", "train_m", "train_i", "caption", "evaluate", "table1"])
RESUME = ".r2m/resume/train_xe/tiny-r2m-0/last.pt"
SUBMITTED = re.compile(r"submitted with SLURM jobid (\d+) \(log: \S*?logs/slurm/rule_([A-Za-z0-9_]+)/")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm_run(_slurm_dag_started, tmp_path_factory):
    """The cluster and its Table-1 DAG, started in the background as the session started
    (tests/slurm_background.py); stopped once this module's tests are done."""
    run = _slurm_dag_started or SlurmDagRun(tmp_path_factory)
    yield run
    run.stop()


def test_cluster_scripts_refuse_a_non_root_user_in_one_line():
    if shutil.which("runuser") is None or subprocess.run(["id", "-u"], capture_output=True, text=True).stdout != "0\n":
        pytest.skip("needs root (to run the scripts as user nobody)")
    for script in ("slurm_up.sh", "slurm_down.sh"):
        r = subprocess.run(["runuser", "-u", "nobody", "--", "bash", str(CLUSTER / script)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and r.stdout == "", script
        assert r.stderr.count("\n") == 1 and "needs root" in r.stderr, r.stderr


def snakemake(wd: Path, *args: str, timeout: int = 900):
    """``snakemake --workflow-profile workflow/profiles/slurm`` in ``wd``; args: targets, then options."""
    return subprocess.run(snakemake_cmd(*args), cwd=wd, env=tiny_dag_env(), capture_output=True, text=True,
                          timeout=timeout)


def sacct(ids: list[str], *fields: str) -> dict[str, dict[str, str]]:
    r = subprocess.run(["sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o", ",".join(("JobID", *fields))],
                       capture_output=True, text=True, check=True)
    rows = [line.split("|") for line in r.stdout.splitlines() if line]
    return {row[0]: dict(zip(fields, row[1:], strict=True)) for row in rows}


def tres(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",") if item)


def runtime_minutes(rule: str) -> int:
    """The run time limit the profile declares for a rule (set-resources, else default-resources)."""
    profile = yaml.safe_load((ROOT / PROFILE / "config.yaml").read_text())
    return (profile.get("set-resources", {}).get(rule) or {}).get("runtime", profile["default-resources"]["runtime"])


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.fixture(scope="module")
def slurm_dag(slurm_run):
    """Table 1 of `tiny` through Slurm, in a scratch copy of the workflow with the shared local run's params
    (conftest.tiny_workflow); returns (folder, snakemake's output)."""
    return slurm_run.wait_dag()


def test_every_job_is_a_slurm_job_with_the_resources_the_profile_declares(slurm_dag):
    wd, out = slurm_dag
    jobs = {m[1]: m[2] for m in SUBMITTED.finditer(out)}  # Slurm job id -> rule
    assert sorted(jobs.values()) == TABLE1_RULES
    rows = sacct(list(jobs), "State", "Account", "AllocTRES", "Timelimit")
    assert sorted(rows) == sorted(jobs)  # the accounting database knows every job
    for jid, rule in jobs.items():
        row, want = rows[jid], BY_NAME[rule].resources
        got = tres(row["AllocTRES"])
        assert (row["State"], row["Account"]) == ("COMPLETED", "r2m"), (rule, row)
        assert got["cpu"] == "1" and got["mem"] == f"{want.mem_mb}M", (rule, got)  # threads: 1; mem_mb
        assert got.get("gres/gpu") == ("1" if want.gpu else None), (rule, got)  # gpu=1 -> --gpus=1 -> GRES
        minutes = runtime_minutes(rule)
        assert row["Timelimit"] == f"{minutes // 60:02d}:{minutes % 60:02d}:00", (rule, row)
        assert list((wd / "logs/slurm" / f"rule_{rule}").rglob(f"{jid}.log")), rule  # Slurm's log, kept
        assert list((wd / "logs" / rule).glob("*.log")), rule  # the stage's own log


def test_tables_identical_to_the_local_run(slurm_dag, tiny_dag):
    wd, _ = slurm_dag
    for rel in (TABLE1, "reports/table1.md", "results/tiny/r2m/s0/train_i/eval.json",
                "results/tiny/r2m/s0/train_i/captions.json"):
        assert (wd / rel).read_bytes() == (tiny_dag / rel).read_bytes(), rel


def _wait_for(what: str, ready, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"snakemake exited before {what}: {proc.communicate()[0][-4000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} within {seconds:.0f} s")
        time.sleep(0.5)


def sbatch_and_wait(args: list[str], cwd: Path, seconds: float) -> str:
    """Submit a batch job, wait for it (squeue every 0.25 s) and return its id; fails with its log unless it
    COMPLETED. Not ``sbatch --wait``: that polls after 2, 8, then every 32 s, so a half-minute job was seen
    finished ~10-30 s late."""
    r = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, env=tiny_dag_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    jid = r.stdout.strip().split(";")[0]
    deadline, state = time.monotonic() + seconds, ""
    while state in ("", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"):
        if time.monotonic() > deadline:
            subprocess.run(["scancel", jid])
            pytest.fail(f"Slurm job {jid} not finished within {seconds:.0f} s")
        time.sleep(0.25)
        state = subprocess.run(["squeue", "-h", "-t", "all", "-j", jid, "-o", "%T"], capture_output=True,
                               text=True, check=True).stdout.strip()
    logs = sorted(cwd.glob(f"*{jid}*.log"))
    assert state == "COMPLETED", f"Slurm job {jid}: {state}\n" + "".join(p.read_text()[-4000:] for p in logs)
    return jid


def test_scancel_of_a_training_job_is_reported_and_the_rerun_resumes_bit_identical(slurm_dag, tmp_path):
    """train_xe (60 steps, last.pt every 20) as a Slurm job, held at step 30 (R2M_FAULT=train_xe@30:STOP, so
    it cannot finish first) and cancelled with scancel once last.pt exists: Snakemake reports the job and
    exits (plugin 2.8.0 with sacct would wait forever: this test fails on its timeout then); the rerun
    resumes from last.pt and ends with the uninterrupted run's weights and loss.tsv."""
    done, _ = slurm_dag
    wd = copy_run(done, tmp_path / "cut")
    env = {**tiny_dag_env(), "R2M_FAULT": "train_xe@30:STOP"}
    cmd = snakemake_cmd("models/tiny/r2m/s0/train_xe", "--forcerun", "train_xe")
    proc = subprocess.Popen(cmd, cwd=wd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for("last.pt", (wd / RESUME).exists, proc, 300)
    running = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i|%Z"], capture_output=True, text=True, check=True)
    ids = [line.split("|")[0] for line in running.stdout.splitlines() if line.endswith(f"|{wd}")]
    assert len(ids) == 1, running.stdout
    subprocess.run(["scancel", ids[0]], check=True)
    try:
        out = proc.communicate(timeout=240)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("snakemake still waits 240 s after scancel (the plugin's CANCELLED hang: status command?)")
    assert proc.returncode != 0
    assert f"SLURM-job '{ids[0]}' failed" in out and "CANCELLED" in out, out[-3000:]
    assert f"r2m: train_xe: Slurm job {ids[0]} was cancelled; run the same command again to resume it" in out
    assert sacct(ids, "State")[ids[0]]["State"].startswith("CANCELLED")
    step = torch.load(wd / RESUME, weights_only=True)["step"]
    assert 20 <= step < 60  # (the finished model folder stays as it was: Snakemake deletes no real output)

    r = snakemake(wd, "models/tiny/r2m/s0/train_xe")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert f"resuming from {RESUME} at step {step}" in (wd / "logs/train_xe/tiny-r2m-0.log").read_text()
    assert not (wd / RESUME).exists()
    a = torch.load(done / "models/tiny/r2m/s0/train_xe/model.pt", weights_only=True)["state_dict"]
    b = torch.load(wd / "models/tiny/r2m/s0/train_xe/model.pt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    loss = "results/tiny/r2m/s0/train_xe/loss.tsv"
    assert (wd / loss).read_text() == (done / loss).read_text()


def test_a_job_over_its_memory_limit_fails_with_a_one_line_reason(slurm_dag, tmp_path):
    """train_xe given 300 MB (Snakemake's job wrapper and torch need more): Slurm kills it and the Snakefile's
    onerror prints one line naming the rule, the job and both sizes; the finished upstream outputs stay."""
    wd = copy_run(slurm_dag[0], tmp_path / "oom")
    r = snakemake(wd, "models/tiny/r2m/s0/train_xe", "--forcerun", "train_xe", "--set-resources", "train_xe:mem_mb=300")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "Error in rule train_xe:" in out, out[-3000:]
    reason = [line for line in out.splitlines() if line.startswith("r2m: train_xe: Slurm job ")]
    assert len(reason) == 1, out[-3000:]
    assert re.fullmatch(r"r2m: train_xe: Slurm job \d+ exceeded its memory limit \((\d+) MB > 300 MB\) and was "
                        r"killed; raise mem_mb for train_xe \(set-resources in the Slurm profile\)", reason[0]), reason
    assert int(re.search(r"\((\d+) MB", reason[0])[1]) > 300
    assert (wd / "data/tiny/vocab/vocab.json").exists() and (wd / "data/tiny/features/features.h5").exists()


def test_ddp_as_two_srun_tasks_follows_the_single_process_loss_curve(slurm_dag, tmp_path):
    """One Slurm job of 2 tasks, two steps: train_xe as one process (srun -n 1), then as two (srun -n 2; gloo on
    CPU, rank and world size from Slurm's environment): the same loss curve within float summation order, as
    tests/test_distributed.py checks locally (and, like it, over a few steps: summation-order differences grow
    with every step); rank 0 alone writes the outputs. Dropout off: its masks are drawn per rank, so with
    dropout the curves agree in distribution only."""
    done, _ = slurm_dag
    # the params the DAG's jobs ran with: Snakemake's content-addressed copy of this run's merged config
    used = max((done / ".snakemake/r2m/params").glob("*.yaml"), key=lambda f: f.stat().st_mtime)
    raw = yaml.safe_load(used.read_text())
    raw["model"]["dropout"] = 0.0
    raw["catalog"]["tiny"]["overrides"]["train_xe"].update(steps=8, eval_every=4, checkpoint_every=4)
    for name in ("one", "two"):
        wd = copy_run(done, tmp_path / name)
        for rel in ("models/tiny/r2m/s0/train_xe", "results/tiny/r2m/s0/train_xe"):
            shutil.rmtree(wd / rel)
        (wd / "ddp_params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    r2m = f"{BIN / 'r2m'} train_xe --dataset tiny --variant r2m --params ddp_params.yaml"
    jid = sbatch_and_wait(["--ntasks=2", "--cpus-per-task=1", "--mem=4000", "-t", "20", "-o", "ddp-%j.log", "--wrap",
                           f"cd one && srun -n 1 {r2m} && cd ../two && srun -n 2 {r2m}"], tmp_path, 900)
    want = {f"{jid}.0|1|COMPLETED", f"{jid}.1|2|COMPLETED"}
    for _ in range(40):  # the accounting database may record the steps a moment after the job ended
        steps = subprocess.run(["sacct", "-n", "-P", "-j", jid, "-o", "JobID,NTasks,State"], capture_output=True,
                               text=True, check=True).stdout.splitlines()
        if want <= set(steps):
            break
        time.sleep(0.25)
    assert want <= set(steps), steps
    loss = "results/tiny/r2m/s0/train_xe/loss.tsv"
    one, two = tmp_path / "one", tmp_path / "two"
    assert_same_loss_curve((one / loss).read_text(), (two / loss).read_text(), "train_xe: srun -n 1 vs -n 2")
    assert (two / "models/tiny/r2m/s0/train_xe/model.pt").exists()
    locks = ".r2m/locks/train_xe/tiny-r2m-0-rank1.lock"  # rank 1's own lock: RANK=1 came from SLURM_PROCID
    assert (two / locks).exists() and not (one / locks).exists()


def test_the_poll_wrapper_caps_the_plugins_status_interval_and_nothing_else(monkeypatch):
    """tests/cluster/snakemake_poll.py: the interval the plugin asks for (+10 s per check without a finished job)
    is capped, a shorter one is kept; without the cap the plugin's own value stands (the wrapper must not be a
    no-op that leaves the 10-30 s waits, nor change the executor otherwise)."""
    if plugin_missing():
        pytest.skip(plugin_missing())
    import snakemake_executor_plugin_slurm as slurm

    spec = importlib.util.spec_from_file_location("snakemake_poll", CLUSTER / "snakemake_poll.py")
    poll = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(poll)
    monkeypatch.setattr(slurm.Executor, "next_seconds_between_status_checks",
                        slurm.Executor.next_seconds_between_status_checks)  # put back afterwards
    executor = object.__new__(slurm.Executor)  # no workflow needed for the attribute
    executor.next_seconds_between_status_checks = 41
    assert executor.next_seconds_between_status_checks == 41  # the plugin's own value, before the cap
    poll.cap_status_interval(1.5)
    for asked, got in ((41, 1.5), (11, 1.5), (1, 1)):
        executor.next_seconds_between_status_checks = asked
        assert executor.next_seconds_between_status_checks == got, asked


def kill_wait() -> int:
    """Slurm's KillWait: seconds between the SIGTERM of a time limit (or scancel) and its SIGKILL."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"^KillWait\s*=\s*(\d+)", config, re.M)[1])


def job_state(jid: str) -> str:
    return subprocess.run(["squeue", "-h", "-t", "all", "-j", jid, "-o", "%T"], capture_output=True, text=True,
                          check=True).stdout.strip()


def sbatch_wrapped(wd: Path, minutes: int, env: dict[str, str]) -> tuple[str, Path]:
    """``r2m warm -- snakemake`` (tests/stop_runs.py's chains) as the batch step of one Slurm job in ``wd``: its id
    and output file."""
    script = f"exec {BIN / 'r2m'} warm --log warm.log -- {' '.join(SR.SNAKEMAKE)}"
    r = subprocess.run(["sbatch", "--parsable", "-c", "2", "--mem=4000", "-t", str(minutes), "-o", "slurm-%j.out",
                        "--wrap", script], cwd=wd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    jid = r.stdout.strip().split(";")[0]
    return jid, wd / f"slurm-{jid}.out"


def ended(jid: str, seconds: float) -> float | None:
    """Seconds until job ``jid`` left RUNNING/COMPLETING (squeue every 0.1 s), None if not within ``seconds``."""
    t0 = time.monotonic()
    while job_state(jid) in ("", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
        if time.monotonic() - t0 > seconds:
            return None
        time.sleep(0.1)
    return time.monotonic() - t0


def stopped_then_resumed(wd: Path, jid: str, out: Path, ref: Path) -> None:
    """The stopped job's end as ``r2m warm`` reports it, then the same job again: it resumes and ends with the
    uninterrupted run's bytes."""
    text = out.read_text()
    assert "r2m warm: stopped by SIGTERM in" in text and job_state(jid) == "FAILED", text[-3000:]  # (exit 143)
    assert not (wd / ".snakemake/locks").exists()
    again, again_out = sbatch_wrapped(wd, 10, tiny_dag_env())
    assert ended(again, 900) is not None and job_state(again) == "COMPLETED", again_out.read_text()[-3000:]
    SR.same_results(wd, ref)


@pytest.mark.parametrize("moment", SR.MOMENTS)
def test_a_time_limits_sigterm_to_every_process_stops_a_wrapped_run_before_its_sigkill(slurm_dag, stop_upstream,
                                                                                       stop_reference, tmp_path,
                                                                                       moment):
    """What a time limit does first — SIGTERM to every process of the job (``scancel --signal=TERM --full``): the
    engine, its job shells and clients, the warm server and its jobs all get it; Snakemake's own SIGTERM
    handling may deadlock, the wrapper's SIGINT ends that. The run must end before Slurm's SIGKILL (KillWait
    later; sent here if it has not), each held job having saved its state; the next run resumes."""
    wd = SR.copy(stop_upstream, tmp_path / "wd")
    jid, out = sbatch_wrapped(wd, 10, {**tiny_dag_env(), **SR.faults(wd, moment)})
    SR.reach(wd, moment, lambda: job_state(jid) in ("PENDING", "CONFIGURING", "RUNNING"), lambda: SR.text(out))
    subprocess.run(["scancel", "--signal=TERM", "--full", jid], check=True)
    seconds = ended(jid, kill_wait())
    if seconds is None:
        subprocess.run(["scancel", "--signal=KILL", "--full", jid], check=True)
        ended(jid, 60)
        pytest.fail(f"{moment}: still running {kill_wait()} s after the SIGTERM (Slurm's KillWait): "
                    f"{SR.text(out)[-3000:]}")
    print(f"\nSlurm SIGTERM to every process, {moment}: ended in {seconds:.1f} s "
          f"(r2m warm: {SR.own_count(out.read_text(), 'TERM'):.1f} s)")
    if moment == "run":
        assert [SR.last_step(wd, v) for v in SR.VARIANTS] == [SR.HELD, SR.HELD]
    stopped_then_resumed(wd, jid, out, stop_reference)


def test_a_real_time_limit_stops_a_wrapped_run_and_it_resumes(slurm_dag, stop_upstream, stop_reference, tmp_path):
    """``sbatch -t 2``: both training jobs held at step 15 until the time limit comes (2 min after the start, or up
    to Slurm's time-limit check later); the run ends before the SIGKILL (``r2m warm`` gets to say how it
    stopped), each job saved at step 15, the job is recorded TIMEOUT, and the next run resumes."""
    wd = SR.copy(stop_upstream, tmp_path / "wd")
    jid, out = sbatch_wrapped(wd, 2, {**tiny_dag_env(), **SR.faults(wd, "run")})
    SR.reach(wd, "run", lambda: job_state(jid) in ("PENDING", "CONFIGURING", "RUNNING"), lambda: SR.text(out))
    assert ended(jid, 240) is not None, "the time limit did not end the job"
    text = out.read_text()
    assert "r2m warm: SIGTERM: stopping the run" in text and job_state(jid) == "TIMEOUT", text[-3000:]
    seconds = SR.own_count(text, "TERM")
    print(f"\nSlurm time limit, run: r2m warm stopped in {seconds:.1f} s")
    assert seconds < kill_wait()
    assert [SR.last_step(wd, v) for v in SR.VARIANTS] == [SR.HELD, SR.HELD]
    assert not (wd / ".snakemake/locks").exists()
    again, again_out = sbatch_wrapped(wd, 10, tiny_dag_env())
    assert ended(again, 900) is not None and job_state(again) == "COMPLETED", again_out.read_text()[-3000:]
    for v in SR.VARIANTS:
        assert f"at step {SR.HELD}" in (wd / f"logs/train_xe/tiny-{v}-0.log").read_text(), v
    SR.same_results(wd, stop_reference)


def test_a_stop_signal_to_a_wrapped_snakemake_cancels_its_slurm_jobs_which_save_their_state(slurm_dag, tmp_path):
    """``r2m warm -- snakemake`` with the Slurm executor: its jobs are Slurm jobs (run cold in their allocations,
    not in the wrapper's server on this same node), so the wrapper's stop reaches them through Snakemake — one
    SIGINT once the server has no job left to stop — whose executor cancels them (scancel: SIGTERM): the
    training job saves its state where it was held, and the next run resumes it bit-identically."""
    done, _ = slurm_dag
    wd = copy_run(done, tmp_path / "stop")
    log = wd / "logs/train_xe/tiny-r2m-0.log"
    log.unlink()
    env = {**tiny_dag_env(), "R2M_FAULT": "train_xe@30:HOLD"}
    cmd = [str(BIN / "r2m"), "warm", "--log", "warm.log", "--",
           *snakemake_cmd("models/tiny/r2m/s0/train_xe", "--forcerun", "train_xe")]
    proc = subprocess.Popen(cmd, cwd=wd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    _wait_for("the job held", lambda: "holding at" in SR.text(log), proc, 300)
    assert "start " not in SR.text(wd / "warm.log")  # the job did not run in the server
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        out = proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the wrapped Snakemake did not end within 60 s of SIGTERM")
    print(f"\nSIGTERM to r2m warm (Slurm executor), run: ended in {time.monotonic() - t0:.1f} s")
    assert proc.returncode == 143, out[-3000:]
    deadline = time.monotonic() + 60  # the cancelled job saves its state within Slurm's kill wait
    while "stopped by SIGTERM at step 30" not in SR.text(log) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert "stopped by SIGTERM at step 30" in SR.text(log), SR.text(log)[-2000:]
    assert torch.load(wd / RESUME, weights_only=True)["step"] == 30
    r = snakemake(wd, "models/tiny/r2m/s0/train_xe")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert f"resuming from {RESUME} at step 30" in log.read_text()
    a = torch.load(done / "models/tiny/r2m/s0/train_xe/model.pt", weights_only=True)["state_dict"]
    b = torch.load(wd / "models/tiny/r2m/s0/train_xe/model.pt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

"""``r2m warm``: stage jobs forked from a server that imported their libraries once (r2m.warm).

What a user relies on: a warm job writes the same bytes as a cold one; it runs in the server, not in
its client; a signal to the client reaches the job (Snakemake stops jobs that way); a client killed
with SIGKILL takes its job with it; with no server there, the job runs cold, saying so in one line; asked to stop,
the server signals its jobs and refuses new ones; a job of another Slurm job runs cold. (How a whole wrapped run
stops: tests/test_stop_signals.py.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import BIN, ROOT, copy_workflow

ENV = {**os.environ, "R2M_NO_PROGRESS": "1", "R2M_THREADS": "1", "PATH": f"{BIN}:{os.environ['PATH']}"}


def _tiny_workspace(wd: Path) -> None:
    copy_workflow(ROOT, wd)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["datasets"] = ["tiny"]
    raw["catalog"]["tiny"].update(n_train_images=6, n_val_images=2, n_test_images=2, n_sentences=40, image_size=32)
    (wd / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_warm_jobs_run_in_the_server_and_write_the_same_bytes_as_cold_ones(tmp_path):
    cold, warm = tmp_path / "cold", tmp_path / "warm"
    jobs = [["inputs", "--dataset", "tiny"], ["prepare", "--dataset", "tiny"], ["references", "--dataset", "tiny"]]
    for wd in (cold, warm):
        _tiny_workspace(wd)
    for job in jobs:
        r = subprocess.run([str(BIN / "r2m"), *job], cwd=cold, env=ENV, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    script = " && ".join(f"r2m {' '.join(j)}" for j in jobs)
    log = tmp_path / "warm.log"
    r = subprocess.run([str(BIN / "r2m"), "warm", "--log", str(log), "--", "sh", "-c", script], cwd=warm, env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = log.read_text().splitlines()
    started = [ln.split(" ", 2)[2] for ln in lines if ln.startswith("start ")]
    assert started == [f"r2m {' '.join(j)}" for j in jobs]  # every job ran in the server, in order
    assert [ln.split()[-1] for ln in lines if ln.startswith("end ")] == ["0"] * len(jobs)
    assert "not reachable" not in r.stderr
    a, b = _files(cold / "data/tiny"), _files(warm / "data/tiny")
    assert sorted(a) == sorted(b) and len(a) >= 5
    assert [k for k in a if a[k] != b[k]] == []
    # each job's log went where a cold job's goes
    assert (warm / "logs/prepare/tiny.log").read_text().count("done in") == 1


def test_without_a_server_the_job_runs_cold_and_says_so(tmp_path):
    env = {**ENV, "R2M_WARM": str(tmp_path / "no-such-socket")}
    r = subprocess.run([str(BIN / "r2m"), "table1", "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "usage: r2m table1" in r.stdout
    assert r.stderr.count("\n") == 1 and "not reachable" in r.stderr and "running cold" in r.stderr


# a server whose "job" is a small function (not r2m): the protocol's signals and exits, without the stages
SERVER = r"""
import os, signal, socket, sys, time
from pathlib import Path
from r2m.warm.server import serve

def job(argv):
    Path(argv[0]).write_text(str(os.getpid()))
    def stop(signum, frame):
        Path(argv[0] + ".signal").write_text(signal.Signals(signum).name)
        sys.exit(42)
    signal.signal(signal.SIGTERM, stop)
    while True:
        time.sleep(0.05)

listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(8)
print("ready", flush=True)
serve(listener, target=job)
"""
CLIENT = "import sys; from r2m.warm.client import run; sys.exit(run([sys.argv[1]]))"


def _server(tmp_path: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    sock = tmp_path / "s"
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(sock)], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    return server, {**ENV, "R2M_WARM": str(sock)}


def _wait_for(path: Path, timeout: float = 30) -> str:
    end = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < end, f"{path} never written"
        time.sleep(0.05)
    return path.read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.fixture
def served(tmp_path):
    """A client whose job is running in a test server: ``(client, job pid)``; the server stopped and the job
    killed afterwards, whatever the test did."""
    server, env = _server(tmp_path)
    pid = None
    try:
        client = subprocess.Popen([sys.executable, "-c", CLIENT, str(tmp_path / "job")], env=env)
        pid = int(_wait_for(tmp_path / "job"))
        yield client, pid
    finally:
        server.terminate()
        server.wait(timeout=30)
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_to_the_client_reaches_the_job_and_its_status_comes_back(served, tmp_path):
    client, pid = served
    assert pid != client.pid  # the job is the server's child, not the client
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=30) == 42  # the job's own exit status, through the client
    assert (tmp_path / "job.signal").read_text() == "SIGTERM"


def test_a_client_killed_with_sigkill_takes_its_job_with_it(served, tmp_path):
    client, pid = served
    client.kill()
    client.wait(timeout=30)
    end = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _alive(pid)
    assert not (tmp_path / "job.signal").exists()  # killed, not asked to stop


def test_a_long_tmpdir_still_gets_a_server_and_no_socket_runs_the_command_cold(tmp_path):
    """A Unix socket's path holds ~107 bytes: a long $TMPDIR must not stop `make run`."""
    long_tmp = tmp_path / ("t" * 60) / ("u" * 60)
    long_tmp.mkdir(parents=True)
    log = tmp_path / "warm.log"
    env = {**ENV, "TMPDIR": str(long_tmp)}
    r = subprocess.run([str(BIN / "r2m"), "warm", "--log", str(log), "--", "r2m", "table1", "--help"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "usage: r2m table1" in r.stdout, r.stderr[-2000:]
    first = log.read_text().splitlines()[0].split(" ", 2)
    assert first[0] == "start" and first[2] == "r2m table1 --help"  # the job ran in the server
    assert not list(long_tmp.glob("r2m-warm-*"))  # the server's folder went to /tmp (and is gone)

    from r2m.warm import server

    def no_socket():
        raise OSError(98, "Address already in use")

    server.open_socket, saved = no_socket, server.open_socket
    try:
        rc = server.main(["--", sys.executable, "-c", "import os, sys; sys.exit(0 if 'R2M_WARM' not in os.environ "
                                                      "else 3)"], target=lambda argv: 1)
    finally:
        server.open_socket = saved
    assert rc == 0  # the command ran, without a server named


# the server as `r2m warm` runs it: with a control channel from its front end (its fd number: argv[2])
CONTROLLED = SERVER.replace("serve(listener, target=job)",
                            "serve(listener, target=job, control=socket.socket(fileno=int(sys.argv[2])))")


def test_a_stop_signals_every_job_refuses_new_ones_and_reports_idle(tmp_path):
    """``stop 15`` on the control channel: the running job gets SIGTERM (its own status comes back), a job that
    arrives afterwards is not run (status 143, one line on its stderr), and the server, which said ``started``
    at its first job, says ``idle``."""
    ours, theirs = socket.socketpair()
    sock = tmp_path / "s"
    server = subprocess.Popen([sys.executable, "-c", CONTROLLED, str(sock), str(theirs.fileno())],
                              stdout=subprocess.PIPE, text=True, pass_fds=[theirs.fileno()])
    theirs.close()
    try:
        assert server.stdout.readline().strip() == "ready"
        env = {**ENV, "R2M_WARM": str(sock)}
        client = subprocess.Popen([sys.executable, "-c", CLIENT, str(tmp_path / "job")], env=env)
        _wait_for(tmp_path / "job")
        ours.sendall(b"stop 15\n")
        assert client.wait(timeout=30) == 42 and (tmp_path / "job.signal").read_text() == "SIGTERM"
        late = subprocess.run([sys.executable, "-c", CLIENT, str(tmp_path / "late")], env=env, capture_output=True,
                              text=True, timeout=60)
        assert late.returncode == 143 and not (tmp_path / "late").exists()
        assert late.stderr.count("\n") == 1 and "not started: the run is stopping (SIGTERM)" in late.stderr
        ours.settimeout(30)
        heard = b""
        while not heard.endswith(b"idle\n"):
            heard += ours.recv(64)
        assert heard == b"started\nidle\n"  # it had run a job; none runs now
        ours.sendall(b"quit\n")
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
        ours.close()


def test_a_job_of_another_slurm_job_runs_cold(tmp_path):
    """A cluster executor's job (another Slurm job than the wrapper's) must run in its own allocation, not in a
    server it happens to reach on the same node: the client does not even connect."""
    server, env = _server(tmp_path)
    try:
        env = {**env, "R2M_WARM_SLURM_JOB": "", "SLURM_JOB_ID": "77"}
        r = subprocess.run([sys.executable, "-c", "from r2m.warm.client import run; print(run(['x']))"], env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.stdout.strip() == "None" and r.stderr == ""  # None: run it here (cold), silently
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_next_wrapped_snakemake_reruns_incomplete_jobs_itself(tmp_path):
    """Outputs a killed Snakemake left marked incomplete: ``r2m warm`` adds ``--rerun-incomplete`` right after the
    program (one line says so) — only for Snakemake, only when there are markers, not twice."""
    from r2m.warm.engine import prepare

    argv = ["/v/bin/snakemake", "--cores", "2", "all", "--config", "a=1"]
    assert prepare(argv, tmp_path) == (argv, [])  # no .snakemake at all
    markers = tmp_path / ".snakemake/incomplete"
    markers.mkdir(parents=True)
    (markers / "migration_underway").touch()  # Snakemake's own file there, not a marker
    assert prepare(argv, tmp_path) == (argv, [])
    (markers / "bW9kZWxzL3g=").touch()
    got, lines = prepare(argv, tmp_path)
    assert got == ["/v/bin/snakemake", "--rerun-incomplete", "--cores", "2", "all", "--config", "a=1"]
    assert len(lines) == 1 and "1 output(s)" in lines[0] and "--rerun-incomplete" in lines[0]
    module = ["/v/bin/python3", "-m", "snakemake", "--cores", "1"]
    assert prepare(module, tmp_path)[0] == ["/v/bin/python3", "-m", "snakemake", "--rerun-incomplete", "--cores", "1"]
    given = ["snakemake", "--ri", "--cores", "1"]
    assert prepare(given, tmp_path) == (given, [])
    other = ["dvc", "repro"]
    assert prepare(other, tmp_path) == (other, [])
    elsewhere = tmp_path / "elsewhere"  # -d: Snakemake's folder is that one, with no markers
    assert prepare(["snakemake", "-d", str(elsewhere), "all"], tmp_path)[0] == ["snakemake", "-d", str(elsewhere),
                                                                               "all"]

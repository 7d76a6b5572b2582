"""No network at run time outside the download stages (r2m.utils.netguard, r2m.pipeline.network), and a
model folder's inference.json checked against a closed schema (r2m.captioning.settings.vet).

Each probe runs ``r2m`` in a subprocess under a recorder of its own (:data:`RECORDER`, an audit hook
installed before r2m is imported, so it sees every attempt, refused or not) that is also a safety
net: a lookup of, or a connection to, anything but the loopback raises there, so nothing these tests
run can reach another machine whatever the code under test does. The only traffic is to a server of
the test's own on 127.0.0.1 (:func:`loopback`), which counts the connections it accepts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

RECORDER = r'''
import json, os, socket, sys

LOG = open(os.environ["NET_RECORD"], "a", buffering=1)
LOOPBACK = {"127.0.0.1", "::1", "localhost", None, "", b""}
LOOKUPS = ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo")
SOCKETS = ("socket.connect", "socket.sendto", "socket.sendmsg")
CLIENTS = ("urllib.Request", "http.client.connect")


def hook(event, args):
    if event in SOCKETS:
        unix = getattr(args[0], "family", None) == socket.AF_UNIX
        address = args[1]
        LOG.write(json.dumps({"event": event, "unix": unix, "to": repr(address), "pid": os.getpid()}) + "\n")
        if not unix and address is not None and address[0] not in LOOPBACK:
            raise OSError(f"test safety net: {event} {address!r} is not the loopback")
    elif event in LOOKUPS or event in CLIENTS:
        target = args[0] if event in LOOKUPS else (args[1] if event != "urllib.Request" else
                                                   getattr(args[0], "full_url", args[0]))
        LOG.write(json.dumps({"event": event, "unix": False, "to": repr(target), "pid": os.getpid()}) + "\n")
        host = target[0] if isinstance(target, tuple) else target
        if event in LOOKUPS and host not in LOOPBACK:
            raise OSError(f"test safety net: {event} {host!r} is not the loopback")


sys.addaudithook(hook)
if os.environ.get("NET_PROBE_STAGE"):  # a stage of the test's own, run by the stage runner
    from r2m import cli
    from r2m.stage.spec import Stage

    stage = Stage("probe", impl=os.environ["NET_PROBE_STAGE"], help="a network probe", axes=())
    sys.exit(cli.run_stage(stage, sys.argv[1:]))
from r2m.cli import main

sys.exit(main(sys.argv[1:]))
'''

PROBE_STAGE = r'''
import os, socket, tempfile, threading, urllib.request
from pathlib import Path


def run(ctx):
    mode, port = os.environ["PROBE"], int(os.environ.get("PROBE_PORT", "9"))
    if mode == "urlopen_ip":
        urllib.request.urlopen(f"http://127.0.0.1:{port}/x", timeout=5)
    elif mode == "urlopen_host":
        urllib.request.urlopen(f"http://localhost:{port}/x", timeout=5)
    elif mode == "connect_ip":
        socket.create_connection(("127.0.0.1", port), timeout=5)
    elif mode == "connect_host":
        socket.create_connection(("localhost", port), timeout=5)
    elif mode == "swallowed":  # a library that falls back when the network fails, whatever the error
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/x", timeout=5)
        except BaseException:
            pass
    elif mode == "thread":
        t = threading.Thread(target=lambda: socket.create_connection(("127.0.0.1", port)))
        t.start()
        t.join()
    elif mode == "unix":  # the warm server's kind of socket, and multiprocessing's
        a, b = socket.socketpair()
        a.sendall(b"ping")
        got = b.recv(4)
        with tempfile.TemporaryDirectory() as d:
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(os.path.join(d, "s"))
            server.listen(1)
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(os.path.join(d, "s"))
            conn, _ = server.accept()
            client.sendall(b"pong")
            got += conn.recv(4)
        Path(os.environ["PROBE_OUT"]).write_bytes(got)
'''


@pytest.fixture
def loopback():
    """A TCP server on 127.0.0.1 that answers every connection with 403 and counts them (with the
    first line each sent): the only place any probe may send a byte to."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    seen: list[str] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    first = conn.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    first = ""
                seen.append(first)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], seen
    stop.set()
    t.join(2)
    srv.close()


def run_r2m(cwd: Path, argv: list[str], **env: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """``r2m argv`` in ``cwd`` under the recorder; its result and every network attempt it recorded."""
    record = cwd / f"net-record-{len(list(cwd.glob('net-record-*')))}.jsonl"
    wrapper = cwd / "record_r2m.py"
    wrapper.write_text(RECORDER)
    base = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "no_proxy",
                                                                      "all_proxy")}
    full = {**base, "NET_RECORD": str(record), "R2M_THREADS": "1", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(cwd), base.get("PYTHONPATH", "")]), **env}
    proc = subprocess.run([sys.executable, str(wrapper), *argv], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=300)
    rows = [json.loads(ln) for ln in record.read_text().splitlines()] if record.exists() else []
    return proc, rows


def off_machine(rows: list[dict]) -> list[dict]:
    """The recorded attempts that are not an AF_UNIX socket's."""
    return [r for r in rows if not r["unix"]]


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.strip()]


# --------------------------------------------------------------------------- a trained model, offline
@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A synthetic dataset (tests/test_training.py) and its params."""
    from test_training import make_synthetic

    ws = tmp_path_factory.mktemp("netws")
    make_synthetic(ws)
    sched = {"batch_size": 16, "lr": 3e-3, "max_len": 12, "eval_every": 10, "checkpoint_every": 10}
    raw = {"datasets": ["syn"], "catalog": {"syn": {"kind": "tiny"}},
           "model": {"d": 16, "heads": 2, "d_k": 8, "dropout": 0.0},
           "train_xe": {"steps": 3, **sched}, "caption": {"beam": 2, "max_len": 8, "batch_size": 5}}
    (ws / "params.yaml").write_text(yaml.safe_dump(raw))
    return ws


@pytest.fixture(scope="module")
def trained(workspace) -> tuple[Path, subprocess.CompletedProcess, list[dict]]:
    """``r2m train_xe`` run by the stage runner under the recorder; its model folder then captions with the
    bundled offline classifier (what tests/test_caption_own_images.py uses)."""
    proc, rows = run_r2m(workspace, ["train_xe", "--dataset", "syn", "--variant", "r2m", "--seed", "0",
                                     "--no-log-file"])
    folder = workspace / "models/syn/r2m/s0/train_xe"
    info = json.loads((folder / "inference.json").read_text())
    info["detect_concepts"] = {"backend": "classifier", "options": {"topk": 3}, "batch_size": 2, "min_side": 8}
    (folder / "inference.json").write_text(json.dumps(info))
    return folder, proc, rows


@pytest.fixture(scope="module")
def photo(tmp_path_factory) -> Path:
    from PIL import Image
    from skimage import data

    path = tmp_path_factory.mktemp("photo") / "coffee.jpg"
    Image.fromarray(data.coffee()).save(path)
    return path


def test_a_stage_and_caption_make_no_network_attempt(trained, photo, workspace):
    folder, train, rows = trained
    assert train.returncode == 0, train.stderr[-2000:]
    assert off_machine(rows) == [], rows  # the stage: not one lookup, connection or URL
    proc, rows = run_r2m(workspace, ["caption", str(photo), "--model", str(folder)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    path, _caption = proc.stdout.splitlines()[0].split("\t")  # (3 training steps: maybe an empty caption)
    assert Path(path).name == "coffee.jpg"
    assert off_machine(rows) == [], rows


def _model_folder(trained, tmp_path: Path, detect: dict) -> Path:
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(trained[0], folder)
    info = json.loads((folder / "inference.json").read_text())
    info["detect_concepts"] = detect
    (folder / "inference.json").write_text(json.dumps(info))
    return folder


def test_b_faster_rcnn_default_weights_refused_before_any_attempt(trained, photo, workspace, tmp_path):
    # before, `r2m caption` started downloading torchvision's COCO weights (a DNS lookup seen)
    folder = _model_folder(trained, tmp_path, {"backend": "faster_rcnn", "options": {}})
    proc, rows = run_r2m(workspace, ["caption", str(photo), "--model", str(folder)],
                         TORCH_HOME=str(tmp_path / "torch-home"))
    assert proc.returncode != 0
    lines = stderr_lines(proc)
    assert len(lines) == 1, lines
    assert str(folder / "inference.json") in lines[0] and "detect_concepts.backend" in lines[0]
    assert "fasterrcnn_resnet50_fpn" in lines[0] and "downloads" in lines[0]
    assert rows == []  # refused before anything was tried
    assert proc.stdout == ""


def test_b_faster_rcnn_weights_in_the_hub_cache_are_allowed(trained, photo, workspace, tmp_path):
    """With the file torchvision looks for already in torch's hub cache, the folder passes the schema and
    loading it opens no connection (a stand-in file: its load fails, in one line, offline)."""
    folder = _model_folder(trained, tmp_path, {"backend": "faster_rcnn", "options": {}})
    hub = tmp_path / "torch-home" / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    (hub / "fasterrcnn_resnet50_fpn_coco-258fb6c6.pth").write_bytes(b"not a checkpoint")
    proc, rows = run_r2m(workspace, ["caption", str(photo), "--model", str(folder)],
                         TORCH_HOME=str(tmp_path / "torch-home"))
    lines = stderr_lines(proc)
    assert proc.returncode == 1 and len(lines) == 1, lines
    assert "inference.json" not in lines[0] and "faster_rcnn" in lines[0]  # got past the schema, failed on the load
    assert off_machine(rows) == [], rows


@pytest.mark.parametrize("change, key", [
    ({"bogus": 1}, "bogus"),  # unknown top-level key
    ({"caption": {"beam": 2, "max_len": 8, "surprise": True}}, "caption.surprise"),  # unknown key in a section
    ({"caption": {"beam": "two"}}, "caption.beam"),  # a value its params section refuses
    ({"concepts": {"dictionary": "/etc/passwd"}}, "concepts.dictionary"),
    ({"detect_concepts": {"backend": "tf_oid", "options": {"source": "zoo"}}}, "detect_concepts.backend"),
    ({"detect_concepts": {"backend": "offline", "options": {"parts": ["faster_rcnn"]}}},
     "detect_concepts.options.faster_rcnn.backend"),
    ({"extract_features": {"backend": "inception_v4", "options": {}}}, "extract_features.backend"),
    ({"detect_concepts": {"backend": "owl", "options": {"allow_download": True}}},
     "detect_concepts.options.allow_download"),
])
def test_inference_json_closed_schema(trained, tmp_path, change, key, monkeypatch):
    from r2m.captioning import settings

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty-torch-home"))
    monkeypatch.setenv("R2M_CACHE", str(tmp_path / "empty-r2m-cache"))
    path = trained[0] / "inference.json"
    data = {**json.loads(path.read_text()), **change}
    with pytest.raises(ValueError) as err:
        settings.vet(data, path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: {key}") and "\n" not in msg, msg


def test_inference_json_as_recorded_passes(trained):
    from r2m.captioning import settings

    path = trained[0] / "inference.json"
    data = json.loads(path.read_text())
    assert settings.vet(data, path) is data


# --------------------------------------------------------------------------- a stage that tries the network
@pytest.fixture
def probe_ws(tmp_path) -> Path:
    (tmp_path / "netprobe.py").write_text(PROBE_STAGE)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"datasets": ["syn"], "catalog": {"syn": {"kind": "tiny"}}}))
    return tmp_path


@pytest.mark.parametrize("mode, what", [
    ("urlopen_ip", "urllib.Request http://127.0.0.1:{port}/x"),
    ("urlopen_host", "urllib.Request http://localhost:{port}/x"),
    ("connect_ip", "socket.getaddrinfo 127.0.0.1:{port}"),
    ("connect_host", "socket.getaddrinfo localhost:{port}"),
    ("swallowed", "urllib.Request http://127.0.0.1:{port}/x"),
    ("thread", "socket.getaddrinfo 127.0.0.1:{port}"),
])
def test_c_stage_network_attempt_refused_in_one_line(probe_ws, loopback, mode, what):
    port, seen = loopback
    proc, rows = run_r2m(probe_ws, ["--no-log-file"], NET_PROBE_STAGE="netprobe:run", PROBE=mode,
                         PROBE_PORT=str(port))
    assert proc.returncode == 1, proc.stderr[-2000:]
    refused = [ln for ln in stderr_lines(proc) if "network access refused" in ln]
    assert len(refused) == 1, proc.stderr
    expected = f"r2m probe: network access refused at run time: {what.format(port=port)} (from netprobe"
    assert expected in refused[0], refused[0]
    assert seen == []  # the loopback server was never reached
    assert not [r for r in rows if r["event"] == "socket.connect" and not r["unix"]], rows


def test_c_stage_unix_sockets_work(probe_ws, loopback):
    out = probe_ws / "probe.out"
    proc, rows = run_r2m(probe_ws, ["--no-log-file"], NET_PROBE_STAGE="netprobe:run", PROBE="unix",
                         PROBE_OUT=str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.read_bytes() == b"pingpong"
    assert any(r["unix"] for r in rows) and off_machine(rows) == [], rows


# --------------------------------------------------------------------------- the download stages
def test_d_download_stage_is_not_guarded(tmp_path, loopback):
    """``prepare`` of a paper benchmark fetches its missing raw sources: its attempt reaches the network (here a
    proxy of the test's own on the loopback, which refuses every request), and is not refused by the guard."""
    port, seen = loopback
    raw = tmp_path / "raw"
    raw.mkdir()
    params = {"datasets": ["bench"], "catalog": {"bench": {"kind": "coco_shutterstock", "raw_dir": str(raw)}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    proxy = f"http://127.0.0.1:{port}"
    proc, rows = run_r2m(tmp_path, ["prepare", "--dataset", "bench", "--no-log-file"], http_proxy=proxy,
                         https_proxy=proxy)
    assert "network access refused" not in proc.stderr
    assert proc.returncode != 0 and "download of" in proc.stderr  # the proxy said 403
    assert any("cs.stanford.edu" in s or "cocodataset.org" in s for s in seen), seen
    assert {r["event"] for r in off_machine(rows)} >= {"urllib.Request", "socket.connect"}

    # the same entry with download: false runs guarded and fetches nothing (the missing files, listed)
    params["catalog"]["bench"]["download"] = False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    before = len(seen)
    proc, rows = run_r2m(tmp_path, ["prepare", "--dataset", "bench", "--no-log-file"], http_proxy=proxy,
                         https_proxy=proxy)
    assert proc.returncode != 0 and "network access refused" not in proc.stderr
    assert len(seen) == before and off_machine(rows) == []


def _view(raw: dict):
    from r2m import params as P

    return P.for_dataset(P.validate({"datasets": ["d"], **raw}), "d")


@pytest.mark.parametrize("stage, raw, downloads", [
    ("prepare", {"catalog": {"d": {"kind": "coco_gcc"}}}, True),
    ("prepare", {"catalog": {"d": {"kind": "coco_gcc", "download": False}}}, False),
    ("prepare", {"catalog": {"d": {"kind": "tiny"}}}, False),  # a recipe that never downloads
    ("detect_concepts", {"catalog": {"d": {"kind": "tiny"}}, "detect_concepts": {"backend": "faster_rcnn"}}, True),
    ("detect_concepts", {"catalog": {"d": {"kind": "tiny"}}, "detect_concepts": {
        "backend": "faster_rcnn", "options": {"checkpoint": "w.pth", "classes": "c.txt"}}}, False),
    ("detect_concepts", {"catalog": {"d": {"kind": "tiny"}}}, False),  # offline: bundled weights
    ("extract_features", {"catalog": {"d": {"kind": "tiny"}}, "extract_features": {"backend": "inception_v4"}}, True),
    ("extract_features", {"catalog": {"d": {"kind": "tiny"}}}, False),
    ("train_xe", {"catalog": {"d": {"kind": "coco_gcc"}}}, False),
])
def test_d_which_instances_may_download(stage, raw, downloads):
    from r2m.pipeline.network import downloads as may
    from r2m.pipeline.network import guard_for
    from r2m.utils.netguard import NetworkGuard, NoGuard

    assert bool(may(stage, _view(raw), "d")) is downloads
    assert isinstance(guard_for(stage, _view(raw), "d")[0], NoGuard if downloads else NetworkGuard)


# --------------------------------------------------------------------------- a job of the warm server
WARM_SERVER = r"""
import socket, sys
sys.path.insert(0, sys.argv[2])
from r2m.stage import registry as S
from r2m.stage.spec import Stage
S.BY_NAME["probe"] = Stage("probe", impl="netprobe:run", help="a network probe", axes=())  # served like a stage
from r2m.cli import main
from r2m.warm.server import serve

listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(8)
print("ready", flush=True)
serve(listener, target=main)
"""
WARM_CLIENT = "import sys; from r2m.warm.client import run; sys.exit(run(sys.argv[1:]))"


def test_c_warm_server_job_is_guarded(probe_ws, loopback):
    """A stage job forked from the warm server (``r2m warm``) runs under the guard as a cold one does."""
    port, seen = loopback
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "R2M_THREADS": "1"}
    sock = probe_ws / "warm.sock"
    server = subprocess.Popen([sys.executable, "-c", WARM_SERVER, str(sock), str(probe_ws)], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        job_env = {**env, "R2M_WARM": str(sock), "PROBE": "connect_ip", "PROBE_PORT": str(port)}
        proc = subprocess.run([sys.executable, "-c", WARM_CLIENT, "probe", "--no-log-file"], cwd=probe_ws,
                              env=job_env, capture_output=True, text=True, timeout=120)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "not reachable" not in proc.stderr  # it ran in the server
    refused = [ln for ln in proc.stderr.splitlines() if "network access refused" in ln]
    assert len(refused) == 1 and f"socket.getaddrinfo 127.0.0.1:{port} (from netprobe" in refused[0], proc.stderr
    assert seen == []

"""`ptt demo` watches every process it starts, all the time: a worker that cannot bind its port
(taken between the demo's check and the worker's start, by a program whose /metrics looks like
a worker's), a worker killed mid-replay, a shuffler (with its HTTP front door) killed
mid-replay -- each ends the demo within 10 s with exit code 8, naming the process and quoting
its log, with nothing left running -- and a port the demo chose for its shuffler, taken before
the shuffler binds it, is chosen again. The enrollment secret of ``--via-shuffler`` is owner only,
outside the output directory, and gone when the demo ends."""

from __future__ import annotations

import http.server
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from estimators import get_spec
from stream_app.cli.errors import EXIT_HELPER
from stream_app.cli.local_broker import free_port
from tests.processes import door_pid, frozen, unread_at

from .stream_helpers import QUICK_DEMO
from .test_demo import _alive, _children, _metrics, _wait

pytestmark = pytest.mark.integration


class _LookAlike(http.server.BaseHTTPRequestHandler):
    """Another program's worker: a /metrics page with ``ptt_`` lines, without the demo's token."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b"# TYPE ptt_epochs_closed_total counter\nptt_epochs_closed_total{query=\"q\"} 1\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _demo(out: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    err, printed = out.parent / "demo.err", out.parent / "demo.out"
    with err.open("wb") as e, printed.open("wb") as p:
        proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "demo", "--stations", "4",  # noqa: S603
                                 *QUICK_DEMO, "--no-plots",
                                 "--query-mechanisms", "alp,unary",  # the 30-s queries: no span-sized fleet
                                 "--out", str(out), "--prometheus-port", str(free_port()), *args],
                                stdout=p, stderr=e, start_new_session=True, cwd=out.parent)
    return proc, err, printed


@pytest.fixture
def stopper() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


def _ends_within(proc: subprocess.Popen[bytes], seconds: float, err: Path) -> float:
    t0 = time.monotonic()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the demo still runs 60 s on\n{err.read_text()[-3000:]}") from None
    took = time.monotonic() - t0
    assert took <= seconds, f"the demo took {took:.1f}s to notice\n{err.read_text()[-3000:]}"
    return took


def _helper_pid(demo_pid: int, marker: bytes) -> int:
    (pid,) = [c for c in _children(demo_pid) if marker in Path(f"/proc/{c}/cmdline").read_bytes()]
    return pid


def _the_error(err: Path) -> str:
    text = err.read_text()
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.startswith("ptt demo: error:")]
    assert len(lines) == 1, text
    return lines[0]


def test_worker_port_taken_after_the_check_ends_the_demo_naming_the_worker(
        tmp_path: Path, stopper: list[subprocess.Popen[bytes]]) -> None:
    """The demo checks --metrics-port before it starts its broker; the port is taken once the
    broker's log exists (the worker is started after the broker is up, and its Python start
    takes seconds) by a look-alike /metrics page. Before: the demo took that page for its
    worker's and replayed on in silence."""
    port = free_port()
    out = tmp_path / "out"
    proc, err, _ = _demo(out, "--speed", "2", "--max-epochs", "50", "--metrics-port", str(port), "--no-shuffler")
    stopper.append(proc)
    _wait(lambda: (out / "broker.log").exists() or proc.poll() is not None, 60, "the broker's log", err)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _LookAlike)  # fails if the worker won the race
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert proc.poll() is None, err.read_text()
        helpers = _children(proc.pid)
        worker_log = out / "worker.log"
        _wait(lambda: (worker_log.exists() and "already in use" in worker_log.read_text()) or proc.poll() is not None,
              90, "the worker's refusal of the taken port", err)  # its start (imports: seconds) not in the bound
        _ends_within(proc, 10.0, err)
        assert proc.returncode == EXIT_HELPER, err.read_text()
        line = _the_error(err)
        assert "the stream-app worker exited with code 4 at start" in line, line
        assert f"ptt worker: error: the metrics port 127.0.0.1:{port} is already in use" in line, line
        assert str(out / "worker.log") in line, line
        _wait(lambda: not any(_alive(c) for c in helpers), 5.0, "every helper gone")
    finally:
        server.shutdown()
        server.server_close()


def _replaying(proc: subprocess.Popen[bytes], printed: Path, err: Path, metrics_port: int) -> None:
    _wait(lambda: "\nreplaying " in printed.read_text() or proc.poll() is not None, 180, "the replay's start", err)
    assert proc.poll() is None, err.read_text()
    _wait(lambda: "ptt_estimate_vehicles{" in _metrics(metrics_port) or proc.poll() is not None, 120,
          "an estimate in /metrics", err)
    assert proc.poll() is None, err.read_text()


def test_worker_killed_mid_replay_ends_the_demo_within_10_s(tmp_path: Path,
                                                             stopper: list[subprocess.Popen[bytes]]) -> None:
    """Before: the demo noticed only after the replay (here 100 epochs at 1.5 s each)."""
    metrics_port = free_port()
    out = tmp_path / "out"
    proc, err, printed = _demo(out, "--speed", "20", "--max-epochs", "100", "--metrics-port", str(metrics_port),
                               "--no-shuffler")
    stopper.append(proc)
    _replaying(proc, printed, err, metrics_port)
    helpers = _children(proc.pid)
    os.kill(_helper_pid(proc.pid, b"stream_app.cli\x00worker"), signal.SIGKILL)
    _ends_within(proc, 10.0, err)
    assert proc.returncode == EXIT_HELPER, err.read_text()
    line = _the_error(err)
    assert "the stream-app worker was killed by signal 9 (SIGKILL)" in line and str(out / "worker.log") in line, line
    _wait(lambda: not any(_alive(c) for c in helpers), 5.0, "every helper gone")


def test_shuffler_front_door_killed_mid_replay_ends_the_demo_within_10_s(
        tmp_path: Path, stopper: list[subprocess.Popen[bytes]]) -> None:
    """Killed while the replay waits on the front door: the replay uploads as fast as it can
    (--speed 0), the door is frozen until a device's request waits unread at it, then the
    shuffler is killed and the door let go (it stops, its parent gone). Before: the watch saw the
    shuffler gone at once, but the replay went on sending the epoch's devices, each retried 8
    times (~16 s) 32 at a time, before it looked at the stop -- 19 to 83 s; at --speed 20 the
    kill mostly landed between two uploads, and the test failed only on a loaded machine."""
    metrics_port = free_port()
    out = tmp_path / "out"
    proc, err, printed = _demo(out, "--speed", "0", "--max-epochs", "2000", "--metrics-port", str(metrics_port),
                               "--via-shuffler", "--transport", "http")
    stopper.append(proc)
    _replaying(proc, printed, err, metrics_port)
    # the enrollment secret: said where, owner only, outside the output directory
    (said,) = [line for line in printed.read_text().splitlines() if line.startswith("enrollment  secret in ")]
    secret = Path(said.removeprefix("enrollment  secret in ").split(" (")[0])
    assert secret.is_file() and out not in secret.parents, said
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    (door_port,) = re.findall(r"devices POST http://127\.0\.0\.1:(\d+)/v1/reports", printed.read_text())
    helpers = _children(proc.pid)
    shuffler = _helper_pid(proc.pid, b"stream_app.cli\x00shuffler")
    with frozen(door_pid(shuffler)):
        _wait(lambda: unread_at(int(door_port)) > 0 or proc.poll() is not None, 60,
              "a device's request waiting at the frozen front door", err)
        os.kill(shuffler, signal.SIGKILL)
    _ends_within(proc, 10.0, err)
    assert proc.returncode == EXIT_HELPER, err.read_text()
    line = _the_error(err)
    assert "the shuffler (and its HTTP front door) was killed by signal 9 (SIGKILL)" in line, line
    assert str(out / "shuffler.log") in line, line
    _wait(lambda: not any(_alive(c) for c in helpers), 5.0, "every helper gone")
    assert not secret.parent.exists(), "the secret outlived the demo"
    assert not list(out.rglob("*secret*")), list(out.rglob("*secret*"))


def test_a_port_the_demo_chose_for_its_shuffler_taken_before_the_shuffler_binds_it_is_chosen_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The demo picks free ports for its shuffler (/metrics, the front door); another program
    can take one before the shuffler binds it. The shuffler then exits 4 at start, and the
    demo -- waiting for the shuffler to answer before it replays -- starts it again on new
    ports (as it does its worker and Prometheus), then runs to the end. Run in this process,
    the worker's and Prometheus's ports given, so the demo's first choice is the shuffler's
    /metrics port: the port it returns is held by a listening socket. Before: the demo started the
    replay without waiting and ended with exit code 8 naming the shuffler."""
    import socket

    import stream_app.cli.demo as demo
    from stream_app.cli import main

    held = socket.create_server(("127.0.0.1", 0))
    fixed = [str(free_port()), str(free_port())]  # the worker's and Prometheus's: no choice of the demo's
    chosen: list[int] = []

    def free() -> int:
        chosen.append(held.getsockname()[1] if not chosen else free_port())
        return chosen[-1]

    monkeypatch.setattr(demo, "free_port", free)
    out = tmp_path / "out"
    try:
        code = main(["demo", "--via-shuffler", "--stations", "4", *QUICK_DEMO, "--query-mechanisms", "alp",
                     "--speed", "0", "--no-plots",
                     "--max-epochs", "3", "--exit-when-done", "--out", str(out), "--metrics-port", fixed[0],
                     "--prometheus-port", fixed[1]])
    finally:
        held.close()
    assert code == 0, capsys.readouterr().err[-3000:]
    run_log = (out / "run.log").read_text()
    assert len(chosen) >= 4, chosen  # the shuffler's two ports (the first one held), then two more
    assert f":{chosen[0]}/" not in run_log and f"metrics http://127.0.0.1:{chosen[2]}/" in run_log, run_log[:2000]
    rows = (out / "estimates.jsonl").read_text().count("\n")
    assert rows == 3 * 4 * len(get_spec("alp").estimator_names), rows  # 3 epochs, 4 stations

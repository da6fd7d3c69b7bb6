"""`ptt demo` (the README's main command): estimates flow, metrics are served, and Ctrl-C
stops everything it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from producers.local_broker import free_port

pytestmark = pytest.mark.integration


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if text in line and "ps -eww" not in line]


def test_demo_serves_metrics_and_ctrl_c_leaves_nothing_behind(tmp_path: Path) -> None:
    broker_port, metrics_port, prom_port = free_port(), free_port(), free_port()
    log = (tmp_path / "demo.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "demo", "--speed", "60", "--stations", "4",  # noqa: S603
                             "--port", str(broker_port), "--metrics-port", str(metrics_port),
                             "--prometheus-port", str(prom_port)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own process group: a failure kills it all
    try:
        deadline = time.time() + 120
        text = ""
        while time.time() < deadline:  # estimates flowing into the metrics
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=3) as r:  # noqa: S310
                    text = r.read().decode()
                if "ptt_estimate_vehicles{" in text:
                    break
            except OSError:
                pass
            time.sleep(1.0)
        assert "ptt_estimate_vehicles{" in text, (tmp_path / "demo.log").read_text()[-3000:]
        assert _processes_mentioning(f"tcp://127.0.0.1:{broker_port}")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) in (0, 130)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
    time.sleep(1.0)
    output = (tmp_path / "demo.log").read_text()
    assert f"http://127.0.0.1:{metrics_port}/metrics" in output and "ptt subscribe" in output
    assert not _listening(broker_port) and not _listening(metrics_port) and not _listening(prom_port)
    assert not _processes_mentioning(f"tcp://127.0.0.1:{broker_port}")
    assert not _processes_mentioning(f"127.0.0.1:{prom_port}")

"""``ptt demo``: everything on one machine with nothing configured.

Starts the embedded broker, a stream-app worker (serving /metrics), Prometheus scraping it
when the ``prometheus`` binary is installed (Debian package ``prometheus``), and replays the
synthetic day at a watchable speed. After the replay it keeps serving until Ctrl-C (or exits
with ``--exit-when-done``). Ctrl-C stops everything it started: no process is left behind.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from producers.local_broker import LocalBroker, terminate
from producers.replay import StopFlag, replay
from producers.settings import ReplaySettings

from .settings import WorkerSettings

__all__ = ["prometheus_config", "run_demo"]


def prometheus_config(targets: list[str], scrape_interval_s: int = 5) -> str:
    """A Prometheus configuration scraping the workers' /metrics."""
    joined = ", ".join(f'"{t}"' for t in targets)
    return (f"global:\n  scrape_interval: {scrape_interval_s}s\n  evaluation_interval: {scrape_interval_s}s\n"
            f"scrape_configs:\n  - job_name: ptt-stream\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: [{joined}]\n")


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - loopback
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout_s}s")


def run_demo(speed: float = 120.0, max_epochs: int | None = None, stations: int = 16, port: int | None = None,
             metrics_port: int = 6066, prometheus_port: int = 9090, exit_when_done: bool = False) -> int:
    worker: subprocess.Popen[bytes] | None = None
    prom: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory(prefix="ptt-demo-") as tmp_name, \
            LocalBroker(port=port, log_path=Path(tmp_name) / "broker.log") as broker:
        tmp = Path(tmp_name)
        try:
            ws = WorkerSettings(bootstrap_servers=broker.bootstrap, web_port=metrics_port, min_participants=1,
                                worker_dir=tmp / "worker")
            with (tmp / "worker.log").open("wb") as log:
                worker = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "worker"],  # noqa: S603
                                          env={**_os_env(), **ws.to_env()}, stdout=log, stderr=subprocess.STDOUT)
            metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
            _wait_http(metrics_url, 90, worker)
            prom_bin = shutil.which("prometheus")
            prom_url = None
            if prom_bin:
                cfg = tmp / "prometheus.yml"
                cfg.write_text(prometheus_config([f"127.0.0.1:{metrics_port}"]))
                with (tmp / "prometheus.log").open("wb") as log:
                    prom = subprocess.Popen(  # noqa: S603
                        [prom_bin, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                         f"--web.listen-address=127.0.0.1:{prometheus_port}"], stdout=log, stderr=subprocess.STDOUT)
                prom_url = f"http://127.0.0.1:{prometheus_port}"
                _wait_http(prom_url + "/-/ready", 60, prom)
            print(f"broker      {broker.bootstrap} (embedded, memory only; logs in {tmp})")
            print(f"metrics     {metrics_url}")
            print(f"prometheus  {prom_url or 'not installed (apt-get install prometheus) - skipped'}")
            print(f"estimates   ptt subscribe --bootstrap-servers {broker.bootstrap}")
            print(f"queries     ptt analyst list --bootstrap-servers {broker.bootstrap}")
            print(f"replaying the synthetic day ({stations} stations) at {speed:g}x real time; Ctrl-C stops",
                  flush=True)
            rs = ReplaySettings(bootstrap_servers=broker.bootstrap, speed=speed, max_epochs=max_epochs,
                                synthetic_stations=stations, data_dir=tmp / "data")
            summary = replay(rs, progress=True)
            print(f"data: {summary.data_quality}")
            print(f"replayed {summary.epochs} epochs: {summary.reports:,} reports in {summary.records:,} records "
                  f"from a fleet of {summary.fleet_size:,} vehicles in {summary.elapsed_s:.1f}s"
                  + (" (interrupted)" if summary.interrupted else ""), flush=True)
            if summary.interrupted:
                return 130
            if not exit_when_done:
                print("replay done; still serving metrics - Ctrl-C stops", flush=True)
                with StopFlag() as stop:
                    while not stop.wait(1.0):
                        if worker.poll() is not None:
                            print(f"the worker exited ({worker.returncode}); see {tmp}/worker.log", file=sys.stderr)
                            return 1
            return 1 if summary.delivery_failures else 0
        finally:
            terminate(prom)
            terminate(worker)


def _os_env() -> dict[str, str]:
    import os

    return dict(os.environ)

"""The default ``ptt demo`` is the private system, and every output gives the same whole-day
figure for it: the banner, ``ptt analyst list`` and the worker's ``/metrics``
(``ptt_vehicle_day_epsilon``, while the demo serves), ``summary.txt`` and ``summary.json`` once
it has stopped, and ``ptt plan fleet`` given the demo's crowd, stations,
queries and day budget -- all from one function (:mod:`stream_app.day_figure`), at most the
day budget the demo planned for, through the shuffler."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from stream_app.cli.local_broker import free_port
from tests.processes import sigint_default

from .stream_helpers import metric, wait_for

pytestmark = pytest.mark.integration

FIGURE = re.compile(r"a vehicle's day across its \d+ quer(?:y|ies) \([^)]*\): epsilon ([0-9.e+-]+) at delta 1e-06 "
                    r"through the shuffler's aggregate release among n=([0-9,]+)")


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = path.read_text()
        if text in got:
            return got
        assert proc.poll() is None, f"the demo exited ({proc.returncode}) before {text!r}: {got[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"no {text!r} within {timeout_s:.0f} s: {path.read_text()[-3000:]}")


def _worker_metrics(banner: str, proc: subprocess.Popen[bytes]) -> str:
    """The worker's /metrics (its address from the banner) once its day figure is computed
    (off its event loop: tens of seconds at the demo's crowd on a busy machine)."""
    url = re.search(r"^metrics +(http\S+)", banner, re.M)
    assert url is not None, banner
    page: list[str] = []

    def ready() -> bool:
        assert proc.poll() is None, f"the demo exited ({proc.returncode})"
        with urllib.request.urlopen(url.group(1), timeout=10) as r:  # noqa: S310 - loopback
            page[:] = [r.read().decode()]
        return 'ptt_vehicle_day_epsilon_state{state="ready"} 1.0' in page[0]

    wait_for(ready, 600, "the worker's ptt_vehicle_day_epsilon")
    return page[0]


def test_the_default_demo_goes_through_the_shuffler_and_every_output_gives_one_day_figure(tmp_path: Path) -> None:
    out, printed = tmp_path / "out", tmp_path / "demo.out"
    with printed.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "demo", "--speed", "0",  # noqa: S603
                                 "--max-epochs", "4", "--stations", "4", "--out", str(out),
                                 "--metrics-port", str(free_port()), "--prometheus-port", str(free_port())],
                                stdout=fh, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True,
                                preexec_fn=sigint_default)
    try:
        text = _wait_for(printed, "still serving", proc, 600)
        banner = FIGURE.search(text)
        assert banner is not None, text
        assert "shuffler    device reports" in text and "from 07:00" in text, text
        broker = re.search(r"^broker +(\S+)", text, re.M)
        assert broker is not None
        listed = subprocess.run([sys.executable, "-m", "stream_app.cli", "analyst", "list",  # noqa: S603
                                 "--bootstrap-servers", broker.group(1)], capture_output=True, text=True, timeout=120)
        assert listed.returncode == 0, listed.stderr
        metrics = _worker_metrics(text, proc)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130, printed.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    in_list = FIGURE.search(listed.stdout)
    summary = (out / "report" / "summary.txt").read_text()
    in_summary = FIGURE.search(summary.splitlines()[0])
    assert in_list is not None and in_summary is not None, (listed.stdout, summary[:2000])
    day = float(banner.group(1))
    assert banner.groups() == in_list.groups() == in_summary.groups()
    doc = json.loads((out / "report" / "summary.json").read_text())
    assert f"{doc['vehicle_day']['epsilon']:.4g}" == banner.group(1) and doc["vehicle_day"]["release"] == "aggregate"
    assert 0 < day <= 1.0  # the demo's default day budget, planned together
    n = int(banner.group(2).replace(",", ""))
    shown = "\n".join(line for line in metrics.splitlines() if line.startswith("ptt_vehicle_day"))
    assert f"{metric(metrics, 'ptt_vehicle_day_epsilon', release='aggregate'):.3g}" == f"{day:.3g}", shown
    assert metric(metrics, "ptt_vehicle_day_shuffle_size", release="aggregate") == n
    assert metric(metrics, "ptt_vehicle_day_epsilon_state", state="ready") == 1
    assert {q: metric(metrics, "ptt_vehicle_day_query_version", query=q) for q in ("alp-day", "unary-hour")} == {
        "alp-day": 1, "unary-hour": 1}
    planned = subprocess.run([sys.executable, "-m", "stream_app.cli", "plan", "fleet", "--population", str(n),  # noqa: S603
                              "--expected-yes", "100", "--stations", "4", "--query-mechanisms", "unary@3600//40,alp",
                              "--day-budget", "1", "--json"], capture_output=True, text=True, timeout=600)
    assert planned.returncode == 0, planned.stderr
    assert f"{json.loads(planned.stdout)['epsilon_day_vehicle']:.3g}" == f"{day:.3g}"

"""Every panel of every Grafana dashboard shows data, against a real worker and a real Prometheus.

A real ``ptt worker`` consumes a short replay (real broker) that also produces every event the
overview counts: malformed records (dead letters), a record for a closed epoch (late), and a
phase in which the devices refuse two of the three queries (refused vehicles, suppressed
estimates). A real Prometheus (the system binary) scrapes the worker every second. Then each
dashboard's template variables are resolved the way Grafana does (``label_values`` through the
label-values API) and every PromQL expression of every panel is evaluated through
``/api/v1/query``; an empty result fails the test with the dashboard, panel and expression.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from producers.replay import load_day
from producers.replay import replay as run_replay
from producers.settings import ReplaySettings
from producers.sink import ReportSink
from schemas import EndOfEpoch, EndOfEpochSet, encode_batch, encode_json, new_batch_id
from schemas.kafka_io import read_queries
from stream_app.cli.demo import prometheus_config
from stream_app.cli.local_broker import free_port, terminate
from stream_app.settings import WorkerSettings
from tests.paths import ROOT

from .stream_helpers import WorkerProcess, metric, pipeline_settings, wait_for

pytestmark = pytest.mark.integration

DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
# Grafana's global variables, as Grafana would expand them for a 30-minute view
GRAFANA_MACROS = {"__rate_interval": "1m", "__interval": "15s", "__range": "30m"}
NORMAL_EPOCHS = 12
REFUSING_EPOCHS = 3
# epsilon per epoch of the demo queries: sp 1.91, alp 1.25, rr 3.04 -> sp and rr are refused
REFUSING_LIMIT = 1.5


class Prometheus:
    """The system's ``prometheus`` in a subprocess on a free loopback port, data in ``tmp``."""

    def __init__(self, tmp: Path, targets: list[str], binary: str) -> None:
        self.tmp = tmp
        self.binary = binary
        self.targets = targets
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> Prometheus:
        cfg = self.tmp / "prometheus.yml"
        cfg.write_text(prometheus_config(self.targets, scrape_interval_s=1))
        log = self.tmp / "prometheus.log"
        with log.open("wb") as fh:
            self.proc = subprocess.Popen([self.binary, f"--config.file={cfg}",
                                          f"--storage.tsdb.path={self.tmp / 'tsdb'}",
                                          f"--web.listen-address=127.0.0.1:{self.port}"],
                                         stdout=fh, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited ({self.proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2):  # noqa: S310 - loopback
                    return self
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"prometheus not ready:\n{log.read_text()[-3000:]}")

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:  # 400 on a bad expression: keep Prometheus' reason
            body = json.loads(exc.read())
        if body.get("status") != "success":
            raise ValueError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] in ("vector", "scalar"), data["resultType"]
        return list(data["result"]) if data["resultType"] == "vector" else [{"metric": {}, "value": data["result"]}]

    def stop(self) -> None:
        terminate(self.proc)


def _settings(broker: str, tmp: Path) -> tuple[ReplaySettings, WorkerSettings]:
    # the default queries (ALP, unary: the station dashboard's panels) and Sampling Privacy and RR opted in
    return pipeline_settings(broker, tmp, synthetic_stations=6, max_epochs=NORMAL_EPOCHS,
                             query_mechanisms="sp,alp,rr,unary")


def _send_bad_records(rs: ReplaySettings) -> int:
    """Malformed records for the dead-letter topic: random bytes and an invalid JSON report."""
    sink = ReportSink(rs, rs.reports_topic)
    rng = np.random.default_rng(5)
    values = [rng.bytes(40) for _ in range(3)] + [b'{"kind": "report", "query_id": "sp-day"}'] * 2
    for value in values:
        key = new_batch_id().encode()
        sink.send(value, key=key, partition=sink.partition_for(key))
    sink.close()
    return len(values)


def _send_late_record(rs: ReplaySettings) -> str:
    """One Sampling Privacy batch for the first epoch, long closed."""
    day = load_day(rs)
    q = next(q for q in read_queries(rs) if q.mechanism == "sp")
    sink = ReportSink(rs, rs.reports_topic)
    batch_id = new_batch_id()
    late = encode_batch({"kind": "reports", "query_id": q.query_id, "query_version": q.version,
                         "epoch": int(day.epochs[0]), "round": 1, "producer_id": "straggler", "layout": "values",
                         "n_stations": q.n_stations, "n_outputs": q.n_stations + 1, "batch_id": batch_id,
                         "reports": 5}, {"value": np.full(5, 1)})
    sink.send(late, key=batch_id.encode(), partition=sink.partition_for(batch_id.encode()))
    sink.close()
    return q.query_id


def _send_shuffled_epoch(rs: ReplaySettings, epoch_index: int) -> str:
    """One RR epoch as a shuffler's aggregate release (a producer of its own, an exact tally and
    markers that attest the shuffle size): the direct replay attests none, and the shuffled-epsilon
    panel would stay empty. Counts drawn from the mechanism's outputs for vehicles at no station.
    (RR, not Sampling Privacy: SP has no shuffled bound, so its epsilon_shuffled is null.)"""
    day = load_day(rs)
    q = next(q for q in read_queries(rs) if q.mechanism == "rr")
    epoch = int(day.epochs[epoch_index])
    n = min(60, q.population)
    mech = q.build()
    rng = np.random.default_rng(7)
    sink = ReportSink(rs, rs.reports_topic)
    sent: dict[int, int] = {}
    for r in range(q.n_rounds):
        batch_id = new_batch_id()
        no_row = mech.output_table(r)[0]
        counts = rng.multinomial(n, no_row / no_row.sum(), size=q.n_stations).astype(np.int64).ravel()
        sink.send(encode_batch({"kind": "tally", "query_id": q.query_id, "query_version": q.version, "epoch": epoch,
                                "round": r, "producer_id": "shuf-test-0", "layout": "counts",
                                "n_stations": q.n_stations, "n_outputs": q.n_outputs, "batch_id": batch_id,
                                "reports": n}, {"counts": counts}),
                  key=batch_id.encode(), partition=(part := sink.partition_for(batch_id.encode())))
        sent[r] = part
    for part in range(rs.partitions):
        markers = tuple(EndOfEpoch(
            producer_id="shuf-test-0", producer_index=0, producer_count=1, query_id=q.query_id,
            query_version=q.version, epoch=epoch, round=r, partition=part,
            reports_to_partition=n if sent[r] == part else 0, batches_to_partition=int(sent[r] == part),
            reports_total=n, batches_total=1, participants=n, refused=0, mode="tally", shuffle_size=n,
            release="aggregate")
            for r in range(q.n_rounds))
        sink.send(encode_json(EndOfEpochSet(markers=markers)), key=b"eoe-shuf-test-0", partition=part)
    sink.close()
    return q.query_id


# -- Grafana's side: variables and substitution ------------------------------------------------

def _regex_escape(value: str) -> str:
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", value)


def _substitute(text: str, values: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"${name} has no value")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, text)


def _resolve_variables(prom: Prometheus, board: dict[str, Any]) -> dict[str, str]:
    """Each variable's value as Grafana would interpolate it into a query: the first value of a
    single-value variable, ``(a|b|c)`` for a multi-value one with everything selected."""
    values = dict(GRAFANA_MACROS)
    for var in board["templating"]["list"]:
        m = re.fullmatch(r"label_values\((?:(.+?)\s*,\s*)?(\w+)\)", var["query"])
        assert m, f"{board['title']}: variable {var['name']}: unsupported query {var['query']}"
        selector, label = m.group(1), m.group(2)
        params = {"match[]": _substitute(selector, values)} if selector else {}
        options = prom.api(f"label/{label}/values", **params)
        assert options, f"{board['title']}: variable ${var['name']} ({var['query']}) has no values"
        if var.get("sort") in (3, 4):
            options.sort(key=float, reverse=var["sort"] == 4)
        if var.get("multi") or var.get("includeAll"):
            values[var["name"]] = "(" + "|".join(_regex_escape(o) for o in options) + ")"
        else:
            values[var["name"]] = options[0]
    return values


def _problem(prom: Prometheus, expr: str, legend: str) -> str | None:
    """Why this expression would show nothing in its panel (None when it shows data)."""
    try:
        result = prom.query(expr)
    except ValueError as exc:
        return f"invalid: {exc}"
    if not result:
        return "no data"
    for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend):
        if any(label not in series["metric"] for series in result):
            return f"legend label {label!r} missing from {[s['metric'] for s in result]}"
    return None


def test_every_panel_of_every_dashboard_has_data(broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 prometheus_bin: str) -> None:
    boards = [json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))]
    assert len(boards) == 2
    monkeypatch.chdir(tmp_path)  # the worker inherits it: Faust's data dir (<app id>-data) lands in tmp
    rs, ws = _settings(broker, tmp_path)
    worker = WorkerProcess(ws, tmp_path / "worker.log")
    prom = Prometheus(tmp_path, [f"127.0.0.1:{ws.web_port}"], prometheus_bin)
    try:
        worker.start()
        worker.wait_ready()
        prom.start()
        run_replay(rs, progress=False)
        bad = _send_bad_records(rs)
        refusing = rs.model_copy(update={"start_epoch": NORMAL_EPOCHS, "max_epochs": REFUSING_EPOCHS,
                                         "device_epsilon_limit": REFUSING_LIMIT})
        summary = run_replay(refusing, progress=False)
        assert set(summary.refused) == {"sp-day", "rr-day", "unary-day"}, summary.refused
        closed = 4 * (NORMAL_EPOCHS + REFUSING_EPOCHS)
        wait_for(lambda: metric(worker.metrics(), "ptt_epochs_closed_total") >= closed, 60, "every epoch closed")
        late_query = _send_late_record(rs)
        wait_for(lambda: metric(worker.metrics(), "ptt_late_records_total", query=late_query) >= 1, 30, "late")
        shuffled_query = _send_shuffled_epoch(rs, NORMAL_EPOCHS + REFUSING_EPOCHS)
        wait_for(lambda: "ptt_query_epsilon_shuffled{" in worker.metrics(), 60, "a shuffled epoch's epsilon")
        # computed off the worker's event loop, a few seconds at this crowd (local: every other epoch went direct)
        wait_for(lambda: 'ptt_vehicle_day_epsilon{release="local"}' in worker.metrics(), 300, "a vehicle's day")
        text = worker.metrics()
        # the events the overview counts really happened (not just zero-valued series)
        assert metric(text, "ptt_dead_letters_total") == bad
        assert metric(text, "ptt_refused_vehicles_total", query="sp-day") > 0
        assert metric(text, "ptt_refused_vehicles_total", query="rr-day") > 0
        assert metric(text, "ptt_refused_vehicles_total", query="alp-day") == 0
        assert metric(text, "ptt_suppressed_estimates_total", query="sp-day") > 0
        assert metric(text, "ptt_query_epsilon_shuffled", query=shuffled_query) > 0
        assert metric(text, "ptt_epsilon_shuffled_null_epochs_total", query=shuffled_query) > 0  # the direct epochs

        wait_for(lambda: bool(prom.query("ptt_late_records_total")), 30, "Prometheus to scrape it all")
        pending: dict[tuple[str, str, str], tuple[str, str]] = {}
        for board in boards:
            values = _resolve_variables(prom, board)
            panels = [q for p in board["panels"] for q in (p, *p.get("panels", []))]  # rows hold panels
            for panel in panels:
                for t in panel.get("targets") or []:
                    expr = _substitute(t["expr"], values)
                    title = _substitute(panel["title"], values)
                    pending[(board["title"], title, expr)] = (expr, t.get("legendFormat", ""))
        # rates need two scrapes of a series (1 s apart): retry what is still empty for a while
        problems: dict[tuple[str, str, str], str] = {}
        deadline = time.time() + 30
        while pending:
            problems = {}
            for key, (expr, legend) in pending.items():
                why = _problem(prom, expr, legend)
                if why is not None:
                    problems[key] = why
            pending = {k: v for k, v in pending.items() if k in problems}
            if not pending or time.time() > deadline:
                break
            time.sleep(1.0)
        assert not problems, "panels without data:\n" + "\n".join(
            f"{b} / {p}: {why}\n    {expr}" for (b, p, expr), why in problems.items())
    finally:
        prom.stop()
        worker.stop()

"""The shuffler's HTTP front door (``ptt shuffler --http-port``) with a real broker and real
shuffler processes: bad requests refused with their reason and nothing of them written, a
busy port, a front door killed mid-request (the client retries; nothing half-written is
answered 202), a retried request counted once, and the demo over HTTP publishing the direct
demo's estimates."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from estimators import get_spec, privacy
from producers.http_client import DeviceClient
from schemas import DeviceReport, SourceEpoch, encode_json
from schemas.device_binary import encode_device
from schemas.device_http import FRAMED, NDJSON, frame
from schemas.estimates import DeadLetter
from stream_app.cli.local_broker import free_port
from stream_app.shuffler.door_policy import DeviceCheck
from stream_app.shuffler.settings import ShufflerSettings
from tests.devices import enrollment, signed, signed_note
from tests.paths import ROOT
from tests.processes import cpu_s, door_healthy, door_pid, frozen
from tests.slowloris import open_slow, tick
from tests.system_tools import require_tool

from .kafka_helpers import drain
from .stream_helpers import DIRECT_DEMO_GROUP, demo_estimates, direct_demo_estimates, same_values, wait_for
from .test_shuffler import ShufflerProcess, _drain_decoded, _hand_fed_query, _send_notes, _setup

pytestmark = pytest.mark.integration


def _door_settings(broker: str, tmp: Path, **kw: Any) -> ShufflerSettings:
    _, _, ss = _setup(broker, tmp, 1, min_crowd=1, device_partitions=2, **kw)
    return ss.model_copy(update={"http_port": free_port(), "device_partitions": 2})


def _start(ss: ShufflerSettings, log: Path) -> ShufflerProcess:
    door = ShufflerProcess(ss, log).start()
    proc = door.proc
    assert proc is not None
    wait_for(lambda: door_healthy(ss.http_port) or proc.poll() is not None, 90, "the front door to answer")
    assert proc.poll() is None, log.read_text()[-3000:]
    return door


@pytest.fixture
def door(broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
         ) -> Iterator[tuple[ShufflerSettings, ShufflerProcess]]:
    """A front door logging at debug level (every logger's every line: aiohttp's access log
    would be among them)."""
    monkeypatch.setenv("PTT_LOG_LEVEL", "debug")
    ss = _door_settings(broker, tmp_path)
    ss = ss.model_copy(update={"http_max_reports": 3, "http_max_body_bytes": 2048, "http_device_reports_per_s": 0.01,
                               "http_device_burst": 6})
    shuffler = _start(ss, tmp_path / "shuffler.log")
    try:
        yield ss, shuffler
    finally:
        if shuffler.proc is not None and shuffler.proc.poll() is None:
            shuffler.kill()


def _post(conn: http.client.HTTPConnection, body: bytes, content_type: str = FRAMED,
          path: str = "/v1/reports") -> tuple[int, dict[str, Any], http.client.HTTPResponse]:
    conn.request("POST", path, body=body, headers={"Content-Type": content_type})
    r = conn.getresponse()
    text = r.read()
    return r.status, (json.loads(text) if r.getheader("Content-Type", "").startswith("application/json") else {}), r


def test_bad_requests_are_refused_with_their_reason_and_nothing_of_them_is_written(
        door: tuple[ShufflerSettings, ShufflerProcess]) -> None:
    """Every refusal is a 4xx with its JSON reason, on one keep-alive connection -- an unsigned
    report ``401 unauthenticated``, a forged MAC or an id not enrolled ``403`` (the shuffler's
    own check, at the door); only the good requests' reports reach the device topic, byte for
    byte; a device past its rate is answered 429 with Retry-After while another device on the
    same connection is not; the log names no client and has one line per reason, not one per
    refusal."""
    ss, shuffler = door
    e, dev = 9_000_000, enrollment()
    raw0, raw1 = encode_device("q", 1, e, 0, value=1), encode_device("q", 1, e, 1, value=2)
    sp0, sp1 = dev.seal(raw0, 7), dev.seal(raw1, 7)
    line = encode_json(signed(DeviceReport(query_id="q", query_version=1, epoch=e, round=0, value=2), 8))
    bad: list[tuple[bytes, str, int, str]] = [
        (frame([sp0]), "text/plain", 415, "unsupported_media_type"),
        (b"", FRAMED, 400, "empty"),
        (frame([sp0])[:-2], FRAMED, 400, "malformed"),
        (frame([sp0, sp1, sp0, sp1]), FRAMED, 400, "too_many_reports"),
        (frame([sp0, dev.seal(encode_device("q", 1, e + 1, 1, value=2), 7)]), FRAMED, 400, "mixed_epochs"),
        (frame([sp0, dev.seal(encode_device("q", 1, e, 0, value=2), 7)]), FRAMED, 400, "mixed_devices"),
        (frame([sp0, dev.seal(raw1, 9)]), FRAMED, 400, "mixed_devices"),
        (frame([sp0, sp1[:-1]]), FRAMED, 400, "bad_report"),
        (frame([encode_json(SourceEpoch(epoch=e))]), FRAMED, 400, "bad_report"),
        (b"\x01" * 3000, FRAMED, 413, "too_large"),
        (frame([raw0, raw1]), FRAMED, 401, "unauthenticated"),
        (encode_json(DeviceReport(query_id="q", query_version=1, epoch=e, round=0, value=2)), NDJSON, 401,
         "unauthenticated"),
        (frame([sp0, sp1[:-1] + bytes([sp1[-1] ^ 1])]), FRAMED, 403, "bad_mac"),
        (frame([sp0[:-16] + bytes(16)]), FRAMED, 403, "bad_mac"),
        (frame([dev.seal(raw0, dev.devices)]), FRAMED, 403, "unknown_device"),
    ]
    conn = http.client.HTTPConnection("127.0.0.1", ss.http_port, timeout=30)
    conn.connect()
    client_port = conn.sock.getsockname()[1]
    for body, ctype, status, reason in bad:
        got, answer, _ = _post(conn, body, ctype)
        assert (got, answer.get("reason")) == (status, reason), (reason, got, answer)
        assert answer.get("detail"), answer
        if status == 413:  # the door closes a connection whose body it did not read
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", ss.http_port, timeout=30)
    got, answer, _ = _post(conn, frame([sp0, sp1]))
    assert got == 202 and answer["accepted"] == 2 and len(answer["offsets"]) == 2, answer
    got, answer, _ = _post(conn, line + b"\n", NDJSON)
    assert got == 202 and answer["accepted"] == 1, answer
    values = Counter(bytes(r.value) for r in drain(ss, ss.device_topic, quiet_polls=2))
    assert values == Counter([sp0, sp1, line])  # the good requests' reports, unchanged, once each
    # the rate is the device's: burst 6 reports at 0.01/s (a token a 100 s: none while this runs);
    # device 7 sent 2, so 4 more, then 429; device 9 on the same connection has its own
    statuses = [_post(conn, frame([sp0]))[0] for _ in range(5)]
    assert statuses == [202] * 4 + [429], statuses
    limited = _post(conn, frame([sp0]))
    assert limited[0] == 429 and limited[1]["reason"] == "rate_limited"
    assert int(limited[2].getheader("Retry-After") or "0") >= 1
    assert _post(conn, frame([dev.seal(raw1, 9)]))[0] == 202
    conn.close()
    assert shuffler.stop() == 130
    log = shuffler.log.read_text()
    assert "front door: " in log and "rate_limited" in log, log[-3000:]
    # this shuffler logs at debug level, where kafka-python adds a traceback to its own debug line when
    # a metadata refresh is cancelled by the clients' close ("Metadata refresh failed"): not ours
    lines = log.splitlines()
    ours_raised = [lines[max(0, i - 1)] for i, text in enumerate(lines) if text.startswith("Traceback")
                   and not re.search(r" DEBUG (kafka|aiokafka)\.", lines[max(0, i - 1)])]
    assert not ours_raised, log[-3000:]
    # a reason's first refusal is a line at once, the rest one line with their count (interval 10 s)
    counted: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    for n, why in re.findall(r"front door: (\d+) refused \((\w+)\)", log):
        counted[why] += int(n)
        lines[why] += 1
    assert counted == Counter(reason for _, _, _, reason in bad) + Counter(rate_limited=2), log[-3000:]
    assert max(lines.values()) <= 2, lines
    # nothing names a client, at debug level: no access log line, no request line, and the
    # client's port in no line but the Kafka clients' own (about their broker connections)
    assert "aiohttp.access" not in log and '"POST /v1/reports' not in log, log[-3000:]
    ours = [line for line in log.splitlines() if " kafka." not in line and " aiokafka" not in line]
    assert not [line for line in ours if str(client_port) in line], client_port


def test_a_busy_http_port_is_one_line_and_exit_code_4(broker: str, tmp_path: Path) -> None:
    ss = _door_settings(broker, tmp_path)
    with socket.socket() as held:
        held.bind(("127.0.0.1", ss.http_port))
        held.listen()
        proc = subprocess.run([sys.executable, "-m", "stream_app.cli", "shuffler", "--bootstrap-servers", broker,  # noqa: S603
                               "--http-port", str(ss.http_port), "--metrics-port", "0"],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "--http-port" in proc.stderr and "Traceback" not in proc.stderr
    bad = subprocess.run([sys.executable, "-m", "stream_app.cli", "shuffler", "--bootstrap-servers", "127.0.0.1:1",  # noqa: S603
                          "--http-port", "70000"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--http-port" in bad.stderr and "broker" not in bad.stderr  # before the network


def test_a_broker_that_does_not_acknowledge_is_503_and_the_retry_is_accepted(tmp_path: Path) -> None:
    """The door's own broker frozen (SIGSTOP): a request is answered 503 ``broker_unavailable``
    within ``--http-ack-timeout-s``, never 202; once the broker runs again the same request
    is accepted."""
    from stream_app.cli.local_broker import LocalBroker

    with LocalBroker(log_path=tmp_path / "broker.log") as own:
        ss = _door_settings(own.bootstrap, tmp_path).model_copy(
            update={"http_ack_timeout_s": 3.0, "broker_loss_timeout_s": 120.0})
        shuffler = _start(ss, tmp_path / "shuffler.log")
        records = _one_device("q", 9_000_000)
        conn = http.client.HTTPConnection("127.0.0.1", ss.http_port, timeout=60)
        assert own.pid is not None
        try:
            assert _post(conn, frame(records))[0] == 202
            with frozen(own.pid):  # every broker thread stopped before the request is sent
                t0 = time.monotonic()
                status, answer, r = _post(conn, frame(records))
                took = time.monotonic() - t0
            assert (status, answer["reason"]) == (503, "broker_unavailable") and r.getheader("Retry-After"), answer
            assert took < 30, took
            deadline = time.monotonic() + 60
            while (got := _post(conn, frame(records)))[0] != 202 and time.monotonic() < deadline:
                time.sleep(0.5)
            assert got[0] == 202, got
        finally:
            conn.close()
            if shuffler.proc is not None and shuffler.proc.poll() is None:
                shuffler.kill()


def _one_device(q_id: str, epoch: int) -> list[bytes]:
    """One enrolled device's two Sampling Privacy rounds of ``epoch``, sealed with its key
    (tests/devices.py: the suite's enrollment)."""
    e = enrollment()
    return [e.seal(encode_device(q_id, 1, epoch, 0, value=1), 7), e.seal(encode_device(q_id, 1, epoch, 1, value=2), 7)]


def _finished(ss: ShufflerSettings, epoch: int) -> None:
    """The replay's source note that ``epoch`` is finished (the shuffler's trusted clock)."""
    producer = KafkaProducer(**ss.client_kwargs(), acks="all")
    producer.send(ss.source_topic, key=b"source-epoch", value=signed_note(SourceEpoch(epoch=epoch)), partition=0)
    producer.flush()
    producer.close()


def _killed_mid_request(broker: str, tmp_path: Path, point: str) -> tuple[ShufflerSettings, list[bytes], int]:
    """A device's request held by the front door at ``point`` (fault injection), the shuffler
    SIGKILLed while it is held, started again without the hold: the client saw the cut
    connection (never a 202), retried, and got its 202 from the new process. Returns the
    settings, the records sent, and the epoch."""
    ss = _door_settings(broker, tmp_path)
    q = _hand_fed_query(ss, f"q-{point}", ss.device_partitions)
    epoch = q.epoch_range()[0] + 1
    _send_notes(ss, epoch, epoch - 1)  # the clock opens the epoch: reports for it are taken
    records = _one_device(q.query_id, epoch)
    held = ss.model_copy(update={"http_fault_hold_s": 300.0, "http_fault_point": point})
    log = tmp_path / "shuffler.log"
    first = _start(held, log)
    client = DeviceClient(f"http://127.0.0.1:{ss.http_port}", concurrency=1, attempts=60, timeout_s=60)
    try:
        with ThreadPoolExecutor(1) as pool:
            sent: Future[Any] = pool.submit(client.send, records)
            wait_for(lambda: "fault injection: holding" in log.read_text(), 60, "the front door to hold the request")
            first.kill()  # the client's connection is cut: no 202 from this door; it backs off and retries
            second = _start(ss, log)
            offsets = sent.result(timeout=180)
        assert len(offsets) == 2 and client.retries >= 1
    finally:
        client.close()
    _finished(ss, epoch)  # the shuffler releases it
    wait_for(lambda: any(b.header.epoch == epoch for _, b in _drain_decoded(ss)[0]), 90, "the epoch's release")
    assert second.stop() == 130
    return ss, records, epoch


def test_a_front_door_killed_before_writing_writes_nothing_and_the_retry_counts_once(
        broker: str, tmp_path: Path) -> None:
    """Killed while it holds a request it has not written: nothing of it is on the device topic
    until the client's retry, which is written once and released as one device per round."""
    ss, records, epoch = _killed_mid_request(broker, tmp_path, "before_send")
    assert Counter(bytes(r.value) for r in drain(ss, ss.device_topic, quiet_polls=2)) == Counter(records)
    tallies = [b for _, b in _drain_decoded(ss)[0] if b.header.epoch == epoch]
    assert sorted((b.header.round, b.header.reports) for b in tallies) == [(0, 1), (1, 1)]


def test_a_retried_request_the_broker_had_acknowledged_counts_once(broker: str, tmp_path: Path) -> None:
    """Killed after the broker acknowledged the request but before the 202: the reports are
    durable (on the device topic) though the client never heard so, and its retry writes them
    again -- the shuffler still releases one device per round: the retry's copies are its
    device's second reports of their slots, dead-lettered ``duplicate_report`` (per-device
    enrollment, docs/wire.md, "Device authentication")."""
    ss, records, epoch = _killed_mid_request(broker, tmp_path, "after_ack")
    assert Counter(bytes(r.value) for r in drain(ss, ss.device_topic, quiet_polls=2)) == Counter(records * 2)
    tallies = [b for _, b in _drain_decoded(ss)[0] if b.header.epoch == epoch]
    assert sorted((b.header.round, b.header.reports) for b in tallies) == [(0, 1), (1, 1)]
    letters = [DeadLetter.model_validate_json(r.value).reason for r in drain(ss, ss.dead_letter_topic, quiet_polls=1)]
    assert letters == ["duplicate_report"] * 2, letters


@pytest.mark.xdist_group(DIRECT_DEMO_GROUP)  # the direct demo run once for this test and test_shuffler's
def test_the_demo_over_http_publishes_the_direct_demos_estimates(tmp_path: Path) -> None:
    """``ptt demo --via-shuffler --transport http --speed 0 --max-epochs 6 --exit-when-done``
    (:data:`~tests.integration.stream_helpers.COMPARED_DEMO`: the default queries, ALP and unary
    RR, and the opt-in Sampling Privacy and RR): every device's reports of an epoch go through
    the front door in one request, and every row equals the direct demo's, field for field but
    ``epsilon_shuffled`` and ``release`` (null on the direct path, which attests no shuffle) --
    counts, participants and reports exactly, floats to the last bits
    (:func:`~tests.integration.stream_helpers.same_values`); nothing withheld. The direct demo
    is test_shuffler's (:func:`~tests.integration.stream_helpers.direct_demo_estimates`)."""
    plain = direct_demo_estimates(tmp_path / "direct")
    via = demo_estimates(tmp_path / "http", "--transport", "http", timeout_s=900)
    estimators = sum(len(get_spec(m).estimator_names) for m in ("sp", "alp", "rr", "unary"))
    assert len(plain) == 6 * 16 * estimators and plain.keys() == via.keys()  # 6 epochs, 16 stations
    log = (tmp_path / "http" / "out" / "shuffler.log").read_text()
    assert "front door: " in log and "reports accepted" in log, log[-2000:]
    for key, e in plain.items():
        assert e["withheld"] is None and via[key]["withheld"] is None, (e, via[key])
        bounded = privacy.rounds_independent(get_spec(e["mechanism"]).build({}, 16))
        assert (via[key]["epsilon_shuffled"] is not None) == bounded and via[key]["release"] == "aggregate"
        shuffled = ("epsilon_shuffled", "release")
        assert same_values({k: v for k, v in via[key].items() if k not in shuffled},
                     {k: v for k, v in e.items() if k not in shuffled}), (key, e, via[key])


class _SlowClients(threading.Thread):
    """``n`` connections that each send a request's first header bytes, then one more byte every
    ``every_s`` (a slowloris); ``closed``: how many the server has closed (a send or a read
    fails or sees the end)."""

    def __init__(self, port: int, n: int, every_s: float) -> None:
        super().__init__(daemon=True)
        self.port, self.n, self.every_s = port, n, every_s
        self.socks: list[socket.socket] = []
        self.open_failed = 0
        self.closed = 0
        self.stop = threading.Event()
        self.opened = threading.Event()

    def run(self) -> None:
        for _ in range(self.n):
            try:
                self.socks.append(open_slow(self.port))
            except OSError:
                self.open_failed += 1
        self.opened.set()
        live = list(self.socks)
        while live and not self.stop.wait(self.every_s):
            live, closed = tick(live)
            self.closed += closed

    def close(self) -> None:
        self.stop.set()
        self.join(30)
        for s in self.socks:
            s.close()


def _flood(port: int, bodies: list[bytes], deadline: float) -> Counter[tuple[int, str]]:
    """Post ``bodies`` on keep-alive connections (a new one where the server closed it) until
    done or ``deadline``: (status, reason) of each answer."""
    got: Counter[tuple[int, str]] = Counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for body in bodies:
        if time.monotonic() > deadline:
            break
        try:
            status, answer, r = _post(conn, body)
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            continue
        got[(status, answer.get("reason", ""))] += 1
        if r.getheader("Connection", "").lower() == "close":
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.close()
    return got


def _released_and_clean_estimates(ss: ShufflerSettings, q: Any, epoch: int, genuine: list[list[int]]
                                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The worker's estimates of ``epoch`` from what the shuffler released (every record of the
    reports topic through stage 1, a window, :func:`~stream_app.worker.estimate.epoch_results`), and
    from a clean run's release of the ``genuine`` devices' reports (each one's value per round):
    their exact tally per round with as many participants, one producer -- what the aggregate
    release of those reports alone is. Each: participants, reports per round, and every
    estimator's arrays as lists."""
    import numpy as np

    from stream_app.worker.decode import to_partials
    from stream_app.worker.estimate import QueryEstimators, epoch_results
    from stream_app.worker.records import BatchPartial, MarkerPartial, WindowId
    from stream_app.worker.windows import WindowState

    def estimates(parts: list[Any]) -> dict[str, Any]:
        w = WindowState.new(WindowId(q.query_id, q.version, epoch), q.n_rounds, q.width)
        for p in parts:
            assert w.add(p) == "added", p
        w.close("markers")
        [res] = epoch_results(QueryEstimators.build(q), [(w, "markers")], (0.95,), 1)
        assert res.withheld is None and res.values, res.withheld
        return {"participants": res.participants, "round_reports": list(res.round_reports),
                **{name: [a.tolist() for a in (e.estimate, e.sd, e.lower, e.upper)]
                   for name, e in sorted(res.values.items())}}

    lookup = {(q.query_id, q.version): q}
    staged = [p for rec in drain(ss, ss.reports_topic, quiet_polls=1)
              for p in to_partials(rec.value, rec.partition, lambda i, v: lookup.get((i, v)))]
    assert all(isinstance(p, BatchPartial | MarkerPartial) for p in staged), staged  # nothing refused
    parts = [p for p in staged if isinstance(p, BatchPartial | MarkerPartial) and p.epoch == epoch]
    n = len(genuine)
    clean: list[Any] = []
    for r in range(q.n_rounds):
        counts = np.bincount([v[r] for v in genuine], minlength=q.width).astype(np.int64)
        clean.append(BatchPartial(q.query_id, q.version, epoch, r, 0, "clean", f"clean-{r}", n, True, counts))
        clean.append(MarkerPartial(q.query_id, q.version, epoch, r, 0, "clean", 0, 1, n, 1, n, 0, False))
    return estimates(parts), estimates(clean)


def test_floods_and_slow_connections_write_nothing_and_fresh_devices_are_answered_at_once(
        broker: str, tmp_path: Path) -> None:
    """Through the door, at once: 300 requests of unsigned reports, 300 of forged MACs (another
    secret), 60 bodies of 64 KiB (one past the limit, one at it), and 3,000 slowloris
    connections against a door capped at 1,500 connections with a 3 s idle timeout -- while 40
    fresh devices each post their two reports on a new connection. Every fresh request is
    answered 202 within 5 s; the device topic holds exactly the genuine reports; the shuffler
    releases all of them (40 per round) and writes no dead letter (0 bytes, against the
    megabytes sent), and the worker's estimates of the epoch equal a clean run's (the genuine
    reports' exact tally: :func:`_released_and_clean_estimates`); every slow connection is
    closed by the door; the log has no traceback and stays small (one line per reason and
    interval)."""
    ss = _door_settings(broker, tmp_path).model_copy(update={
        "http_idle_timeout_s": 3.0, "http_body_timeout_s": 3.0, "http_max_connections": 1500,
        "lateness_epochs": 2})
    q = _hand_fed_query(ss, "q-flood", ss.device_partitions)
    epoch = q.epoch_range()[0] + 1
    _send_notes(ss, epoch, epoch - 1)
    log = tmp_path / "shuffler.log"
    shuffler = _start(ss, log)
    e = enrollment()
    from schemas.enrollment import Enrollment

    thief = Enrollment(b"not the operator's secret, 32 bytes or more", e.devices)

    def reports(d: int) -> list[bytes]:
        return [encode_device(q.query_id, 1, epoch, r, value=(d + r) % 3) for r in (0, 1)]

    genuine = {d: [e.seal(raw, d) for raw in reports(d)] for d in range(100, 140)}
    unsigned = [frame(reports(d)) for d in range(300)]
    forged = [frame([thief.seal(raw, d) for raw in reports(d)]) for d in range(300)]
    one = thief.seal(reports(1)[0], 1)
    at_limit = frame([one] * ((ss.http_max_body_bytes - 4) // (len(one) + 4)))
    at_limit += b"\x00" * (ss.http_max_body_bytes - len(at_limit))
    big = [at_limit if i % 2 else at_limit + b"\x01" for i in range(60)]
    sent_bytes = sum(map(len, unsigned + forged + big))
    slow = _SlowClients(ss.http_port, 3000, every_s=1.0)
    latencies: list[float] = []
    try:
        slow.start()
        assert slow.opened.wait(120), "the slow connections did not open"
        deadline = time.monotonic() + 60
        with ThreadPoolExecutor(3) as pool:
            floods = [pool.submit(_flood, ss.http_port, bodies, deadline) for bodies in (unsigned, forged, big)]
            for d, records in genuine.items():
                t0 = time.monotonic()
                fresh = http.client.HTTPConnection("127.0.0.1", ss.http_port, timeout=10)
                status, answer, _ = _post(fresh, frame(records))
                fresh.close()
                latencies.append(time.monotonic() - t0)
                assert status == 202, (d, status, answer)
            answers = [f.result() for f in floods]
        assert max(latencies) < 5.0, sorted(latencies)[-5:]
        assert set(answers[0]) == {(401, "unauthenticated")} and sum(answers[0].values()) == len(unsigned), answers[0]
        assert set(answers[1]) == {(403, "bad_mac")} and sum(answers[1].values()) == len(forged), answers[1]
        assert set(answers[2]) == {(413, "too_large"), (400, "malformed")}, answers[2]  # padded with a 0 length
        wait_for(lambda: slow.closed + slow.open_failed >= slow.n, 60, "the door to close every slow connection")
    finally:
        slow.close()
        if sys.exc_info()[0] is not None and shuffler.proc is not None and shuffler.proc.poll() is None:
            shuffler.kill()
    # only the genuine reports were written; the shuffler releases them all and dead-letters nothing
    written = Counter(bytes(r.value) for r in drain(ss, ss.device_topic, quiet_polls=2))
    assert written == Counter(r for records in genuine.values() for r in records), len(written)
    _finished(ss, epoch)
    wait_for(lambda: any(b.header.epoch == epoch for _, b in _drain_decoded(ss)[0]), 90, "the epoch's release")
    tallies = [b for _, b in _drain_decoded(ss)[0] if b.header.epoch == epoch]
    assert sorted((b.header.round, b.header.reports) for b in tallies) == [(0, 40), (1, 40)]
    released, clean = _released_and_clean_estimates(ss, q, epoch, [[(d + r) % 3 for r in (0, 1)] for d in genuine])
    assert released == clean, (released, clean)
    letters = drain(ss, ss.dead_letter_topic, quiet_polls=1)
    assert sum(len(r.value) for r in letters) == 0 < sent_bytes
    assert shuffler.stop() == 130
    text = log.read_text()
    assert "Traceback" not in text and len(text.encode()) < 1_000_000, text[-3000:]
    assert "(unauthenticated)" in text and "(bad_mac)" in text and "(evicted_idle_connection)" in text, text[-3000:]
    print(f"fresh devices' latency: max {max(latencies):.3f} s, median {sorted(latencies)[20]:.3f} s; "
          f"flood answers {answers}; slow closed {slow.closed} (open failed {slow.open_failed}); "
          f"log {len(text.encode())} bytes; sent {sent_bytes} bytes")


NGINX_CONF = ROOT / "deploy" / "nginx" / "nginx.conf"


@contextmanager
def _nginx(door_port: int, tmp: Path) -> Iterator[tuple[int, Path]]:
    """deploy/nginx/nginx.conf run by a real nginx in front of a door on ``door_port``: only its
    listening address and its upstream are replaced (by loopback ports). Yields (its port, its
    error log)."""
    nginx = require_tool("nginx")
    text = NGINX_CONF.read_text()
    assert text.count("listen 8080 ") == 1 and text.count("server shuffler:8080;") == 1
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(text.replace("listen 8080 ", f"listen 127.0.0.1:{port} ")
                    .replace("server shuffler:8080;", f"server 127.0.0.1:{door_port};"))
    errors = tmp / "nginx.stderr"
    with errors.open("wb") as fh:
        proc = subprocess.Popen([nginx, "-c", str(conf), "-p", str(tmp), "-g",  # noqa: S603
                                 f"daemon off; pid {tmp / 'nginx.pid'};"], stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: door_healthy(port) or proc.poll() is not None, 30, "nginx to answer")
        assert proc.poll() is None, errors.read_text()
        yield port, errors
    finally:
        proc.terminate()
        proc.wait(30)


def test_nginx_in_front_passes_the_doors_answers_and_times_out_slow_clients_itself(
        broker: str, tmp_path: Path) -> None:
    """The shipped nginx configuration as a real process in front of a door: a genuine
    request is 202 through it, an unsigned one the door's 401, a body past 64 KiB nginx's own
    413 in the door's JSON form; 2,000 slowloris connections are closed by nginx within its 5 s
    header timeout (the door never sees them) while 20 fresh devices are answered 202 within
    5 s; only the genuine reports reach the device topic; nginx's log names no client."""
    ss = _door_settings(broker, tmp_path)
    shuffler = _start(ss, tmp_path / "shuffler.log")
    e = enrollment()
    q_epoch = 9_000_000
    genuine = [[e.seal(encode_device("q", 1, q_epoch, r, value=r), d) for r in (0, 1)] for d in range(300, 320)]
    try:
        with _nginx(ss.http_port, tmp_path) as (port, errors):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            status, answer, _ = _post(conn, frame([encode_device("q", 1, q_epoch, 0, value=1)]))
            assert (status, answer.get("reason")) == (401, "unauthenticated"), answer
            status, answer, _ = _post(conn, b"\x01" * (65 * 1024))
            assert (status, answer.get("reason")) == (413, "too_large"), answer
            conn.close()
            slow = _SlowClients(port, 2000, every_s=1.0)
            latencies = []
            try:
                slow.start()
                assert slow.opened.wait(60), "the slow connections did not open"
                t_open = time.monotonic()
                for records in genuine:
                    t0 = time.monotonic()
                    fresh = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    status, answer, _ = _post(fresh, frame(records))
                    fresh.close()
                    latencies.append(time.monotonic() - t0)
                    assert status == 202, answer
                wait_for(lambda: slow.closed + slow.open_failed >= slow.n, 60, "nginx to close the slow connections")
                closed_after = time.monotonic() - t_open
            finally:
                slow.close()
            assert max(latencies) < 5.0 and closed_after < 30, (sorted(latencies)[-3:], closed_after)
            log = errors.read_text()
            assert "client:" not in log and "127.0.0.1" not in log and len(log) < 10_000, log[-2000:]
        written = Counter(bytes(r.value) for r in drain(ss, ss.device_topic, quiet_polls=2))
        assert written == Counter(r for records in genuine for r in records)
    finally:
        if shuffler.proc is not None and shuffler.proc.poll() is None:
            shuffler.kill()
    print(f"through nginx: fresh max {max(latencies):.3f} s; 2,000 slow closed {closed_after:.1f} s after opening")


def test_a_file_descriptor_limit_lowered_under_the_door_lowers_its_connection_cap(
        broker: str, tmp_path: Path) -> None:
    """The door's file-descriptor limit lowered under it (``prlimit`` on its process) to 200
    more than it has open, then 500 slowloris connections: the door's cap follows the limit (less its reserve of
    512: 16 connections here), closing the longest-open idle ones, so the process never runs
    out of descriptors -- at filing, accept() failed with EMFILE and the log took 139,530
    tracebacks in 40 s; here the shuffler keeps running, the log has no traceback and no
    "Too many open files", its CPU stays well under a core, and a fresh device is answered 202."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        pytest.skip("prlimit (util-linux) is not installed")
    ss = _door_settings(broker, tmp_path).model_copy(update={"http_idle_timeout_s": 4.0})
    log = tmp_path / "shuffler.log"
    shuffler = _start(ss, log)
    assert shuffler.proc is not None
    pid = door_pid(shuffler.proc.pid)
    try:
        limit = len(os.listdir(f"/proc/{pid}/fd")) + 200
        subprocess.run([prlimit, f"--pid={pid}", f"--nofile={limit}:{limit}"], check=True, timeout=30)  # noqa: S603
        slow = _SlowClients(ss.http_port, 500, every_s=1.0)
        cpu0, t0 = cpu_s(pid), time.monotonic()
        try:
            slow.start()
            assert slow.opened.wait(60), "the slow connections did not open"
            wait_for(lambda: slow.closed + slow.open_failed >= slow.n, 90, "the door to close the slow connections")
        finally:
            slow.close()
        busy = (cpu_s(pid) - cpu0) / (time.monotonic() - t0)
        e = enrollment()
        records = [e.seal(encode_device("q", 1, 9_000_000, r, value=r), 11) for r in (0, 1)]
        fresh = http.client.HTTPConnection("127.0.0.1", ss.http_port, timeout=30)
        assert _post(fresh, frame(records))[0] == 202
        fresh.close()
        assert shuffler.proc.poll() is None
        assert shuffler.stop() == 130
    finally:
        if shuffler.proc.poll() is None:
            shuffler.kill()
    text = log.read_text()
    assert "Traceback" not in text and "Too many open files" not in text and "unexpected failure" not in text, \
        text[-3000:]
    assert "(evicted_idle_connection)" in text and len(text.encode()) < 50_000, text[-3000:]
    assert busy < 0.5, f"the door used {busy:.2f} of a core"
    print(f"fd limit {limit}: door CPU {busy:.2f} of a core; {text.count('refused (')} log lines")


def test_a_front_door_process_that_dies_stops_the_shuffler_with_exit_code_8(broker: str, tmp_path: Path) -> None:
    """The door runs in a process of its own (stream_app/shuffler/door_process.py): killed
    (SIGKILL) under a running shuffler, the shuffler stops within seconds with one line naming
    the door and exit code 8 -- devices could no longer upload, so running on silently would
    hide it -- and no traceback. Before the door had its own process there was nothing to die
    alone; the check is that its death is not silent."""
    import signal

    ss = _door_settings(broker, tmp_path)
    log = tmp_path / "shuffler.log"
    shuffler = _start(ss, log)
    proc = shuffler.proc
    assert proc is not None
    try:
        os.kill(door_pid(proc.pid), signal.SIGKILL)
        wait_for(lambda: proc.poll() is not None, 60, "the shuffler to stop after its door died")
    finally:
        if proc.poll() is None:
            shuffler.kill()
    text = log.read_text()
    assert proc.returncode == 8, (proc.returncode, text[-2000:])
    assert "front door's process" in text and "exited with code -9" in text and "Traceback" not in text, text[-2000:]


def _refused_from_its_next_request(ss: ShufflerSettings, device_check: DeviceCheck | None,
                                   revoke: Callable[[int], None]) -> dict[str, int]:
    """Device 5 posts, is revoked (``revoke``), posts again, device 6 posts: 202, 403 ``revoked``,
    202; only the accepted reports are written. The door's refusals by reason."""
    from stream_app.shuffler.front_door import FrontDoor

    door = FrontDoor(ss, device_check=device_check)
    door.start()
    e = enrollment()

    def records(d: int, epoch: int) -> list[bytes]:
        return [e.seal(encode_device("q", 1, epoch, r, value=r), d) for r in (0, 1)]

    try:
        conn = http.client.HTTPConnection("127.0.0.1", ss.http_port, timeout=30)
        assert _post(conn, frame(records(5, 9_000_000)))[0] == 202
        revoke(5)
        status, answer, _ = _post(conn, frame(records(5, 9_000_001)))
        assert (status, answer["reason"]) == (403, "revoked"), answer
        assert _post(conn, frame(records(6, 9_000_001)))[0] == 202
        conn.close()
    finally:
        door.stop()
    written = Counter(bytes(r.value) for r in drain(ss, ss.device_topic, quiet_polls=2))
    assert written == Counter(records(5, 9_000_000) + records(6, 9_000_001))
    return dict(door.refused)


def test_the_doors_device_check_refuses_a_device_from_its_next_request(broker: str, tmp_path: Path) -> None:
    """``FrontDoor(settings, device_check=...)``: the one check of a verified device id (the
    hook a revocation list plugs into). A device the check refuses is answered 403 with the
    check's reason from its next request on, nothing of it written; the others pass."""
    revoked: set[int] = set()
    refused = _refused_from_its_next_request(_door_settings(broker, tmp_path),
                                             lambda device: "revoked" if device in revoked else None, revoked.add)
    assert refused == {"revoked": 1}


def test_a_device_revoked_in_the_list_mid_run_is_refused_at_the_door_from_its_next_request(
        broker: str, tmp_path: Path) -> None:
    """``--revoked-devices-file`` at the door: the list is re-read when its file changes, and a
    revoked device's next request is answered 403 ``revoked`` with nothing of it written; the
    others pass (fails without the door's refresh of the list)."""
    listed = tmp_path / "revoked"
    listed.write_text("# none yet\n")
    ss = _door_settings(broker, tmp_path).model_copy(update={"revoked_devices_file": listed})

    def revoke(device: int) -> None:
        listed.write_text(f"# stolen\n{device}\n")

    assert _refused_from_its_next_request(ss, None, revoke) == {"revoked": 1}

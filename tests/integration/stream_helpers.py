"""Real Faust worker processes for integration tests."""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from kafka import KafkaConsumer

import estimators as E
from producers.fleet import epoch_rng, query_truth_counts, split_fleet
from producers.pems import TrafficDay
from producers.replay import ReplaySummary, replay
from producers.settings import ReplaySettings
from schemas import Query
from schemas.estimates import Estimate
from schemas.kafka_io import assign_all, at_end
from schemas.settings import KafkaSettings
from stream_app.cli.helper_process import wait_until
from stream_app.cli.local_broker import free_port, terminate
from stream_app.settings import WorkerSettings
from tests.station_counts import pair_counts

from .kafka_helpers import drain


def env_for(settings: KafkaSettings) -> dict[str, str]:
    """The process environment plus the PTT_* variables that reproduce ``settings``."""
    return {**os.environ, **settings.to_env()}


_LIVE: list[WorkerProcess] = []  # started and not yet stopped: what a timed-out wait describes
EXITED_EARLY: list[WorkerProcess] = []  # found exited when stopped (tests/benchmarks/common.py reports them)
OWN_CODE = ("/stream_app/", "/schemas/", "/producers/")
DIAGNOSIS_METRICS = ("ptt_records_total", "ptt_reports_total", "ptt_dead_letters_total", "ptt_epochs_closed_total",
                     "ptt_late_records_total", "ptt_duplicate_records_total", "ptt_newest_seen_epoch",
                     "ptt_withheld_epochs_total", "faust_messages_received_total", "faust_events_total",
                     "faust_topic_messages_received_total")


class WorkerProcess:
    """``ptt worker`` in a subprocess, with its log in a file (stderr in ``err`` if given)."""

    def __init__(self, settings: WorkerSettings, log: Path, err: Path | None = None) -> None:
        self.settings = settings
        self.log = log
        self.err = err
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        # the child keeps its own copies of the descriptors
        with self.log.open("ab") as fh, (self.err or self.log).open("ab") as eh:
            self.proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "worker"],  # noqa: S603
                                         env=env_for(self.settings), stdout=fh,
                                         stderr=subprocess.STDOUT if self.err is None else eh, cwd=self.log.parent)
        _LIVE.append(self)
        return self

    def diagnosis(self, lines: int = 120) -> str:
        """What the running worker is doing: the log's last lines, and where each of its
        tasks and threads waits in this project's code (``/debug/tasks``). For a wait that
        timed out, so that a failure in CI says where the worker was stuck."""
        if self.proc is None or self.proc.poll() is not None:
            return f"\n-- {self.log.name}: not running"
        log_tail = (self.err or self.log).read_text(errors="replace").splitlines()[-15:]
        try:
            tasks = own_frames(self.tasks().splitlines())
        except OSError as exc:
            tasks = [f"/debug/tasks did not answer: {exc}"]
        try:
            counters = [ln for ln in self.metrics().splitlines() if ln.startswith(DIAGNOSIS_METRICS)]
        except OSError as exc:
            counters = [f"/metrics did not answer: {exc}"]
        return (f"\n-- {self.log.name}: last log lines\n" + "\n".join(log_tail)
                + f"\n-- {self.log.name}: counters\n" + "\n".join(counters[:60])
                + f"\n-- {self.log.name}: tasks and threads in this project's code\n" + "\n".join(tasks[:lines]))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.web_port}/metrics"

    def tasks(self) -> str:
        """The /debug/tasks page: the consumer's state per partition, then every task and thread."""
        with urllib.request.urlopen(self.url.replace("/metrics", "/debug/tasks"), timeout=10) as r:  # noqa: S310
            return str(r.read().decode())

    def metrics(self, *names: str) -> str:
        """The /metrics page; with ``names``, only those series (``/metrics?name[]=...``)."""
        query = "?" + urllib.parse.urlencode([("name[]", n) for n in names]) if names else ""
        with urllib.request.urlopen(self.url + query, timeout=5) as r:  # noqa: S310 - loopback
            return str(r.read().decode())

    def ready_status(self) -> int | None:
        """The HTTP status of /ready (None while the worker does not answer)."""
        url = f"http://127.0.0.1:{self.settings.web_port}/ready"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return None

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Until the worker serves /metrics. The deadline only bounds a hung start: under two busy
        loops and 3 pytest-xdist workers (load average ~12 on 2 cores) a worker had written no
        line at all 60 s after its start (importing Faust, numpy, scipy)."""
        def exited() -> None:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker exited ({self.proc.returncode}); log:\n{self.log.read_text()[-3000:]}")

        def serving() -> bool:
            try:
                self.metrics()
            except OSError:
                return False
            return True

        if not wait_until(serving, timeout_s, poll_s=0.3, check=exited):
            raise TimeoutError(f"worker not serving /metrics; log:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self in _LIVE:
            _LIVE.remove(self)
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self in _LIVE:
            _LIVE.remove(self)
            if self.proc is not None and self.proc.poll() is not None:
                EXITED_EARLY.append(self)  # it had exited before it was stopped (a benchmark says so)
        terminate(self.proc)


def own_frames(dump: list[str]) -> list[str]:
    """From ``/debug/tasks``: the consumer's state, then each task or thread that waits in
    this project's code, with its chain from the first step in this project's code inwards."""
    out: list[str] = []
    head: str | None = None
    section = ""
    for line in dump:
        text = line.strip()
        if text.startswith(("CONSUMER", "THREAD ", "TASK ", "COROUTINE ")):
            section = text.split(" ", 1)[0]
            head, mine = text, False
            if section == "CONSUMER":
                out.append(text)
                head = None
        elif section == "CONSUMER":
            out.append("  " + text)
        elif mine or any(c in text for c in OWN_CODE):  # from this project's code inwards
            if head is not None:
                out.append(head)
                head = None
            mine = True
            out.append("  " + text)
    return out


def pipeline_settings(broker: str, tmp: Path, **replay_kw: object) -> tuple[ReplaySettings, WorkerSettings]:
    """Replay and worker settings sharing fresh topics (3 partitions) and a fresh app id; the
    fleet's seed is 11, or ``PTT_TEST_SEED``."""
    u = uuid.uuid4().hex[:8]
    kafka = KafkaSettings(bootstrap_servers=broker, reports_topic=f"reports-{u}", queries_topic=f"queries-{u}",
                          truth_topic=f"truth-{u}", partitions=3)
    # Sampling Privacy opted in beside ALP and RR (the mix these tests were written for)
    replay_kw = {"synthetic_stations": 6, "query_mechanisms": "sp,alp,rr", **replay_kw}
    seed = int(os.environ.get("PTT_TEST_SEED", "11"))  # vary it to loop a test over seeds
    rs = ReplaySettings(**kafka.model_dump(), data_dir=tmp / "data", seed=seed, batch_size=200,
                        **replay_kw)  # type: ignore[arg-type]
    ws = WorkerSettings(**kafka.model_dump(), app_id=f"ptt-{u}", estimates_topic=f"estimates-{u}",
                        dead_letter_topic=f"dead-{u}", internal_partitions=3, web_port=free_port(),
                        tick_interval_s=1.0, min_participants=1, horizon_epochs=120)
    return rs, ws


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def read_estimates(settings: WorkerSettings, span_s: int = 30) -> dict[tuple[str, int, int, int, str], Estimate]:
    """The latest estimate per (query, version, epoch, station, estimator) of one span: the
    epochs' (30 s), or the 5-minute or hourly rollups' (300, 3600)."""
    out: dict[tuple[str, int, int, int, str], Estimate] = {}
    for rec in drain(settings, settings.estimates_topic, quiet_polls=2):
        e = Estimate.model_validate_json(rec.value)
        if e.span_s == span_s:
            out[(e.query_id, e.query_version, e.epoch, e.station, e.estimator)] = e
    return out


class EstimateCount:
    """How many estimates of one span :func:`read_estimates` would return (one per key), read
    as they come: one consumer kept across calls, each record decoded once. For the waits: a
    wait of ``len(read_estimates(...)) >= n`` read and validated the whole topic again on every
    poll (the 17,280 rows of test_interval_coverage_over_a_replayed_day: 17 reads, most of the
    test process's own CPU). What a test asserts on is still read by :func:`read_estimates`."""

    def __init__(self, settings: WorkerSettings, span_s: int = 30) -> None:
        self.settings, self.span_s = settings, span_s
        self.keys: set[tuple[str, int, int, int, str]] = set()
        self.consumer: KafkaConsumer | None = None

    def __call__(self) -> int:
        if self.consumer is None:
            consumer = KafkaConsumer(**self.settings.client_kwargs(), group_id=None, enable_auto_commit=False,
                                     max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024)
            if not assign_all(consumer, self.settings.estimates_topic):  # not created yet: again next call
                consumer.close()
                return 0
            self.consumer = consumer
        while True:
            got = self.consumer.poll(timeout_ms=300, max_records=50_000)
            for records in got.values():
                for rec in records:
                    e = Estimate.model_validate_json(rec.value)
                    if e.span_s == self.span_s:
                        self.keys.add((e.query_id, e.query_version, e.epoch, e.station, e.estimator))
            if not got or at_end(self.consumer):
                return len(self.keys)

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None


def wait_for_estimates(settings: WorkerSettings, n: int, timeout_s: float, what: str = "", *, span_s: int = 30,
                       also: Callable[[], bool] | None = None) -> None:
    """:func:`wait_for` ``len(read_estimates(settings, span_s)) >= n`` (and ``also()``, if given),
    counted by an :class:`EstimateCount`."""
    count = EstimateCount(settings, span_s)
    try:
        wait_for(lambda: count() >= n and (also is None or also()), timeout_s, what or f"{n} estimates")
    finally:
        count.close()


class ReplayThread(threading.Thread):
    """``replay(rs)`` in a thread of the test's process (a paced replay the test acts on while
    it runs): its summary, or its error, kept for the test (:meth:`result`)."""

    def __init__(self, settings: ReplaySettings) -> None:
        super().__init__(daemon=True)
        self.settings = settings
        self.summary: ReplaySummary | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.summary = replay(self.settings, progress=False)
        except BaseException as exc:  # noqa: BLE001 - raised by result()
            self.error = exc

    def result(self, timeout_s: float) -> ReplaySummary:
        """The summary once the replay has ended (its error raised; TimeoutError if it runs on)."""
        self.join(timeout=timeout_s)
        if self.is_alive():
            raise TimeoutError(f"the replay did not finish within {timeout_s}s")
        if self.error is not None:
            raise self.error
        assert self.summary is not None
        return self.summary


def start_replay_thread(settings: ReplaySettings) -> ReplayThread:
    """A started :class:`ReplayThread` of ``settings``."""
    runner = ReplayThread(settings)
    runner.start()
    return runner


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Until ``predicate`` holds, or :class:`TimeoutError` after ``timeout_s``. A page of a busy
    worker that does not answer within its own timeout (``WorkerProcess.metrics``: 5 s; under
    load a worker's event loop can run one batch for 5-9 s) is "not yet", not a failure: the
    deadline decides."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if predicate():
                return
        except TimeoutError:  # socket.timeout: the page did not answer in time
            pass
        time.sleep(0.5)
    raise TimeoutError(f"timed out waiting for {what}" + "".join(w.diagnosis() for w in list(_LIVE)))


def core_estimates(q: Query, settings: ReplaySettings, day: TrafficDay, epoch_index: int, fleet: int,
                   confidences: tuple[float, ...]) -> dict[str, Any]:
    """The statistics core applied directly to the same seeded reports (one producer)."""
    epoch = int(day.epochs[epoch_index])
    tc = query_truth_counts(split_fleet(settings.seed, epoch, day.flows[epoch_index], fleet, 1)[0], day.stations, q)
    rng = epoch_rng(settings.seed, q, epoch, 0)
    mech = q.build()
    n = int(tc.sum())
    if settings.mode == "tally":
        if q.mechanism == "sp":
            counts = E.station_counts(mech, mech.tally(rng, tc))
        else:
            counts = E.PerStation(mech, q.n_stations).tally(rng, tc[1:], n)[:, None, :]
    else:
        truths = np.repeat(np.arange(tc.size), tc)
        rng.shuffle(truths)
        if q.mechanism == "sp":
            reports = mech.sample(rng, truths)
            counts = E.station_counts(mech, np.stack([np.bincount(reports[r], minlength=q.n_stations + 1)
                                                      for r in range(2)]))
        else:
            ps = E.PerStation(mech, q.n_stations)
            counts = pair_counts(q.spec, mech, q.n_stations, [ps.sample_sparse(rng, truths)], n)
    if q.mechanism == "sp":
        ests = {"sp_difference": E.sp_difference(mech)}
    elif q.mechanism == "alp":
        ests = E.alp_estimators(mech)
    elif q.mechanism == "unary":
        ests = {"unary": E.rr_estimator(mech, name="unary")}
    else:
        ests = {"rr": E.rr_estimator(mech)}
    out: dict[str, Any] = {}
    for name, est in ests.items():
        values = est.estimate(counts, n)
        out[name] = (values, {c: est.score_interval(values, n, c) for c in confidences}, n)
    return out


# -- hand-made producers (adversarial tests) --------------------------------------------------

def publish_queries(settings: KafkaSettings, queries: list[Query]) -> None:
    """Publish several query versions with one producer (acks=all)."""
    from kafka import KafkaProducer

    from schemas.connection import producer_options
    from schemas.kafka_io import connect, ensure_topics

    ensure_topics(settings)
    producer = connect("producer", settings, KafkaProducer, acks="all", **producer_options(settings))
    try:
        futures = [producer.send(settings.queries_topic, key=q.record_key.encode(), value=q.model_dump_json().encode())
                   for q in queries]
        for f in futures:
            f.get(timeout=30)
    finally:
        producer.close(timeout=10)


def genuine_reports(settings: ReplaySettings, day: TrafficDay, epoch_index: int, fleet: int,
                    template: Query) -> Any:
    """One producer's privatized reports for one epoch, drawn as the replay draws them for
    ``template``: the same arrays can then be sent under any query id with its parameters."""
    from estimators import StationCounts
    from producers.fleet import Device, privatize

    epoch = int(day.epochs[epoch_index])
    tc = query_truth_counts(split_fleet(settings.seed, epoch, day.flows[epoch_index], fleet, 1)[0], day.stations,
                            template)
    return privatize(template, StationCounts(tc), epoch_rng(settings.seed, template, epoch, 0), "per-vehicle", Device())


class EpochSender:
    """Sends one producer's share of one (query, epoch) as the replay does: batches of
    ``batch_size`` reports keyed by fresh batch ids (round by round), then an end-of-epoch
    marker per round and partition saying what was sent there. Batches can be sent a few at
    a time (a producer that dies mid-epoch sends some and no markers)."""

    def __init__(self, sink: Any, q: Query, epoch: int, er: Any, producer_id: str, batch_size: int,
                 producer_index: int = 0, producer_count: int = 1) -> None:
        from schemas import encode_batch, new_batch_id

        self.sink, self.q, self.epoch, self.er = sink, q, epoch, er
        self.producer_id, self.producer_index, self.producer_count = producer_id, producer_index, producer_count
        self.chunks: list[tuple[int, int, int, bytes, dict[str, Any]]] = []  # (round, partition, n, value, arrays)
        base = {"query_id": q.query_id, "query_version": q.version, "epoch": epoch, "producer_id": producer_id,
                "n_stations": q.n_stations, "n_outputs": q.n_outputs, "kind": "reports"}
        for r, rnd in enumerate(er.rounds):  # none when refused
            for chunk in rnd.chunks(batch_size):
                n, arrays = chunk.n_reports, chunk.arrays()
                batch_id = new_batch_id()
                value = encode_batch({**base, "round": r, "layout": rnd.layout, "batch_id": batch_id, "reports": n},
                                     arrays)
                self.chunks.append((r, sink.partition_for(batch_id.encode()), n, value, arrays))
        self.next = 0

    def batches(self, k: int | None = None) -> int:
        """Send the next ``k`` batches (all that are left if None); returns how many were sent."""
        stop = len(self.chunks) if k is None else min(len(self.chunks), self.next + k)
        for _, part, _, value, _ in self.chunks[self.next:stop]:
            self.sink.send(value, key=None, partition=part)
        sent = stop - self.next
        self.next = stop
        return sent

    def sent_reports(self) -> int:
        return sum(c[2] for c in self.chunks[:self.next])

    def marker(self, r: int, partition: int, **overrides: Any) -> Any:
        from schemas import EndOfEpoch

        sent = self.chunks[:self.next]
        mine = [c for c in sent if c[0] == r and c[1] == partition]
        fields: dict[str, Any] = {
            "producer_id": self.producer_id, "producer_index": self.producer_index,
            "producer_count": self.producer_count, "query_id": self.q.query_id, "query_version": self.q.version,
            "epoch": self.epoch, "round": r, "partition": partition,
            "reports_to_partition": sum(c[2] for c in mine), "batches_to_partition": len(mine),
            "reports_total": sum(c[2] for c in sent if c[0] == r),
            "batches_total": sum(1 for c in sent if c[0] == r),
            "participants": self.er.participants, "refused": self.er.refused, "mode": "per-vehicle"}
        return EndOfEpoch(**{**fields, **overrides})

    def markers(self, **overrides: Any) -> None:
        """Every round's marker to every partition (what the replay sends after an epoch)."""
        from schemas import encode_json

        for r in range(self.q.n_rounds):
            for p in self.sink.partitions:
                self.sink.send(encode_json(self.marker(r, p, **overrides)), partition=p)


def estimates_by_query(settings: WorkerSettings) -> dict[str, dict[tuple[int, int, str], Estimate]]:
    """query id -> (epoch, station, estimator) -> the latest estimate."""
    out: dict[str, dict[tuple[int, int, str], Estimate]] = {}
    for (qid, _, epoch, station, name), e in read_estimates(settings).items():
        out.setdefault(qid, {})[(epoch, station, name)] = e
    return out


def dead_letter_origins(settings: WorkerSettings) -> list[tuple[str, str | None]]:
    """(reason, query id named by the original record or None) of every dead letter."""
    import base64
    import json
    import struct

    out: list[tuple[str, str | None]] = []
    for rec in drain(settings, settings.dead_letter_topic, quiet_polls=2):
        letter = json.loads(rec.value)
        raw = base64.b64decode(letter["value_b64"])
        qid: str | None = None
        try:
            if raw[:4] == b"PTT1":
                (hlen,) = struct.unpack_from(">I", raw, 4)
                qid = json.loads(raw[8:8 + hlen]).get("query_id")
            elif raw[:1] == b"{":
                qid = json.loads(raw).get("query_id")
            elif raw[:4] == b"PTS1":  # a stage record (refused at stage 2)
                (hlen,) = struct.unpack_from(">I", raw, 5)
                qid = json.loads(raw[9:9 + hlen]).get("query_id")
        except (ValueError, struct.error):
            qid = None
        out.append((letter["reason"], qid))
    return out


def assert_long_table_is_the_rows(table: Path, rows: Path) -> list[dict[str, Any]]:
    """The Parquet file ``table`` (long form, :data:`stream_app.worker.frames.LONG_SCHEMA`) holds
    exactly the estimates of the JSON lines ``rows``, the latest per (query, version, epoch,
    station, estimator): the same keys and, per key, every field the rows carry (``epoch_start``
    as the same instant); a withheld row has a withheld frame row (null estimate, no bounds).
    Returns the JSON rows."""
    import json

    import pyarrow.parquet as pq

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["query_id"], r["query_version"], r["epoch"], r.get("span_s", 30), r["station"], r["estimator"])

    saved = {key(r): r for r in (json.loads(line) for line in rows.read_text().splitlines() if line.strip())}
    kept = pq.read_table(table).to_pylist()
    assert len(kept) == len({key(r) for r in kept}), "a (query, version, epoch, station, estimator) twice"
    assert {key(r) for r in kept} == set(saved)
    for r in kept:
        e = saved[key(r)]
        assert r["epoch_start"] == datetime.fromisoformat(e["epoch_start"]), (r, e)
        assert {f: r[f] for f in e if f not in ("kind", "epoch_start")} == \
               {f: v for f, v in e.items() if f not in ("kind", "epoch_start")}, (r, e)
        assert (r["withheld_code"] is None) == (e["withheld"] is None) and r["retracted"] is False
    return list(saved.values())


def same_values(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-12 relative: the worker's floating-point results differ in the last
    bit between two runs of the same counts (measured: ``sd`` by up to 2.7e-16 relative in ~3%
    of the rows, on the direct path against the Kafka transport as against HTTP)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) and type(a) is type(b)


#: ``ptt demo`` quick to start, for tests of other things than its defaults: a fleet placed at
#: random per span (not the trip fleet of the peak hour), replayed from midnight, the queries
#: it asked before the day budget (30-s ALP and unary RR, hourly flows), each at its own
#: defaults (no joint plan for the day budget: a minute of planning saved). A test's own
#: ``--query-mechanisms`` goes after these.
QUICK_DEMO = ("--fleet-model", "spans", "--start-time", "00:00", "--no-plan-day",
              "--query-mechanisms", "alp,unary,unary@3600")
#: the same, straight into the worker's topic (no shuffler)
DIRECT_DEMO = ("--no-shuffler", *QUICK_DEMO)

#: The demo that test_shuffler and test_front_door compare with the direct demo: QUICK_DEMO's
#: fleet and start, 6 epochs of the 16-station day as fast as it goes, the default 30-s queries
#: (ALP, unary RR) and the opt-in Sampling Privacy and RR: 6 x 16 x 7 estimates.
COMPARED_DEMO = ("--speed", "0", "--max-epochs", "6", "--exit-when-done", "--stations", "16", *QUICK_DEMO,
                 "--no-plots", "--query-mechanisms", "sp,alp,rr,unary")
#: The xdist group of the tests that compare with :func:`direct_demo_estimates`: under
#: ``--dist loadgroup`` they run in one worker, which runs the direct demo once for them.
DIRECT_DEMO_GROUP = "direct_demo"

DemoRows = dict[tuple[str, int, int, str], dict[str, Any]]


def demo_estimates(tmp: Path, *flags: str, timeout_s: float = 240) -> DemoRows:
    """``ptt demo`` of :data:`COMPARED_DEMO` and ``flags`` run in ``tmp`` (created; its output
    in ``tmp/out``): its estimates.jsonl by (query, epoch, station, estimator)."""
    out = tmp / "out"
    tmp.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "stream_app.cli", "demo", "--out", str(out),  # noqa: S603
                           *COMPARED_DEMO, *flags,
                           "--metrics-port", str(free_port()), "--prometheus-port", str(free_port())],
                          capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "estimates.jsonl").read_text().splitlines()]
    return {(e["query_id"], e["epoch"], e["station"], e["estimator"]): e for e in rows}


_DIRECT_DEMO: list[DemoRows] = []


def direct_demo_estimates(tmp: Path) -> DemoRows:
    """:func:`demo_estimates` of ``--no-shuffler``, run once per process (in ``tmp`` by the first
    caller; a test in :data:`DIRECT_DEMO_GROUP` may find it run by another): a deep copy each
    call (the fleet is seeded: a second run would publish the same rows)."""
    if not _DIRECT_DEMO:
        _DIRECT_DEMO.append(demo_estimates(tmp, "--no-shuffler"))
    return copy.deepcopy(_DIRECT_DEMO[0])

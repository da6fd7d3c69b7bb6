"""Benchmark: per-vehicle reports through the shuffler (``ptt shuffler``) against the direct path.
One JSON line per run.

Scenarios (``--only`` picks some):

* ``s1``  -- 500 stations, per vehicle, SP + ALP + RR (the demo's three default queries), the
  same fleet and epochs twice in one run: the direct path (``ptt replay`` batches the reports)
  and through the shuffler once per ``--releases`` value (``ptt replay --via-shuffler``: one
  record per device report; the shuffler releases each (query, version, epoch, round) as its
  counts, one tally, or permuted columnar batches, with markers, in Kafka transactions; each
  run's line has ``release`` and ``reports_topic_bytes``). Per path: wall time per epoch,
  ``realtime_factor``, the CPU seconds of each process; then ``shuffler_vs_direct`` (wall time
  per epoch through the shuffler / direct) and whether both paths published the same estimates
  (``same_estimates``: every row equal, field for field, but ``epsilon_shuffled`` and
  ``release``, null on the direct path, which attests no shuffle);
* ``s2``  -- the papers' scale, 3,220 stations and ``--expand-to 47,719`` vehicles, through the
  shuffler (and the direct path in the same run with ``--direct-s2``). The synthetic day's peak
  flow (136,161 vehicles) is above 47,719, so the fleet is that peak (``vehicles`` says so):
  ~2.9x the paper's fleet.

Every line of a path has:

* ``realtime_factor = epochs x 30 / last_estimate_s`` (30 s of data per epoch), with
  ``last_estimate_s`` from the replay's start to the last estimate written (the broker's record
  timestamps); ``wall_s_per_epoch = last_estimate_s / epochs``. Through the shuffler the last
  epochs are released ``idle_release_s`` (here 1 s) after the input stops, which is counted;
* ``cpu_s``: CPU seconds (user + system, from /proc) of the replay (this process, its producer
  thread included), the shuffler, the worker and the broker over the run, and ``cpu_share`` of
  their sum -- on 2 cores, the process with the largest share is the wall;
* ``estimates == expected_estimates`` (nothing lost), ``dead_letters``, ``device_records``
  (the replay's records through the shuffler), ``shuffler_summary`` (its last line).

``--profile`` runs the shuffler under :mod:`cProfile` (``tests/benchmarks/cpu_profile.py``) and
the replay under :class:`cProfile.Profile`, both timed by their main thread's CPU clock (waits
and other threads do not count; slower: the line is marked ``profiled``) and adds
``shuffler_profile`` and ``replay_profile``: the top functions by own and by cumulative CPU
time, in seconds.

Measured on 2 cores shared with other sessions (load average 3-5; every run's figures are in the
benchmark record, tests/benchmarks/record.jsonl):

* s1, 5 epochs, 398,560 device records: direct 0.37 s/epoch (82x real time), through the
  shuffler 8.8 s/epoch (3.4x): 24x the direct path's wall time per epoch; CPU s replay 23.0,
  shuffler 12.6 (17.4 before its hot path went to whole columns), worker 1.3, broker 4.4. All
  15,000 estimates on both paths, equal but ``data_quality`` and ``consistent`` on the 6 cells
  the direct path marks ``no_source_data``.
* s2, 2 epochs, 1,089,288 device records: through the shuffler 74.8 s/epoch, 0.40x real time
  (goal 1x not met), 7.0x the direct path (10.7 s/epoch, 2.8x); CPU s replay 124 (59%),
  shuffler 72 (34%), worker 5, broker 11. All 38,640 estimates.

* s1 with ``--releases aggregate,permuted`` (load average 9-10): direct 1.87 s/epoch; aggregate
  39.6 s/epoch, 180,023 B on the reports topic; permuted 44.6 s/epoch, 14,069,631 B; CPU s of
  the shuffler 26.3 vs 25.0, worker 4.2 vs 4.7. Both ``same_estimates`` (15,000 rows).

* ``day10`` -- the real-day shape: a synthetic 10-station day (``--epochs-day``, default the
  whole day's 2,880 epochs) of per-vehicle records with the queries ``--day-queries`` (default
  ``alp,unary,unary@300,unary@3600``: two 30-s queries, a 5-minute and an hour's span), the
  direct path and through the shuffler in one run, then one comparison line: ``direct_s`` and
  ``shuffler_s`` (from the replay's start to the last row published, rollups and spans
  included), ``shuffler_vs_direct`` (their ratio), ``rows_identical`` (every row of the direct
  path published through the shuffler, equal but ``epsilon_shuffled`` and ``release``, and no
  other) and ``meets_bar`` (rows identical within 3x the direct path's time). An unpaced replay
  writes its source notes far ahead of the shuffler's reading, so thousands of slots are open
  at once behind the backlog: the run that found the policy's scans of every open slot (the
  shuffler released nothing for 37 minutes of a real day).

``--device-clients librdkafka,kafka-python`` runs each shuffler path once per way the replay
hands device reports over: ``librdkafka`` (:meth:`producers.sink.ReportSink.send_many`, the
replay's) and ``kafka-python`` (one ``KafkaProducer.send`` per record, the replay before
:mod:`producers.bulk`), so before and after are measured in one run. Every shuffler line has
``cpu_s_per_million_device_records`` per process and every line the ``load_average`` at its end.

``--replay-producers N`` splits the fleet over N replay processes (``ptt replay --producers``);
``cpu_s.replay`` then counts them all.

``--shufflers N`` runs N shuffler instances (``ptt shuffler --instance-count N --instance-index
i``), each reading the device partitions ``p`` with ``p % N == i`` and releasing its own counts
with its own markers; ``cpu_s`` then has each (``shuffler``, ``shuffler2``, ...) and their sum
(``shufflers``), and ``--profile`` profiles the first. The time is not free in privacy: each
instance's release hides a device among its own share of the crowd (about 1/N), and the worker
attests each estimate's ``epsilon_shuffled`` at the smallest size an instance's markers attest.

Every path waits after its replay until the worker has closed every window the replay marked and
decided every rollup it completes (:func:`stream_app.cli.demo.expected_windows`, a span query's
once a span; ``expected_rollups``), up to ``max(600, 20 x the replay's seconds)``.

Run: ``python tests/benchmarks/bench_shuffler.py [--only s1,s2,day10] [--epochs-s1 10] [--epochs-s2 5]
[--direct-s2] [--epochs-day 2880] [--day-queries alp,unary,unary@300,unary@3600]
[--releases aggregate,permuted] [--device-clients librdkafka,kafka-python] [--replay-producers 1] [--shufflers 1]
[--profile]``
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import re
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from producers.replay import replay
from producers.settings import ReplaySettings
from producers.sink import ReportSink
from schemas.epochs import EPOCH_S
from schemas.kafka_io import publish_query, read_to_end
from schemas.settings import cache_dir
from stream_app.cli.demo import expected_rollups, expected_windows
from stream_app.cli.local_broker import LocalBroker, free_port
from stream_app.settings import WorkerSettings
from stream_app.shuffler.settings import ShufflerSettings
from stream_app.worker.app import ensure_stream_topics
from tests.benchmarks.bench_scale import _dead, _scrape, _wait_url
from tests.benchmarks.common import load_scenario, row_kind, stop_children_on_signals, unwatch, watch
from tests.integration.stream_helpers import WorkerProcess, env_for
from tests.processes import cpu_s

_SEND_MANY = ReportSink.send_many


def _send_each(self: ReportSink, values: Sequence[bytes], keys: bytes, key_size: int,
               headers: Iterable[tuple[str, bytes]] = (), topic: str | None = None, stop: Any = None,
               partitions: Sequence[int] | None = None) -> int:
    """The device path before :mod:`producers.bulk`: kafka-python's ``send`` once per record."""
    hdrs = list(headers)
    for j, value in enumerate(values):
        if stop is not None and stop.requested:
            return j
        self.send(value, key=keys[j * key_size:(j + 1) * key_size], headers=hdrs, topic=topic, reports=1,
                  partition=None if partitions is None else partitions[j])
    return len(values)


def use_device_client(client: str) -> None:
    """How the replay (in this process) hands device reports over: ``librdkafka`` (the replay's
    :meth:`ReportSink.send_many`) or ``kafka-python`` (one ``send`` per record, as before)."""
    ReportSink.send_many = _SEND_MANY if client == "librdkafka" else _send_each  # type: ignore[method-assign]


def _children_cpu_s() -> float:
    """CPU seconds of this process's ended and waited-for children (the replay's producer
    processes, ``--replay-producers`` > 1: joined before :func:`replay` returns)."""
    got = resource.getrusage(resource.RUSAGE_CHILDREN)
    return got.ru_utime + got.ru_stime


class _Shuffler:
    """``ptt shuffler`` in a subprocess (under cProfile with ``profile``), its output in a log."""

    def __init__(self, settings: ShufflerSettings, log: Path, profile: Path | None) -> None:
        self.settings = settings
        self.log = log
        self.profile = profile
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> _Shuffler:
        run = [str(Path(__file__).with_name("cpu_profile.py")), str(self.profile)] if self.profile else ["-m"]
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen([sys.executable, *run, "stream_app.cli", "shuffler"],  # noqa: S603
                                         env=env_for(self.settings), stdout=fh, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while "shuffler " not in self.log.read_text(errors="replace"):  # its signal handlers are in
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the shuffler did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)
        watch("shuffler", self)  # one that dies mid-run ends the benchmark (tests/benchmarks/common.py)
        return self

    def stop(self) -> None:
        """SIGTERM (it ends after its current step and writes its summary; cProfile then writes
        the profile), SIGKILL after 60 s."""
        unwatch(self)
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def summary(self) -> str:
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.startswith("shuffler: ")]
        return lines[-1] if lines else ""


_STARTED: list[WorkerProcess | _Shuffler] = []  # every process a run started: main() stops them however it ends


def _profile_top(path: Path, n: int = 15) -> dict[str, Any]:
    stats = pstats.Stats(str(path))
    rows: list[tuple[str, int, float, float]] = []
    for (file, line, func), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(file).name}:{line}({func})" if line else func
        rows.append((where, calls, tottime, cumtime))

    def top(col: int) -> list[list[Any]]:
        return [[w, c, round(t, 2), round(cu, 2)] for w, c, t, cu in sorted(rows, key=lambda r: -float(r[col]))[:n]]

    return {"columns": ["function", "calls", "own_s", "cumulative_s"], "by_own_time": top(2),
            "by_cumulative_time": top(3)}


def _estimate_rows(ws: WorkerSettings) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The latest estimate row per (query, version, epoch, station, estimator, span: rollups apart)."""
    out = {}
    for r in read_to_end(ws, ws.estimates_topic, idle_timeout_s=5):
        row = json.loads(r.value)
        out[(row["query_id"], row["query_version"], row["epoch"], row["station"], row["estimator"],
             row.get("span_s", 30))] = row
    return out


_SHUFFLE_FIELDS = ("epsilon_shuffled", "release")  # null on the direct path, which attests no shuffle


def _without(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """A row without ``epsilon_shuffled`` and ``release``: the direct path attests no shuffle (null there)."""
    return None if row is None else {k: v for k, v in row.items() if k not in _SHUFFLE_FIELDS}


def _topic_bytes(settings: ReplaySettings, topic: str) -> int:
    """Bytes of the record values on ``topic`` (what the shuffler released, markers included)."""
    return sum(len(r.value or b"") for r in read_to_end(settings, topic, idle_timeout_s=2))


def _outcomes(worker: WorkerProcess) -> float:
    """Windows the worker closed and rollups it decided so far, every query and reason."""
    metrics = _scrape(worker, "ptt_epochs_closed_total", "ptt_rollups_total", "ptt_withheld_rollups_total")
    return sum(float(v) for v in
               re.findall(r'ptt_(?:epochs_closed|rollups|withheld_rollups)_total\{[^}]*\} ([0-9.e+]+)', metrics))


def run_path(name: str, broker: str, broker_pid: int | None, tmp: Path, *, stations: int, epochs: int,
             vehicles: int | None, via_shuffler: bool, data_dir: Path, profile: bool = False,
             keep_rows: bool = False, release: str = "aggregate", device_client: str = "librdkafka",
             replay_producers: int = 1, mechanisms: str | None = None, shufflers: int = 1,
             ) -> tuple[dict[str, Any], dict[tuple[Any, ...], dict[str, Any]]]:
    tag = f"{name}-{'shuffler-' + release if via_shuffler else 'direct'}-{uuid.uuid4().hex[:8]}"
    use_device_client(device_client)
    chosen: dict[str, Any] = {"query_mechanisms": mechanisms} if mechanisms else {}  # else the default queries
    rs = ReplaySettings(bootstrap_servers=broker, data_dir=data_dir, truth=False, default_queries=False, **chosen,
                        reports_topic=f"r-{tag}", queries_topic=f"q-{tag}", truth_topic=f"t-{tag}", partitions=4,
                        synthetic_stations=stations, mode="per-vehicle", max_epochs=epochs,
                        start_epoch=max(0, min(14 * 120, 2880 - epochs)), expand_to=vehicles, batch_size=50_000,
                        via_shuffler=via_shuffler, device_topic=f"dev-{tag}", device_partitions=4,
                        producers=replay_producers,
                        # the operator's secret, shared with the simulated (enrolled) fleet
                        enrollment_secret=SecretStr(secrets.token_hex(32)))
    day, load_s, fleet, queries, base = load_scenario(rs)
    ws = WorkerSettings(**base, app_id=f"bench-{tag}", estimates_topic=f"e-{tag}", dead_letter_topic=f"d-{tag}",
                        web_port=free_port(), min_participants=1, estimate_output="rows")
    ensure_stream_topics(ws)
    for q in queries:
        publish_query(rs, q)
    worker = WorkerProcess(ws, tmp / f"worker-{tag}.log")
    _STARTED.append(worker)
    worker.start()
    worker.wait_ready(120)
    _wait_url(worker.url.replace("/metrics", "/ready"), 120)
    started: list[_Shuffler] = []
    prof_path = tmp / f"shuffler-{tag}.prof" if profile else None  # the first instance's
    if via_shuffler:
        ss = ShufflerSettings(**rs.model_dump(include=set(ShufflerSettings.model_fields)),
                              shuffler_id=f"shuf-{uuid.uuid4().hex[:8]}", dead_letter_topic=ws.dead_letter_topic,
                              min_crowd=1, idle_release_s=1.0, release=release, instance_count=shufflers,
                              metrics_port=0)  # any free port: other shufflers may run on the host
        for i in range(shufflers):  # each reads the device partitions p with p % shufflers == i
            one = _Shuffler(ss.model_copy(update={"instance_index": i}), tmp / f"shuffler-{tag}-{i}.log",
                            prof_path if i == 0 else None)
            _STARTED.append(one)
            started.append(one.start())
    pids = {**{("shuffler" if i == 0 else f"shuffler{i + 1}"): sh.proc.pid for i, sh in enumerate(started)
               if sh.proc}, "worker": worker.proc.pid if worker.proc else None, "broker": broker_pid}
    cpu0 = {k: cpu_s(p) for k, p in pids.items()}
    expected = sum(q.n_stations * len(q.spec.estimator_names) for q in queries) * epochs
    t0 = time.time()
    replay_cpu0 = time.process_time() + _children_cpu_s()
    replay_prof = cProfile.Profile(time.thread_time) if profile else None
    if replay_prof is not None:
        replay_prof.enable()
    summary = replay(rs, progress=False)
    if replay_prof is not None:
        replay_prof.disable()
        replay_prof.dump_stats(tmp / f"replay-{tag}.prof")
    replay_s = time.time() - t0
    cpu = {"replay": time.process_time() + _children_cpu_s() - replay_cpu0}  # its producer processes too
    replayed = [int(e) for e in day.epochs[rs.start_epoch:rs.start_epoch + epochs]]
    outcomes = expected_windows(queries, replayed) + expected_rollups(queries, replayed)
    deadline = time.time() + max(600.0, 20 * replay_s)
    while time.time() < deadline and _outcomes(worker) < outcomes:
        time.sleep(0.5)
    cpu.update({k: cpu_s(p) - cpu0[k] for k, p in pids.items() if p is not None})
    if shufflers > 1:  # the instances as one tier, after each its own
        cpu["shufflers"] = sum(v for k, v in cpu.items() if k.startswith("shuffler"))
    every = [(r.timestamp, r.value) for r in read_to_end(ws, ws.estimates_topic, idle_timeout_s=5)]
    spans = {q.query_id for q in queries if q.span_s != EPOCH_S}
    rows = [(t, v) for t, v in every if row_kind(v, spans) == "epoch"]  # rollups and span queries' rows apart
    last_s = max(t for t, _ in rows) / 1000.0 - t0 if rows else float("nan")
    last_row_s = max(t for t, _ in every) / 1000.0 - t0 if every else float("nan")
    total_cpu = sum(v for k, v in cpu.items() if k != "shufflers")
    out: dict[str, Any] = {
        "scenario": name, "path": "shuffler" if via_shuffler else "direct",
        **({"release": release, "device_client": device_client} if via_shuffler else {}), "stations": stations,
        "vehicles": fleet, "mode": "per-vehicle", "queries": [q.mechanism for q in queries],
        "query_mechanisms": rs.query_mechanisms, "epochs": epochs,
        "replay_producers": replay_producers, **({"shufflers": shufflers} if via_shuffler else {}),
        "reports": summary.reports, "load_s": round(load_s, 2), "replay_s": round(replay_s, 2),
        "last_estimate_s": round(last_s, 2), "last_row_s": round(last_row_s, 2),
        "wall_s_per_epoch": round(last_s / epochs, 3),
        "realtime_factor": round(epochs * 30 / last_s, 3), "estimates": len(rows), "expected_estimates": expected,
        "rollup_estimates": len(every) - len(rows),
        "dead_letters": int(_dead(_scrape(worker, "ptt_dead_letters_total"))),
        "cpu_s": {k: round(v, 1) for k, v in cpu.items()},
        "cpu_share": {k: round(v / total_cpu, 3) for k, v in cpu.items() if k != "shufflers"},
    }
    if via_shuffler:
        out["device_records"] = summary.records
        out["cpu_s_per_million_device_records"] = {k: round(1e6 * v / max(summary.records, 1), 1)
                                                   for k, v in cpu.items()}
    out["load_average"] = [round(x, 1) for x in os.getloadavg()]
    out["reports_topic_bytes"] = _topic_bytes(rs, rs.reports_topic)
    worker.stop()
    for sh in started:
        sh.stop()
    if started:
        out["shuffler_summary"] = " | ".join(sh.summary() for sh in started)
        if prof_path is not None:
            out["profiled"] = True
            out["shuffler_profile"] = _profile_top(prof_path) if prof_path.exists() else "no profile written"
    if profile:
        out["replay_profile"] = _profile_top(tmp / f"replay-{tag}.prof")
    return out, (_estimate_rows(ws) if keep_rows else {})


Rows = dict[tuple[Any, ...], dict[str, Any]]


def _differing(d_rows: Rows, v_rows: Rows) -> list[tuple[Any, ...]]:
    """The direct path's rows that the shuffler's run published otherwise or not at all."""
    return [k for k, row in d_rows.items() if _without(v_rows.get(k)) != _without(row)]


def _day_line(direct: dict[str, Any], d_rows: Rows, via: dict[str, Any], v_rows: Rows) -> dict[str, Any]:
    """day10's comparison line: the time to the last row published on each path, their ratio,
    whether every row is identical, and the bar (identical, within 3x); where rows differ, the
    first one's differing fields (direct, shuffler) and how many of the differing rows the
    shuffler's run withheld (by reason) or published."""
    differ = _differing(d_rows, v_rows)
    ratio = round(via["last_row_s"] / direct["last_row_s"], 2)
    identical = not differ and d_rows.keys() == v_rows.keys()
    first = (d_rows[differ[0]], v_rows.get(differ[0]) or {}) if differ else ({}, {})
    fields = {k: [first[0].get(k), first[1].get(k)] for k in sorted(first[0].keys() | first[1].keys())
              if k not in _SHUFFLE_FIELDS and first[0].get(k) != first[1].get(k)}
    withheld = Counter(str(v_rows[k]["withheld"])[:60] for k in differ
                       if k in v_rows and v_rows[k].get("withheld") is not None)
    return {"scenario": "day10", "compare": "shuffler vs direct, same fleet and epochs, same run",
            "queries": direct["query_mechanisms"], "epochs": direct["epochs"],
            "device_records": via.get("device_records"), "shufflers": via.get("shufflers", 1),
            "direct_s": direct["last_row_s"], "shuffler_s": via["last_row_s"], "shuffler_vs_direct": ratio,
            "rows_direct": len(d_rows), "rows_shuffler": len(v_rows), "rows_differing": len(differ),
            "rows_only_shuffler": len(v_rows.keys() - d_rows.keys()), "rows_identical": identical,
            "example": list(differ[0]) if differ else None, "example_fields": fields,
            "differing_withheld": dict(withheld.most_common(5)),
            "differing_published": len(differ) - sum(withheld.values()),
            "meets_bar": identical and ratio <= 3.0,
            "load_average": via["load_average"]}


def _compare(direct: dict[str, Any], d_rows: dict[tuple[Any, ...], dict[str, Any]], via: dict[str, Any],
             v_rows: dict[tuple[Any, ...], dict[str, Any]], profiled: bool) -> dict[str, Any]:
    """S1's comparison line: the shuffler's run (one release) against the direct path's."""
    differ = _differing(d_rows, v_rows)
    fields = Counter(f for k in differ for f in d_rows[k]
                     if f not in _SHUFFLE_FIELDS and d_rows[k].get(f) != v_rows.get(k, {}).get(f))
    example = ({f: [d_rows[differ[0]].get(f), v_rows.get(differ[0], {}).get(f)]
                for f in fields} | {"key": list(differ[0])}) if differ else None
    return {
        "scenario": "s1", "compare": "shuffler vs direct, same fleet and epochs, same run", "release": via["release"],
        "shuffler_vs_direct": round(via["wall_s_per_epoch"] / direct["wall_s_per_epoch"], 2),
        "realtime_factor_direct": direct["realtime_factor"],
        "realtime_factor_shuffler": via["realtime_factor"],
        "reports_topic_bytes_direct": direct["reports_topic_bytes"],
        "reports_topic_bytes_shuffler": via["reports_topic_bytes"],
        "estimates_direct": len(d_rows), "estimates_shuffler": len(v_rows),
        "rows_differing": len(differ),
        "of_them_no_source_data": sum(d_rows[k]["data_quality"] == "no_source_data" for k in differ),
        "rows_no_source_data_direct": sum(r["data_quality"] == "no_source_data" for r in d_rows.values()),
        "fields_differing": dict(fields), "example": example,
        "same_estimates": not differ and d_rows.keys() == v_rows.keys(),
        "epsilon_shuffled_published": sum(r.get("epsilon_shuffled") is not None for r in v_rows.values()),
        "release_published": sorted({str(r.get("release")) for r in v_rows.values()}),
        **({"profiled": True} if profiled else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="s1,s2")
    parser.add_argument("--epochs-s1", type=int, default=10)
    parser.add_argument("--epochs-s2", type=int, default=5)
    parser.add_argument("--direct-s2", action="store_true", help="S2 also on the direct path, in the same run")
    parser.add_argument("--releases", default="aggregate,permuted",
                        help="the shuffler's --release values to run (s1: each against the direct path; s2: the first)")
    parser.add_argument("--epochs-day", type=int, default=2880, help="day10: epochs of the 10-station day")
    parser.add_argument("--day-queries", default="alp,unary,unary@300,unary@3600",
                        help="day10: the queries' mechanisms (MECH or MECH@SPAN, as ptt demo --query-mechanisms)")
    parser.add_argument("--device-clients", default="librdkafka",
                        help="how the replay hands device reports over, each a shuffler run (s1, s2, day10): "
                             "librdkafka (producers.bulk), kafka-python (one send per record, as before)")
    parser.add_argument("--profile", action="store_true", help="the shuffler under cProfile (its figures are slower)")
    parser.add_argument("--shufflers", type=int, default=1,
                        help="shuffler instances splitting the device partitions (ptt shuffler --instance-count), "
                             "every shuffler run")
    parser.add_argument("--replay-producers", type=int, default=1,
                        help="replay processes splitting the fleet (ptt replay --producers), every path")
    parser.add_argument("--data-dir", type=Path, default=cache_dir("bench"),
                        help="where synthetic days and their parse cache are kept between runs")
    args = parser.parse_args()
    stop_children_on_signals("bench_shuffler")  # SIGTERM/SIGINT: the cleanup below still runs
    wanted = set(args.only.split(","))
    with tempfile.TemporaryDirectory() as tmp_name, LocalBroker(log_path=Path(tmp_name) / "broker.log") as broker:
        tmp = Path(tmp_name)
        common = {"data_dir": args.data_dir, "replay_producers": args.replay_producers}
        instances = {"shufflers": args.shufflers}
        try:
            clients = args.device_clients.split(",")
            if "s1" in wanted:
                kw: dict[str, Any] = {"stations": 500, "epochs": args.epochs_s1, "vehicles": None, **common}
                direct, d_rows = run_path("s1", broker.bootstrap, broker.pid, tmp, via_shuffler=False,
                                          keep_rows=True, **kw)
                print(json.dumps(direct), flush=True)
                for release in args.releases.split(","):
                    for client in clients:
                        via, v_rows = run_path("s1", broker.bootstrap, broker.pid, tmp, via_shuffler=True,
                                               keep_rows=True, profile=args.profile, release=release,
                                               device_client=client, **instances, **kw)
                        print(json.dumps(via), flush=True)
                        print(json.dumps(_compare(direct, d_rows, via, v_rows, args.profile)), flush=True)
            for name, stations, epochs, vehicles, direct_too, mechanisms in (
                    ("s2", 3220, args.epochs_s2, 47_719, args.direct_s2, None),
                    ("day10", 10, args.epochs_day, None, True, args.day_queries)):
                if name not in wanted:
                    continue
                day = name == "day10"  # its rows are compared
                kw = {"stations": stations, "epochs": epochs, "vehicles": vehicles, "mechanisms": mechanisms,
                      "keep_rows": day, **common}
                if direct_too:
                    direct, d_rows = run_path(name, broker.bootstrap, broker.pid, tmp, via_shuffler=False, **kw)
                    print(json.dumps(direct), flush=True)
                for client in clients:
                    via, v_rows = run_path(name, broker.bootstrap, broker.pid, tmp, via_shuffler=True,
                                           profile=args.profile, release=args.releases.split(",")[0],
                                           device_client=client, **instances, **kw)
                    print(json.dumps(via), flush=True)
                    if day:
                        print(json.dumps({**_day_line(direct, d_rows, via, v_rows), "device_client": client}),
                              flush=True)
                    elif direct_too:
                        print(json.dumps({"scenario": name, "compare": "shuffler vs direct, same run",
                                          "device_client": client, "load_average": via["load_average"],
                                          "shuffler_vs_direct": round(via["wall_s_per_epoch"]
                                                                      / direct["wall_s_per_epoch"], 2)}),
                              flush=True)
        finally:  # a run that failed leaves no worker or shuffler behind
            for p in _STARTED:
                p.stop()


if __name__ == "__main__":
    main()

"""Benchmark: the stream app at the papers' scale. One JSON line per scenario.

Scenarios (``--only`` picks some; defaults are the issue's bar):

* ``p1-10``   -- 10 stations, per vehicle, SP + ALP + RR (a PeMS-like day's shape);
* ``p1-500``  -- 500 stations, per vehicle;
* ``p2``      -- 47,719 vehicles x 3,220 stations, per vehicle, >= 20 epochs;
* ``p3``      -- 10,047,719 vehicles x 3,220 stations, exact tallies, >= 60 epochs, plus the raw
  broker's produce throughput for the same estimate bytes, measured in the same run;
* ``p4``      -- a paced tally run at 3,220 stations (``--speed-p4``, ``--epochs-p4 2880`` for a day): close latency in
  steady state and the worker's RSS at epoch 200 vs 2,000. The embedded broker keeps every record in
  memory (it honours no retention), and a whole day at 3,220 stations is ~30 GB of uncompressed
  estimates (19,320 records of ~540 B per epoch): more than this machine has; ~2.4 GB with zstd, the
  default codec (``size`` below). ``--stations-p4 500`` runs the whole day at 500 stations
  (~4.5 GB) to show the worker's memory over 2,880 epochs;
* ``p5``      -- 4 workers vs 1 at 3,220 stations (tally);
* ``size``    -- a tally run at 3,220 stations writing rows and frames (``PTT_ESTIMATE_OUTPUT=both``):
  one closed epoch of the three default queries re-produced per codec (none, gzip, lz4, zstd) with
  the worker's producer, the bytes of the record batches the broker serves for it, per-row JSON vs
  frames (also with Arrow IPC buffer compression), and the CPU seconds of compressing and consuming.

P3, P4 and ``size`` also scrape the worker's whole ``/metrics`` 5 times during the run
(``metrics_scrape``: median and max seconds, bytes, series).

Every scenario samples the embedded broker's RSS as epochs close (``broker_rss_by_epoch_mb``,
``broker_peak_rss_mb``): it keeps every record in memory. P4 with frames on then writes the
whole frames topic to Parquet with ``ptt subscribe --parquet``, reads the file back with pyarrow
and holds every window's rows equal, value for value, to its frame (``parquet_windows_equal``,
``parquet_windows_missing``).

``--output rows|frames|both`` (P3 and P4) sets the worker's ``PTT_ESTIMATE_OUTPUT``. With
``frames`` the delivered estimates are counted from the estimate frames topic: every window
framed once (``frames == expected_frames``, e.g. 2,880 x 3 for a day of the three queries) and
``estimates`` = the station x estimator values the frames hold, so ``estimates ==
expected_estimates`` holds from frames; ``last_estimate_s`` and the raw baseline then use the
frames' timestamps and sizes. Use ``frames`` for P4 at >= 500 stations over a whole day: the
rows of such a day fill the in-memory broker, the frames carry the same values in far fewer,
smaller records. Every line says its ``output``.

Every figure that is a speed is also given as a ratio measured in the same run:
``realtime_factor = epochs x 30 / last_estimate_s`` (the data's own time) and
``worker_vs_replay = last_estimate_s / replay_s`` (P1: the worker is never the wall when
<= 1.2). ``last_estimate_s`` runs from the replay's start to the moment the last estimate was
written (the broker's record timestamps); ``estimates == expected_estimates`` means nothing
was lost. The worker's rollups (5-minute and hourly sums of a 30-s query, ``span_s`` 300 and
3,600) are counted apart, as ``rollup_estimates``, and a span query's estimates (one per span,
``PTT_QUERY_MECHANISMS`` with ``MECH@SPAN``) as ``span_estimates``: ``estimates``,
``expected_estimates``, ``frames``, ``last_estimate_s`` and the sizes are the 30-s queries'
per-epoch ones. ``p99_close_latency_s`` comes from the worker's ``ptt_close_latency_seconds``
histogram (a stage-2 batch that closes epochs -> their estimates acknowledged).

Run: ``python tests/benchmarks/bench_scale.py [--only p1-10,p3] [--epochs-p3 60]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from producers.replay import replay
from producers.settings import ReplaySettings
from schemas.epochs import EPOCH_S
from schemas.kafka_io import ensure_topics, publish_query, read_to_end
from schemas.settings import cache_dir
from stream_app.cli.demo import expected_windows
from stream_app.cli.local_broker import LocalBroker, free_port
from stream_app.settings import WorkerSettings
from stream_app.worker.app import ensure_stream_topics
from tests.benchmarks.common import (
    compress_cpu_s,
    load_scenario,
    raw_produce,
    row_kind,
    stop_children_on_signals,
    stored_batches,
)
from tests.integration.stream_helpers import WorkerProcess


def _rss_mb(pid: int, field: str = "VmHWM") -> float:
    """Peak (VmHWM) or current (VmRSS) resident memory of a process, in MB."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    m = re.search(field + r":\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else float("nan")


def _p99(metrics: str) -> float:
    """99th percentile of ptt_close_latency_seconds from its cumulative buckets (upper edge)."""
    buckets = [(float("inf") if le == "+Inf" else float(le), float(v)) for le, v in
               re.findall(r'ptt_close_latency_seconds_bucket\{le="([^"]+)"\} ([0-9.e+]+)', metrics)]
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    total = buckets[-1][1]
    return next(le for le, v in buckets if v >= 0.99 * total)


def _milestones(epochs: int, seen: dict[int, float]) -> set[int]:
    """The sampled epoch counts closest to 10%, 50%, 100% of the run and to 200 and 2,000."""
    marks = {epochs // 10, epochs // 2, epochs, 200, 2000}
    return {min(seen, key=lambda k: abs(k - m)) for m in marks if seen and m <= epochs}


def _wait_url(url: str, timeout_s: float) -> None:
    import urllib.error
    import urllib.request

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5):  # noqa: S310 - loopback
                return
        except (urllib.error.HTTPError, OSError):
            time.sleep(0.2)
    raise TimeoutError(f"{url} not ready within {timeout_s}s")


def _scrape(w: WorkerProcess, *names: str) -> str:
    """Only the named series: the per-station families (~100k series) are not rendered."""
    import urllib.request

    query = "&".join(f"name[]={n}" for n in names)
    with urllib.request.urlopen(f"{w.url}?{query}", timeout=10) as r:  # noqa: S310 - loopback
        return str(r.read().decode())


def _dead(metrics: str) -> float:
    return sum(float(v) for v in re.findall(r'ptt_dead_letters_total\{[^}]*\} ([0-9.e+]+)', metrics))


def _closed_epochs(metrics: str) -> int:
    """Epochs closed, every query and reason (each stage-2 partition closes its own epochs:
    the newest closed epoch says nothing of the older ones)."""
    return int(sum(float(v) for v in re.findall(r'ptt_epochs_closed_total\{[^}]*\} ([0-9.e+]+)', metrics)))


def _last_closed(metrics: str) -> dict[str, int]:
    return {q: int(float(v)) for q, v in re.findall(r'ptt_last_closed_epoch\{query="([^"]+)"\} ([0-9.e+]+)', metrics)}


def _full_scrapes(w: WorkerProcess, n: int = 5) -> dict[str, Any]:
    """``n`` scrapes of the worker's whole registry (every per-station family), as Prometheus
    does: the median wall time and the bytes of the answer."""
    import urllib.request

    times, sizes = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        with urllib.request.urlopen(w.url, timeout=60) as r:  # noqa: S310 - loopback
            body = r.read()
        times.append(time.perf_counter() - t0)
        sizes.append(len(body))
    return {"scrape_median_s": round(statistics.median(times), 3), "scrape_max_s": round(max(times), 3),
            "scrape_bytes": int(statistics.median(sizes)),
            "scrape_series": sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))}


def _delivered(ws: WorkerSettings, span_queries: set[str]) -> dict[str, Any]:
    """What the worker delivered, from the rows topic, or from the frames topic when it
    publishes frames only (``--output frames``): ``estimates`` counts station-estimator values
    (a frame of S stations and E estimators holds S x E, the latest frame per window counted
    once), ``stamps`` the records' broker timestamps, ``sizes`` their value sizes, ``frames``
    the distinct windows framed (when frames are on) -- of the 30-s queries' epochs, the span
    queries' (``span_queries``) and the rollups counted apart (:func:`row_kind`)."""
    from stream_app.worker.frames import decode_frame

    got: dict[str, Any] = {}
    if ws.frames_on:
        latest: dict[bytes | None, Any] = {}
        stamps, sizes = [], []
        for r in read_to_end(ws, ws.frames_topic, idle_timeout_s=5):
            latest[r.key] = r.value
            stamps.append(r.timestamp)
            sizes.append(len(r.value))
        frames = [decode_frame(v) for v in latest.values()]
        values = [(row_kind(f.header, span_queries), f.table.num_rows * len(f.estimators)) for f in frames]
        got = {"frames": sum(1 for kind, _ in values if kind == "epoch"), "stamps": stamps, "sizes": sizes,
               **{f"{pre}estimates": sum(n for kind, n in values if kind == k) for k, pre in KINDS.items()}}
    if ws.rows_on:  # the rows are what a rows or both run is measured by
        rows = [(r.timestamp, len(r.value), row_kind(r.value, span_queries))
                for r in read_to_end(ws, ws.estimates_topic, idle_timeout_s=5)]
        got.update({f"{pre}estimates": sum(1 for *_, kind in rows if kind == k) for k, pre in KINDS.items()},
                   stamps=[t for t, _, kind in rows if kind == "epoch"],
                   sizes=[n for _, n, kind in rows if kind == "epoch"])
    return got


KINDS = {"epoch": "", "span": "span_", "rollup": "rollup_"}  # row_kind -> the prefix of its count



def _block_digest(t: Any) -> str:
    """An exact digest of a long-form table's values in row order (floats by their bits, nulls
    distinct from every value): equal digests mean equal values."""
    import hashlib

    import pyarrow as pa
    import pyarrow.compute as pc

    h = hashlib.sha256()
    for name in t.column_names:
        col = t.column(name).combine_chunks()
        h.update(name.encode() + col.is_null().to_numpy(zero_copy_only=False).tobytes())
        if pa.types.is_string(col.type):
            enc = col.dictionary_encode()
            h.update(enc.indices.fill_null(-1).to_numpy().tobytes())
            h.update("\x00".join(enc.dictionary.to_pylist()).encode())
        elif pa.types.is_list(col.type):
            h.update(pc.list_value_length(col).fill_null(-1).to_numpy().tobytes())
            flat = pc.list_flatten(col)
            for f in range(flat.type.num_fields):
                h.update(flat.field(f).to_numpy(zero_copy_only=False).tobytes())
        else:
            if pa.types.is_timestamp(col.type):
                col = col.cast(pa.int64())
            h.update(col.to_numpy(zero_copy_only=False).tobytes() if col.null_count == 0 else
                     col.drop_null().to_numpy(zero_copy_only=False).tobytes())
    return h.hexdigest()


def _frame_digests(ws: WorkerSettings) -> dict[tuple[str, int, int], tuple[int, str]]:
    """Per window, the latest frame's long-form row count and digest, read from the topic."""
    from stream_app.worker.frames import decode_frame, long_table

    out: dict[tuple[str, int, int], tuple[int, str]] = {}
    for r in read_to_end(ws, ws.frames_topic, idle_timeout_s=5):
        f = decode_frame(r.value)
        t = long_table(f)
        out[(f.header["query_id"], f.header["query_version"], f.header["epoch"])] = (t.num_rows, _block_digest(t))
    return out


def _read_back(ws: WorkerSettings, path: Path, digests: dict[tuple[str, int, int], tuple[int, str]]) -> dict[str, Any]:
    """``ptt subscribe --parquet`` of the whole frames topic, then the file read back with
    pyarrow block by block (a frame's rows are contiguous): every window's values must equal
    its frame's."""
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "stream_app.cli", "subscribe", "--parquet", str(path),  # noqa: S603
                    "--frames-topic", ws.frames_topic, "--from-beginning", "--idle-timeout", "10",
                    "--bootstrap-servers", ws.bootstrap_servers], check=True, stdout=subprocess.DEVNULL)
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    seen: dict[tuple[str, int, int], bool] = {}
    pending: Any = None
    rows = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1 << 16):
        part = pa.Table.from_batches([batch])
        pending = part if pending is None else pa.concat_tables([pending, part])
        while pending is not None and pending.num_rows:
            key = (pending["query_id"][0].as_py(), pending["query_version"][0].as_py(), pending["epoch"][0].as_py())
            n, digest = digests.get(key, (pending.num_rows + 1, ""))
            if pending.num_rows < n:
                break
            seen[key] = seen.get(key, True) and _block_digest(pending.slice(0, n)) == digest
            rows += n
            pending = pending.slice(n)
    return {"parquet_bytes": path.stat().st_size, "parquet_rows": rows, "parquet_write_s": round(write_s, 1),
            "parquet_read_s": round(time.perf_counter() - t0, 1),
            "parquet_windows_equal": sum(seen.values()), "parquet_windows_missing": len(set(digests) - set(seen)),
            "parquet_rows_left": 0 if pending is None else pending.num_rows}

_STARTED: list[WorkerProcess] = []  # every worker a scenario started: main() stops them however it ends


def scenario(name: str, broker: str, tmp: Path, *, stations: int, mode: str, epochs: int, vehicles: int | None,
             workers: int = 1, raw_baseline: bool = False, speed: float = 0.0,
             data_dir: Path | None = None, full_scrape: bool = False, sizes: bool = False,
             output: str = "rows", broker_pid: int | None = None, read_back: bool = False) -> dict[str, Any]:
    tag = f"{name}-{os.getpid()}-{int(time.time())}"
    rs = ReplaySettings(bootstrap_servers=broker, data_dir=data_dir or tmp / "data", truth=False, default_queries=False,
                        speed=speed,
                        reports_topic=f"r-{tag}", queries_topic=f"q-{tag}", truth_topic=f"t-{tag}", partitions=4,
                        synthetic_stations=stations, mode=mode, max_epochs=epochs,
                        start_epoch=max(0, min(14 * 120, 2880 - epochs)),
                        expand_to=vehicles, batch_size=50_000)
    day, load_s, fleet, queries, base = load_scenario(rs)
    procs = []
    for i in range(workers):
        ws = WorkerSettings(**base, app_id=f"bench-{tag}", estimates_topic=f"e-{tag}", dead_letter_topic=f"d-{tag}",
                            web_port=free_port(), min_participants=1,
                            estimate_output="both" if sizes else output, frames_topic=f"f-{tag}")
        if i == 0:
            ensure_stream_topics(ws)
        procs.append(WorkerProcess(ws, tmp / f"worker-{tag}-{i}.log"))
    for q in queries:
        publish_query(rs, q)
    for w in procs:
        _STARTED.append(w)
        w.start()
    for w in procs:
        w.wait_ready(120)
    for w in procs:  # the consumer group has formed and the tables are recovered
        _wait_url(w.url.replace("/metrics", "/ready"), 120)
    live = [q for q in queries if q.span_s == EPOCH_S]  # the 30-s queries: estimates and frames per epoch
    span_queries = {q.query_id for q in queries if q.span_s != EPOCH_S}
    expected = sum(q.n_stations * len(q.spec.estimator_names) for q in live) * epochs
    windows = expected_windows(queries, [int(e) for e in day.epochs[rs.start_epoch:rs.start_epoch + epochs]])
    first_epoch = int(day.epochs[rs.start_epoch])
    rss_at: dict[int, float] = {}  # epochs closed -> the worker's current RSS (MB)
    broker_at: dict[int, float] = {}  # epochs closed -> the broker's current RSS (MB)
    rss_ready = _rss_mb(procs[0].proc.pid, "VmRSS") if procs[0].proc else float("nan")
    stop = threading.Event()
    scrape: dict[str, Any] = {}

    def sample() -> None:
        while not stop.wait(1.0):
            try:
                closed = _last_closed(_scrape(procs[0], "ptt_last_closed_epoch"))
                if full_scrape and closed and not scrape:  # during the run, once every station has a series
                    scrape.update(_full_scrapes(procs[0]))
            except OSError:
                continue
            if closed and procs[0].proc:
                at = min(closed.values()) - first_epoch + 1
                rss_at[at] = _rss_mb(procs[0].proc.pid, "VmRSS")
                if broker_pid:
                    broker_at[at] = _rss_mb(broker_pid, "VmRSS")

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.time()
    summary = replay(rs, progress=False)
    replay_s = time.time() - t0
    deadline = time.time() + max(600.0, 20 * replay_s)
    while time.time() < deadline:
        if sum(_closed_epochs(_scrape(w, "ptt_epochs_closed_total")) for w in procs) >= windows:
            break
        time.sleep(1.0)
    stop.set()
    ws0 = procs[0].settings
    delivered = _delivered(ws0, span_queries)
    stamps = delivered["stamps"]
    last_s = max(stamps) / 1000.0 - t0 if stamps else float("nan")
    out: dict[str, Any] = {
        "scenario": name, "stations": stations, "vehicles": fleet, "mode": mode, "workers": workers,
        "epochs": epochs, "reports": summary.reports, "load_s": round(load_s, 2), "replay_s": round(replay_s, 2),
        "last_estimate_s": round(last_s, 2), "realtime_factor": round(epochs * 30 / last_s, 2),
        "worker_vs_replay": round(last_s / replay_s, 2), "estimates": delivered["estimates"],
        "expected_estimates": expected, "rollup_estimates": delivered["rollup_estimates"], "output": output,
        **({"span_estimates": delivered["span_estimates"]} if span_queries else {}),
        **({"frames": delivered["frames"], "expected_frames": epochs * len(live)} if ws0.frames_on else {}),
        "worker_peak_rss_mb": round(max(_rss_mb(w.proc.pid) for w in procs if w.proc), 1),
        "worker_rss_ready_mb": round(rss_ready, 1),
        "worker_rss_by_epoch_mb": {str(k): round(v, 1) for k, v in sorted(rss_at.items())
                                   if k in _milestones(epochs, rss_at)},
        "dead_letters": int(sum(_dead(_scrape(w, "ptt_dead_letters_total")) for w in procs)),
        "p99_close_latency_s": max(_p99(_scrape(w, "ptt_close_latency_seconds_bucket")) for w in procs),
    }
    if raw_baseline and stamps:
        values = delivered["sizes"]
        t_raw = raw_produce(rs, f"raw-{tag}", values)
        span = (max(stamps) - min(stamps)) / 1000.0
        out["estimate_bytes"] = sum(values)
        out["raw_produce_s"] = round(t_raw, 2)
        out["estimate_output_s"] = round(span, 2)
        out["output_vs_raw"] = round(t_raw / span, 2) if span > 0 else None
    if full_scrape:
        if not scrape:  # the run ended before the sampler got to it: the worker still runs
            scrape.update(_full_scrapes(procs[0]))
        out["metrics_scrape"] = scrape
    if sizes:
        out["sizes"] = epoch_sizes(ws0, tag)
    if broker_pid:  # the embedded broker keeps every record in memory (it honours no retention)
        out["broker_peak_rss_mb"] = round(_rss_mb(broker_pid), 1)
        out["broker_rss_by_epoch_mb"] = {str(k): round(v, 1) for k, v in sorted(broker_at.items())
                                         if k in _milestones(epochs, broker_at)}
    if read_back and ws0.frames_on:
        out.update(_read_back(ws0, tmp / f"day-{tag}.parquet", _frame_digests(ws0)))
    for w in procs:
        w.stop()
    return out


def epoch_sizes(ws: WorkerSettings, tag: str) -> dict[str, Any]:
    """One closed epoch of every query, as the worker published it, per-row JSON vs estimate
    frames: re-produced with the worker's own producer (:class:`stream_app.worker.publish.BatchSink`,
    1 MiB batches) to a fresh topic per codec, and the record batches the broker then serves
    summed (:func:`tests.benchmarks.common.stored_batches`). Frames also with Arrow IPC's own
    buffer compression (``arrow-zstd``/``arrow-lz4``; every reader of frames reads them:
    checked here with :func:`stream_app.worker.frames.decode_frame`)."""
    import asyncio

    import pyarrow as pa

    from stream_app.worker.frames import decode_frame, frame_rows
    from stream_app.worker.publish import BatchSink

    frames = [(r.key, r.value) for r in read_to_end(ws, ws.frames_topic, idle_timeout_s=5)]
    by_epoch: dict[int, list[tuple[bytes, bytes]]] = {}
    for key, value in frames:
        by_epoch.setdefault(int(decode_frame(value).header["epoch"]), []).append((key, value))
    epoch = max(by_epoch, key=lambda e: (len(by_epoch[e]), e))
    one_frames = by_epoch[epoch]
    rows = [(r.key, r.value) for r in read_to_end(ws, ws.estimates_topic, idle_timeout_s=5)
            if json.loads(r.value)["epoch"] == epoch]

    def arrow(value: bytes, codec: str) -> bytes:
        reader = pa.ipc.open_stream(value)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, reader.schema, options=pa.ipc.IpcWriteOptions(compression=codec)) as writer:
            for batch in reader:
                writer.write_batch(batch)
        out = bytes(sink.getvalue().to_pybytes())
        assert list(frame_rows(decode_frame(out))) == list(frame_rows(decode_frame(value)))  # noqa: S101
        return out

    t0 = time.process_time()
    arrow_frames = {c: [(k, arrow(v, c)) for k, v in one_frames] for c in ("zstd", "lz4")}
    arrow_cpu = (time.process_time() - t0) / 2  # both codecs, each re-encoded once
    payloads = {"rows": rows, "frames": one_frames, **{f"frames-arrow-{c}": v for c, v in arrow_frames.items()}}
    out: dict[str, Any] = {"epoch": epoch, "rows": len(rows), "frames": len(one_frames),
                           "frame_stations": sum(decode_frame(v).table.num_rows for _, v in one_frames),
                           "value_bytes": {k: sum(len(v) for _, v in recs) for k, recs in payloads.items()},
                           "arrow_reencode_cpu_s_per_codec": round(arrow_cpu, 4),
                           "method": "record batches served by Fetch (kafka-python's fetched buffers), summed"}
    topic_bytes: dict[str, dict[str, int]] = {}
    cpu: dict[str, dict[str, dict[str, float]]] = {}
    for kind, recs in payloads.items():
        for codec in ("none", "gzip", "lz4", "zstd"):
            topic = f"s-{kind}-{codec}-{tag}"
            ensure_topics(ws, {topic: ws.internal_partitions})
            s = ws.model_copy(update={"topic_compression": {topic: codec}})

            async def send(s: WorkerSettings = s, topic: str = topic, recs: list[tuple[bytes, bytes]] = recs) -> None:
                sink = BatchSink(s, topic)
                try:
                    await sink.publish(recs)
                finally:
                    await sink.stop()

            asyncio.run(send())
            batches, consume_cpu = stored_batches(ws, topic)
            codecs = {b[3] for b in batches}
            if codecs != {codec}:
                raise AssertionError(f"{topic}: the broker serves {codecs}, not {codec}")
            topic_bytes.setdefault(kind, {})[codec] = sum(b[2] for b in batches)
            cpu.setdefault(kind, {})[codec] = {"compress_cpu_s": round(compress_cpu_s(recs, codec), 4),
                                               "consume_cpu_s": round(consume_cpu, 4)}
    out["topic_bytes"] = topic_bytes
    out["cpu_per_epoch"] = cpu
    base = topic_bytes["rows"]["none"]
    out["frames_vs_rows"] = {f"{k}/{c}": round(base / b, 1) for k in payloads if k != "rows"
                             for c, b in topic_bytes[k].items()}
    out["bar_1_20"] = {k: b <= base / 20 for k, b in
                       ((f"{k}/{c}", b) for k in payloads if k != "rows" for c, b in topic_bytes[k].items())}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="p1-10,p1-500,p2,p3,p4,p5",
                        help="also: size (one epoch at 3,220 stations, rows vs frames per codec, and a full "
                             "/metrics scrape during the run)")
    parser.add_argument("--epochs-size", type=int, default=3)
    parser.add_argument("--epochs-p1", type=int, default=120)
    parser.add_argument("--epochs-p2", type=int, default=20)
    parser.add_argument("--epochs-p3", type=int, default=60)
    parser.add_argument("--epochs-p4", type=int, default=600,
                        help="P4: epochs of a paced tally run (2880: a whole day, ~36 min at 40x)")
    parser.add_argument("--speed-p4", type=float, default=40.0, help="P4's replay speed (x real time)")
    parser.add_argument("--stations-p4", type=int, default=3220,
                        help="P4's stations (500 for a whole day: the in-memory broker holds every estimate)")
    parser.add_argument("--output", choices=("rows", "frames", "both"), default="rows",
                        help="P3 and P4: the worker's PTT_ESTIMATE_OUTPUT; with frames the delivered estimates are "
                             "counted from the frames (station x estimator values). Frames for >= 500 stations: a "
                             "day at 3,220 stations is ~30 GB of rows, far less as frames")
    parser.add_argument("--data-dir", type=Path, default=cache_dir("bench"),
                        help="where synthetic days and their parse cache are kept between runs")
    args = parser.parse_args()
    stop_children_on_signals("bench_scale")  # SIGTERM/SIGINT: the cleanup below still runs
    wanted = set(args.only.split(","))
    plans: list[tuple[str, dict[str, Any]]] = [
        ("p1-10", {"stations": 10, "mode": "per-vehicle", "epochs": args.epochs_p1, "vehicles": None}),
        ("p1-500", {"stations": 500, "mode": "per-vehicle", "epochs": args.epochs_p2, "vehicles": None}),
        ("p2", {"stations": 3220, "mode": "per-vehicle", "epochs": args.epochs_p2, "vehicles": 47_719}),
        ("p3", {"stations": 3220, "mode": "tally", "epochs": args.epochs_p3, "vehicles": 10_047_719,
                "raw_baseline": True, "full_scrape": True, "output": args.output}),
        ("p4", {"stations": args.stations_p4, "mode": "tally", "epochs": args.epochs_p4, "vehicles": 10_047_719,
                "speed": args.speed_p4, "full_scrape": True, "output": args.output, "read_back": True}),
        ("p5", {"stations": 3220, "mode": "tally", "epochs": args.epochs_p2, "vehicles": 10_047_719, "workers": 4}),
        ("size", {"stations": 3220, "mode": "tally", "epochs": args.epochs_size, "vehicles": 10_047_719,
                  "full_scrape": True, "sizes": True}),
    ]
    with tempfile.TemporaryDirectory() as tmp_name, LocalBroker(log_path=Path(tmp_name) / "broker.log") as broker:
        try:
            for name, kw in plans:
                if name not in wanted:
                    continue
                out = scenario(name, broker.bootstrap, Path(tmp_name), data_dir=args.data_dir, broker_pid=broker.pid,
                               **kw)
                if name == "p5":  # the same scenario with one worker, in the same run: the speed-up
                    one = scenario("p5-one-worker", broker.bootstrap, Path(tmp_name), data_dir=args.data_dir,
                                   **{**kw, "workers": 1})
                    print(json.dumps(one), flush=True)
                    out["speedup_vs_one_worker"] = round(one["last_estimate_s"] / out["last_estimate_s"], 2)
                print(json.dumps(out), flush=True)
        finally:  # a scenario that failed leaves no worker behind
            for w in _STARTED:
                w.stop()


if __name__ == "__main__":
    main()

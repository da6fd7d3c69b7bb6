"""Real Faust worker processes for integration tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import estimators as E
from producers.fleet import epoch_rng, query_truth_counts, split_fleet
from producers.local_broker import free_port, terminate
from producers.pems import TrafficDay
from producers.settings import ReplaySettings
from schemas import Query
from schemas.estimates import Estimate
from schemas.settings import KafkaSettings
from stream_app.settings import WorkerSettings

from .kafka_helpers import drain


def env_for(settings: KafkaSettings) -> dict[str, str]:
    """The process environment plus the PTT_* variables that reproduce ``settings``."""
    return {**os.environ, **settings.to_env()}


class WorkerProcess:
    """``ptt worker`` in a subprocess, with its log in a file."""

    def __init__(self, settings: WorkerSettings, log: Path) -> None:
        self.settings = settings
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        with self.log.open("ab") as fh:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "worker"],  # noqa: S603
                                         env=env_for(self.settings), stdout=fh, stderr=subprocess.STDOUT,
                                         cwd=self.log.parent)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.web_port}/metrics"

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url, timeout=5) as r:  # noqa: S310 - loopback
            return str(r.read().decode())

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker exited ({self.proc.returncode}); log:\n{self.log.read_text()[-3000:]}")
            try:
                self.metrics()
                return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"worker not serving /metrics; log:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        terminate(self.proc)


def pipeline_settings(broker: str, tmp: Path, **replay_kw: object) -> tuple[ReplaySettings, WorkerSettings]:
    """Replay and worker settings sharing fresh topics (3 partitions) and a fresh app id."""
    u = uuid.uuid4().hex[:8]
    kafka = KafkaSettings(bootstrap_servers=broker, reports_topic=f"reports-{u}", queries_topic=f"queries-{u}",
                          truth_topic=f"truth-{u}", partitions=3)
    replay_kw = {"synthetic_stations": 6, **replay_kw}
    rs = ReplaySettings(**kafka.model_dump(), data_dir=tmp / "data", seed=11, batch_size=200,
                        **replay_kw)  # type: ignore[arg-type]
    ws = WorkerSettings(**kafka.model_dump(), app_id=f"ptt-{u}", estimates_topic=f"estimates-{u}",
                        dead_letter_topic=f"dead-{u}", internal_partitions=3, web_port=free_port(),
                        tick_interval_s=1.0, min_participants=1)
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


def read_estimates(settings: WorkerSettings) -> dict[tuple[str, int, int, int, str], Estimate]:
    """The latest estimate per (query, version, epoch, station, estimator)."""
    out: dict[tuple[str, int, int, int, str], Estimate] = {}
    for rec in drain(settings, settings.estimates_topic, quiet_polls=2):
        e = Estimate.model_validate_json(rec.value)
        out[(e.query_id, e.query_version, e.epoch, e.station, e.estimator)] = e
    return out


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(1.0)
    raise TimeoutError(f"timed out waiting for {what}")


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
            counts = ps.counts_from_sparse(ps.sample_sparse(rng, truths), n)[:, None, :]
    if q.mechanism == "sp":
        ests = {"sp_difference": E.sp_difference(mech)}
    elif q.mechanism == "alp":
        ests = E.alp_estimators(mech)
    else:
        ests = {"rr": E.rr_estimator(mech)}
    out: dict[str, Any] = {}
    for name, est in ests.items():
        values = est.estimate(counts, n)
        out[name] = (values, {c: est.score_interval(values, n, c) for c in confidences}, n)
    return out

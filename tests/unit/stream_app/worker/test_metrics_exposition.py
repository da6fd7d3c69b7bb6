"""The worker's /metrics text: the per-station families written from their arrays
(StationArrays.expose) say exactly what prometheus_client's own rendering of the same
registry says, and follow every change of the arrays."""

from __future__ import annotations

import math

import numpy as np
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stream_app.worker.metrics import StationArrays


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            value = s.value
            out[(s.name, tuple(sorted(s.labels.items())))] = "NaN" if math.isnan(value) else value
    return out


def _registry() -> tuple[CollectorRegistry, StationArrays]:
    reg = CollectorRegistry()
    arrays = StationArrays()
    reg.register(arrays)
    Gauge("ptt_other", "Another metric", ["query"], registry=reg).labels(query="sp-day").set(3)
    stations = [400001, 400002, 400003]
    est = np.array([1.5, float("nan"), 2.5e7])
    arrays.set_estimates('q"\\x\n', "sp", "sp_difference", stations, est, np.stack([est - 1, est - 2]),
                         np.stack([est + 1, est + 2]), (0.95, 0.99))
    arrays.set_estimates("alp-day", "alp", "alp_sum", stations, -est, np.stack([-est - 1]), np.stack([-est + 1]),
                         (0.9,))
    arrays.set_truth(stations, [10.0, float("nan"), float("inf")])
    return reg, arrays


def test_expose_says_what_prometheus_client_says() -> None:
    reg, arrays = _registry()
    fast, slow = arrays.expose(reg), generate_latest(reg)
    assert _samples(fast) == _samples(slow)
    assert len(_samples(fast)) == 1 + 3 * (1 + 2 * 2) + 3 * (1 + 2 * 1) + 2
    assert fast.count(b"# TYPE ") == slow.count(b"# TYPE ")  # every family once, with its HELP and TYPE
    assert _samples(generate_latest(reg)) == _samples(slow)  # expose() leaves the collector as it was


def test_expose_follows_every_change_of_the_arrays() -> None:
    reg, arrays = _registry()
    arrays.expose(reg)  # cached now
    arrays.set_estimates("alp-day", "alp", "alp_sum", [400001], np.array([7.0]), np.array([[6.0]]),
                         np.array([[8.0]]), (0.9,))
    labels = (("estimator", "alp_sum"), ("mechanism", "alp"), ("query", "alp-day"), ("station", "400001"))
    assert _samples(arrays.expose(reg))[("ptt_estimate_vehicles", labels)] == 7.0
    arrays.set_truth([400009], [4.0])
    assert _samples(arrays.expose(reg))[("ptt_ground_truth_vehicles", (("station", "400009"),))] == 4.0
    assert _samples(arrays.expose(reg)) == _samples(generate_latest(reg))

"""Stage 2's plan for the shuffled epsilon (``stream_app.worker.stage2``): ``shuffled_needs`` names the
(query, size) pairs the closing epochs need that the cache lacks -- the worker computes them
off its event loop (``ShuffledEpsilon.warm`` in an executor) -- and after that ``epoch_outputs``
publishes every closed epoch's value from the cache, computing nothing more."""

from __future__ import annotations

import pytest

from schemas import Query
from stream_app.worker.estimate import ShuffledEpsilon
from stream_app.worker.stage2 import OutputSettings, epoch_outputs, shuffled_needs
from stream_app.worker.windows import Outcome
from tests.unit.stream_app.worker.test_estimate import CONF, N_PARTITIONS, QE, QUERIES, run
from tests.unit.stream_app.worker.test_estimate_shuffled import attest, count_bound_calls


def test_needs_then_warm_then_publish_without_computing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_bound_calls(monkeypatch)
    q = QUERIES["alp"]
    _, attested, _ = run(q)
    n = min(attest(attested, q).values())
    _, direct, _ = run(q)  # the direct replay's markers: nothing to compute
    outcome = Outcome()
    outcome.closed = [(attested, "markers"), (direct, "markers")]

    def known(query_id: str, version: int) -> Query | None:
        return q if (query_id, version) == (q.query_id, q.version) else None

    out = OutputSettings(CONF, 1, N_PARTITIONS, ShuffledEpsilon(1e-6))
    assert shuffled_needs(outcome, known, out) == [(q, n, "permuted")]  # a size without a release: permuted
    assert shuffled_needs(outcome, known, OutputSettings(CONF, 1, N_PARTITIONS)) == []  # no cache: nothing
    assert out.shuffled is not None
    out.shuffled.warm(shuffled_needs(outcome, known, out))
    assert len(calls) == 1 and shuffled_needs(outcome, known, out) == []
    results = list(epoch_outputs(outcome, known, lambda _: QE[q.mechanism], out))
    assert len(calls) == 1  # published from the cache
    assert [r.epsilon_shuffled is not None for r in results] == [True, False]
    assert [r.shuffle_null for r in results] == [None, "not_attested"]

"""A vehicle's whole-day epsilon on the worker's ``/metrics`` (``ptt_vehicle_day_epsilon``): the
figure the demo's banner, ``ptt analyst list``, ``summary.txt``/``summary.json`` and the plots
give, from the same function (:func:`stream_app.day_figure.vehicle_day`), over every query the
worker has read from the queries topic (the newest version of each, as ``ptt analyst list``).

* **Which release.** The worker does not know whether a shuffler is in front of it; its
  published epochs say so. The figure is for the path of the newest published epoch of each
  query (:func:`release_path`): the shuffler's release when every query's newest one attests
  the same release -- the figure the banner gives for the shuffler's path -- (the permuted
  release's when some attest aggregate and some permuted: it bounds both), ``local`` when
  some went direct (unattested, as ``ptt_query_epsilon_shuffled`` has no series for it: the
  local figure holds whatever path a report took; a shuffled one would not), and no figure
  before any epoch has been published (the path is not known yet).
* **Off the event loop.** The demo's queries at its 125,119 vehicles and 16 stations took 21-24 s
  of CPU and 1.3 GB at its peak (privacy loss distributions over 2,880 epochs; 2 s at 247
  vehicles), much of it Python that holds the GIL: in a thread of the worker it would take
  turns with stage 1 and 2 for the one GIL (a child process runs beside them on another core)
  and keep its memory afterwards. It runs in a child process
  (``python -m stream_app.worker.day_metric``: the queries as JSON in, the figure as JSON out), killed
  when the worker stops or when what it computes is no longer current, once per change of the
  running queries (id and version) or of the path (:func:`figure_key`); the last figure stays on
  ``/metrics`` until then.
* **No figure rather than a stale one.** While none is computed for the running queries and
  path, ``ptt_vehicle_day_epsilon`` has no series and ``ptt_vehicle_day_epsilon_state`` says why
  (:data:`STATES`). Nothing per vehicle is a label: release, query, state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from schemas import Query

from ..day_figure import crowd, newest, release_of, unbounded, vehicle_day

if TYPE_CHECKING:  # the child process (main) does without
    from .estimate import EpochResult

__all__ = ["RETRY_S", "STATES", "Compute", "DayFigure", "DayMonitor", "VehicleDay", "figure", "figure_key",
           "in_child", "main", "release_path"]

log = logging.getLogger(__name__)

#: what ``ptt_vehicle_day_epsilon_state`` can say: no query read yet; no epoch published yet (the
#: path is not known); a figure being computed; the figure shown; no query has a whole-day bound
#: (Sampling Privacy only); the computation failed (logged; tried again after ``RETRY_S``)
STATES = ("no_queries", "no_epochs", "computing", "ready", "no_bound", "failed")
RETRY_S = 60.0


@dataclass(frozen=True)
class DayFigure:
    """A vehicle's day across ``counted`` ((query, version) with a whole-day bound), for ``release``
    among ``shuffle_size`` reports (None: local); ``epsilon`` None: no query has a bound."""

    release: str
    epsilon: float | None
    shuffle_size: int | None
    counted: tuple[tuple[str, int], ...]
    line: str


def figure(queries: Sequence[Query], release: str) -> DayFigure:
    """The day figure of ``queries`` for ``release``, by :func:`~stream_app.day_figure.vehicle_day`
    (the banner's and ``ptt analyst list``'s function), with the n and the queries it counts."""
    line, epsilon = vehicle_day(list(queries), release)
    answered = newest(queries)
    counted = tuple((q.query_id, q.version) for q in answered if not unbounded(q))
    return DayFigure(release, epsilon, None if release == "local" else crowd(answered), counted, line)


def figure_key(queries: Sequence[Query], release: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    """What a figure depends on: the release and each query's newest version (versions are immutable).

    >>> from types import SimpleNamespace as Q
    >>> figure_key([Q(query_id="b", version=1), Q(query_id="a", version=2), Q(query_id="a", version=1)], "local")
    ('local', (('a', 2), ('b', 1)))
    """
    return release, tuple((q.query_id, q.version) for q in newest(queries))


def release_path(newest_epochs: Mapping[str, str | None]) -> str | None:
    """The release a vehicle's day is accounted for, from the release of each query's newest
    published epoch (None: not attested, the direct path): :func:`release_of` of them, as the
    report's; None before any epoch is published.

    >>> release_path({"alp": "aggregate", "unary": "aggregate"}), release_path({"alp": None})
    ('aggregate', 'local')
    >>> release_path({"alp": "aggregate", "unary": None}), release_path({"a": "aggregate", "b": "permuted"})
    ('local', 'permuted')
    >>> release_path({}) is None
    True
    """
    if not newest_epochs:
        return None
    return release_of(newest_epochs.values())


Compute = Callable[[Sequence[Query], str], Awaitable[DayFigure]]


class DayMonitor(Protocol):
    """Where the figure goes: :meth:`stream_app.worker.metrics.StreamMonitor.on_vehicle_day` (which
    imports :data:`STATES` from here)."""

    def on_vehicle_day(self, state: str, release: str = ..., epsilon: float | None = ...,
                       shuffle_size: int | None = ..., counted: Sequence[tuple[str, int]] = ...,
                       seconds: float | None = ...) -> None: ...


async def in_child(queries: Sequence[Query], release: str) -> DayFigure:
    """:func:`figure` in a child process (``python -m stream_app.worker.day_metric``); cancelling kills it."""
    job = json.dumps({"release": release, "queries": [q.model_dump_json() for q in queries]}).encode()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "stream_app.worker.day_metric",
                                                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await proc.communicate(job)
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"the day figure's process exited with {proc.returncode}: {err.decode()[-2000:]}")
    got: dict[str, Any] = json.loads(out)
    return DayFigure(got["release"], got["epsilon"], got["shuffle_size"],
                     tuple((q, int(v)) for q, v in got["counted"]), got["line"])


class VehicleDay:
    """Keeps the worker's ``ptt_vehicle_day_*`` gauges current: told of every published epoch
    (:meth:`on_epoch_closed`) and of the queries after each read of the queries topic
    (:meth:`follow`, on the event loop: it only starts or cancels the computation)."""

    def __init__(self, monitor: DayMonitor, compute: Compute = in_child) -> None:
        self._monitor = monitor
        self._compute = compute
        self._newest: dict[str, tuple[int, str | None]] = {}  # query -> (epoch, release) of its newest epoch
        self._key: tuple[str, tuple[tuple[str, int], ...]] | None = None  # of the figure shown or computing
        self._task: asyncio.Task[None] | None = None
        self._state = ""
        self._set_state("no_queries")

    def on_epoch_closed(self, r: EpochResult) -> None:
        """An epoch decided: a published one's release is its query's path (a withheld one released nothing)."""
        if r.retracted or r.withheld is not None:
            return
        qid = r.query.query_id
        if qid not in self._newest or r.epoch >= self._newest[qid][0]:
            self._newest[qid] = (r.epoch, r.release)

    def follow(self, queries: Sequence[Query]) -> None:
        """The queries as read now: start computing their figure if it is not the one shown or computing."""
        release = release_path({q: rel for q, (_, rel) in self._newest.items()})
        if not queries or release is None:
            self._cancel()
            self._key = None
            self._set_state("no_queries" if not queries else "no_epochs")
            return
        key = figure_key(queries, release)
        if key == self._key:
            return
        self._cancel()
        self._key = key
        self._set_state("computing")
        self._task = asyncio.ensure_future(self._run(key, list(queries), release))

    async def _run(self, key: tuple[str, tuple[tuple[str, int], ...]], queries: list[Query], release: str) -> None:
        started = time.monotonic()
        try:
            fig = await self._compute(queries, release)
        except Exception:
            log.exception("could not compute a vehicle's day for %s (release %s); trying again in %.0f s",
                          key[1], release, RETRY_S)
            self._set_state("failed")
            await asyncio.sleep(RETRY_S)
            if self._key == key:
                self._key = None  # the next follow() starts it again
            return
        seconds = time.monotonic() - started
        log.info("%s (computed in %.1f s)", fig.line, seconds)
        self._state = "ready" if fig.epsilon is not None else "no_bound"
        self._monitor.on_vehicle_day(self._state, fig.release, fig.epsilon, fig.shuffle_size, fig.counted, seconds)

    def _set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            self._monitor.on_vehicle_day(state)

    def _cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None

    async def close(self) -> None:
        """Stop a computation still running (its process killed)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def main() -> int:
    """The child's side of :func:`in_child`: ``{"release", "queries": [JSON]}`` on stdin, the figure on stdout."""
    job = json.loads(sys.stdin.read())
    queries = [Query.model_validate_json(q) for q in job["queries"]]
    json.dump(asdict(figure(queries, job["release"])), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``ptt demo``: everything on one machine with nothing configured.

Starts the embedded broker, a stream-app worker (serving /metrics), Prometheus scraping it
when the ``prometheus`` binary is installed (Debian package ``prometheus``), and replays the
synthetic day (or a PeMS file) at a watchable speed. After the replay it keeps serving until
Ctrl-C (or exits with ``--exit-when-done``). However it ends, it reads the estimates and
ground-truth topics to their end, saves them as JSON lines in the output directory with a
``ptt report`` of them, saves the estimate frames (the worker publishes rows and frames) as
``estimates.parquet`` in long form, and stops everything it started: no process is left behind.

The demo is a list of helper processes (:class:`~.helper_process.HelperProcess`): the broker,
then the worker, the shuffler and Prometheus, each started once the one before is ready and
watched from then on (:class:`~.supervise.Watch`). They run in their own process groups, so a
terminal's Ctrl-C reaches only the demo, which then stops them in order (the broker last, after
its topics have been saved).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from producers.settings import ReplaySettings
from schemas.epochs import EPOCH_S, epoch_start
from schemas.settings import KafkaSettings, cache_dir

from ..settings import WorkerSettings
from ..shuffler.settings import ShufflerSettings
from .base import add_settings_flags, ptt_command, settings_from_args
from .cpu import cpu_words, own_cpu_s, process_cpu_s
from .demo_output import output_may_close
from .demo_settings import DEFAULT_METRICS_PORT, DEFAULT_PROMETHEUS_PORT, DemoSettings, demo_query_mechanisms
from .errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_PORT, EXIT_UNPUBLISHED, CliError, error_line
from .helper_process import HelperProcess, Ports, stop_all
from .local_broker import LocalBroker, PortInUse, free_port, port_free
from .private_dir import private_dir
from .replay import delivery_failures_message, replay_summary_lines
from .supervise import Watch

if TYPE_CHECKING:
    from producers.replay import ReplaySummary
    from producers.stopping import StopFlag
    from schemas import Query

#: seconds the helpers get to stop gracefully once asked (then SIGKILL); the topics are saved meanwhile
STOP_GRACE_S = 2.0
#: every line the demo prints, also kept in the output directory (a `| tee` a Ctrl-C ended misses the last ones)
RUN_LOG = "run.log"
#: from this many stations the demo's worker publishes estimate frames only (docs/operations.md:
#: a 3,220-station day of rows is ~32 GB); the report is then drawn from ``estimates.parquet``
FRAMES_ONLY_STATIONS = 500
#: the queries the run answered, saved next to the estimates (``ptt report --queries``)
QUERIES_FILE = "queries.jsonl"
#: what a day cap dropped per query, span and station (a simulation diagnostic, never published)
CAP_DROPS_FILE = "cap-drops.csv"
#: what :func:`write_report`'s line says when a Ctrl-C stopped it (the demo then exits 130)
REPORT_INTERRUPTED = "(Ctrl-C)"

__all__ = ["CAP_DROPS_FILE", "FRAMES_ONLY_STATIONS", "QUERIES_FILE", "RUN_LOG", "Closing", "add_parser",
           "choose_port", "cut_epoch_note", "output_may_close", "prometheus_config", "read_frames", "run", "run_demo",
           "save_topics", "secret_dir", "start_index", "unpublished", "write_report"]


def add_parser(sub: Any) -> None:
    d = sub.add_parser("demo", help="embedded broker + worker + Prometheus + a replayed day, nothing to configure",
                       description="Start the embedded broker, a stream-app worker and Prometheus, replay the "
                                   "synthetic day (or a PeMS file), and save the estimates, ground truth and a "
                                   "report into --out when it ends (done, --exit-when-done, or Ctrl-C).")
    add_settings_flags(d, DemoSettings)
    d.add_argument("--no-shuffler", dest="via_shuffler", action="store_const", const=False,
                   help="replay straight into the worker's topic, without the shuffler: only the local figure "
                        "holds (the same as --no-via-shuffler)")
    d.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return run_demo(settings_from_args(DemoSettings, args))


def prometheus_config(targets: list[str], scrape_interval_s: int = 5) -> str:
    """A Prometheus configuration scraping the workers' /metrics."""
    joined = ", ".join(f'"{t}"' for t in targets)
    return (f"global:\n  scrape_interval: {scrape_interval_s}s\n  evaluation_interval: {scrape_interval_s}s\n"
            f"scrape_configs:\n  - job_name: ptt-stream\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: [{joined}]\n")


def choose_port(explicit: int | None, default: int, what: str) -> tuple[int, str]:
    """The port to use and a note: an explicit port must be free (:class:`PortInUse`); the
    default is taken when free, else a free one is chosen and the note says so."""
    if explicit is not None:
        if not port_free(explicit):
            raise PortInUse(f"{what} port {explicit} is already in use; choose another or leave it out")
        return explicit, ""
    if port_free(default):
        return default, ""
    port = free_port()
    return port, f" (port {default} is taken, using {port})"


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback
            body: bytes = r.read()
            return body
    except OSError:
        return None


def _answers(url: str, holding: bytes) -> bool:
    """``url`` answers, with ``holding`` in its body."""
    body = _get(url)
    return body is not None and holding in body


def _python_helper(command: str) -> list[str]:
    """``python -m stream_app.cli COMMAND``."""
    return [sys.executable, "-m", "stream_app.cli", command]


def _worker(ws: WorkerSettings, port_given: bool, log: Path) -> HelperProcess:
    """The demo's stream-app worker, ready once its /metrics carries ``ws.instance_token`` (a
    port given explicitly is never changed)."""
    return HelperProcess("stream-app worker", _python_helper("worker"),
                         env=lambda ports: ws.model_copy(update={"web_port": ports[0]}).to_env(),
                         ready=lambda ports: _ours_metrics(f"http://127.0.0.1:{ports[0]}/metrics", ws.instance_token),
                         log=log, ports=(ws.web_port,), timeout_s=90, fresh_port=free_port,
                         port_taken=lambda code: not port_given and code == EXIT_PORT)


def _shuffler(ss: ShufflerSettings, log: Path) -> HelperProcess:
    """The demo's shuffler on ports (its /metrics, its front door), ready once its front door
    answers (the replay's devices upload there) or, without one, its own /metrics."""
    door = ss.http_port != 0

    def env(ports: Ports) -> dict[str, str]:
        return ss.model_copy(update={"metrics_port": ports[0], "http_port": ports[1] if door else 0}).to_env()

    def ready(ports: Ports) -> bool:
        if door:
            return _answers(f"http://127.0.0.1:{ports[1]}/v1/health", b"")
        return _answers(f"http://127.0.0.1:{ports[0]}/metrics", b"ptt_shuffler_")

    return HelperProcess("shuffler", _python_helper("shuffler"), env=env, ready=ready, log=log,
                         ports=(ss.metrics_port, ss.http_port), timeout_s=90, fresh_port=free_port,
                         port_taken=lambda code: code == EXIT_PORT)


def _prometheus(binary: str, targets: Callable[[], list[str]], out: Path, port: int, port_given: bool) -> HelperProcess:
    """Prometheus scraping ``targets`` (asked when it starts: the ports the helpers before it
    got), its data in ``out/tsdb``, ready once it answers with the demo's own configuration
    (not another Prometheus on that port)."""
    cfg = (out / "prometheus.yml").absolute()

    def command(ports: Ports) -> list[str]:
        cfg.write_text(prometheus_config(targets()))
        return [binary, f"--config.file={cfg}", f"--storage.tsdb.path={out / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{ports[0]}"]

    return HelperProcess("Prometheus", command,
                         ready=lambda ports: _ours_prometheus(f"http://127.0.0.1:{ports[0]}", cfg),
                         log=out / "prometheus.log", ports=(port,), timeout_s=60, fresh_port=free_port,
                         port_taken=lambda code: not port_given)


@dataclass
class _Helpers:
    """The demo's helper processes besides the broker, in the order they start: the stream-app
    worker, the shuffler (``--via-shuffler``), Prometheus (when installed)."""

    ws: WorkerSettings
    worker: HelperProcess
    shuffler: HelperProcess | None = None
    released: str = ""  # --via-shuffler: what the shuffler releases
    door: bool = False  # --transport http: the shuffler serves a front door
    prometheus: HelperProcess | None = None

    @property
    def started(self) -> list[HelperProcess]:
        """In start order."""
        return [h for h in (self.worker, self.shuffler, self.prometheus) if h is not None]

    @property
    def stopping(self) -> list[HelperProcess]:
        """In stop order (the broker after them all)."""
        return [h for h in (self.shuffler, self.worker, self.prometheus) if h is not None]

    @property
    def http_port(self) -> int:
        """The shuffler's front door (``--transport http``; else ReplaySettings' default, unused)."""
        return self.shuffler.ports[1] if self.door and self.shuffler is not None else 8080

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.worker.ports[0]}/metrics"

    def start(self, watch: Watch) -> None:
        """Start each in turn, ready before the next (:meth:`HelperProcess.start`), and watch it."""
        for h in self.started:
            h.start(check=watch.check)
            watch.add(h, f"{h.name} (and its HTTP front door)" if h is self.shuffler and self.door else None)


def _helpers(demo: DemoSettings, plan: _Plan, bootstrap: str) -> _Helpers:
    """The demo's helpers (:class:`_Helpers`), not started: the worker on the metrics port chosen,
    the shuffler on free ports, Prometheus on its port scraping the two."""
    out = demo.out
    ws = WorkerSettings(bootstrap_servers=bootstrap, web_port=plan.metrics[0], min_participants=1,
                        worker_dir=out / "worker", instance_token=secrets.token_hex(8),  # its identity on /metrics
                        estimate_output="frames" if plan.frames_only else "both")
    helpers = _Helpers(ws, _worker(ws, demo.metrics_port is not None, out / "worker.log"))
    if demo.via_shuffler:
        metrics_port, http_port = free_port(), free_port()  # its /metrics (scraped by Prometheus), its front door
        ss = ShufflerSettings(bootstrap_servers=bootstrap, metrics_port=metrics_port,
                              http_port=http_port if demo.transport == "http" else 0, **plan.enrolled)
        ss = ss.model_copy(update={"release": demo.release}) if demo.release is not None else ss
        helpers.shuffler, helpers.released = _shuffler(ss, out / "shuffler.log"), ss.release
        helpers.door = ss.http_port != 0
    prom_bin = shutil.which("prometheus")
    if prom_bin:
        def targets() -> list[str]:
            return [f"127.0.0.1:{h.ports[0]}" for h in (helpers.worker, helpers.shuffler) if h is not None]

        helpers.prometheus = _prometheus(prom_bin, targets, out, plan.prometheus[0], demo.prometheus_port is not None)
    return helpers


def _ours_metrics(url: str, token: str) -> bool:
    """The worker this demo started answers at ``url``: its /metrics carries the demo's token
    (``PTT_INSTANCE_TOKEN``), not merely any ``ptt_`` line another program's worker would have."""
    from ..worker.app import INSTANCE_HEADER

    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback
            return bool(r.headers.get(INSTANCE_HEADER) == token)
    except OSError:
        return False


def _ours_prometheus(base: str, config: Path) -> bool:
    if _get(base + "/-/ready") is None:
        return False
    flags = _get(base + "/api/v1/status/flags")
    try:
        return flags is not None and json.loads(flags)["data"]["config.file"] == str(config)
    except (ValueError, KeyError, TypeError):
        return False


def _closed_epochs(metrics_url: str, families: tuple[bytes, ...] = (b"ptt_epochs_closed_total{",)) -> float:
    """Epochs (or with ``families``, other outcomes) the worker has counted so far, every query and reason."""
    body = _get(metrics_url) or b""
    return sum(float(line.rsplit(b" ", 1)[1]) for line in body.splitlines() if line.startswith(families))


def expected_rollups(queries: list[Query], epochs: Iterable[int]) -> int:
    """The rollups (:mod:`stream_app.worker.rollups`) a replay of ``epochs`` completes: those whose
    every epoch it marks for the same query version.

    >>> from schemas import Query
    >>> from schemas.epochs import epoch_start
    >>> day = Query(query_id="q", analyst_id="a", version=1, sensors=(1, 2), mechanism="sp",
    ...             population=100, t_start=epoch_start(60_000), t_end=epoch_start(61_000))
    >>> expected_rollups([day], range(60_000, 60_025))  # 5-minute rollups from 60,000 and 60,010
    2
    """
    from producers.replay import active_queries

    from ..worker.rollups import SPANS

    active = {e: {(q.query_id, q.version) for q in active_queries(queries, epoch_start(e)) if not q.is_span}
              for e in epochs}  # a span query has no rollups: its rows are its span's flows
    return sum(len(set.intersection(*(active.get(start + i, set()) for i in range(span))))
               for span in SPANS for start in {e - e % span for e in active})


def expected_windows(queries: list[Query], epochs: Iterable[int]) -> int:
    """The (query, epoch) windows a replay of ``epochs`` marks: the queries active at each; a span
    query's once a span, at the first epoch of each span that starts among ``epochs`` (one begun
    before them sends nothing; the last, cut short, is marked interrupted).

    >>> from schemas import Query
    >>> from schemas.epochs import epoch_start
    >>> day = Query(query_id="q", analyst_id="a", version=1, sensors=(1, 2), mechanism="sp",
    ...             population=100, t_start=epoch_start(60_000), t_end=epoch_start(60_002))
    >>> expected_windows([day], range(59_999, 60_004))  # epochs 60,000 and 60,001
    2
    >>> expected_windows([day, day.model_copy(update={"version": 2})], range(60_000, 60_001))  # newest only
    1
    """
    from producers.replay import active_queries

    return sum(sum(q.span_start(e) == e for q in active_queries(queries, epoch_start(e))) for e in epochs)


@dataclass(frozen=True)
class Closing:
    """How far the worker got once the demo stopped waiting: the windows the replay marked (each
    query's epochs, a span query's spans) and those it closed, the rollups the replay completes
    and those it decided."""

    windows: int
    closed: int
    rollups: int = 0
    decided: int = 0

    @property
    def complete(self) -> bool:
        return self.closed >= self.windows and self.decided >= self.rollups


def _wait_closed(metrics_url: str, windows: int, stop: StopFlag, timeout_s: float = 60.0, rollups: int = 0,
                 check: Callable[[], None] = lambda: None, shuffler_port: int | None = None) -> Closing:
    """After the replay: until the worker has closed every window the replay marked and decided
    every rollup it completes (complete), or a stop, or ``timeout_s`` without one more closed or
    decided (a stalled pipeline; a busy one that still makes progress is waited for). Each
    stage-2 partition closes its own epochs, so the newest closed epoch says nothing of the
    older ones: the closed epochs are counted; so are the records a shuffler (``shuffler_port``) read."""
    decided = (b"ptt_rollups_total{", b"ptt_withheld_rollups_total{")
    progress, read, deadline, got = -1.0, -1.0, time.monotonic() + timeout_s, Closing(windows, 0, rollups, 0)
    while time.monotonic() < deadline and not stop.requested:
        check()  # a helper that exited meanwhile (:meth:`~.supervise.Watch.check`)
        got = Closing(windows, int(_closed_epochs(metrics_url)), rollups, int(_closed_epochs(metrics_url, decided)))
        if got.complete:
            break
        now_read = (_closed_epochs(f"http://127.0.0.1:{shuffler_port}/metrics", (b"ptt_shuffler_records_total{",))
                    if shuffler_port else 0.0)
        if got.closed + got.decided > progress or now_read > read:
            progress, read, deadline = got.closed + got.decided, now_read, time.monotonic() + timeout_s
        stop.wait(0.5)
    return got


def unpublished(closing: Closing, code: int, saved: int) -> tuple[int, str | None]:
    """The demo's exit code and error line once it has saved what was published (``saved``
    estimates): a replay with windows or rollups never published -- the pipeline stalled --
    exits ``EXIT_UNPUBLISHED`` and says how many are missing, unless it exits otherwise already
    (``code``: interrupted, delivery failures).

    >>> code, line = unpublished(Closing(windows=11_808, closed=215, rollups=3_360, decided=60), EXIT_OK, 860)
    >>> code == EXIT_UNPUBLISHED
    True
    >>> print(line)  # doctest: +NORMALIZE_WHITESPACE
    ptt demo: error: 11,593 of the 11,808 windows the replay sent (each query's epochs, a span query's
    spans) and 3,300 of its 3,360 rollups were never published (860 estimates saved); the worker or the
    shuffler stalled: see worker.log and shuffler.log in the output folder
    >>> unpublished(Closing(windows=20, closed=20), EXIT_OK, 100), unpublished(Closing(20, 3), EXIT_INTERRUPTED, 9)
    ((0, None), (130, None))
    """
    if closing.complete or code != EXIT_OK:
        return code, None
    rollups = (f" and {closing.rollups - closing.decided:,} of its {closing.rollups:,} rollups"
               if closing.decided < closing.rollups else "")
    what = (f"{max(closing.windows - closing.closed, 0):,} of the {closing.windows:,} windows the replay sent (each "
            f"query's epochs, a span query's spans){rollups} were never published ({saved:,} estimates saved)")
    return EXIT_UNPUBLISHED, error_line("demo", what, "the worker or the shuffler stalled: see worker.log and "
                                                      "shuffler.log in the output folder")


def save_topics(settings: KafkaSettings, topics: dict[str, Path], idle_timeout_s: float = 1.0) -> dict[str, int]:
    """Read each topic to its end and write its values as lines; returns the lines written."""
    from schemas.kafka_io import read_to_end

    counts: dict[str, int] = {}
    for topic, path in topics.items():
        n = 0
        with path.open("wb") as fh:
            try:
                for rec in read_to_end(settings, topic, idle_timeout_s=idle_timeout_s):
                    if rec.value:
                        fh.write(rec.value.rstrip(b"\n") + b"\n")
                        n += 1
            except LookupError:
                pass  # the topic was never created: nothing to save
        counts[topic] = n
    return counts


def read_frames(settings: KafkaSettings, topic: str, idle_timeout_s: float = 1.0) -> list[bytes]:
    """The estimate frames topic read to its end: the latest frame per window
    (:func:`stream_app.subscribe.latest_frames`); an absent topic gives none. Read while the
    broker runs; written (:func:`stream_app.subscribe.write_frames`) once it has stopped."""
    from schemas.kafka_io import read_to_end

    from ..subscribe import latest_frames

    try:
        return latest_frames((rec.key, rec.value) for rec in read_to_end(settings, topic, idle_timeout_s=idle_timeout_s)
                             if rec.value)
    except LookupError:  # the topic was never created: nothing to save
        return []


def write_report(estimates: Path, truth: Path, out: Path, say: Callable[[str], None] | None = None,
                 queries: Sequence[Query] = (), plots: bool = True) -> str:
    """The report of the saved files (``ptt report``'s defaults), in process; returns one line
    saying what it wrote, or why there is none. The summary is written first and ``say`` told
    of it; the plots follow (about a second each on a busy machine), and a Ctrl-C while they
    are drawn (a KeyboardInterrupt) skips the rest: the line then gives the command that
    draws them. ``queries``: those the run answered (the summary and the plots' titles give a
    vehicle's whole day across them); what a day cap dropped is read from ``cap-drops.csv``
    beside ``estimates``, if the replay wrote one. ``plots=False`` (``--no-plots``): the summary only; the line
    gives the command that draws them."""
    from .. import report
    from .report import read_cap_drops_file, read_file

    summary = out / "summary.txt"
    drops = estimates.parent / CAP_DROPS_FILE  # the replay wrote it if a query has a day cap
    again = (f"`ptt report --estimates {estimates} --truth {truth} --queries {estimates.parent / QUERIES_FILE}"
             + (f" --cap-drops {drops}" if drops.exists() else "") + f" --out {out}` draws them")

    def before_plots(path: Path) -> None:
        if say is not None:
            say(f"report      {path}; drawing the plots into {out}/ (Ctrl-C skips them)")

    try:
        truth_lines = read_file(str(truth)) if truth.exists() and truth.stat().st_size else None
        rows = (report.estimates_of_long_table(estimates) if estimates.suffix == ".parquet"
                else read_file(str(estimates)))
        cap_drops = read_cap_drops_file(str(drops)) if drops.exists() else None
        _, drawn = report.write_report(rows, truth_lines, out, where=str(estimates), before_plots=before_plots,
                                       queries=queries, plots=plots, cap_drops=cap_drops)
    except (CliError, report.ReportError) as exc:
        return f"no report: {error_line('report', str(exc))}"
    except KeyboardInterrupt:
        if not summary.exists():
            return f"none {REPORT_INTERRUPTED}"
        return f"{summary}; plots skipped {REPORT_INTERRUPTED}: {again}"
    if not plots:
        return f"{summary} (--no-plots: {again})"
    return f"{summary} and {len(drawn)} plots in {out}/"


def _report(estimates: Path, truth: Path, out: Path, queries: Sequence[Query], code: int, plots: bool = True) -> int:
    """The report of the saved run, said in one line; the exit code (130 if a Ctrl-C cut it)."""
    done = write_report(estimates, truth, out / "report", say=lambda line: print(line, flush=True), queries=queries,
                        plots=plots)
    print(f"report      {done}", flush=True)
    return EXIT_INTERRUPTED if REPORT_INTERRUPTED in done else code


def cut_epoch_note(replayed: int, truth_epochs: int) -> str:
    """Why the ground truth can hold one epoch more than were replayed: the epoch a stop cut
    short has its truth, and its reports in part, but is marked interrupted, not counted.

    >>> cut_epoch_note(72, 73)
    ' (one more than replayed: the epoch the stop cut short, marked interrupted and withheld)'
    >>> cut_epoch_note(72, 72)
    ''
    """
    if truth_epochs == replayed + 1:
        return " (one more than replayed: the epoch the stop cut short, marked interrupted and withheld)"
    return ""


def _vehicle_day(demo: DemoSettings, rs: ReplaySettings, day: Any) -> str:
    """The start-up's per-vehicle day: every demo query, for the release the demo uses (the
    shuffler's, or local on the direct path; a query without a whole-day bound, Sampling
    Privacy's, is left out of the figure and said so), then once what that figure means."""
    from estimators import plain_words
    from producers.replay import default_fleet, default_queries

    from ..day_figure import vehicle_day

    release = (demo.release or ShufflerSettings().release) if demo.via_shuffler else "local"
    line, epsilon_day = vehicle_day(default_queries(day, default_fleet(day, rs), rs.mechanisms, rs.flow_day_budget,
                                                    rs.day_budget, cache_dir("plans")),
                                    release)
    line += ("" if demo.via_shuffler else "; --no-shuffler: only this local figure holds"
             + (f" (the planned day of {demo.day_budget:g} needs the shuffler)" if demo.plan_day else ""))
    return line + "\n" + " " * 12 + plain_words(epsilon_day)


def start_index(first_epoch: int, start_s: int) -> int:
    """The index, in a day starting at ``first_epoch``, of the first epoch at or after ``start_s``
    seconds past midnight (Pacific).

    >>> from schemas.epochs import epoch_of
    >>> from datetime import datetime
    >>> from schemas.epochs import PACIFIC
    >>> midnight = epoch_of(datetime(2026, 11, 18, tzinfo=PACIFIC))
    >>> start_index(midnight, 6 * 3600), start_index(midnight + 10, 0), start_index(midnight + 10, 60)
    (720, 0, 0)
    """
    local = epoch_start(first_epoch)
    into = local.hour * 3600 + local.minute * 60 + local.second
    return max(0, -(-(start_s - into) // EPOCH_S))


def _replay_settings(demo: DemoSettings, bootstrap: str, http_port: int = 8080,
                     enrolled: dict[str, Any] | None = None, start_epoch: int = 0) -> ReplaySettings:
    chosen: dict[str, Any] = {"start_epoch": start_epoch, "fleet_model": demo.fleet_model,
                              "day_budget": demo.day_budget if demo.plan_day else None,
                              "flow_day_budget": demo.day_budget,
                              "query_mechanisms": demo.query_mechanisms or demo_query_mechanisms(demo.fleet_model)}
    from estimators.fleet import parse_fleet_queries

    if any(q.max_passages_day is not None for q in parse_fleet_queries(chosen["query_mechanisms"])):
        chosen["cap_drops_file"] = demo.out / CAP_DROPS_FILE  # what the day cap dropped, for the report
    return ReplaySettings(bootstrap_servers=bootstrap, speed=demo.speed, max_epochs=demo.max_epochs,
                          synthetic_stations=demo.stations, data_dir=demo.out / "data", pems_raw=demo.pems_raw,
                          pems_5min=demo.pems_5min, meta=demo.meta, day=demo.day, via_shuffler=demo.via_shuffler,
                          transport=demo.transport, front_door_url=f"http://127.0.0.1:{http_port}",
                          **(enrolled or {}), **chosen)


@contextlib.contextmanager
def secret_dir() -> Iterator[Path]:
    """A directory for the run's secrets, owner only (0700), outside the output directory (which
    is for sharing) -- under ``$XDG_RUNTIME_DIR`` (memory, per user) when set, else the system's
    temporary directory -- and removed when the demo ends, however it ends (:mod:`.private_dir`:
    SIGTERM and SIGHUP end the demo as Ctrl-C does, a forced quit removes it first, a killed
    demo's is removed by the next)."""
    with private_dir("ptt-demo-") as d:
        yield d


def _enroll(where: Path, fleet: int) -> dict[str, Any]:
    """--via-shuffler: a fresh enrollment secret for this run (``enrollment-secret`` in ``where``,
    :func:`secret_dir`; the file owner only, 0600), which the shuffler (the operator) and the
    replay (the simulated fleet, standing in for the enrolled devices) both read; the whole
    fleet enrolled."""
    path = where / "enrollment-secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return {"enrollment_secret_file": path.absolute(), "enrolled_devices": max(fleet, 262_144)}


def run_demo(demo: DemoSettings) -> int:
    """Run the demo; the exit code of ``ptt demo``. Expected failures raise (the CLI maps them).
    A closed stdout or stderr (its reader gone) only ends the printing: the demo still stops
    everything it started and saves its results."""
    with output_may_close(copy=demo.out / RUN_LOG), secret_dir() as secrets_at:
        return _run_demo(demo, secrets_at)


def _said_replayed(summary: ReplaySummary, drops_file: Path | None) -> int:
    """Print what the replay did (its delivery failures on stderr, not only in the exit code;
    what a day cap dropped, in ``drops_file``); the demo's exit code so far."""
    print(f"data: {summary.data_quality}")
    print(f"replayed {summary.epochs} epochs: {summary.reports:,} reports in {summary.records:,} records "
          f"from a fleet of {summary.fleet_size:,} vehicles"
          + (f" (at least {summary.fleet_basis})" if summary.fleet_basis else "")
          + f" in {summary.elapsed_s:.1f}s"
          + (" (interrupted)" if summary.interrupted else ""), flush=True)
    for line in replay_summary_lines(summary, drops_file)[2:]:  # refusals, spans, the vehicles' days
        print(line, flush=True)
    if summary.delivery_failures:  # exit code 1 (unless interrupted)
        print(error_line("demo", delivery_failures_message(summary)), file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED if summary.interrupted else (EXIT_FAILURE if summary.delivery_failures else EXIT_OK)


_PLANNING = ("(ptt plan fleet --day-budget: seconds for the default setting's shipped plan or a remembered one, "
             "a minute or more for a new setting on a busy machine)")


def _source(demo: DemoSettings) -> str:
    """What the demo replays, for its banner."""
    given = demo.pems_raw or demo.pems_5min
    return str(given) if given is not None else f"the synthetic day ({demo.stations} stations)"


def _cpu_line(helpers: _Helpers, broker: HelperProcess) -> str:
    """The CPU seconds each of the run's processes used so far (:mod:`.cpu`): the replay's is
    the demo's own process."""
    procs = {"shuffler": helpers.shuffler, "worker": helpers.worker, "broker": broker, "prometheus": helpers.prometheus}
    return cpu_words({"replay (the demo)": own_cpu_s(),
                      **{k: process_cpu_s(h.pid) for k, h in procs.items() if h is not None and h.pid is not None}})


def _clear_stale(out: Path) -> None:
    """What an earlier run left in ``out`` that this one would mistake for its own: the worker's
    and Prometheus' state, the report, the day cap's drops, and where an earlier version of the
    demo kept its enrollment secret."""
    for stale in ("worker", "tsdb", "report"):
        shutil.rmtree(out / stale, ignore_errors=True)
    for name in ("enrollment-secret", CAP_DROPS_FILE):
        (out / name).unlink(missing_ok=True)


@dataclass(frozen=True)
class _Plan:
    """What the demo checked and chose before it starts anything: the day and the index of its
    first epoch to replay, the fleet's enrollment (``--via-shuffler``), the privacy banner line,
    and the metrics and Prometheus ports with their notes (:func:`choose_port`)."""

    day: Any
    start: int
    frames_only: bool
    enrolled: dict[str, Any]
    privacy_line: str
    metrics: tuple[int, str]
    prometheus: tuple[int, str]


def _plan(demo: DemoSettings, secrets_at: Path) -> _Plan:
    """Check the flags and the input (a bad or empty input file fails here, before anything
    starts), clear what an earlier run left in ``--out``, enroll the fleet, plan the day."""
    from producers.replay import default_fleet, load_day

    for path in (demo.pems_raw, demo.pems_5min, demo.meta):
        if path is not None and not path.is_file():
            raise FileNotFoundError(2, "no such file", str(path))
    metrics = choose_port(demo.metrics_port, DEFAULT_METRICS_PORT, "metrics")
    prometheus = choose_port(demo.prometheus_port, DEFAULT_PROMETHEUS_PORT, "Prometheus")
    if demo.port is not None and not port_free(demo.port):
        raise PortInUse(f"broker port {demo.port} is already in use; choose another or leave --port out")
    demo.out.mkdir(parents=True, exist_ok=True)
    _clear_stale(demo.out)
    day = load_day(_replay_settings(demo, "127.0.0.1:1"))
    start = start_index(int(day.epochs[0]), demo.start_s)
    if start >= day.epochs.size:
        raise CliError(f"the day has no epoch at or after --start-time {demo.start_time}; give an earlier one")
    rs_check = _replay_settings(demo, "127.0.0.1:1", start_epoch=start)
    enrolled = _enroll(secrets_at, default_fleet(day, rs_check)) if demo.via_shuffler else {}
    if demo.plan_day:
        print(f"planning    the queries together for a whole day of {demo.day_budget:g} {_PLANNING}", flush=True)
    return _Plan(day, start, day.stations.size >= FRAMES_ONLY_STATIONS, enrolled, _vehicle_day(demo, rs_check, day),
                 metrics, prometheus)


def _banner(demo: DemoSettings, plan: _Plan, broker: LocalBroker, helpers: _Helpers) -> None:
    """Where to look, once every helper is ready, and what the demo replays."""
    out, ptt, bootstrap = demo.out, ptt_command(), broker.bootstrap
    print(f"broker      {bootstrap} (embedded, memory only)")
    if helpers.shuffler is not None:
        door = f", devices POST http://127.0.0.1:{helpers.http_port}/v1/reports" if demo.transport == "http" else ""
        print(f"shuffler    device reports -> {helpers.ws.reports_topic}, {helpers.released} release (log "
              f"{out / 'shuffler.log'}, metrics http://127.0.0.1:{helpers.shuffler.ports[0]}/metrics{door})")
        print(f"enrollment  secret in {plan.enrolled['enrollment_secret_file']} (owner only; removed at the end)")
    print(f"metrics     {helpers.metrics_url}{helpers.worker.note or plan.metrics[1]}")
    prom = helpers.prometheus
    prom_url = f"http://127.0.0.1:{prom.ports[0]}" if prom is not None else None
    prom_note = (prom.note if prom is not None else "") or plan.prometheus[1]
    print(f"prometheus  {(prom_url or 'not installed (apt-get install prometheus) - skipped') + prom_note}")
    print(f"estimates   {ptt} subscribe --bootstrap-servers {bootstrap}")
    print(f"queries     {ptt} analyst list --bootstrap-servers {bootstrap}")
    print(f"privacy     {plan.privacy_line}")
    print(f"output      {out}/ (logs now; estimates.jsonl, estimates.parquet, truth.jsonl and report/ when "
          "the demo ends)")
    day, start = plan.day, plan.start
    pace = f"at {demo.speed:g}x real time" if demo.speed > 0 else "as fast as possible"
    epochs = min(day.epochs.size - start, demo.max_epochs or day.epochs.size)
    print(f"replaying {_source(demo)} from {epoch_start(int(day.epochs[start])):%H:%M}, {epochs:,} epochs "
          f"({epochs * EPOCH_S / 3600:g} h), {pace}; Ctrl-C stops", flush=True)


def _replayed(rs: ReplaySettings, watch: Watch) -> ReplaySummary:
    """The replay, stopped within a second by a helper that exits (:meth:`Watch.interrupting`),
    which is then the failure named."""
    from producers.replay import ReplayLost, replay

    try:
        with watch.interrupting():  # a helper that exits stops the replay within a second
            summary = replay(rs, progress=True)
    except ReplayLost as exc:  # what the broker acknowledged, then the CLI's one-line error
        print("\n".join(replay_summary_lines(exc.summary)), flush=True)
        watch.check()  # the broker (or another helper) exited: that is the failure to name
        raise
    watch.check()
    return summary


def _closing(demo: DemoSettings, plan: _Plan, rs: ReplaySettings, summary: ReplaySummary, helpers: _Helpers,
             stop: StopFlag, watch: Watch) -> Closing:
    """After the replay: wait until the worker has closed what the replay sent (:func:`_wait_closed`),
    then, without ``--exit-when-done``, serve on until Ctrl-C, checking the helpers."""
    from schemas.kafka_io import read_queries

    closing = Closing(0, 0)
    if not summary.interrupted and summary.epochs:
        replayed = [int(e) for e in plan.day.epochs[plan.start:plan.start + summary.epochs]]
        queries = read_queries(rs)
        shuffler_port = helpers.shuffler.ports[0] if helpers.shuffler is not None else None
        closing = _wait_closed(helpers.metrics_url, expected_windows(queries, replayed), stop,
                               rollups=expected_rollups(queries, replayed), check=watch.check,
                               shuffler_port=shuffler_port)
        if not closing.complete and not stop.requested:
            print("demo: the worker closed no further epoch for 60 s; saving what it has published",
                  file=sys.stderr, flush=True)
    if not summary.interrupted and not demo.exit_when_done and not stop.requested:
        print("replay done; still serving metrics - Ctrl-C stops (and saves the estimates)", flush=True)
        while not stop.wait(0.5):
            watch.check()
    return closing


@dataclass(frozen=True)
class _Saved:
    """What the demo read from the topics before the broker stopped."""

    counts: dict[str, int]
    queries: list[Query]
    frames: list[bytes]


def _save_and_stop(out: Path, rs: ReplaySettings, helpers: _Helpers, broker: LocalBroker, watch: Watch,
                   interrupted: bool) -> _Saved:
    """Ask the helpers to stop, read the topics meanwhile, then stop them (SIGKILL after what is
    left of :data:`STOP_GRACE_S`) and the broker."""
    from schemas.kafka_io import read_queries

    watch.retire()  # from here the demo stops them itself
    for h in helpers.stopping:  # they stop while the topics are read
        h.terminate()
    asked = time.monotonic()
    ws = helpers.ws
    again = " (Ctrl-C again quits without them)" if interrupted else ""
    print(f"saving the estimates and the ground truth into {out}/{again}", flush=True)
    counts = save_topics(rs, {ws.estimates_topic: out / "estimates.jsonl", rs.truth_topic: out / "truth.jsonl"})
    answered = read_queries(rs)  # the run's queries, for the day figure of summary.txt and the plots
    (out / QUERIES_FILE).write_text("".join(q.model_dump_json() + "\n" for q in answered))
    frame_values = read_frames(rs, ws.frames_topic)
    # the worker's graceful stop (its producers closed, no error logged) takes about half a second
    stop_all(helpers.stopping, grace_s=max(STOP_GRACE_S - (time.monotonic() - asked), 0.1))
    broker.stop()
    return _Saved(counts, answered, frame_values)


def _reported(demo: DemoSettings, plan: _Plan, rs: ReplaySettings, summary: ReplaySummary, ws: WorkerSettings,
              saved: _Saved, stop: StopFlag, code: int) -> tuple[int, int]:
    """Write ``estimates.parquet`` (every helper gone), say what was saved, write the report;
    the exit code so far and the estimates published."""
    from ..subscribe import write_frames

    out = demo.out
    estimates, truth, table = out / "estimates.jsonl", out / "truth.jsonl", out / "estimates.parquet"
    frames = write_frames(saved.frames, table, "parquet")  # pyarrow: ~0.5 s under load
    counts, frames_only = saved.counts, plan.frames_only
    published = frames.rows if frames_only else counts[ws.estimates_topic]
    print(f"saved {counts[ws.estimates_topic]:,} estimates to {estimates}"
          + (f" (at {plan.day.stations.size:,} stations the worker publishes frames only)" if frames_only else "")
          + f" and {counts[rs.truth_topic]:,} ground-truth epochs to {truth}"
          f"{cut_epoch_note(summary.epochs, counts[rs.truth_topic])}", flush=True)
    print(f"saved {'the same ' if not frames_only else ''}{frames.rows:,} estimates from {frames.frames:,} "
          f"estimate frames to {table} (one row per query, epoch, station and estimator)", flush=True)
    if published:
        stop.event.set()  # from here a Ctrl-C raises KeyboardInterrupt: it skips the plots
        code = _report(table if frames_only else estimates, truth, out, saved.queries, code, demo.plots)
    else:
        print("report      none (no estimate was published yet)", flush=True)
    return code, published


def _run_demo(demo: DemoSettings, secrets_at: Path) -> int:
    """The demo as a list of helper processes: the broker, then :class:`_Helpers` started in turn
    and watched; the replay; the wait for what it sent; the topics saved while they stop; the report."""
    from producers.stopping import StopFlag

    plan = _plan(demo, secrets_at)
    broker = LocalBroker(port=demo.port, log_path=demo.out / "broker.log", own_group=True)
    helpers = _helpers(demo, plan, broker.bootstrap)
    broker.start()
    watch = Watch()  # every helper, from its start until the demo stops them (stream_app/cli/supervise.py)
    watch.add(broker.helper)
    try:
        helpers.start(watch)
        _banner(demo, plan, broker, helpers)
        rs = _replay_settings(demo, broker.bootstrap, helpers.http_port, plan.enrolled, plan.start)
        summary = _replayed(rs, watch)
        code = _said_replayed(summary, rs.cap_drops_file)
        with StopFlag() as stop:
            if summary.interrupted:  # the replay took the first Ctrl-C: the next one forces quit
                stop.event.set()
            closing = _closing(demo, plan, rs, summary, helpers, stop, watch)
            if stop.requested:
                code = EXIT_INTERRUPTED
            cpu = _cpu_line(helpers, broker.helper)  # before they stop
            saved = _save_and_stop(demo.out, rs, helpers, broker, watch, stop.requested)
            code, published = _reported(demo, plan, rs, summary, helpers.ws, saved, stop, code)
            print(f"cpu         {cpu or 'not known here (read from /proc)'}", flush=True)
            print(f"log         {demo.out / RUN_LOG}: every line above (a `| tee` that Ctrl-C ended misses the last)",
                  flush=True)
            code, missing = unpublished(closing, code, published)
            if missing is not None:
                print(missing, file=sys.stderr, flush=True)
        return code
    finally:  # nothing once they have stopped
        stop_all(helpers.stopping, grace_s=1.0)
        broker.stop()

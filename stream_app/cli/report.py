"""``ptt report``: plots and a summary from the topics or saved JSON lines.

The command-line half of :mod:`stream_app.report`: the flags, reading saved JSON lines
(``-``: standard input) and topics (:func:`schemas.kafka_io.read_to_end`), and the exit
codes every command shares: a missing or unreadable input file is 5, an unreachable broker
3, anything else wrong with the inputs, the filters or the output directory 2.
kafka-python is imported only when a topic is read, matplotlib only when plotting.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas import Query
from schemas.estimates import Estimate
from schemas.settings import KafkaSettings

from .. import report
from .base import add_settings_flags, settings_from_args
from .errors import EXIT_BROKER, EXIT_INPUT, EXIT_OK, EXIT_USAGE, CliError

__all__ = ["add_arguments", "add_parser", "read_cap_drops_file", "read_file", "read_queries_file", "read_topic", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="plots (truth vs estimate with bands) and a text summary of a replay",
                       description="Read estimates and ground truth (from the topics or saved JSON lines) and write "
                                   "PNG plots (truth, estimate and its 95% and 99% bands over the day: per station "
                                   "for the 30-s epochs, and per query and span for the flows -- the 5-minute and "
                                   "hourly rollups and span queries) plus a summary that scores each query at each "
                                   "span and names every row it leaves out and why.")
    add_arguments(p)
    p.set_defaults(func=run)


# --------------------------------------------------------------------------- inputs


def read_file(path: str) -> Iterator[bytes]:
    """The lines of a JSON-lines file (``-``: standard input), read as they are consumed. A
    missing or unreadable file is a :class:`CliError` (exit 5) at once, not when read."""
    if path == "-":
        return iter(sys.stdin.buffer)
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}; check the path", EXIT_INPUT) from exc
    return _file_lines(path)


def _file_lines(path: str) -> Iterator[bytes]:
    try:
        with open(path, "rb") as fh:
            yield from fh
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}; check the path", EXIT_INPUT) from exc


def read_topic(settings: KafkaSettings, topic: str, idle_timeout_s: float = 3.0, hint: str = "") -> Iterator[bytes]:
    """Every record value of ``topic`` from the beginning to its end or until nothing arrived
    for ``idle_timeout_s`` (:func:`schemas.kafka_io.read_to_end`). A generator: the consumer
    is created when reading starts and closed when it ends; ``hint`` is added to "no such
    topic" (exit 2); an unreachable broker or a failed read is exit 3."""
    from kafka.errors import KafkaError

    from schemas.kafka_io import read_to_end

    try:
        for rec in read_to_end(settings, topic, idle_timeout_s=idle_timeout_s):
            if rec.value is not None:
                yield rec.value
    except KafkaError as exc:
        raise CliError(f"cannot read topic {topic!r}: {exc}", EXIT_BROKER) from exc
    except LookupError as exc:
        if type(exc) is not LookupError:  # read_to_end's "no such topic", nothing else
            raise
        raise CliError(f"{exc}{hint}", EXIT_USAGE) from exc


def _estimates_file(path: str) -> Iterable[bytes | Estimate]:
    """JSON lines, or a long-form Parquet/Arrow file (recognized by its first bytes)."""
    lines = read_file(path)  # a missing or unreadable file: exit 5 at once
    if path == "-":
        return lines
    with open(path, "rb") as fh:
        magic = fh.read(6)
    if magic[:4] != b"PAR1" and magic != b"ARROW1":
        return lines
    try:
        return list(report.estimates_of_long_table(Path(path)))
    except ValueError as exc:
        raise CliError(f"cannot read {path}: {exc}", EXIT_INPUT) from exc


# --------------------------------------------------------------------------- command line


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected station ids (integers, comma-separated), got {text!r}") from exc


def _spans(text: str) -> list[int]:
    try:
        spans = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected spans in seconds (integers, comma-separated), got {text!r}") \
            from exc
    bad = [s for s in spans if s <= 0 or s % 30]
    if bad:
        raise argparse.ArgumentTypeError(f"a span is a positive multiple of 30 seconds, got {bad[0]}")
    return spans


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from exc
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("inputs")
    one = src.add_mutually_exclusive_group(required=True)
    one.add_argument("--from-topic", action="store_true",
                     help="read the estimates topic (and, unless --truth/--no-truth, the truth topic) from the "
                          "beginning until it is quiet")
    one.add_argument("--from-frames", action="store_true",
                     help="read the estimate frames topic (--frames-topic) instead of the rows: a worker with "
                          "PTT_ESTIMATE_OUTPUT=frames publishes only frames")
    one.add_argument("--estimates", metavar="FILE",
                     help="saved estimates: one JSON per line (ptt subscribe --json; - for stdin), or the Parquet "
                          "or Arrow file of ptt subscribe --parquet/--arrow (ptt demo's estimates.parquet)")
    src.add_argument("--estimates-topic", default="ptt.estimates", help="estimates topic (default ptt.estimates)")
    src.add_argument("--frames-topic", default="ptt.estimate-frames",
                     help="estimate frames topic read by --from-frames (default ptt.estimate-frames)")
    src.add_argument("--truth", metavar="FILE",
                     help="ground truth, one GroundTruth JSON per line. Without it: the truth topic with "
                          "--from-topic or an explicit --truth-topic, else none")
    src.add_argument("--queries", metavar="FILE",
                     help="the queries the run answered, one Query JSON per line (ptt demo's queries.jsonl): the "
                          "summary and the plots' titles then give a vehicle's whole day across them, for the path "
                          "the estimates took (the shuffler's release they attest, or local)")
    src.add_argument("--cap-drops", metavar="FILE",
                     help="what a day cap dropped, per query, span and station (ptt replay --cap-drops-file, ptt "
                          "demo's cap-drops.csv; a simulation diagnostic): the summary says it after the flows")
    src.add_argument("--no-truth", action="store_true",
                     help="no ground truth (a real deployment): no coverage or error, only widths and counts")
    src.add_argument("--idle-timeout", type=float, default=3.0, metavar="SECONDS",
                     help="stop reading a topic after this many seconds without data (default 3)")
    sel = parser.add_argument_group("selection")
    sel.add_argument("--query", type=_names, action="append", default=[], metavar="ID",
                     help="only these query ids (repeatable or comma-separated)")
    sel.add_argument("--station", type=_ints, action="append", default=[], metavar="ID[,ID...]",
                     help="only these stations (repeatable or comma-separated); all of them are plotted")
    sel.add_argument("--estimator", type=_names, action="append", default=[], metavar="NAME",
                     help="only these estimators (repeatable or comma-separated); they are the ones plotted")
    sel.add_argument("--span", type=_spans, action="append", default=[], metavar="SECONDS",
                     help="only rows of these spans (repeatable or comma-separated): 30 for the epochs, 300 and "
                          "3600 for the 5-minute and hourly rollups, a span query's span")
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, default=Path("report"), metavar="DIR",
                     help="output directory (default ./report)")
    out.add_argument("--stations", type=_positive, default=6, metavar="N",
                     help="plot the N busiest stations by total truth (default 6; 0: no plots)")
    out.add_argument("--every", type=_positive, default=0, metavar="K",
                     help=f"draw every k-th epoch (default 0: automatic, at most {report.MAX_POINTS} points per "
                          "plot)")
    out.add_argument("--with-gls", action="store_true", help="overlay alp_gls (dashed) on the ALP plots")
    out.add_argument("--no-plots", dest="plots", action="store_false",
                     help="write summary.txt and summary.json only, no PNG (quicker: a plot takes about a second; "
                          "matplotlib is not even imported, e.g. on a headless server)")
    kafka = parser.add_argument_group("broker (with --from-topic or for the truth topic)")
    add_settings_flags(kafka, KafkaSettings,  # type: ignore[arg-type]
                       skip=frozenset({"reports_topic", "queries_topic", "partitions"}))


def _flatten(lists: Sequence[Sequence[Any]]) -> list[Any]:
    return [x for xs in lists for x in xs]


def _settings(args: argparse.Namespace) -> KafkaSettings:
    try:
        return settings_from_args(KafkaSettings, args)
    except ValidationError as exc:
        raise CliError(f"invalid broker settings: {exc.errors()[0].get('msg', exc)}") from exc


def _truth_source(args: argparse.Namespace) -> str:
    """'file', 'topic' or 'none': --truth FILE; --no-truth; the topic with --from-topic or an
    explicit --truth-topic; else none (a saved estimates file alone)."""
    if args.truth and args.no_truth:
        raise CliError("give --truth FILE or --no-truth, not both")
    if args.truth:
        return "file"
    if args.no_truth:
        return "none"
    return "topic" if args.from_topic or args.from_frames or getattr(args, "truth_topic", None) else "none"


def read_queries_file(path: str) -> list[Query]:
    """The queries of a JSON-lines file (``ptt demo``'s ``queries.jsonl``); a line that is no
    query is exit 5, naming it."""
    out = []
    for i, line in enumerate(read_file(path), 1):
        if not line.strip():
            continue
        try:
            out.append(Query.model_validate_json(line))
        except ValidationError as exc:
            raise CliError(f"{path} line {i} is not a query: {exc.errors()[0].get('msg', exc)}", EXIT_INPUT) from exc
    return out


def read_cap_drops_file(path: str) -> report.CapDrops:
    """What a day cap dropped (``ptt replay --cap-drops-file``); an unreadable file or a bad line
    is exit 5, naming it."""
    text = b"".join(read_file(path)).decode("utf-8", "replace")
    try:
        return report.read_cap_drops(text)
    except report.CapDropError as exc:
        raise CliError(f"{path}: {exc}", EXIT_INPUT) from exc


def run(args: argparse.Namespace) -> int:
    queries = read_queries_file(args.queries) if getattr(args, "queries", None) else None
    cap_drops = read_cap_drops_file(args.cap_drops) if getattr(args, "cap_drops", None) else None
    selection = report.Selection(frozenset(_flatten(args.query)), frozenset(_flatten(args.station)),
                                 frozenset(_flatten(args.estimator)), frozenset(_flatten(args.span)))
    truth_source = _truth_source(args)
    settings = _settings(args) if args.from_topic or args.from_frames or truth_source == "topic" else None
    truth: Iterable[bytes] | None = None
    if truth_source == "file":
        truth = read_file(args.truth)  # checked before the long read
    elif settings is not None and truth_source == "topic":  # read after the estimates
        hint = " (give --truth FILE, or --no-truth to report without ground truth)"
        truth = read_topic(settings, settings.truth_topic, args.idle_timeout, hint)
    raw: Iterable[bytes | Estimate]
    if settings is not None and args.from_topic:
        raw = read_topic(settings, args.estimates_topic, args.idle_timeout,
                         " (a worker with PTT_ESTIMATE_OUTPUT=frames publishes frames only: use --from-frames)")
        where = f"topic {args.estimates_topic!r}"
    elif settings is not None and args.from_frames:
        raw = report.estimates_of_frames(read_topic(settings, args.frames_topic, args.idle_timeout))
        where = f"frames topic {args.frames_topic!r}"
    else:
        raw = _estimates_file(args.estimates)
        where = args.estimates
    out: Path = args.out
    try:
        text, plots = report.write_report(raw, truth, out, selection=selection, where=where, stations=args.stations,
                                          every=args.every or None, with_gls=args.with_gls, queries=queries,
                                          plots=args.plots, cap_drops=cap_drops)
    except report.ReportError as exc:
        hint = ("; a worker with PTT_ESTIMATE_OUTPUT=frames publishes frames only: read them with --from-frames"
                if args.from_topic and "(0 records read" in str(exc) else "")
        raise CliError(f"{exc}{hint}") from exc
    print(text, end="")
    print(f"wrote {len(plots)} plots{'' if args.plots else ' (--no-plots)'}, summary.txt and summary.json to {out}")
    return EXIT_OK

"""The one thin Kafka layer that producers, the stream app and the CLI share (kafka-python).

Connection settings (:class:`KafkaSettings`, secrets as ``SecretStr``), connecting with a
bounded retry (:func:`connect`), topic creation with explicit partition counts
(:func:`ensure_topics`), publishing and following queries (:func:`publish_query`,
:class:`QueryReader`), reading a topic to its end (:func:`read_to_end`) and telling a lost
broker from a slow one (:class:`BrokerHealth`, :class:`BrokerWatch`, :class:`BrokerLost`). The end is the
high-water mark returned with fetched data: the embedded broker's ListOffsets end offsets
are wrong (see the README's broker notes), so nothing here uses ``end_offsets()``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from .connection import producer_options
from .query import Query
from .settings import KafkaSettings

__all__ = ["BrokerHealth", "BrokerLost", "BrokerUnavailable", "BrokerWatch", "KafkaSettings", "QueryReader",
           "assign_all", "at_end", "broker_lost", "confirm_period_s", "connect", "ensure_topics", "probe",
           "publish_query", "read_queries", "read_to_end"]

log = logging.getLogger(__name__)


class BrokerUnavailable(RuntimeError):
    """The Kafka broker could not be reached (or kept failing) after retries."""


class BrokerLost(BrokerUnavailable):
    """The broker was lost mid-run: silent for longer than the loss timeout, or a topic in use
    gone or recreated (a memory-only broker restarted). Build it with :func:`broker_lost`."""


LOST_HINT = ("an embedded broker keeps everything in memory, so what it held is gone: start the broker again "
             "(`ptt broker`), then the worker, and replay into fresh topics; --broker-loss-timeout-s sets how long "
             "a silent broker is waited for")


def broker_lost(settings: KafkaSettings, reason: str) -> BrokerLost:
    """The one-line error for a broker lost mid-run: what happened, then what to do.

    >>> from schemas.settings import KafkaSettings
    >>> str(broker_lost(KafkaSettings(), "no answer for 30.0s")).split(";")[0]
    'lost the Kafka broker at 127.0.0.1:9092 mid-run (no answer for 30.0s)'
    """
    return BrokerLost(f"lost the Kafka broker at {settings.bootstrap_servers} mid-run ({reason}); {LOST_HINT}")


def confirm_period_s(timeout_s: float) -> float:
    """How long a topic the broker showed must stay absent from its metadata answers before it
    counts as gone: a third of the loss timeout, within [1 s, 10 s].

    >>> confirm_period_s(30.0), confirm_period_s(3.0), confirm_period_s(600.0)
    (10.0, 1.0, 10.0)
    """
    return min(10.0, max(1.0, timeout_s / 3))


class BrokerHealth:
    """When is a broker lost, rather than slow? Decided from what a process saw of it (pure;
    the clock is the caller's ``now``).

    Lost: no sign of life (an acknowledgement, an answer to a metadata request) for longer
    than ``timeout_s`` while something waited on the broker; or a topic in use gone; or one
    recreated under the same name (its topic id changed). The latter two are what a restart of
    a memory-only broker looks like: waiting does not bring back what it held. The first
    verdict sticks (:attr:`lost`).

    *Gone* is confirmed, not read off one answer: a topic counts only once the broker has
    shown it (a topic about to be created is not gone), and it is gone once it was absent from
    every successful metadata answer for ``confirm_s`` (:func:`confirm_period_s`) -- at least
    two answers; an answer that shows it again starts over. One answer can lag behind the
    broker's state (a metadata cache, a busy broker); two answers ``confirm_s`` apart that
    agree do not. A failed request is no answer: it neither confirms nor clears (the silence
    clock judges it).

    *Recreated* is immediate: a topic id is assigned once, when a topic is created, and never
    reused. An answer that lags shows an earlier state of the same topic (absent, or its id),
    never an id the topic did not have; an answer with another id means the name now belongs to
    a new, empty topic, and what the old one held is gone.

    >>> h = BrokerHealth(timeout_s=30.0, now=0.0)
    >>> h.alive(1.0)                                     # an answer, an acknowledgement
    >>> h.silent(20.0, "connection refused") is None     # 19 s without an answer: still waiting
    True
    >>> h.silent(31.5, "connection refused")
    'no answer from the broker for 30.5s: connection refused'
    >>> h = BrokerHealth(timeout_s=30.0, now=0.0)        # confirm_s = 10 s
    >>> h.seen({"ptt.reports": None}, 0.0) is None       # not shown yet: about to be created
    True
    >>> h.seen({"ptt.reports": "id-1", "ptt.truth": "id-2"}, 1.0) is None   # the ids to compare with
    True
    >>> h.seen({"ptt.reports": "id-1", "ptt.truth": None}, 2.0) is None     # absent once: not yet gone
    True
    >>> h.pending
    True
    >>> h.seen({"ptt.reports": "id-1", "ptt.truth": None}, 12.5)            # still absent 10.5 s later
    'topic ptt.truth is gone (absent from 2 metadata answers over 10.5s): deleted, or the broker restarted'
    >>> h = BrokerHealth(30.0, 0.0)
    >>> _ = h.seen({"ptt.reports": "id-1"}, 0.0)
    >>> h.seen({"ptt.reports": "id-9"}, 5.0)             # another id: at once
    'topic ptt.reports was deleted and recreated: the broker restarted?'
    >>> h.seen({"ptt.reports": "id-1"}, 6.0)             # the first verdict sticks
    'topic ptt.reports was deleted and recreated: the broker restarted?'
    """

    def __init__(self, timeout_s: float, now: float, confirm_s: float | None = None) -> None:
        self.timeout_s = timeout_s
        self.confirm_s = confirm_period_s(timeout_s) if confirm_s is None else confirm_s
        self.last_alive = now
        self.topic_ids: dict[str, str] = {}  # the id each topic was first shown with (if it has one)
        self.shown: set[str] = set()  # topics the broker has shown at least once
        self.absent: dict[str, tuple[float, int]] = {}  # shown, then absent: (first absent at, answers since)
        self.lost: str | None = None

    @property
    def pending(self) -> bool:
        """A topic the broker showed is absent, not yet for long enough to count as gone."""
        return self.lost is None and bool(self.absent)

    def alive(self, now: float) -> None:
        """A sign of life (or, :meth:`waiting`, the start of a new wait): the silence clock restarts."""
        self.last_alive = max(self.last_alive, now)

    waiting = alive

    def seen(self, topic_ids: dict[str, str | None], now: float) -> str | None:
        """One successful metadata answer at ``now``: the broker named each topic in use with its
        id ("" or all zeros: it has no ids; None: the topic does not exist). Returns the verdict
        if the broker counts as lost."""
        if self.lost is not None:
            return self.lost
        for topic, tid in sorted(topic_ids.items()):
            if tid is None:
                if topic not in self.shown:  # not created yet, or not visible yet: nothing to lose
                    continue
                since, answers = self.absent.get(topic, (now, 0))
                self.absent[topic] = (since, answers + 1)
                if answers + 1 >= 2 and now - since >= self.confirm_s:
                    self.lost = (f"topic {topic} is gone (absent from {answers + 1} metadata answers over "
                                 f"{now - since:.1f}s): deleted, or the broker restarted")
                    return self.lost
                continue
            self.shown.add(topic)
            self.absent.pop(topic, None)
            if not tid.strip("0-"):  # a broker without topic ids (an all-zero id) cannot tell
                continue
            if self.topic_ids.setdefault(topic, tid) != tid:
                self.lost = f"topic {topic} was deleted and recreated: the broker restarted?"
                return self.lost
        return None

    def silent(self, now: float, why: str) -> str | None:
        """Something waited on the broker in vain (``why``). Returns the verdict if the broker
        has now been silent for longer than ``timeout_s``."""
        if self.lost is None and now - self.last_alive > self.timeout_s:
            self.lost = f"no answer from the broker for {now - self.last_alive:.1f}s: {why}"
        return self.lost


class BrokerWatch:
    """Asks the broker about the ``topics`` in use (one metadata request per :meth:`check`) and
    feeds the answers, or their absence, to a :class:`BrokerHealth`. One thread at a time."""

    def __init__(self, settings: KafkaSettings, topics: set[str] | list[str], timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self.topics = sorted(set(topics))
        self.clock = clock
        self.health = BrokerHealth(timeout_s, clock())
        self._admin: Any = None
        # one metadata request must not outlast the loss timeout
        self._request_timeout_ms = int(min(settings.request_timeout_ms, max(1000.0, 1000 * timeout_s / 3)))

    def topic_ids(self) -> dict[str, str | None]:
        """Each watched topic's id ("" if the broker has none, None if the topic does not exist);
        raises what the client raises when the broker does not answer."""
        if self._admin is None:
            quick = self._settings.model_copy(update={"request_timeout_ms": self._request_timeout_ms})
            self._admin = connect("admin", quick, KafkaAdminClient)
        ids: dict[str, str | None] = {}
        for t in self._admin.describe_topics(self.topics):
            code = int(t.get("error_code", 0))
            if code == 3:  # UNKNOWN_TOPIC_OR_PARTITION
                ids[str(t["name"])] = None
            elif code != 0:
                raise KafkaError(f"metadata of {t['name']}: error code {code}")
            else:
                ids[str(t["name"])] = str(t.get("topic_id") or "")
        return ids

    def check(self) -> str | None:
        """One metadata request; returns the verdict if the broker counts as lost."""
        try:
            ids = self.topic_ids()
        except (KafkaError, OSError, BrokerUnavailable) as exc:
            why = probe(self._settings.bootstrap_servers, timeout_s=1.0) or _why(exc)  # "refused" says more
            return self.health.silent(self.clock(), why)
        now = self.clock()
        self.health.alive(now)
        return self.health.seen(ids, now)

    def close(self) -> None:
        if self._admin is not None:
            with contextlib.suppress(KafkaError, OSError):
                self._admin.close()
            self._admin = None


def _why(exc: BaseException) -> str:
    """A short reason from a client exception (its first line, without the hint)."""
    text = str(exc).split("; ")[0].strip() or type(exc).__name__
    return text if len(text) < 160 else text[:157] + "..."


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad broker address {address!r}: expected host:port; fix --bootstrap-servers "
                         "or PTT_BOOTSTRAP_SERVERS")
    return host.strip("[]"), int(port)


def probe(bootstrap_servers: str, timeout_s: float = 3.0) -> str | None:
    """A plain TCP connect to every bootstrap address: None if one accepts, else why none did.

    Used before kafka-python is asked to connect, which retries a refused bootstrap for its
    whole ``bootstrap_timeout_ms`` per attempt. A timeout (a filtering firewall, a slow
    network) is not a verdict: the caller then lets the client try within its own bounds."""
    reasons: list[str] = []
    refused_everywhere = True
    for address in bootstrap_servers.split(","):
        host, port = _split_address(address)
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return None
        except ConnectionRefusedError:
            reasons.append(f"{host}:{port} refused the connection")
        except socket.gaierror:
            reasons.append(f"{host} is not a known host")
        except OSError as exc:  # timeout, unreachable network: inconclusive
            refused_everywhere = False
            reasons.append(f"{host}:{port} {exc.strerror or type(exc).__name__}")
    return "; ".join(reasons) if refused_everywhere else None


def connect(what: str, settings: KafkaSettings, factory: Any, **kw: Any) -> Any:
    """Create a client, retrying with exponential back-off; :class:`BrokerUnavailable` at the end.

    Fails at once, without retries, when every bootstrap address refuses a plain TCP connection
    (nothing listens there) or does not resolve."""
    hint = "is the broker running? Start one with `ptt broker`, or set --bootstrap-servers / PTT_BOOTSTRAP_SERVERS"
    why = probe(settings.bootstrap_servers, timeout_s=min(settings.bootstrap_timeout_ms / 1000, 3.0))
    if why is not None:
        raise BrokerUnavailable(f"cannot reach the Kafka broker at {settings.bootstrap_servers} ({why}); {hint}")
    delay = 0.5
    attempts = settings.connect_attempts
    for attempt in range(1, attempts + 1):
        try:
            return factory(**settings.client_kwargs(), **kw)
        except KafkaError as exc:
            if attempt == attempts:
                raise BrokerUnavailable(
                    f"cannot reach the Kafka broker at {settings.bootstrap_servers} ({what}, {attempts} attempts: "
                    f"{exc}); {hint}"
                ) from exc
            log.warning("broker not reachable (%s), retrying in %.1fs", what, delay)
            time.sleep(delay)
            delay = min(delay * 2, 8.0)
    raise AssertionError("unreachable")


def ensure_topics(settings: KafkaSettings, partitions: dict[str, int] | None = None,
                  compacted: set[str] | None = None) -> dict[str, str]:
    """Create topics with explicit partition counts if they do not exist; ``compacted`` ones
    (default: the queries topic) get ``cleanup.policy=compact``. Returns once the broker's
    metadata shows every one of them (within the request timeout): each topic's id ("" if the
    broker has none), the ids a :class:`BrokerHealth` compares later answers with."""
    wanted = partitions or {settings.reports_topic: settings.partitions, settings.queries_topic: 1,
                            settings.truth_topic: 1}
    compact = compacted if compacted is not None else {settings.queries_topic}
    admin = connect("admin", settings, KafkaAdminClient)
    try:
        existing = set(admin.list_topics())
        new = [NewTopic(name, num_partitions=n, replication_factor=1,
                        topic_configs={"cleanup.policy": "compact"} if name in compact else {})
               for name, n in wanted.items() if name not in existing]
        if new:
            try:
                admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass
        return _shown_ids(admin, sorted(wanted), settings.request_timeout_ms / 1000)
    finally:
        admin.close()


def _shown_ids(admin: Any, topics: list[str], timeout_s: float) -> dict[str, str]:
    """Each topic's id once the broker's metadata shows them all: a created topic may take a
    moment to appear there. A topic refused for another reason (not authorized to describe it)
    is left out, not waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = {str(t["name"]): t for t in admin.describe_topics(topics)}
        unknown = [name for name in topics if int(answer.get(name, {}).get("error_code", 3)) == 3]
        if not unknown:
            return {name: str(t.get("topic_id") or "") for name, t in answer.items()
                    if name in topics and int(t.get("error_code", 0)) == 0}
        if time.monotonic() > deadline:
            raise BrokerUnavailable(f"the broker does not show the topics {', '.join(unknown)} {timeout_s:g}s after "
                                    "creating them; is it overloaded?")
        time.sleep(0.2)


def publish_query(settings: KafkaSettings, query: Query) -> None:
    """Publish one version of a query on the compacted queries topic (acks=all)."""
    ensure_topics(settings)
    producer = connect("producer", settings, KafkaProducer, acks="all",
                       **producer_options(settings, settings.queries_topic))
    try:
        producer.send(settings.queries_topic, key=query.record_key.encode(),
                      value=query.model_dump_json().encode()).get(timeout=30)
    finally:
        producer.close(timeout=10)


class QueryReader:
    """Follows the queries topic from its beginning; keeps every valid version."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._consumer = connect("consumer", settings, KafkaConsumer, group_id=None, enable_auto_commit=False,
                                  consumer_timeout_ms=1000, auto_offset_reset="earliest")
        self._topic = settings.queries_topic
        self._assign()
        self.queries: dict[tuple[str, int], Query] = {}
        self.invalid = 0

    def _assign(self) -> bool:
        """Assign the topic's partitions once the broker's metadata names them (it may not yet,
        right after a start): a reader with nothing assigned would think it is at the end."""
        if self._consumer.assignment():
            return True
        parts = self._consumer.partitions_for_topic(self._topic) or set()
        if not parts:
            return False
        tps = [TopicPartition(self._topic, p) for p in sorted(parts)]
        self._consumer.assign(tps)
        for tp in tps:
            # offset 0, not a ListOffsets(earliest) answer; a compacted-away start is out of
            # range and resets to the earliest (auto_offset_reset), so nothing is skipped
            self._consumer.seek(tp, 0)
        return True

    def poll(self, timeout_ms: int = 0) -> int:
        """Read what is new; returns how many records were read."""
        if not self._assign():
            return 0
        n = 0
        for records in self._consumer.poll(timeout_ms=timeout_ms, max_records=10_000).values():
            for rec in records:
                n += 1
                try:
                    q = Query.model_validate_json(rec.value)
                except ValueError as exc:
                    self.invalid += 1
                    log.warning("ignoring an invalid query record at offset %s: %s", rec.offset, exc)
                    continue
                self.queries[(q.query_id, q.version)] = q
        return n

    def catch_up(self, timeout_s: float = 30.0) -> None:
        """Poll until every partition's position has reached its high-water mark."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if not self._assign():
                time.sleep(0.1)
                continue
            self.poll(200)
            if at_end(self._consumer):
                return
        raise BrokerUnavailable(f"could not read the queries topic to its end within {timeout_s}s")

    def read_to_end(self, timeout_s: float = 5.0) -> bool:
        """Poll until every partition's position has reached its end as the broker says now (not
        the high-water mark of the last fetch, which may be older); False if not within
        ``timeout_s``. A record that names a query must be checked against what is there."""
        deadline = time.monotonic() + timeout_s
        if not self._assign():
            return False
        tps = list(self._consumer.assignment())
        ends = self._consumer.end_offsets(tps)
        while any(self._consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                return False
            self.poll(100)
        return True

    def close(self) -> None:
        self._consumer.close()


def read_queries(settings: KafkaSettings) -> list[Query]:
    """Every version of every query on the topic, sorted by (query id, version)."""
    ensure_topics(settings)
    reader = QueryReader(settings)
    try:
        reader.catch_up()
        return [reader.queries[k] for k in sorted(reader.queries)]
    finally:
        reader.close()


def at_end(consumer: Any) -> bool:
    """Every assigned partition read up to the high-water mark reported with fetched data."""
    return all((m := consumer.highwater(tp)) is not None and consumer.position(tp) >= m
               for tp in consumer.assignment())


def assign_all(consumer: Any, topic: str, from_beginning: bool = True) -> list[Any]:
    """Assign every partition of ``topic`` (no consumer group); seek to the beginning."""
    parts = consumer.partitions_for_topic(topic) or set()
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    consumer.assign(tps)
    if from_beginning and tps:
        consumer.seek_to_beginning()
    return tps


def read_to_end(settings: KafkaSettings, topic: str, idle_timeout_s: float = 10.0,
                max_bytes: int = 64 * 1024 * 1024) -> Iterator[Any]:
    """Every record of ``topic`` from the beginning to its high-water mark (or until nothing
    arrives for ``idle_timeout_s``). :class:`BrokerUnavailable` if the broker cannot be
    reached; ``LookupError`` if the topic does not exist."""
    consumer = connect("consumer", settings, KafkaConsumer, group_id=None, enable_auto_commit=False,
                       max_partition_fetch_bytes=min(max_bytes, 16 * 1024 * 1024), fetch_max_bytes=max_bytes)
    try:
        if not assign_all(consumer, topic):
            raise LookupError(f"topic {topic!r} does not exist on {settings.bootstrap_servers}")
        last_data = time.monotonic()
        while time.monotonic() - last_data < idle_timeout_s:
            got = consumer.poll(timeout_ms=300, max_records=50_000)
            for records in got.values():
                yield from records
            if any(got.values()):
                last_data = time.monotonic()
            if at_end(consumer):
                break
    finally:
        consumer.close()

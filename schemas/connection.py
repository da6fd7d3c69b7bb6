"""One translation of the project's Kafka connection settings into each client's options, in
the style of quix-streams' ``ConnectionConfig``: kafka-python (producers, the analyst,
``subscribe``, admin), aiokafka (the worker's acknowledged producers), librdkafka
(confluent-kafka: the replay's device reports) and Faust (the worker's app). Nothing else maps
security settings to a client.

No Kafka client is imported at module level (reading settings and building the command line
stay light); Faust's credential classes are imported when they are asked for.

>>> from schemas.settings import KafkaSettings
>>> s = KafkaSettings(bootstrap_servers="a:9092,b:9092")
>>> kafka_python_options(s)["bootstrap_servers"], aiokafka_options(s)["bootstrap_servers"]
(['a:9092', 'b:9092'], ['a:9092', 'b:9092'])
>>> faust_options(s)
{'broker': ['kafka://a:9092', 'kafka://b:9092'], 'broker_credentials': None, 'producer_compression_type': 'zstd'}

Compression is a producer option (a consumer decompresses whatever batches it is served):
``compression_type`` for every producer, ``topic_compression`` per topic where the producer
writes one topic (kafka-python's report sink, the worker's acknowledged producers); Faust has
one producer for all its topics and takes ``compression_type``.

>>> z = KafkaSettings(compression_type="lz4", topic_compression={"ptt.estimate-frames": "zstd"})
>>> producer_options(z, "ptt.reports"), producer_options(z, "ptt.estimate-frames")
({'compression_type': 'lz4'}, {'compression_type': 'zstd'})
>>> faust_options(z)["producer_compression_type"], producer_options(KafkaSettings(compression_type="none"), "t")
('lz4', {'compression_type': None})
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = ["ConnectionFields", "aiokafka_options", "client_logs", "compression_for", "faust_options",
           "kafka_python_options", "librdkafka_options", "producer_options", "ssl_context"]


class _Secret(Protocol):
    """A secret string (pydantic's ``SecretStr``)."""

    def get_secret_value(self) -> str: ...


class ConnectionFields(Protocol):
    """What the translations read from a settings object: the connection fields of
    ``schemas.settings.KafkaSettings``. A protocol, not that class, so that this module imports
    nothing of the project and ``schemas.settings`` can import it at module level (no circle)."""

    @property
    def bootstrap_servers(self) -> str: ...
    @property
    def security_protocol(self) -> str: ...
    @property
    def sasl_mechanism(self) -> str | None: ...
    @property
    def sasl_plain_username(self) -> str | None: ...
    @property
    def sasl_plain_password(self) -> _Secret | None: ...
    @property
    def ssl_cafile(self) -> Path | None: ...
    @property
    def ssl_certfile(self) -> Path | None: ...
    @property
    def ssl_keyfile(self) -> Path | None: ...
    @property
    def ssl_password(self) -> _Secret | None: ...
    @property
    def request_timeout_ms(self) -> int: ...
    @property
    def bootstrap_timeout_ms(self) -> int: ...
    @property
    def compression_type(self) -> str: ...
    @property
    def topic_compression(self) -> Mapping[str, str]: ...


def _servers(s: ConnectionFields) -> list[str]:
    return s.bootstrap_servers.split(",")


def _password(s: ConnectionFields) -> str | None:
    return s.sasl_plain_password.get_secret_value() if s.sasl_plain_password else None


def compression_for(s: ConnectionFields, topic: str | None = None) -> str | None:
    """The codec of a producer writing ``topic`` (None: every topic, or uncompressed)."""
    codec = s.topic_compression.get(topic, s.compression_type) if topic is not None else s.compression_type
    return None if codec == "none" else codec


def producer_options(s: ConnectionFields, topic: str | None = None) -> dict[str, Any]:
    """What a producer (kafka-python or aiokafka: the same option name) adds to the connection
    options: the codec of its batches for ``topic``."""
    return {"compression_type": compression_for(s, topic)}


def kafka_python_options(s: ConnectionFields) -> dict[str, Any]:
    """Connection and security options for any kafka-python client (it builds its own TLS
    context from the file paths, when it connects)."""
    kw: dict[str, Any] = {
        "bootstrap_servers": _servers(s),
        "security_protocol": s.security_protocol,
        "request_timeout_ms": s.request_timeout_ms,
        "bootstrap_timeout_ms": s.bootstrap_timeout_ms,
    }
    if s.sasl_mechanism:
        kw["sasl_mechanism"] = s.sasl_mechanism
        kw["sasl_plain_username"] = s.sasl_plain_username
        kw["sasl_plain_password"] = _password(s)
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        value = getattr(s, name)
        if value is not None:
            kw[name] = str(value)
    if s.ssl_password is not None:
        kw["ssl_password"] = s.ssl_password.get_secret_value()
    return kw


def ssl_context(s: ConnectionFields) -> ssl.SSLContext | None:
    """The TLS context of an SSL or SASL_SSL connection (None otherwise), for the asyncio clients."""
    if s.security_protocol not in ("SSL", "SASL_SSL"):
        return None
    ctx = ssl.create_default_context(cafile=str(s.ssl_cafile) if s.ssl_cafile else None)
    if s.ssl_certfile:
        ctx.load_cert_chain(str(s.ssl_certfile), str(s.ssl_keyfile) if s.ssl_keyfile else None,
                            s.ssl_password.get_secret_value() if s.ssl_password else None)
    return ctx


def aiokafka_options(s: ConnectionFields) -> dict[str, Any]:
    """Connection and security options for an aiokafka client."""
    kw: dict[str, Any] = {"bootstrap_servers": _servers(s), "request_timeout_ms": s.request_timeout_ms,
                          "security_protocol": s.security_protocol}
    ctx = ssl_context(s)
    if ctx is not None:
        kw["ssl_context"] = ctx
    if s.security_protocol.startswith("SASL"):
        kw["sasl_mechanism"] = s.sasl_mechanism or "PLAIN"
        kw["sasl_plain_username"] = s.sasl_plain_username
        kw["sasl_plain_password"] = _password(s)
    return kw


def librdkafka_options(s: ConnectionFields, topic: str | None = None) -> dict[str, Any]:
    """Connection, security and codec options of a librdkafka (confluent-kafka) producer writing ``topic``.

    >>> from schemas.settings import KafkaSettings
    >>> o = librdkafka_options(KafkaSettings(bootstrap_servers="a:9092,b:9092", compression_type="none"))
    >>> o["bootstrap.servers"], o["security.protocol"], o["compression.type"]
    ('a:9092,b:9092', 'plaintext', 'none')
    """
    kw: dict[str, Any] = {"bootstrap.servers": s.bootstrap_servers, "security.protocol": s.security_protocol.lower(),
                          "request.timeout.ms": s.request_timeout_ms,
                          "compression.type": compression_for(s, topic) or "none"}
    if s.security_protocol.startswith("SASL"):
        kw["sasl.mechanism"] = s.sasl_mechanism or "PLAIN"
        kw["sasl.username"] = s.sasl_plain_username or ""
        kw["sasl.password"] = _password(s) or ""
    for name, option in (("ssl_cafile", "ssl.ca.location"), ("ssl_certfile", "ssl.certificate.location"),
                         ("ssl_keyfile", "ssl.key.location")):
        value = getattr(s, name)
        if value is not None:
            kw[option] = str(value)
    if s.ssl_password is not None:
        kw["ssl.key.password"] = s.ssl_password.get_secret_value()
    return kw


def faust_options(s: ConnectionFields) -> dict[str, Any]:
    """The ``broker``, ``broker_credentials`` and ``producer_compression_type`` options of a Faust app."""
    credentials: Any = None
    if s.security_protocol != "PLAINTEXT":
        import faust

        ctx = ssl_context(s)
        if s.security_protocol.startswith("SASL"):
            credentials = faust.SASLCredentials(username=s.sasl_plain_username or "", password=_password(s) or "",
                                                mechanism=s.sasl_mechanism or "PLAIN", ssl_context=ctx)
        else:
            credentials = faust.SSLCredentials(ctx)
    return {"broker": [f"kafka://{hp}" for hp in _servers(s)], "broker_credentials": credentials,
            "producer_compression_type": compression_for(s)}


_CLIENT_LOGGERS = frozenset({"kafka", "aiokafka"})


def client_logs(level: int) -> None:
    """kafka-python's loggers (``kafka``) at ``level``; and unless a client's logger is at DEBUG,
    what it or aiokafka logs with a traceback is one line. kafka-python logs a connection the
    broker reset with ``log.exception`` (``kafka.net.transport``): a user would read its
    traceback as a crash of ours, and a lost broker is already told in one line of its own.
    Installed once per process (a record factory: whatever handlers Faust sets up later).

    >>> import io
    >>> before = logging.getLogRecordFactory(), logging.getLogger("kafka").level
    >>> client_logs(logging.WARNING)
    >>> out = io.StringIO()
    >>> handler = logging.StreamHandler(out)
    >>> log = logging.getLogger("kafka.net.transport")
    >>> log.addHandler(handler)
    >>> try:
    ...     raise ConnectionResetError(104, "Connection reset by peer")
    ... except OSError:
    ...     log.exception("%s: Error receiving network data", "<transport>")
    >>> log.removeHandler(handler)
    >>> print(out.getvalue().strip())
    <transport>: Error receiving network data (ConnectionResetError: [Errno 104] Connection reset by peer)
    >>> logging.setLogRecordFactory(before[0]); logging.getLogger("kafka").setLevel(before[1])
    """
    logging.getLogger("kafka").setLevel(level)
    factory = logging.getLogRecordFactory()
    if getattr(factory, "one_line", False):
        return

    def one_line(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        if record.exc_info and record.exc_info[1] is not None and record.name.partition(".")[0] in _CLIENT_LOGGERS \
                and logging.getLogger(record.name).getEffectiveLevel() > logging.DEBUG:
            exc = record.exc_info[1]
            record.msg, record.args = f"{record.getMessage()} ({type(exc).__name__}: {exc})", ()
            record.exc_info, record.exc_text = None, None
        return record

    marked: Callable[..., logging.LogRecord] = one_line
    marked.one_line = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(marked)

"""Connection settings shared by every process that talks to Kafka (no Kafka import here,
so that reading settings and building the command line stay light)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from .connection import kafka_python_options
from .enrollment import MIN_SECRET_BYTES, Enrollment, EnrollmentError

__all__ = ["BrokerLossSettings", "Codec", "EnrollmentSettings", "KafkaSettings", "cache_dir", "source_topic"]

# the record-batch codecs that work end to end with the embedded broker (Tansu 0.6.0) and every
# client here (docs/operations.md, "Compressed topics"); snappy needs python-snappy in kafka-python
Codec = Literal["none", "gzip", "lz4", "zstd"]


def cache_dir(*parts: str, env: Mapping[str, str] | None = None) -> Path:
    """Where ptt keeps what it can rebuild (parsed days, synthetic days, the worker's local files,
    the benchmarks' data), never the working directory: the user's cache directory of the XDG
    Base Directory spec, ``$XDG_CACHE_HOME/ptt`` (when set to an absolute path), else
    ``~/.cache/ptt``; ``parts`` below it. Nothing is created here.

    >>> cache_dir("worker", env={"XDG_CACHE_HOME": "/var/cache/alice", "HOME": "/home/alice"}).as_posix()
    '/var/cache/alice/ptt/worker'
    >>> cache_dir(env={"XDG_CACHE_HOME": "not/absolute", "HOME": "/home/alice"}).as_posix()
    '/home/alice/.cache/ptt'
    """
    env = os.environ if env is None else env
    xdg = env.get("XDG_CACHE_HOME", "")
    home = env.get("HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else (Path(home) if home else Path.home()) / ".cache"
    return base.joinpath("ptt", *parts)


class KafkaSettings(BaseSettings):
    """Broker address, topic names and security options (passed through to kafka-python)."""

    model_config = SettingsConfigDict(env_prefix="PTT_", frozen=True, extra="ignore")

    bootstrap_servers: str = Field(default="127.0.0.1:9092", description="host:port[,host:port...]")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_password: SecretStr | None = None
    reports_topic: str = "ptt.reports"
    queries_topic: str = "ptt.queries"
    truth_topic: str = "ptt.truth"
    partitions: int = Field(default=4, ge=1, description="partitions of the reports topic when created")
    request_timeout_ms: int = Field(default=30_000, ge=1000)
    bootstrap_timeout_ms: int = Field(default=10_000, ge=100, description="how long one connection attempt waits")
    connect_attempts: int = Field(default=3, ge=1, description="connection attempts (exponential back-off)")
    compression_type: Codec = Field(
        default="zstd",
        description="codec of every producer's record batches (kafka-python, aiokafka, Faust's producer); "
                    "the broker stores and serves them compressed (docs/operations.md, \"Compressed topics\")")
    topic_compression: dict[str, Codec] = Field(
        default={},
        description="per-topic codec overriding compression_type (flag: ptt.estimate-frames=zstd,ptt.reports=lz4, "
                    "merged over the env's JSON) for the producers that write one topic (reports, estimates, "
                    "frames, changelog); Faust's one producer (dead letters, ticks) uses compression_type")

    def __hash__(self) -> int:  # frozen, but topic_compression is a dict
        return hash(tuple(sorted(self.to_env().items())))

    def to_env(self) -> dict[str, str]:
        """The ``PTT_*`` environment variables that reproduce these settings in a child process."""
        env: dict[str, str] = {}
        for name, value in self.model_dump().items():
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            if isinstance(value, tuple):
                value = json.dumps(list(value))
            elif isinstance(value, dict):
                value = json.dumps(value)
            env[f"PTT_{name.upper()}"] = str(value)
        return env

    def client_kwargs(self) -> dict[str, Any]:
        """Connection and security options for any kafka-python client (schemas.connection)."""
        return kafka_python_options(self)


class BrokerLossSettings(KafkaSettings):
    """Connection settings of a long-running process (``replay``, ``worker``): how long a lost
    broker is waited for before the process stops with one line and exit code 7."""

    broker_loss_timeout_s: float = Field(
        default=30.0, gt=0, le=3600,
        description="stop with exit code 7 when the broker has acknowledged nothing (or answered no "
                    "metadata request) for this long, when a topic in use has been absent from its "
                    "metadata for a third of this (1-10 s), or at once when one was recreated (an "
                    "embedded broker's restart)")


class EnrollmentSettings(BrokerLossSettings):
    """The enrollment of the shuffler's devices (``shuffler``; ``replay --via-shuffler``, whose
    simulated fleet stands in for the enrolled devices): the secret every device key derives
    from (schemas/enrollment.py) and how many devices are enrolled."""

    enrollment_secret: SecretStr | None = Field(
        default=None, description="the enrollment secret (at least 32 bytes; prefer the file or the env variable "
                                  "to the flag, which other users see in the process list)")
    enrollment_secret_file: Path | None = Field(
        default=None, description="a file holding the enrollment secret (surrounding whitespace stripped); wins "
                                  "over enrollment_secret")
    enrolled_devices: int = Field(default=262_144, ge=1, le=2**32,
                                  description="the devices enrolled, ids 0..N-1: a report of another id is "
                                              "dead-lettered unknown_device (a replay's fleet must fit)")

    def enrollment(self) -> Enrollment:
        """The enrollment these settings name; :class:`~schemas.enrollment.EnrollmentError` (one
        line) if there is no usable secret. Reads the file: call it before touching the network."""
        if self.enrollment_secret_file is not None:
            try:
                secret = self.enrollment_secret_file.read_bytes().strip()
            except OSError as exc:
                raise EnrollmentError(f"cannot read the enrollment secret file {self.enrollment_secret_file}: "
                                      f"{exc.strerror or exc}") from exc
        elif self.enrollment_secret is not None:
            secret = self.enrollment_secret.get_secret_value().encode()
        else:
            raise EnrollmentError("no enrollment secret: give --enrollment-secret-file or set PTT_ENROLLMENT_SECRET "
                                  f"(at least {MIN_SECRET_BYTES} bytes, e.g. `python -c 'import secrets; "
                                  "print(secrets.token_hex(32))'`)")
        return Enrollment(secret, self.enrolled_devices)


def source_topic(device_topic: str) -> str:
    """The topic of a replay's per-epoch source notes beside the shuffler's device topic (one
    partition; only the replay principal may write it: the shuffler's trusted clock).

    >>> source_topic("ptt.device-reports")
    'ptt.device-reports-source'
    """
    return f"{device_topic}-source"

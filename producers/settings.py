"""Configuration of the replay: environment variables (``PTT_*``) and flags; flags win.

One frozen settings object per process, read at start-up (never at import).
"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["KafkaSettings", "ReplaySettings"]


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

    def to_env(self) -> dict[str, str]:
        """The ``PTT_*`` environment variables that reproduce these settings in a child process."""
        import json

        env: dict[str, str] = {}
        for name, value in self.model_dump().items():
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            env[f"PTT_{name.upper()}"] = json.dumps(list(value)) if isinstance(value, tuple) else str(value)
        return env

    def client_kwargs(self) -> dict[str, Any]:
        """Connection and security options for any kafka-python client."""
        kw: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
            "bootstrap_timeout_ms": self.bootstrap_timeout_ms,
        }
        if self.sasl_mechanism:
            kw["sasl_mechanism"] = self.sasl_mechanism
            kw["sasl_plain_username"] = self.sasl_plain_username
            password = self.sasl_plain_password
            kw["sasl_plain_password"] = password.get_secret_value() if password else None
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            value = getattr(self, name)
            if value is not None:
                kw[name] = str(value)
        if self.ssl_password is not None:
            kw["ssl_password"] = self.ssl_password.get_secret_value()
        return kw


class ReplaySettings(KafkaSettings):
    """Everything ``ptt replay`` needs."""

    pems_raw: Path | None = Field(default=None, description="a PeMS Station Raw 30 s file (gzip or plain)")
    pems_5min: Path | None = Field(default=None, description="a PeMS Station 5-Minute file")
    meta: Path | None = Field(default=None, description="a PeMS station metadata file")
    synthetic_stations: int = Field(default=16, ge=1, description="stations of the synthetic default day")
    synthetic_seed: int = 2026
    synthetic_date: date = date(2026, 11, 18)
    weekend: bool | None = Field(default=None, description="weekend traffic shape (default: from the date)")
    data_dir: Path = Field(default=Path(".ptt-data"), description="where the synthetic day is written")

    seed: int = Field(default=1, description="seed of the fleet's devices")
    fleet_size: int | None = Field(default=None, ge=1, description="vehicles (default: the day's peak total flow)")
    expand_to: int | None = Field(default=None, ge=1, description="query expansion: grow the fleet to N vehicles")
    mode: Literal["per-vehicle", "tally"] = "per-vehicle"
    speed: float = Field(default=0.0, ge=0.0, description="1 = real time, k = k x faster, 0 = as fast as possible")
    producers: int = Field(default=1, ge=1, le=64, description="producer processes sharing the fleet")
    batch_size: int = Field(default=20_000, ge=1, description="reports per Kafka record")
    truth: bool = Field(default=True, description="publish ground truth on the evaluation topic")
    device_epsilon_limit: float = Field(default=10.0, gt=0)
    device_blacklist: tuple[int, ...] = ()
    max_epochs: int | None = Field(default=None, ge=1, description="stop after this many epochs")
    start_epoch: int = Field(default=0, ge=0, description="skip this many epochs of the day")
    default_queries: bool = Field(default=True, description="publish SP, ALP and RR queries if none exist")

    @model_validator(mode="after")
    def _one_source(self) -> ReplaySettings:
        if self.pems_raw is not None and self.pems_5min is not None:
            raise ValueError("give --pems-raw or --pems-5min, not both")
        if self.expand_to is not None and self.fleet_size is not None and self.expand_to < self.fleet_size:
            raise ValueError("--expand-to must be at least --fleet-size")
        return self

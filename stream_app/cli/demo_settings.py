"""Configuration of ``ptt demo`` (flags, or ``PTT_DEMO_*`` environment variables; flags win).

Kept apart from :mod:`stream_app.cli.demo` so that docs/gen_configuration.py reads the settings alone."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from producers.settings import parse_mechanisms
from schemas.wire import Release

__all__ = ["DEFAULT_METRICS_PORT", "DEFAULT_PROMETHEUS_PORT", "DemoSettings", "demo_query_mechanisms"]

DEFAULT_METRICS_PORT = 6066
DEFAULT_PROMETHEUS_PORT = 9090


class DemoSettings(BaseSettings):
    """Everything ``ptt demo`` needs; the broker, worker and Prometheus are started for you."""

    model_config = SettingsConfigDict(env_prefix="PTT_DEMO_", frozen=True, extra="ignore")

    speed: float = Field(default=120.0, ge=0.0, description="x real time: 120 replays a day in 12 minutes, "
                                                           "0 as fast as possible")
    max_epochs: int | None = Field(default=None, ge=1, description="stop after this many 30 s epochs")
    stations: int = Field(default=16, ge=1, le=10_000, description="stations of the synthetic day")
    port: int | None = Field(default=None, ge=1, le=65535, description="broker port (default: a free one)")
    metrics_port: int | None = Field(default=None, ge=1, le=65535,
                                     description=f"port of the worker's /metrics (default {DEFAULT_METRICS_PORT}, "
                                                 "or a free one when that is taken)")
    prometheus_port: int | None = Field(default=None, ge=1, le=65535,
                                        description=f"Prometheus port (default {DEFAULT_PROMETHEUS_PORT}, or a "
                                                    "free one when that is taken)")
    exit_when_done: bool = Field(default=False, description="stop after the replay instead of serving on")
    out: Path = Field(default=Path("ptt-demo-out"),
                      description="directory for logs, estimates.jsonl, estimates.parquet (the same "
                                  "estimates from the frames, long form), truth.jsonl and the report; kept afterwards")
    pems_raw: Path | None = Field(default=None, description="replay this PeMS Station Raw 30 s file instead of the "
                                                             "synthetic day (plain, gzip, bz2, xz or zip)")
    pems_5min: Path | None = Field(default=None, description="replay this PeMS Station 5-Minute file instead")
    meta: Path | None = Field(default=None, description="PeMS station metadata file for --pems-raw/--pems-5min")
    day: date | None = Field(default=None, description="replay only this day (YYYY-MM-DD) of a multi-day file")
    via_shuffler: bool = Field(default=False, description="every device sends its report alone to the device topic; "
                                                          "a `ptt shuffler` started with the demo anonymizes and "
                                                          "batches them (same estimates)")
    transport: Literal["kafka", "http"] = Field(
        default="kafka", description="with --via-shuffler: how the devices send, 'kafka' (each report a record on "
                                     "the device topic, the fast path) or 'http' (each device's reports of an epoch "
                                     "in one request to the shuffler's front door)")
    release: Release | None = Field(default=None,
                                    description="with --via-shuffler: what the shuffler releases, 'aggregate' (only "
                                                "the counts) or 'permuted' (the reports, permuted); default: the "
                                                "shuffler's (aggregate)")

    query_mechanisms: str | None = Field(default=None,
                                         description="the demo queries' mechanisms, comma-separated registry names "
                                                     "(e.g. sp,alp,unary), MECH@SPAN for a span query, MECH@SPAN//M "
                                                     "with a day cap of M passages; default: "
                                                     "PTT_QUERY_MECHANISMS, else the registry's default queries and "
                                                     "hourly flows (alp,unary,unary@3600)")

    fleet_model: Literal["spans", "trips"] = Field(
        default="spans", description="'trips': every vehicle keeps its identity all day and drives trips along "
                                     "corridors, the fleet at the papers' vehicles per passage (needed for a day "
                                     "cap, MECH@SPAN/P/M or MECH@SPAN//M); 'spans': a span query's vehicles placed "
                                     "at random, identities kept through a span")

    @field_validator("query_mechanisms")
    @classmethod
    def _known_mechanisms(cls, value: str | None) -> str | None:
        return None if value is None else ",".join(parse_mechanisms(value))

    @model_validator(mode="after")
    def _one_source(self) -> DemoSettings:
        if self.pems_raw is not None and self.pems_5min is not None:
            raise ValueError("give --pems-raw or --pems-5min, not both")
        if self.transport == "http" and not self.via_shuffler:
            raise ValueError("--transport http sends to the shuffler's front door: it needs --via-shuffler")
        if self.release is not None and not self.via_shuffler:
            raise ValueError("--release chooses what the shuffler releases: it needs --via-shuffler")
        return self


def demo_query_mechanisms() -> str:
    """The demo's queries when none are chosen: ``PTT_QUERY_MECHANISMS``, else the registry's
    default queries at 30 s and an hourly flow query of symmetric unary RR (``unary@3600``,
    planned by ``ptt plan fleet`` at ``PTT_FLOW_DAY_BUDGET``): where a 30-s count is noise, an
    hour's flow is traffic."""
    import os

    from estimators import default_query_mechanisms
    return os.environ.get("PTT_QUERY_MECHANISMS") or ",".join((*default_query_mechanisms(), "unary@3600"))

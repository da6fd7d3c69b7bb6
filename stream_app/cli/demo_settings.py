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
#: the default replay: two hours (07:00-09:00, the morning peak) -- through the shuffler every
#: device report is a record, ~62k a 30-s epoch at the papers' fleet for 16 stations
DEFAULT_EPOCHS = 240
DEFAULT_PROMETHEUS_PORT = 9090


class DemoSettings(BaseSettings):
    """Everything ``ptt demo`` needs; the broker, worker and Prometheus are started for you."""

    model_config = SettingsConfigDict(env_prefix="PTT_DEMO_", frozen=True, extra="ignore")

    speed: float = Field(default=120.0, ge=0.0, description="x real time (120: an hour in 30 s, if the pipeline "
                                                           "keeps up), 0 as fast as possible")
    max_epochs: int | None = Field(default=DEFAULT_EPOCHS, ge=1,
                                   description=f"stop after this many 30 s epochs (default {DEFAULT_EPOCHS}: the "
                                               "two hours of the morning peak from --start-time, about 10 minutes "
                                               "through the shuffler on a busy 2-core machine; 2880 for a whole "
                                               "day)")
    start_time: str = Field(default="07:00", pattern=r"^([01]\d|2[0-3]):[0-5]\d$",
                            description="replay from this time of the day (HH:MM, Pacific; 00:00 for the whole day)")
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
    via_shuffler: bool = Field(default=True, description="every device sends its report alone to the device topic; "
                                                         "a `ptt shuffler` started with the demo anonymizes them "
                                                         "and releases only their counts (the private system); "
                                                         "--no-shuffler replays straight into the worker's topic, "
                                                         "where only the local figure holds")
    day_budget: float = Field(default=1.0, gt=0, description="a vehicle's whole day across every demo query, "
                                                             "through the shuffler's aggregate release: the queries "
                                                             "are planned together to fit it (ptt plan fleet "
                                                             "--day-budget; half a minute or more the first time, then "
                                                             "remembered)")
    plan_day: bool = Field(default=True, description="plan the queries together for --day-budget; --no-plan-day: "
                                                     "each 30-s query at its registry defaults and a span query "
                                                     "alone at the budget (quicker to start; the banner's day "
                                                     "figure is then whatever they add up to)")
    plots: bool = Field(default=True, description="draw the report's plots when the demo ends (about a second "
                                                  "each); --no-plots: the summary only, no matplotlib (quicker, "
                                                  "e.g. on a headless server; ptt report draws them later)")
    transport: Literal["kafka", "http"] = Field(
        default="kafka", description="how the devices send to the shuffler, 'kafka' (each report a record on "
                                     "the device topic, the fast path) or 'http' (each device's reports of an epoch "
                                     "in one request to the shuffler's front door)")
    release: Release | None = Field(default=None,
                                    description="what the shuffler releases, 'aggregate' (only "
                                                "the counts) or 'permuted' (the reports, permuted); default: the "
                                                "shuffler's (aggregate)")

    query_mechanisms: str | None = Field(default=None,
                                         description="the demo queries' mechanisms, comma-separated registry names "
                                                     "(e.g. sp,alp,unary), MECH@SPAN for a span query, MECH@SPAN//M "
                                                     "with a day cap of M passages; default: "
                                                     "PTT_QUERY_MECHANISMS, else hourly flows with a day cap of "
                                                     "40 passages and ALP's 30-s counts (unary@3600//40,alp)")

    fleet_model: Literal["spans", "trips"] = Field(
        default="trips", description="'trips': every vehicle keeps its identity all day and drives trips along "
                                     "corridors, the fleet at the papers' vehicles per passage (needed for a day "
                                     "cap, MECH@SPAN/P/M or MECH@SPAN//M); 'spans': a span query's vehicles placed "
                                     "at random, identities kept through a span")

    @field_validator("query_mechanisms")
    @classmethod
    def _known_mechanisms(cls, value: str | None) -> str | None:
        return None if value is None else ",".join(parse_mechanisms(value))

    @property
    def start_s(self) -> int:
        """--start-time in seconds after midnight."""
        hours, minutes = self.start_time.split(":")
        return int(hours) * 3600 + int(minutes) * 60

    @model_validator(mode="after")
    def _one_source(self) -> DemoSettings:
        if self.pems_raw is not None and self.pems_5min is not None:
            raise ValueError("give --pems-raw or --pems-5min, not both")
        if self.transport == "http" and not self.via_shuffler:
            raise ValueError("--transport http sends to the shuffler's front door: not with --no-shuffler")
        if self.release is not None and not self.via_shuffler:
            raise ValueError("--release chooses what the shuffler releases: not with --no-shuffler")
        return self


def demo_query_mechanisms(fleet_model: str = "trips") -> str:
    """The demo's queries when none are chosen: ``PTT_QUERY_MECHANISMS``, else hourly flows by
    symmetric unary RR, each vehicle naming at most 40 passages a day (``unary@3600//40``), and
    the mission's 30-s counts by ALP's averaged Yes/bottom estimator (``alp``), planned together
    for the demo's ``--day-budget``: where a 30-s count is noise at that budget, an hour's flow
    is traffic. A fleet that does not drive all day (``spans``) cannot keep a day cap: its
    hourly flows then have none."""
    import os

    return os.environ.get("PTT_QUERY_MECHANISMS") or ("unary@3600//40,alp" if fleet_model == "trips" else
                                                       "unary@3600,alp")

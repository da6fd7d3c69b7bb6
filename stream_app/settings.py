"""Configuration of a stream-app worker: PTT_* environment variables and flags; flags win."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from schemas.settings import BrokerLossSettings, cache_dir

__all__ = ["WorkerSettings"]


class WorkerSettings(BrokerLossSettings):
    app_id: str = Field(default="ptt-stream", description="Faust app id: consumer group and internal topic prefix")
    estimates_topic: str = "ptt.estimates"
    estimate_output: Literal["rows", "frames", "both"] = Field(
        default="rows", description="what a closed epoch publishes: per-row JSON estimates (estimates_topic), one "
                                    "Arrow estimate frame per query and epoch (frames_topic), or both; "
                                    "frames at 500 stations or more (a 3,220-station day of rows is ~32 GB)")
    frames_topic: str = Field(default="ptt.estimate-frames",
                              description="topic of the estimate frames (estimate_output frames or both)")
    dead_letter_topic: str = "ptt.dead-letter"
    internal_partitions: int = Field(default=4, ge=1, description="partitions of the re-keyed stage and tables")
    web_host: str = Field(default="127.0.0.1", description="where /metrics is served")
    web_port: int = Field(default=6066, ge=1, le=65535, description="port of /metrics")
    instance_token: str = Field(default="", max_length=64, pattern=r"^[A-Za-z0-9_-]*$",
                                description="an identity /metrics answers with in its X-PTT-Instance header (the "
                                            "demo's random token: the worker it waits for is its own, not another "
                                            "program on the port); empty: no header")
    confidences: tuple[float, ...] = Field(default=(0.95, 0.99), description="confidence levels of the bounds")
    min_participants: int = Field(default=20, ge=0, description="withhold estimates of epochs with fewer vehicles")
    allowed_lateness_epochs: int = Field(default=2, ge=0, description="watermark lateness before an epoch closes")
    wall_clock_grace_s: float = Field(default=60.0, gt=0,
                                      description="live data: close an epoch this long after its end")
    watermark_idle_s: float = Field(default=20.0, ge=0,
                                    description="an epoch the watermark passed closes only after receiving nothing "
                                                "for this long (forged markers far ahead cannot close epochs whose "
                                                "data is still arriving)")
    stall_close_s: float = Field(default=300.0, ge=0,
                                 description="an open epoch that received nothing for this long closes as by the "
                                             "watermark (a producer died before marking it; its incomplete "
                                             "markers withhold it: no epoch is left absent); 0: never")
    live_horizon_s: float = Field(default=3600.0, gt=0,
                                  description="epochs older than this are not closed by the clock")
    tick_interval_s: float = Field(default=5.0, gt=0, description="how often the wall-clock check runs")
    batch_records: int = Field(default=250, ge=1, description="records taken per batch by stage 1 and stage 2")
    stage2_batch_wait_s: float = Field(default=0.1, gt=0, description="longest wait to fill a stage-2 batch")
    stage1_batch_wait_s: float = Field(default=0.05, gt=0, description="longest wait to fill a stage-1 batch")
    max_producers: int = Field(default=64, ge=1, description="largest producer count a marker may claim")
    horizon_epochs: int = Field(default=720, ge=1, description="refuse records more than this many epochs ahead of "
                                                             "the newest epoch a quorum of partitions reached "
                                                             "(keep it above the partitions' skew when reading a "
                                                             "backlog)")
    shuffle_delta: float = Field(default=1e-6, gt=0, lt=1e-2,
                                 description="delta of the published epsilon_shuffled (the central epsilon of an "
                                             "epoch released by a shuffler that attests its shuffle size), in "
                                             "(0, 0.01); keep it well below 1 / the population")
    unknown_query_grace_s: float = Field(default=10.0, ge=0, description="how long stage 1 waits for a query it "
                                                                       "does not know yet before dead-lettering")
    fault_state_write_delay_s: float = Field(default=0.0, ge=0, le=600,
                                             description="testing only (fault injection for the crash tests): hold "
                                                         "every window-state write this long before sending it")
    fault_start_delay_s: float = Field(default=0.0, ge=0, le=600,
                                       description="testing only (fault injection for the crash tests): hold the "
                                                   "worker's start task (its first read of the queries topic and "
                                                   "its producers' start) this long")
    store: str = Field(default="memory://", description="Faust table store (state is rebuilt from the changelog)")
    worker_dir: Path = Field(default_factory=partial(cache_dir, "worker"),
                             description="the worker's local files (Faust datadir; ptt demo: worker/ in its --out)")
    log_level: str = "info"

    @field_validator("confidences")
    @classmethod
    def _levels(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v or any(not 0 < c < 1 for c in v):
            raise ValueError("confidences must be in (0, 1)")
        return tuple(sorted(set(v)))

    @property
    def rows_on(self) -> bool:
        return self.estimate_output != "frames"

    @property
    def frames_on(self) -> bool:
        return self.estimate_output != "rows"

    @property
    def partials_topic(self) -> str:
        return f"{self.app_id}-partials"

    @property
    def changelog_topic(self) -> str:
        return f"{self.app_id}-windows-changelog"

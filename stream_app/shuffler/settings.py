"""Configuration of a shuffler instance (``ptt shuffler``): PTT_* environment variables and flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from schemas.enrollment import Enrollment, Revocation
from schemas.settings import EnrollmentSettings, source_topic
from schemas.wire import Release

__all__ = ["ShufflerSettings"]


class ShufflerSettings(EnrollmentSettings):
    device_topic: str = Field(default="ptt.device-reports",
                              description="topic of the single device reports (input), one record per report")
    device_partitions: int = Field(default=4, ge=1, description="partitions of the device topic when created")
    dead_letter_topic: str = "ptt.dead-letter"
    shuffler_id: str = Field(default="ptt-shuffler", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,40}$",
                             description="names the instances' transactional ids, consumer group and state topics")
    instance_index: int = Field(default=0, ge=0, description="this instance (0..instance_count-1): it reads the "
                                                              "device partitions p with p % count == index")
    instance_count: int = Field(default=1, ge=1, le=64,
                                description="shuffler instances sharing the device topic (producers in the "
                                            "end-of-epoch marker protocol)")
    min_crowd: int = Field(default=20, ge=1, description="withhold an epoch with fewer device reports in a round")
    lateness_epochs: int = Field(default=2, ge=0, description="release an epoch once the shuffler's clock has "
                                                            "passed it by this many epochs")
    clock: Literal["source", "wall"] = Field(
        default="source", description="the trusted clock: a replay's source notes (`source`, on <device topic>-source, "
                                      "which only the replay principal may write) or this host's wall clock (`wall`, "
                                      "live devices); device reports never move it")
    ahead_epochs: int = Field(default=2, ge=0, le=60,
                              description="device reports are taken for epochs up to this many past the clock's "
                                          "newest finished epoch; later ones are dead-lettered outside_open_window")
    note_lead_epochs: int = Field(
        default=3, ge=1, le=60,
        description="a source note may move the clock at most this many epochs past the newest epoch something "
                    "vouches for (the clock itself, an authenticated device report) -- plus what --note-pace allows; "
                    "a note beyond is dead-lettered note_from_future (docs/wire.md, \"Source notes\")")
    note_pace: float = Field(
        default=0.0, ge=0, le=100_000,
        description="the pace of the replay whose notes this shuffler takes, data seconds per host second (its "
                    "--speed; 0: unpaced): a note may also run ahead of the newest vouched epoch by the epochs "
                    "the host's clock has passed at this pace since that epoch was vouched for")
    revoked_devices_file: Path | None = Field(
        default=None, description="a file of revoked device ids (one a line, # comments), re-read when it changes: "
                                  "their reports are dead-lettered revoked (here and at the front door)")
    idle_release_s: float = Field(default=5.0, gt=0, description="release every open epoch once all input is read "
                                                                "and nothing arrived for this long")
    release: Release = Field(
        default="aggregate",
        description="what an epoch's release holds per (query, version, epoch, round): 'aggregate', only the "
                    "per-value or per-station counts (one exact-tally batch); 'permuted', the device reports "
                    "themselves, permuted (reports batches)")
    batch_size: int = Field(default=5000, ge=1, description="reports per released columnar batch (permuted release)")
    max_poll_records: int = Field(default=20000, ge=1,
                                  description="device records read per transaction at most (each transaction "
                                              "waits for the broker a few times: fewer, larger ones read a "
                                              "backlog faster)")
    metrics_host: str = Field(default="127.0.0.1", description="where the shuffler's /metrics is served")
    metrics_port: int = Field(default=6067, ge=0, le=65535,
                              description="port of the shuffler's Prometheus /metrics (0: not served); every "
                                          "instance on a host needs its own")
    http_port: int = Field(default=0, ge=0, le=65535,
                           description="serve devices' uploads, POST /v1/reports, on this port (0: no front door; "
                                       "docs/wire.md, \"Devices over HTTP\")")
    http_host: str = Field(default="127.0.0.1", description="where the front door listens (0.0.0.0: every interface)")
    http_max_body_bytes: int = Field(default=64 * 1024, ge=64, le=16 * 1024 * 1024,
                                     description="a request's body, at most (413 too_large above)")
    http_max_reports: int = Field(default=64, ge=1, le=4096,
                                  description="device reports in one request, at most (400 too_many_reports)")
    http_device_reports_per_s: float = Field(
        default=32.0, gt=0, description="reports a second per enrolled device, on average (429 rate_limited with "
                                        "Retry-After); a device sends one report per slot (the default queries: 4 an "
                                        "epoch; a replay at --speed 60 through the door: 8/s a device)")
    http_device_burst: int = Field(default=1024, ge=1,
                                   description="reports per enrolled device at once above the rate")
    http_max_in_flight: int = Field(default=256, ge=1, le=65_536,
                                    description="requests the front door works on at once, at most (503 busy with "
                                                "Retry-After above)")
    http_max_connections: int = Field(
        default=16_384, ge=16, le=1_000_000,
        description="open connections at most (and at most the file-descriptor limit less 512): at the cap the "
                    "longest-open connection without a request in progress is closed for a new one, or the new one "
                    "is answered 503 too_many_connections")
    http_idle_timeout_s: float = Field(
        default=10.0, gt=0, le=3600,
        description="a connection is closed when no request's headers have arrived within this since it opened or "
                    "since its last answer (the keep-alive idle timeout and the deadline for a request's headers)")
    http_body_timeout_s: float = Field(default=10.0, gt=0, le=600,
                                       description="a request's body must arrive within this (408 slow_body)")
    http_max_header_bytes: int = Field(default=4096, ge=256, le=65_536,
                                       description="a connection's first request's whole headers, at most (431 above); "
                                                   "each header line of its later requests (400 above)")
    http_log_interval_s: float = Field(default=10.0, gt=0, le=3600,
                                       description="the front door logs each refusal reason at most once this "
                                                   "often, with its count")
    http_ack_timeout_s: float = Field(default=10.0, gt=0, le=300,
                                      description="answer 503 when the broker has not acknowledged a request's "
                                                  "reports within this")
    http_linger_ms: int = Field(default=2, ge=0, le=1000,
                                description="the front door's producer waits this long to batch records")
    http_stop_grace_s: float = Field(default=5.0, ge=0, le=120,
                                     description="on a stop, requests in flight get this long to finish")
    http_fault_hold_s: float = Field(default=0.0, ge=0, le=600,
                                     description="testing only (fault injection): hold every request this long at "
                                                 "--http-fault-point")
    http_fault_point: Literal["before_send", "after_ack"] = Field(
        default="after_ack", description="testing only: where --http-fault-hold-s holds a request")
    fault_hold_s: float = Field(default=0.0, ge=0, le=600,
                                description="testing only (fault injection for the crash tests): hold every "
                                            "transaction this long after its records are sent, before it commits")

    @model_validator(mode="after")
    def _index(self) -> ShufflerSettings:
        if self.instance_index >= self.instance_count:
            raise ValueError(f"instance_index {self.instance_index} must be below instance_count {self.instance_count}")
        if self.http_device_burst < self.http_max_reports:
            raise ValueError(f"http_device_burst {self.http_device_burst} is below http_max_reports "
                             f"{self.http_max_reports}: a full request could never be taken")
        return self

    def enrollment(self) -> Enrollment:
        """The enrollment (:meth:`EnrollmentSettings.enrollment`) with the revocation list of
        ``revoked_devices_file``; :class:`~schemas.enrollment.EnrollmentError` (one line) if
        either cannot be read. Reads the files: call it before touching the network."""
        e = super().enrollment()
        if self.revoked_devices_file is not None:
            e.revocation = Revocation.load(self.revoked_devices_file)
        return e

    @property
    def transactional_id(self) -> str:
        return f"{self.shuffler_id}-{self.instance_index}"

    @property
    def source_topic(self) -> str:
        """The replay's per-epoch source notes (one partition): the shuffler's trusted clock."""
        return source_topic(self.device_topic)

    @property
    def state_topic(self) -> str:
        return f"{self.shuffler_id}-state-{self.instance_index}"

"""The shuffler reads its device partitions abreast (``Shuffler._abreast``): a partition read
more than ``ABREAST_EPOCHS`` epochs past the slowest one, by the replay's notes, is paused until
that one catches up. An epoch is released only once every partition is read past it, and a
broker that fills each fetch from the first partition (Tansu) had partition 0 of a day's
backlog read to its end before partition 3 began: no release for minutes. No broker: the
policy is real, the consumer a stand-in that records what is paused.

Checked: with partition 0 read to epoch 10 and the others to 2..3, partition 0 is paused and
the others are not; once they catch up it is fetched again; with the wall clock (live devices,
no notes) nothing is paused."""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

from kafka import TopicPartition

from schemas import SourceEpoch
from stream_app.shuffler.policy import ShufflePolicy
from stream_app.shuffler.runtime import ABREAST_EPOCHS, Shuffler

E = 59_832_000
TPS = [TopicPartition("dev", p) for p in range(4)]


class _Consumer:
    def __init__(self) -> None:
        self.paused: set[int] = set()

    def pause_only(self, tps: Iterable[TopicPartition]) -> None:
        self.paused = {tp.partition for tp in tps}


def _shuffler(clock: str = "source") -> tuple[Shuffler, _Consumer]:
    p = ShufflePolicy(min_crowd=1, lateness_epochs=1, idle_release_s=1.0, partitions=range(4))
    p.note(SourceEpoch(epoch=E, opens=True), lambda e: [], 0.0)
    for e in range(E, E + 20):  # every partition holds 100 records of each epoch
        p.note(SourceEpoch(epoch=e, device_offsets=tuple((q, 100 * (e - E + 1)) for q in range(4))),
               lambda epoch: [], 0.0)
    shuffler = Shuffler.__new__(Shuffler)
    shuffler.policy = p
    shuffler.s = SimpleNamespace(clock=clock)  # type: ignore[assignment]
    shuffler._tps = TPS
    shuffler._consumer = consumer = _Consumer()  # type: ignore[assignment]
    return shuffler, consumer


def test_a_partition_far_ahead_waits_for_the_slowest() -> None:
    shuffler, consumer = _shuffler()
    assert ABREAST_EPOCHS == 2
    shuffler._abreast({0: 1_100, 1: 300, 2: 400, 3: 350})  # read to epochs E+10, E+2, E+3, E+2
    assert consumer.paused == {0}
    shuffler._abreast({0: 1_100, 1: 900, 2: 1_000, 3: 950})  # E+10, E+8, E+9, E+8: within 2 of E+8
    assert consumer.paused == set()


def test_live_devices_are_never_paused() -> None:
    shuffler, consumer = _shuffler(clock="wall")
    shuffler._abreast({0: 1_100, 1: 0, 2: 0, 3: 0})
    assert consumer.paused == set()

"""No epoch absent on the direct path (issue 24, item 4): ``ptt replay --producers 2`` with
producer 1 SIGKILLed before its first epoch. Producer 0 marks what it sent (as one of two) and
the replay stops; nothing later moves the watermark past those epochs, and their markers never
complete. With ``stall_close_s`` the worker still closes every one of them (as by the
watermark) and withholds it -- each epoch a marker named has a row, none published, none absent."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from producers.settings import ReplaySettings
from schemas import EndOfEpochSet, decode_record
from tests.processes import children, stopped

from .kafka_helpers import drain
from .stream_helpers import WorkerProcess, env_for, pipeline_settings, read_estimates, wait_for

pytestmark = pytest.mark.integration


def _producers(pid: int) -> list[int]:
    """The replay's producer processes (multiprocessing spawn children, not its resource tracker), in start order."""
    out = []
    for child in sorted(children(pid)):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            out.append(child)
    return out


def _marked(rs: ReplaySettings) -> dict[tuple[str, int], tuple[int, int]]:
    """(query, epoch) -> (producer index, epoch) of every end-of-epoch marker on the reports topic."""
    out = {}
    for r in drain(rs, rs.reports_topic, quiet_polls=1):
        if r.headers == [("ptt-kind", b"end_of_epoch")]:
            s = decode_record(r.value)
            if isinstance(s, EndOfEpochSet):
                out.update({(m.query_id, m.epoch): (m.producer_index, m.epoch) for m in s.markers})
    return out


def test_a_producer_killed_before_its_first_epoch_leaves_no_epoch_absent(broker: str, tmp_path: Path) -> None:
    rs, ws = pipeline_settings(broker, tmp_path, max_epochs=6, producers=2)
    ws = ws.model_copy(update={"stall_close_s": 5.0})
    worker = WorkerProcess(ws, tmp_path / "w.log").start()
    try:
        worker.wait_ready()
        proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "replay", "--speed", "0", "--quiet"],  # noqa: S603
                                env=env_for(rs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=tmp_path)
        try:
            deadline = time.monotonic() + 60
            while len(_producers(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.005)
            kids = _producers(proc.pid)
            assert len(kids) == 2, kids
            # frozen at once (it is still loading the day), killed once producer 0 marked what the
            # lockstep lets it (epochs 0 and 1): producer 1 dies without sending anything
            subprocess.run(["kill", "-STOP", str(kids[1])], check=True)  # noqa: S603,S607
            wait_for(lambda: stopped(kids[1]), 30, "producer 1 stopped, every thread")  # kill returns before
            wait_for(lambda: len({e for _, e in _marked(rs)}) >= 2 or proc.poll() is not None, 60,
                     "producer 0's first epochs")
            subprocess.run(["kill", "-KILL", str(kids[1])], check=True)  # noqa: S603,S607
            proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        marked = _marked(rs)
        assert {e for _, e in marked} and {i for i, _ in marked.values()} == {0}, marked
        marked_keys = set(marked)

        def rows() -> set[tuple[str, int]]:
            return {(k[0], k[2]) for k in read_estimates(ws)}

        wait_for(lambda: rows() >= marked_keys, 90, f"a row for each of the {len(marked)} marked (query, epoch)s")
        got = read_estimates(ws)
        assert {(k[0], k[2]) for k in got} == marked_keys
        assert all(e.withheld is not None for e in got.values()), [e for e in got.values() if e.withheld is None][:1]
    finally:
        worker.stop()

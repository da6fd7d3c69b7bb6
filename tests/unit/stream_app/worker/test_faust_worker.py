"""The worker process's runner (:mod:`stream_app.worker.faust_worker`): its shutdown closes the event
loop at once, not after mode's fixed one-second sleep, and the worker command uses it."""

from __future__ import annotations

import asyncio
import inspect
import time

from faust.worker import Worker

from stream_app.settings import WorkerSettings
from stream_app.worker import app as app_module
from stream_app.worker.app import create_app
from stream_app.worker.faust_worker import QuickStopWorker


def _shutdown_s(cls: type[Worker]) -> float:
    """How long ``cls``'s shutdown of an idle event loop takes (the step after the app stopped)."""
    loop = asyncio.new_event_loop()
    worker = cls(create_app(WorkerSettings(bootstrap_servers="127.0.0.1:1")), loop=loop, quiet=True,
                 redirect_stdouts=False)
    t0 = time.monotonic()
    worker._shutdown_loop()  # noqa: SLF001 - the step this module changes
    assert loop.is_closed()
    return time.monotonic() - t0


def test_the_loop_closes_without_the_fixed_second() -> None:
    # mode's own Worker waits 1 s here (what the override removes; if a mode upgrade stops
    # calling _sentinel_task, the first assertion says so)
    assert "_sentinel_task" in inspect.getsource(Worker._shutdown_loop)  # noqa: SLF001
    assert _shutdown_s(Worker) >= 1.0
    assert _shutdown_s(QuickStopWorker) < 0.9  # LAST_TURNS_S and the loop's last steps, also under load


def test_the_worker_command_runs_it() -> None:
    assert "QuickStopWorker(app" in inspect.getsource(app_module.run_worker)

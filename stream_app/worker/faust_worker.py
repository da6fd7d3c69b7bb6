"""The worker process's runner: mode's ``Worker`` (what ``faust.worker.Worker`` is), stopped
without its fixed one-second sleep.

After the app has stopped -- agents, consumer, producers, web server, the closers in
``on_shutdown`` -- mode's ``Worker._shutdown_loop`` runs ``_sentinel_task``, an unconditional
``asyncio.sleep(1.0)``, before it closes the event loop. Nothing is left to wait for by then
(every service has stopped and ``_gather_all`` has waited for or cancelled every task), so it
added a second to every stop: to ``make run``'s Ctrl-C, which stops the worker within a
2 s grace before killing it (``stream_app/cli/demo.py``), and to every worker a test stops.
Here the last callbacks (closed transports) get a few turns of the loop instead.
"""

from __future__ import annotations

import asyncio

from faust.worker import Worker

__all__ = ["LAST_TURNS_S", "QuickStopWorker"]

LAST_TURNS_S = 0.05  # what the event loop runs for after the app stopped, before it is closed


class QuickStopWorker(Worker):
    """``faust.worker.Worker`` whose stop ends ``LAST_TURNS_S`` after the app stopped (not 1 s)."""

    async def _sentinel_task(self) -> None:
        await asyncio.sleep(LAST_TURNS_S)

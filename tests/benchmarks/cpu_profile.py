"""Run a module under :mod:`cProfile` timed by its main thread's CPU clock
(:func:`time.thread_time`): time spent waiting -- on a socket, a lock, librdkafka's queue -- and
other threads' CPU are not counted, so own times add up to the CPU the Python code itself costs
(what ``bench_shuffler.py --profile`` reports for the shuffler).

``python tests/benchmarks/cpu_profile.py OUT MODULE [ARG ...]``: ``python -m MODULE ARG ...``,
its profile written to OUT however it ends (an exit code, a signal's exception).
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> None:
    out, module, *args = sys.argv[1:]
    sys.argv = [module, *args]
    prof = cProfile.Profile(time.thread_time)
    try:
        prof.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
    finally:
        prof.dump_stats(out)


if __name__ == "__main__":
    main()

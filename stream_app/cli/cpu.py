"""Where a run's CPU went, per process: the figure that does not depend on how busy the machine
was (a run's wall time does). Read from ``/proc`` (Linux; elsewhere a process has no figure).

>>> cpu_words({"replay": 370.44, "shuffler": 394.0, "worker": None})
'replay 370 s, shuffler 394 s; 764 CPU-s in all (worker: not known)'
>>> cpu_words({"worker": None})
''
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from pathlib import Path

__all__ = ["cpu_words", "own_cpu_s", "process_cpu_s"]


def process_cpu_s(pid: int) -> float | None:
    """The CPU seconds process ``pid`` has used so far, its waited-for children's included
    (``/proc/PID/stat``: utime, stime, cutime, cstime); None if it cannot be read (gone, or
    not Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # fields 14-17 of proc(5), after pid and comm
    except (OSError, IndexError, ValueError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """This process's CPU seconds, its waited-for children's included."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def cpu_words(cpu: Mapping[str, float | None]) -> str:
    """One line of CPU seconds per process, then the sum ("" when none is known)."""
    known = {k: v for k, v in cpu.items() if v is not None}
    if not known:
        return ""
    unknown = [k for k, v in cpu.items() if v is None]
    return (", ".join(f"{k} {v:,.0f} s" for k, v in known.items()) + f"; {sum(known.values()):,.0f} CPU-s in all"
            + (f" ({', '.join(unknown)}: not known)" if unknown else ""))

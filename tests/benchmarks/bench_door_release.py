"""Benchmark: does an attack on the shuffler's HTTP front door delay what the shuffler releases?
One JSON line per run, then a comparison line.

Each run is ``ptt demo --via-shuffler --transport http`` (the embedded broker, a ``ptt
shuffler --http-port`` with its door, the worker, Prometheus; every simulated device uploads
its reports of an epoch in one request to the door) paced at ``--speed`` for ``--epochs``
epochs of the demo's synthetic day, with ``--query-mechanisms`` (default ``alp``: a fleet the
door carries in real time at that pace). Runs:

* ``clean``: nothing else;
* ``slow``: from the replay's first epoch to its end, ``--slow`` slowloris connections held
  against the same door from ``--slow-procs`` processes (a process's file-descriptor limit):
  each sends a request's first header bytes, then one more byte every second, and is opened
  again as soon as the door closes it -- so the door is at its connection cap the whole time
  (its idle/header deadline closes each after ``--http-idle-timeout-s``, 10 s) and spends its
  loop on that churn while the fleet's requests come in.

The release lag of an epoch is the time from the end of that epoch on the paced replay's
schedule (the replay's opening source note -- its record's timestamp, the replay host's clock
-- plus (k + 1) x 30 / speed for the run's k-th epoch) to when this bench's consumer of the
reports topic receives the shuffler's first release record of it (polling every 0.1 s; a
release's own timestamp is the data's time). So it counts everything an attack can delay:
devices' uploads through the door, the replay's notes, the shuffler's loop. ``note_lag_*``:
the same for the replay's note that the epoch is finished (sent once every device's upload of
it was answered): the part of the lag that is the fleet's, not the shuffler's. With
``lateness_epochs`` 2 (the default) an epoch is due when the notes pass it by two, so the
clean lag is about 2 x 30 / speed seconds plus the shuffler's own time. Each line has the lag's
p50/p90/max over the run's epochs (the first two, opened under start-up, left out), epochs
released, the replay's requests retried (its summary), the slow connections opened (and how
many the door closed), the shuffler log's size and tracebacks, ``cpu_s`` by process (the
shuffler, its ``front_door`` process, the worker, the broker, and the attack's ``slowloris``
processes, which share the same 2 cores here), and the load average; the
comparison line (runs interleaved, ``--runs clean,slow,clean,slow``: the shared machine's load
drifts) has ``median_lag_p90_over_clean_s`` (the median over slow runs of their p90 less the
clean runs'; the bar: within 2 s) and ``median_lag_max_over_clean_s``.

``--pin`` (the default) runs the whole demo -- broker, worker, shuffler and its door,
Prometheus, the replay -- on the first core and the slowloris processes on the others, so the
attack costs the server only what the door spends on it, as from other machines (unpinned, the
attackers' own CPU -- 50 s a run, 3x the door's -- loads the same 2 cores). ``--load-procs K``
makes the server busy: K processes spin on the demo's core through every run, clean and slow
alike.

Run: ``python tests/benchmarks/bench_door_release.py [--speed 5] [--epochs 24] [--slow 20000]
[--slow-procs 4] [--runs clean,slow,clean,slow] [--no-pin] [--load-procs 0]`` (through ``tests/benchmarks/record.py`` to
keep the figures).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from schemas.settings import KafkaSettings, source_topic
from stream_app.cli.local_broker import free_port
from tests.benchmarks.bench_door_slow import hogs_on, stop_hogs
from tests.processes import children, cpu_s

SKIP_FIRST = 2  # epochs opened while everything starts


def _slowloris(port: int, n: int, stop: Any, out: Any, cpus: list[int] | None = None) -> None:
    """Hold ``n`` slow connections to ``port`` until ``stop`` is set, opening a new one for
    each the door closes (on ``cpus`` if given); puts (opened, open_failed, closed_by_door)."""
    from tests.slowloris import open_slow, tick

    if cpus:
        os.sched_setaffinity(0, cpus)

    live: list[Any] = []
    opened = failed = closed = 0
    while not stop.is_set():
        while len(live) < n and not stop.is_set():
            try:
                live.append(open_slow(port))
                opened += 1
            except OSError:
                failed += 1
                time.sleep(0.05)
                break
        started = time.monotonic()
        live, gone = tick(live)
        closed += gone
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    for s in live:
        s.close()
    out.put((opened, failed, closed))


class _Stamps(threading.Thread):
    """The replay's opening note (its first epoch, its timestamp) and when the reports topic's
    first release of each epoch arrived here (wall clock), read while the demo runs."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.opened: tuple[int, float] | None = None
        self.finished: dict[int, float] = {}  # epoch -> the replay's note that it is finished (its timestamp)
        self.released: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        from kafka import KafkaConsumer

        from schemas import DecodedBatch, EndOfEpoch, EndOfEpochSet, decode_record

        ks = KafkaSettings(bootstrap_servers=self.bootstrap)
        notes = source_topic("ptt.device-reports")
        c = KafkaConsumer(**ks.client_kwargs(), enable_auto_commit=False, auto_offset_reset="earliest",
                          group_id=None)
        c.subscribe(pattern=f"^({re.escape(ks.reports_topic)}|{re.escape(notes)})$")
        while not self.stop.is_set():
            for tp, recs in c.poll(timeout_ms=100).items():
                now = time.time()
                for r in recs:
                    if tp.topic == notes:
                        note = json.loads(r.value)
                        if note.get("opens") and self.opened is None:
                            self.opened = (int(note["epoch"]), r.timestamp / 1000)
                        elif not note.get("opens"):
                            self.finished.setdefault(int(note["epoch"]), r.timestamp / 1000)
                        continue
                    item = decode_record(r.value)
                    if isinstance(item, DecodedBatch):
                        epoch = item.header.epoch
                    elif isinstance(item, EndOfEpochSet):
                        epoch = item.markers[0].epoch
                    elif isinstance(item, EndOfEpoch):
                        epoch = item.epoch
                    else:
                        continue
                    self.released.setdefault(epoch, now)
        c.close()


class _Cpu(threading.Thread):
    """CPU seconds (user + system) of the demo's processes by role -- the shuffler, its front
    door's process, the worker, the broker -- and of this bench's slowloris processes (the
    attacker shares these 2 cores), sampled every second while they run (the last sample of
    each process counts: the demo reaps its children before this bench could)."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.seen: dict[int, tuple[str, float]] = {}
        self.stop = threading.Event()

    def _role(self, pid: int, parent_role: str) -> str:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return "other"
        if "resource_tracker" in cmd:
            return "other"
        if parent_role == "shuffler" and "multiprocessing" in cmd:
            return "front_door"
        if parent_role == "bench" and "multiprocessing" in cmd:
            return "slowloris"
        for role in ("shuffler", "worker", "prometheus", "tansu"):
            if role in cmd:
                return "broker" if role == "tansu" else role
        return "other"

    def sample(self) -> None:
        todo = [(self.root, "demo", "")] + [(k, "", "bench") for k in children(os.getpid()) if k != self.root]
        while todo:  # (pid, its role if known, its parent's role)
            pid, role, parent = todo.pop()
            used = cpu_s(pid)
            if used != used:  # NaN: gone
                continue
            known = self.seen.get(pid)  # a zombie's cmdline is empty: its role is the one first seen
            role = role or (known[0] if known else self._role(pid, parent))
            self.seen[pid] = (role, used)
            todo += [(k, "", role) for k in children(pid)]

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.sample()

    def by_role(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for role, cpu in self.seen.values():
            out[role] = round(out.get(role, 0.0) + cpu, 1)
        return dict(sorted(out.items()))


def _cpus(pin: bool) -> tuple[list[int] | None, list[int] | None]:
    """(the demo's cores, the attack's): with ``pin`` and two cores or more, the first and the
    rest -- the attacker as from another machine, the system under test on one core -- else
    no pinning."""
    cores = sorted(os.sched_getaffinity(0))
    return (cores[:1], cores[1:]) if pin and len(cores) > 1 else (None, None)


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def run(name: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One run (module docstring); the spinning processes of ``--load-procs`` are stopped
    however it ends."""
    server, attack = _cpus(args.pin)
    hogs = hogs_on(args.load_procs, server or sorted(os.sched_getaffinity(0)))
    try:
        return _run(name, args, out, server, attack)
    finally:
        stop_hogs(hogs)


def _run(name: str, args: argparse.Namespace, out: Path, server: list[int] | None, attack: list[int] | None
         ) -> dict[str, Any]:
    port = free_port()
    cmd = [sys.executable, "-m", "stream_app.cli", "demo", "--via-shuffler", "--transport", "http",
           "--speed", f"{args.speed:g}", "--max-epochs", str(args.epochs), "--exit-when-done", "--out", str(out),
           "--port", str(port), "--query-mechanisms", args.query_mechanisms]
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    demo = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,  # noqa: S603
                            preexec_fn=(lambda: os.sched_setaffinity(0, server)) if server else None)
    assert demo.stdout is not None
    lines: list[str] = []
    door = None
    stamps = _Stamps(f"127.0.0.1:{port}")
    cpu = _Cpu(demo.pid)
    cpu.start()
    workers: list[Any] = []
    ctx = mp.get_context("spawn")
    results, stop = ctx.Queue(), ctx.Event()
    for line in demo.stdout:
        lines.append(line.rstrip())
        m = re.search(r"devices POST http://127\.0\.0\.1:(\d+)/", line)
        if m:
            door = int(m.group(1))
        if line.startswith("replaying "):
            stamps.start()
            if name == "slow" and door is not None:
                each = args.slow // args.slow_procs
                workers = [ctx.Process(target=_slowloris, args=(door, each, stop, results, attack), daemon=True)
                           for _ in range(args.slow_procs)]
                for w in workers:
                    w.start()
            break
    rest = demo.stdout.read()
    code = demo.wait()
    cpu.sample()
    cpu.stop.set()
    lines += rest.splitlines()
    wall = time.monotonic() - t0
    stop.set()
    got = [results.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(30)
    stamps.stop.set()
    stamps.join(10)
    if stamps.opened is None:
        raise RuntimeError("the replay's opening note never arrived: " + "\n".join(lines[-5:]))
    first, t_open = stamps.opened
    epochs = sorted(e for e in stamps.released if e >= first)[SKIP_FIRST:]
    lags = [stamps.released[e] - (t_open + (e - first + 1) * 30 / args.speed) for e in epochs]
    notes = [stamps.finished[e] - (t_open + (e - first + 1) * 30 / args.speed) for e in epochs if e in stamps.finished]
    log = out / "shuffler.log"
    text = log.read_text() if log.exists() else ""
    retried = next((ln.strip() for ln in lines if "retr" in ln.lower()), "")
    return {"run": name, "exit_code": code, "speed": args.speed, "epochs_asked": args.epochs,
            "epochs_released": len(stamps.released), "epochs_measured": len(epochs),
            "lag_p50_s": round(_quantile(lags, 0.5), 2) if lags else None,
            "lag_p90_s": round(_quantile(lags, 0.9), 2) if lags else None,
            "lag_max_s": round(max(lags), 2) if lags else None, "lags_s": [round(x, 2) for x in lags],
            "note_lag_p90_s": round(_quantile(notes, 0.9), 2) if notes else None,
            "note_lags_s": [round(x, 2) for x in notes],
            "slow_connections": args.slow if name == "slow" else 0,
            "slow_opened": sum(g[0] for g in got), "slow_open_failed": sum(g[1] for g in got),
            "slow_closed_by_door": sum(g[2] for g in got), "replay_retries_line": retried,
            "shuffler_log_bytes": len(text.encode()), "tracebacks": text.count("Traceback"),
            "door_summary": next((ln for ln in text.splitlines() if "reports accepted" in ln), ""),
            "pinned": args.pin, "load_procs": args.load_procs, "cpu_s": cpu.by_role(), "wall_s": round(wall, 1),
            "load_average": round(load, 1),
            "tail": lines[-3:] if code else []}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", type=float, default=5.0, help="x real time of the paced replay")
    parser.add_argument("--epochs", type=int, default=24)
    parser.add_argument("--query-mechanisms", default="alp")
    parser.add_argument("--slow", type=int, default=20_000, help="slowloris connections held during the slow run")
    parser.add_argument("--slow-procs", type=int, default=4)
    parser.add_argument("--runs", default="clean,slow,clean,slow")
    parser.add_argument("--keep", type=Path, help="keep each run's demo output (logs) under this directory")
    parser.add_argument("--load-procs", type=int, default=0,
                        help="processes spinning on the demo's core(s) through each run: a busy server")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="the demo's processes on the first core, the attack's on the others (default)")
    args = parser.parse_args()
    if args.speed <= 0 or args.epochs <= SKIP_FIRST + 2:
        parser.error("--speed must be > 0 (a paced replay) and --epochs > 4")
    runs = args.runs.split(",")
    if not set(runs) <= {"clean", "slow"}:
        parser.error(f"--runs takes clean and slow, not {args.runs!r}")
    lines: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-door-release-") as tmp:
        for i, name in enumerate(runs):
            lines.append(run(name, args, (args.keep or Path(tmp)) / f"{i}-{name}"))
            print(json.dumps(lines[-1]), flush=True)
    def each(field: str) -> dict[str, list[float]]:
        return {k: [r[field] for r in lines if r["run"] == k and r[field] is not None] for k in ("clean", "slow")}

    p90, worst = each("lag_p90_s"), each("lag_max_s")
    if p90["clean"] and p90["slow"]:  # interleaved runs: the machine's load drifts between them
        over = statistics.median(p90["slow"]) - statistics.median(p90["clean"])
        print(json.dumps({"compare": "slow_vs_clean", "runs": runs, "lag_p90_s": p90, "lag_max_s": worst,
                          "median_lag_p90_over_clean_s": round(over, 2),
                          "median_lag_max_over_clean_s": round(statistics.median(worst["slow"])
                                                               - statistics.median(worst["clean"]), 2),
                          "within_2_s": over <= 2.0}), flush=True)
    return 0 if all(r["exit_code"] == 0 for r in lines) else 1

if __name__ == "__main__":
    sys.exit(main())

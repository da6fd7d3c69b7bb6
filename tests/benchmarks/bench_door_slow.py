"""Benchmark: the shuffler's HTTP front door (``ptt shuffler --http-port``) under slow
connections. One JSON line per scenario.

* ``slow`` (``slow_nginx``: through deploy/nginx/nginx.conf run by a real nginx in front of
  the door): ``--slow`` slowloris connections (one header byte a second each, from
  ``--slow-procs`` processes: a process's file-descriptor limit), then fresh devices each on a
  new connection: their latency (p50, max), 202s, how many slow connections the door closed
  and how fast and how many bytes they sent, the door process's CPU (``door_cpu_s``, and
  per slow connection: the shuffler's front door runs in a process of its own, which spends
  nothing with no client) and peak RSS, its log's size, and its file-descriptor limit (the
  connection cap is that less 512).
* ``--load-procs K``: a busy server -- K processes spinning Python on the last core, where the
  door's process, its shuffler's (and nginx's workers) are pinned too, from before the slow connections open
  until they are done: the server has at most a (K+1)-th of that core while the attacking
  processes and the fresh devices run on the other at full speed, as from other machines
  (spinning on every core slows the attack as much as the door: 20,000 connections took 80 s
  to open with 6 unpinned spinners). Each line says ``load_procs``, ``server_cpus`` and the
  load average at its start and end.

Measured on 2 cores shared with other sessions: read ``door_cpu_s`` (CPU seconds, fairly
independent of the load) before the latencies (which are what the load does to them), and the
load average before comparing two runs (tests/benchmarks/record.jsonl has every run recorded).

Run: ``python tests/benchmarks/bench_door_slow.py [--only slow,slow_nginx] [--slow 20000]
[--slow-procs 4] [--fresh 40] [--load-procs 0]`` (``bench_front_door.py --only slow`` runs the
same scenario).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from schemas.device_http import frame
from stream_app.cli.local_broker import LocalBroker, free_port
from tests.benchmarks.bench_front_door import _door
from tests.benchmarks.common import stop_children_on_signals
from tests.processes import children, cpu_s, door_healthy, door_pid


def _rss_peak_mb(pid: int | None) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return float("nan")



def _slowloris(port: int, n: int, every_s: float, seconds: float, out: Any) -> None:
    """A process holding ``n`` slow connections for ``seconds``: puts (opened, open_failed,
    closed_by_server, seconds from the first open to each close's median and last, header
    bytes sent after the first)."""
    from tests.slowloris import open_slow, tick

    socks, failed, t0 = [], 0, time.monotonic()
    for _ in range(n):
        try:
            socks.append(open_slow(port))
        except OSError:
            failed += 1
    closed_at: list[float] = []
    sent = 0
    live, end = list(socks), time.monotonic() + seconds
    while live and time.monotonic() < end:
        time.sleep(every_s)
        live, closed = tick(live)
        sent += len(live)
        closed_at += [time.monotonic() - t0] * closed
    for s in live:
        s.close()
    out.put((len(socks), failed, len(closed_at), closed_at[len(closed_at) // 2] if closed_at else None,
             closed_at[-1] if closed_at else None, sent))


NGINX_CONF = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "nginx.conf"


def slow(broker: LocalBroker, tmp: Path, n: int, procs: int, fresh: int, nginx: bool = False,
         load_procs: int = 0) -> dict[str, Any]:
    """``n`` slowloris connections against one door (``nginx``: through an nginx in front of
    it), then ``fresh`` devices on new connections, ``load_procs`` CPU hogs beside (module
    docstring). The door (and nginx, and the hogs) are stopped however it ends."""
    ss, shuffler, q, epoch = _door(broker, tmp, "slow")
    hogs: list[subprocess.Popen[bytes]] = []
    proxies: list[subprocess.Popen[bytes]] = []
    try:
        return _slow(ss, shuffler, q, epoch, tmp, n, procs, fresh, nginx, load_procs, hogs, proxies)
    finally:
        stop_hogs(hogs)
        for proxy in proxies:
            if proxy.poll() is None:
                proxy.kill()
                proxy.wait(30)
        shuffler.stop()


def _slow(ss: Any, shuffler: Any, q: Any, epoch: int, tmp: Path, n: int, procs: int, fresh: int, nginx: bool,
          load_procs: int, hogs: list[subprocess.Popen[bytes]], proxies: list[subprocess.Popen[bytes]]
          ) -> dict[str, Any]:
    import http.client
    import multiprocessing as mp
    import shutil

    from schemas.device_binary import encode_device

    port, proxy = ss.http_port, None
    if nginx:
        prefix = tmp / f"nginx-{uuid.uuid4().hex[:6]}"
        prefix.mkdir()
        port = free_port()
        conf = NGINX_CONF.read_text().replace("listen 8080 ", f"listen 127.0.0.1:{port} ")
        (prefix / "nginx.conf").write_text(conf.replace("server shuffler:8080;", f"server 127.0.0.1:{ss.http_port};"))
        with (prefix / "error.log").open("wb") as fh:  # the shipped configuration: deploy/nginx/nginx.conf
            proxy = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-c",  # noqa: S603
                                      str(prefix / "nginx.conf"), "-p", str(prefix), "-g",
                                      f"daemon off; pid {prefix / 'nginx.pid'};"], stdout=fh, stderr=subprocess.STDOUT)
        proxies.append(proxy)
        deadline = time.monotonic() + 30
        while not door_healthy(port):  # nginx up, passing the door's answer
            if proxy.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("nginx did not answer: " + (prefix / "error.log").read_text()[-2000:])
            time.sleep(0.1)
    e = ss.enrollment()
    loop = shuffler.proc.pid if shuffler.proc else None
    pid = door_pid(loop) if loop else None  # the door's own process (stream_app/shuffler/door_process.py)
    limit = Path(f"/proc/{pid}/limits").read_text() if pid else ""
    nofile = next((ln.split()[3] for ln in limit.splitlines() if ln.startswith("Max open files")), "?")
    server_cpus = sorted(os.sched_getaffinity(0))
    if load_procs:
        server_cpus = server_cpus[-1:]
        _pin(pid, server_cpus)
        _pin(loop, server_cpus)
        if proxy is not None:
            for kid in children(proxy.pid):
                _pin(kid, server_cpus)
    hogs.extend(hogs_on(load_procs, server_cpus))
    _until(lambda: all(cpu_s(h.pid) >= 0.2 for h in hogs), 30)  # the hogs spinning before the first slow one
    load = os.getloadavg()[0]
    cpu0 = cpu_s(pid)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    hold_s = ss.http_idle_timeout_s + 30
    workers = [ctx.Process(target=_slowloris, args=(port, n // procs, 1.0, hold_s, results), daemon=True)
               for _ in range(procs)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    # the fresh devices come while the slow connections open and after: from half of them open
    servers = [p for p in (pid, *(children(proxy.pid) if proxy is not None else [])) if p]
    _until(lambda: sum(_open_fds(p) for p in servers) >= n // 2, 60)
    latencies, statuses, attempts, slowest, connects = [], [], [], (0.0, 0.0, ""), []
    for d in range(fresh):
        body = frame([e.seal(encode_device(q.query_id, 1, epoch, r, value=r), 2000 + d) for r in (0, 1)])
        t = time.perf_counter()
        status, tries, what = 0, 0, []
        while time.perf_counter() - t < 30:
            tries += 1
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                c0 = time.perf_counter()
                conn.connect()
                connects.append(time.perf_counter() - c0)
                conn.request("POST", "/v1/reports", body=body, headers={"Content-Type": "application/octet-stream"})
                r = conn.getresponse()
                r.read()
                status = r.status
                conn.close()
                what.append(f"{status} at {time.perf_counter() - t:.2f}s")
                if status == 202:
                    break
            except OSError as exc:
                status = -1
                what.append(f"{type(exc).__name__} at {time.perf_counter() - t:.2f}s")
            time.sleep(0.05)
        latencies.append(time.perf_counter() - t)
        statuses.append(status)
        attempts.append(tries)
        if latencies[-1] > slowest[0]:
            slowest = (latencies[-1], t - t0, "; ".join(what))
        time.sleep(0.2)
    got = [results.get(timeout=hold_s + 120) for _ in workers]
    for w in workers:
        w.join(30)
    cpu = cpu_s(pid) - cpu0  # the door's own process: with no client it spends nothing (measured 0.0 s/s)
    load_end = os.getloadavg()[0]
    stop_hogs(hogs)
    rss = _rss_peak_mb(pid)
    nginx_cpu = nginx_log = None
    if proxy is not None:
        nginx_cpu = round(sum(cpu_s(k) for k in children(proxy.pid)), 1)
        proxy.terminate()
        proxy.wait(30)
        nginx_log = (prefix / "error.log").stat().st_size
    shuffler.stop()
    lat = sorted(latencies)
    text = shuffler.log.read_text()
    return {"scenario": "slow_nginx" if nginx else "slow", "nginx_workers_cpu_s": nginx_cpu,
            "nginx_error_log_bytes": nginx_log, "fresh_connect_max_s": round(max(connects), 3),
            "slow_connections": n, "processes": procs, "door_nofile_limit": nofile,
            "opened": sum(g[0] for g in got), "open_failed": sum(g[1] for g in got),
            "closed_by_door": sum(g[2] for g in got),
            "close_median_s_after_start": [None if g[3] is None else round(g[3], 1) for g in got],
            "close_last_s_after_start": [None if g[4] is None else round(g[4], 1) for g in got],
            "fresh_devices": fresh, "fresh_202": statuses.count(202), "fresh_p50_s": round(lat[len(lat) // 2], 3),
            "fresh_max_s": round(lat[-1], 3), "fresh_attempts_max": max(attempts),
            "slowest_fresh": {"latency_s": round(slowest[0], 3), "started_s_after_slow_start": round(slowest[1], 1),
                              "attempts": slowest[2]},
            "fresh_latencies_s": [round(x, 2) for x in latencies], "door_cpu_s": round(cpu, 1),
            "slow_bytes_sent": sum(g[5] for g in got), "door_cpu_us_per_slow_connection": round(1e6 * cpu / n),
            "wall_s": round(time.perf_counter() - t0, 1), "door_rss_peak_mb": rss,
            "log_bytes": len(text.encode()), "tracebacks": text.count("Traceback"),
            "door_summary": next((ln for ln in text.splitlines() if ln.startswith("front door: ") and "accepted" in ln),
                                 ""),
            "load_procs": load_procs, "server_cpus": server_cpus, "load_average": round(load, 1),
            "load_average_end": round(load_end, 1)}


def _until(holds: Any, timeout_s: float) -> None:
    """Poll ``holds`` until it is true or ``timeout_s`` has passed (a benchmark goes on either way)."""
    deadline = time.monotonic() + timeout_s
    while not holds() and time.monotonic() < deadline:
        time.sleep(0.1)


def _open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def hogs_on(k: int, cpus: list[int]) -> list[subprocess.Popen[bytes]]:
    """``k`` processes spinning ``cpus`` (a busy server), each until it is killed."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]  # noqa: S603
    for h in hogs:
        os.sched_setaffinity(h.pid, cpus)
    return hogs


def _pin(pid: int | None, cpus: list[int]) -> None:
    """Every thread of process ``pid`` onto ``cpus`` (threads it starts later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for h in hogs:
        h.kill()
    for h in hogs:
        h.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="slow", help="slow, slow_nginx or both")
    parser.add_argument("--slow", type=int, default=20_000, help="slowloris connections")
    parser.add_argument("--slow-procs", type=int, default=4, help="processes holding them (a process's fd limit)")
    parser.add_argument("--fresh", type=int, default=40, help="fresh devices under the slow connections")
    parser.add_argument("--load-procs", type=int, default=0, help="CPU-spinning processes beside (a busy machine)")
    args = parser.parse_args()
    stop_children_on_signals("bench_door_slow")
    wanted = set(args.only.split(","))
    with tempfile.TemporaryDirectory() as tmp_name, LocalBroker(log_path=Path(tmp_name) / "broker.log") as broker:
        for name in ("slow", "slow_nginx"):
            if name in wanted:
                print(json.dumps(slow(broker, Path(tmp_name), args.slow, args.slow_procs, args.fresh,
                                      nginx=name == "slow_nginx", load_procs=args.load_procs)), flush=True)


if __name__ == "__main__":
    main()

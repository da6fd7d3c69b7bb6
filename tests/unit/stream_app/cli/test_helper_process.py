"""stream_app/cli/helper_process.py: a helper process's start, readiness, retry on a taken port
and stop, with real short-lived processes (``python -c``), waiting on conditions, never a fixed
sleep; and :class:`~stream_app.cli.supervise.Watch` naming one that exited."""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stream_app.cli.errors import EXIT_HELPER
from stream_app.cli.helper_process import HelperFailed, HelperProcess, NotReady, Ports, stop_all, wait_until
from stream_app.cli.supervise import Watch

PY = sys.executable

#: binds loopback port argv[1] (exit 1 if taken), then says so in argv[2] and serves until stopped
SERVE = ("import pathlib, signal, socket, sys\n"
         "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
         "pathlib.Path(sys.argv[2]).write_text('bound'); signal.pause()\n")
#: ignores SIGTERM, says so in argv[1], then runs until killed
STUBBORN = ("import pathlib, signal, sys\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "pathlib.Path(sys.argv[1]).write_text('ready')\n"
            "while True: signal.pause()\n")
#: runs until a signal stops it
RUNS = "import signal; signal.pause()"


@pytest.fixture
def helpers() -> Iterator[list[HelperProcess]]:
    """Every helper a test makes, stopped at its end however it ends."""
    made: list[HelperProcess] = []
    yield made
    stop_all(made, grace_s=1.0)


def _sleeper(tmp_path: Path, name: str = "sleeper", ready: Callable[[Ports], bool] | None = None,
             timeout_s: float = 60.0) -> HelperProcess:
    return HelperProcess(name, [PY, "-c", RUNS], log=tmp_path / f"{name}.log", ready=ready,
                         timeout_s=timeout_s, poll_s=0.02)


def test_start_returns_once_its_readiness_check_holds(tmp_path: Path, helpers: list[HelperProcess]) -> None:
    flag = tmp_path / "ready"
    h = HelperProcess("writer", [PY, "-c", "import pathlib, signal, sys; pathlib.Path(sys.argv[1]).write_text('x'); "
                                           "signal.pause()", str(flag)],
                      ready=lambda ports: flag.exists(), log=tmp_path / "writer.log", poll_s=0.02)
    helpers.append(h)
    assert h.start() is h
    assert flag.exists() and h.running and h.pid is not None and h.returncode is None and h.note == ""


def test_the_command_and_environment_get_its_ports(tmp_path: Path, helpers: list[HelperProcess]) -> None:
    log = tmp_path / "env.log"
    h = HelperProcess("env", lambda ports: [PY, "-c", "import os, sys; print(sys.argv[1], os.environ['WHERE'])",
                                            str(ports[0])],
                      env=lambda ports: {"WHERE": f"port {ports[0]}"}, log=log, ports=(12345,))
    helpers.append(h)
    h.launch()
    assert wait_until(lambda: h.returncode is not None, timeout_s=30, poll_s=0.02)
    assert h.returncode == 0 and log.read_text() == "12345 port 12345\n"


def test_a_helper_that_exits_at_start_is_named_and_its_log_quoted(tmp_path: Path,
                                                                   helpers: list[HelperProcess]) -> None:
    log = tmp_path / "crasher.log"
    crash = "print('ptt crasher: error: no such thing; give one'); raise SystemExit(3)"
    h = HelperProcess("crasher", [PY, "-c", crash],
                      ready=lambda ports: False, log=log, poll_s=0.02)
    helpers.append(h)
    with pytest.raises(NotReady) as caught:
        h.start()
    assert caught.value.returncode == 3 and caught.value.code == EXIT_HELPER
    assert str(caught.value) == (f'the crasher exited with code 3 at start: "ptt crasher: error: no such thing; '
                                 f'give one" (its log: {log})')


def test_one_never_ready_times_out_and_is_not_left_behind(tmp_path: Path, helpers: list[HelperProcess]) -> None:
    h = _sleeper(tmp_path, ready=lambda ports: False, timeout_s=0.3)
    helpers.append(h)
    with pytest.raises(NotReady, match=r"^the sleeper did not become ready within 0s: \(its log is empty\)") as caught:
        h.start()
    assert caught.value.returncode is None
    assert not h.running and h.returncode == -signal.SIGTERM


def test_a_start_whose_port_was_taken_is_tried_again_on_a_free_port(tmp_path: Path,
                                                                   helpers: list[HelperProcess]) -> None:
    def ready(ports: Ports) -> bool:
        return (tmp_path / f"bound-{ports[0]}").exists()

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        h = HelperProcess("server", lambda ports: [PY, "-c", SERVE, str(ports[0]), str(tmp_path / f"bound-{ports[0]}")],
                          ready=ready, log=tmp_path / "server.log", ports=(port,), port_taken=lambda code: code == 1,
                          poll_s=0.02)
        helpers.append(h)
        h.start()
    assert h.running and h.ports != (port,)
    assert h.note == f" (port {port} was taken, using {h.ports[0]})"


def test_fresh_ports_come_from_the_callers_choice(tmp_path: Path, helpers: list[HelperProcess]) -> None:
    """``fresh_port`` picks the ports of a start tried again (the demo's own ``free_port``), one each."""
    offered = iter([40_001, 40_002, 40_003, 40_004])

    def command(ports: Ports) -> list[str]:
        return [PY, "-c", "import signal, sys; signal.pause() if sys.argv[1] == '40003' else sys.exit(4)",
                str(ports[0])]

    h = HelperProcess("picky", command, log=tmp_path / "picky.log", ports=(1, 2), poll_s=0.02,
                      ready=lambda ports: ports[0] == 40_003, port_taken=lambda code: code == 4,
                      fresh_port=lambda: next(offered))
    helpers.append(h)
    h.start()
    assert h.ports == (40_003, 40_004) and h.note == " (port 40001 was taken, using 40003)"


def test_a_failure_that_is_not_a_taken_port_is_not_tried_again(tmp_path: Path, helpers: list[HelperProcess]) -> None:
    launched: list[Ports] = []

    def command(ports: Ports) -> list[str]:
        launched.append(ports)
        return [PY, "-c", "raise SystemExit(5)"]

    h = HelperProcess("once", command, ready=lambda ports: False, log=tmp_path / "once.log", ports=(1,),
                      port_taken=lambda code: code == 4, poll_s=0.02)
    helpers.append(h)
    with pytest.raises(NotReady, match="exited with code 5 at start"):
        h.start()
    assert launched == [(1,)] and h.ports == (1,) and h.note == ""


def test_stop_asks_first_and_kills_after_the_grace(tmp_path: Path, helpers: list[HelperProcess]) -> None:
    polite = _sleeper(tmp_path, "polite")
    flag = tmp_path / "stubborn-ready"
    stubborn = HelperProcess("stubborn", [PY, "-c", STUBBORN, str(flag)], ready=lambda ports: flag.exists(),
                             log=tmp_path / "stubborn.log", poll_s=0.02)
    helpers += [polite, stubborn]
    polite.start()
    stubborn.start()
    stop_all([polite, None, stubborn], grace_s=0.5)
    assert polite.returncode == -signal.SIGTERM and stubborn.returncode == -signal.SIGKILL
    stubborn.stop()  # stopping one that has exited does nothing
    assert stubborn.returncode == -signal.SIGKILL


def test_a_check_that_raises_ends_the_wait(tmp_path: Path, helpers: list[HelperProcess]) -> None:
    """The caller's check (a helper started earlier has exited) ends another's wait for readiness."""
    h = _sleeper(tmp_path, ready=lambda ports: False)
    helpers.append(h)
    h.launch()

    def other_died() -> None:
        raise HelperFailed("the broker exited with code 1")

    with pytest.raises(HelperFailed, match="the broker exited"):
        h.wait_ready(check=other_died)


def test_watch_names_a_helper_that_exited(tmp_path: Path, helpers: list[HelperProcess]) -> None:
    log, go = tmp_path / "shuffler.log", tmp_path / "go"
    h = HelperProcess("shuffler", [PY, "-c", "import pathlib, sys, time\nwhile not pathlib.Path(sys.argv[1]).exists(): "
                                             "time.sleep(0.01)\nprint('ptt shuffler: error: gone')", str(go)], log=log)
    helpers.append(h)
    watch = Watch(interrupt=lambda: None)
    h.start()
    watch.add(h, "shuffler (and its HTTP front door)")
    watch.check()  # it runs: nothing to say
    go.write_text("")
    assert wait_until(lambda: h.returncode is not None, timeout_s=30, poll_s=0.02)
    with pytest.raises(HelperFailed) as caught:
        watch.check()
    assert str(caught.value) == (f'the shuffler (and its HTTP front door) exited with code 0: "ptt shuffler: error: '
                                 f'gone" (its log: {log})')

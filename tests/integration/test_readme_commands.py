"""Every command in the README runs as written: the test reads the README's ``sh`` code blocks
and runs each line, in order, as a person following it would -- ``make run``, ``make test``,
the environment's activation, the separate-process session (broker, worker, replay,
subscribe), the shuffler's, a PeMS day's -- and fails on any error. A command that would run
for long gets a short argument set (:data:`SHORT`, appended: a later flag wins); a command
that serves until Ctrl-C (:data:`SERVING`) runs in the background until the README is done,
must be up before the next line runs, must still be up at the end, and must stop cleanly on
Ctrl-C. The README's ``127.0.0.1:9092`` is this test's own broker. A line this test does not
know is run as written (a new broken command fails it; a new one that never ends times out).

Inline commands (in backquotes) cannot hide what they need: none may contain ``...``, and each
``ptt plan`` one parses with the real parser (its required flags given). The README's Python
blocks run in their own tests (tests/integration/test_readme_example.py, test_demo.py)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stream_app.cli import build_parser
from stream_app.cli.local_broker import free_port
from tests.paths import ROOT

pytestmark = pytest.mark.integration

README = ROOT / "README.md"
VENV_BIN = ROOT / ".venv" / "bin"
#: flags appended to a long-running command (a later flag wins over the README's)
SHORT: dict[str, str] = {
    "ptt replay": "--speed 0 --max-epochs 2",
    "ptt demo": "--speed 0 --max-epochs 2 --stations 4 --out {tmp}/demo-out --metrics-port {port} "
                "--prometheus-port {port}",
    "ptt synth": "--stations 4",
    "ptt subscribe": "--from-beginning --idle-timeout 5",
    "make run": 'DEMO_ARGS="--speed 0 --max-epochs 2 --exit-when-done --stations 4 --out {tmp}/make-run-out '
                '--metrics-port {port} --prometheus-port {port}"',
    "make test": 'TEST_WORKERS=2 PYTEST_ARGS="-p no:cacheprovider tests/unit/project/test_house.py"',
}
#: what a person runs in a terminal of its own, and how to tell it is up
SERVING: dict[str, Callable[[dict[str, str]], bool]] = {}
#: the README's Python blocks, each run by a test of its own: a phrase each holds
PYTHON_BLOCKS_TESTED = ("estimates.parquet", "KafkaConsumer")
TIMEOUT_S = 300


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - loopback
            return True
    except OSError:
        return False


SERVING["ptt broker"] = lambda env: _listening(int(env["PTT_BOOTSTRAP_SERVERS"].rsplit(":", 1)[1]))
SERVING["ptt worker"] = lambda env: _answers(f"http://127.0.0.1:{env['PTT_WEB_PORT']}/metrics")
SERVING["ptt shuffler"] = lambda env: _answers(f"http://127.0.0.1:{env['PTT_METRICS_PORT']}/metrics")


def sh_commands(text: str) -> list[tuple[int, str]]:
    """The commands of the ``sh`` code blocks, in order, with their README line numbers;
    comments (two spaces, then ``#``) and blank lines left out.

    >>> sh_commands("x\\n```sh\\nmake run     # the demo\\n\\nptt --help\\n```\\n```\\nnot sh\\n```\\n")
    [(3, 'make run'), (5, 'ptt --help')]
    """
    found: list[tuple[int, str]] = []
    in_sh = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_sh = not in_sh and line.strip() == "```sh"
            continue
        if in_sh:
            command = re.split(r"\s{2,}#\s", line, maxsplit=1)[0].strip()
            if command:
                found.append((number, command))
    return found


def inline_commands(text: str) -> list[str]:
    """Backquoted spans that are commands (``ptt``, ``make``, ``.venv/bin/...``), one line each."""
    spans = (" ".join(s.split()) for s in re.findall(r"(?<!`)`([^`]+)`(?!`)", text))
    return [s for s in spans if s.startswith(("ptt ", "make ", ".venv/bin/"))]


def _key(command: str) -> str:
    words = command.split()
    return " ".join(words[:2]) if words and words[0] in ("ptt", "make") else ""


@dataclass
class Session:
    tmp: Path
    env: dict[str, str]
    broker_port: int
    serving: list[tuple[int, str, subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def log(self, number: int) -> Path:
        return self.tmp / f"line-{number}.log"

    def argv(self, command: str) -> list[str]:
        command = (command.replace("127.0.0.1:9092", f"127.0.0.1:{self.broker_port}")
                   .replace("--port 9092", f"--port {self.broker_port}"))
        short = SHORT.get(_key(command), "")
        while "{port}" in short:
            short = short.replace("{port}", str(free_port()), 1)
        short = short.replace("{tmp}", str(self.tmp))
        if command.startswith("make "):  # from the checkout, its environment taken as made
            target = command.split()[1]
            done = "lint" if target == "test" else "setup"
            return ["make", "-s", "-C", str(ROOT), "-o", done, *shlex.split(command)[1:], *shlex.split(short)]
        return ["bash", "-c", f"{command} {short}".strip()]

    def run(self, number: int, command: str) -> None:
        if command == ". .venv/bin/activate":  # what sourcing it does for the lines after it
            self.env["VIRTUAL_ENV"] = str(VENV_BIN.parent)
            self.env["PATH"] = f"{VENV_BIN}:{self.env['PATH']}"
            return
        if command.startswith("export ") and "=" in command:
            name = command.removeprefix("export ").split("=", 1)[0]
            done = subprocess.run(["bash", "-c", f'{command} && printf %s "${name}"'], env=self.env,  # noqa: S603, S607
                                  capture_output=True, text=True, timeout=60, cwd=self.tmp, check=False)
            assert done.returncode == 0 and done.stdout, f"README line {number}: {command}\n{done.stderr}"
            self.env[name] = done.stdout
            return
        log = self.log(number)
        ready = SERVING.get(_key(command))
        with log.open("wb") as out:
            proc = subprocess.Popen(self.argv(command), env=self.env, cwd=self.tmp, stdout=out,  # noqa: S603
                                    stderr=subprocess.STDOUT, start_new_session=True)
        if ready is None:
            try:
                code = proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                raise AssertionError(f"README line {number} ran {TIMEOUT_S} s: {command}\n"
                                     f"{log.read_text()[-3000:]}") from None
            text = log.read_text()
            assert code == 0, f"README line {number} failed ({code}): {command}\n{text[-3000:]}"
            assert "Traceback" not in text, f"README line {number}: {command}\n{text[-3000:]}"
            return
        self.serving.append((number, command, proc, log))
        deadline = time.monotonic() + 120
        while not ready(self.env):
            assert proc.poll() is None, f"README line {number} exited ({proc.returncode}): {command}\n" \
                                        f"{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"README line {number} not up in 120 s: {command}\n" \
                                                f"{log.read_text()[-3000:]}"
            time.sleep(0.2)

    def stop(self) -> list[str]:
        """Ctrl-C to each serving command, the last started first; what went wrong."""
        wrong = []
        for number, command, proc, log in reversed(self.serving):
            if proc.poll() is not None:
                wrong.append(f"README line {number} exited early ({proc.returncode}): {command}\n"
                             f"{log.read_text()[-2000:]}")
                continue
            os.killpg(proc.pid, signal.SIGINT)
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                code = None
            text = log.read_text()
            if code not in (0, 130) or "Traceback" in text:
                wrong.append(f"README line {number} did not stop cleanly on Ctrl-C ({code}): {command}\n"
                             f"{text[-2000:]}")
        self.serving = []
        return wrong


def test_no_inline_command_hides_what_it_needs() -> None:
    text = README.read_text()
    commands = inline_commands(text)
    assert any(c.startswith("ptt plan fleet ") for c in commands)  # the reading found them
    hidden = [c for c in commands if "..." in c]
    assert not hidden, f"inline commands with a '...': {hidden}"
    for command in (c for c in commands if c.startswith("ptt plan ")):
        try:
            build_parser().parse_args(shlex.split(command)[1:])
        except SystemExit as exc:
            raise AssertionError(f"`{command}` in the README does not parse (missing flags?)") from exc


def test_every_python_block_has_its_test() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    untested = [b for b in blocks if not any(phrase in b for phrase in PYTHON_BLOCKS_TESTED)]
    assert blocks and not untested, f"a README Python block no test runs: {untested}"


def test_every_sh_command_in_the_readme_runs(tmp_path: Path) -> None:
    if not (VENV_BIN / "ptt").exists():
        pytest.skip("the README's commands need the project's .venv (make setup)")
    commands = sh_commands(README.read_text())
    assert len(commands) >= 10, commands  # the reading found the README's blocks
    port = free_port()
    env = {**os.environ, "PTT_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}", "PTT_WEB_PORT": str(free_port()),
           "PTT_METRICS_PORT": str(free_port())}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != str(VENV_BIN))
    session = Session(tmp_path, env, port)
    try:
        for number, command in commands:
            session.run(number, command)
    finally:
        wrong = session.stop()
    assert not wrong, "\n".join(wrong)

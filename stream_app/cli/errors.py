"""The exit-code contract of every ``ptt`` command and the one line of an expected failure.

Every expected failure is one line on stderr, ``ptt <command>: error: <what>; <how to fix>``,
with one of the exit codes below (the README lists them). Anything unexpected is written with
its traceback to a log file, and the one line printed points to it (:func:`guarded`).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ERROR_LOG", "EXIT_BROKER", "EXIT_BROKER_LOST", "EXIT_CODES", "EXIT_EMPTY", "EXIT_FAILURE", "EXIT_HELPER",
           "EXIT_INPUT", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PORT", "EXIT_UNPUBLISHED", "EXIT_USAGE", "SECRET_FLAGS",
           "CliError", "error_line", "guarded", "input_paths", "redacted", "validation_message"]

# The exit codes of every command (documented in the README).
EXIT_OK = 0
EXIT_FAILURE = 1  # something unexpected (traceback in the error log), or delivery failures
EXIT_USAGE = 2  # a bad flag or value
EXIT_BROKER = 3  # the Kafka broker cannot be reached
EXIT_PORT = 4  # a port to listen on is taken
EXIT_INPUT = 5  # an input file is missing, unreadable, or not in a readable compression
EXIT_EMPTY = 6  # the input holds no usable data
EXIT_BROKER_LOST = 7  # the broker was lost mid-run (silent past --broker-loss-timeout-s, or its topics gone)
EXIT_HELPER = 8  # a process the command started (the demo's helpers, the shuffler's front door) exited
EXIT_UNPUBLISHED = 9  # the demo replayed epochs the worker never published (the pipeline stalled)
EXIT_INTERRUPTED = 130  # Ctrl-C (or SIGTERM): what was sent is flushed and marked
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_FAILURE: "unexpected failure (details in the error log named on stderr), or records the broker refused",
    EXIT_USAGE: "bad usage or a bad value",
    EXIT_BROKER: "the Kafka broker cannot be reached",
    EXIT_PORT: "a port to listen on is in use",
    EXIT_INPUT: "an input file is missing, unreadable or in an unreadable compression",
    EXIT_EMPTY: "the input holds no usable data",
    EXIT_BROKER_LOST: "the Kafka broker was lost mid-run (silent for --broker-loss-timeout-s, or its topics gone)",
    EXIT_HELPER: "a process the command started (the demo's broker, worker, shuffler or Prometheus; the "
                 "shuffler's front door) exited while it should have been running (which one, how it ended and "
                 "the end of its log on stderr)",
    EXIT_UNPUBLISHED: "ptt demo replayed epochs that were never published: the worker or the shuffler stalled "
                      "(how many windows and rollups are missing on stderr)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C or SIGTERM)",
}
ERROR_LOG = "ptt-error.log"
# the flags of the settings' secrets (SecretStr): their values never reach the error log
SECRET_FLAGS = ("--enrollment-secret", "--sasl-plain-password", "--ssl-password")


class CliError(Exception):
    """An expected failure: one line and an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def validation_message(exc: Any) -> str:
    """A pydantic ValidationError as one line naming each flag and its problem (no links)."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = [str(x) for x in err.get("loc", ())]
        msg = str(err.get("msg", "invalid value"))
        msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if loc:
            given = err.get("input")
            got = f" (got {given!r})" if isinstance(given, str | int | float) else ""
            parts.append(f"{_flag(loc[0])}{''.join(f'[{x}]' for x in loc[1:])}: {msg[:1].lower()}{msg[1:]}{got}")
        else:
            parts.append(msg)
    return "; ".join(parts)


def input_paths(args: argparse.Namespace) -> list[Path]:
    """The input files a command was given (``--pems-raw``, ``--pems-5min``, ``--meta``)."""
    return [Path(p) for p in (getattr(args, n, None) for n in ("pems_raw", "pems_5min", "meta")) if p is not None]


def _error_log(args: argparse.Namespace | None) -> Path:
    out = getattr(args, "out", None) if args is not None and getattr(args, "command", "") == "demo" else None
    return (Path(out) if out is not None else Path.cwd()) / ERROR_LOG


def redacted(argv: list[str]) -> list[str]:
    """A command line with the values of :data:`SECRET_FLAGS` (or of their abbreviations,
    which argparse takes) hidden: what the error log keeps of it.

    >>> redacted(["ptt", "replay", "--enrollment-secret", "s3cr3t", "--ssl-pass=pw", "--enrollment-secret-file", "f"])
    ['ptt', 'replay', '--enrollment-secret', '***', '--ssl-pass=***', '--enrollment-secret-file', 'f']
    """
    def secret(flag: str) -> bool:
        return len(flag) > 3 and any(name.startswith(flag) for name in SECRET_FLAGS)

    out: list[str] = []
    for i, arg in enumerate(argv):
        flag, eq, _ = arg.partition("=")
        if eq and secret(flag):
            out.append(f"{flag}=***")
        elif i and secret(argv[i - 1]) and "=" not in argv[i - 1]:
            out.append("***")
        else:
            out.append(arg)
    return out


def _write_error_log(command: str, path: Path) -> Path:
    text = f"ptt {command} failed; {' '.join(redacted(sys.argv))}\n{traceback.format_exc()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path
    except OSError:
        import tempfile

        fd, name = tempfile.mkstemp(prefix="ptt-error-", suffix=".log")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return Path(name)


def error_line(command: str, what: str, fix: str = "") -> str:
    """The one line of an expected failure: ``ptt <command>: error: <what>; <fix>``.

    >>> error_line("replay", "cannot read x.txt: no such file", "check the path")
    'ptt replay: error: cannot read x.txt: no such file; check the path'
    """
    what = " ".join(str(what).split())
    return f"ptt {command}: error: {what}{'; ' + fix if fix and fix not in what else ''}"


def guarded(command: str, fn: Callable[[], int], args: argparse.Namespace | None = None) -> int:
    """Run a command; map every expected failure to one line and its exit code, and anything
    else to one line pointing to a log file with the traceback (exit 1)."""
    from pydantic import ValidationError

    from producers.replay import EmptyData
    from schemas.kafka_io import BrokerLost, BrokerUnavailable

    from ..ports import PortInUse

    def fail(code: int, what: str, fix: str = "") -> int:
        print(error_line(command, what, fix), file=sys.stderr)
        return code

    help_hint = f"see ptt {command} --help"
    try:
        return fn()
    except KeyboardInterrupt:
        print(f"ptt {command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except CliError as exc:
        return fail(exc.code, str(exc))
    except ValidationError as exc:
        return fail(EXIT_USAGE, validation_message(exc), help_hint)
    except BrokerLost as exc:
        return fail(EXIT_BROKER_LOST, str(exc))
    except BrokerUnavailable as exc:
        return fail(EXIT_BROKER, str(exc))
    except PortInUse as exc:
        return fail(EXIT_PORT, str(exc), "stop what uses it or choose another port")
    except EmptyData as exc:
        return fail(EXIT_EMPTY, str(exc), "check the file (and --day) holds readings")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        name = exc.filename or ""
        return fail(EXIT_INPUT, f"cannot read {name}: {exc.strerror or exc}", "check the path")
    except ValueError as exc:
        inputs = [str(p) for p in input_paths(args)] + [str(p.absolute()) for p in input_paths(args)] \
            if args is not None else []
        if any(str(exc).startswith(p) for p in inputs):
            return fail(EXIT_INPUT, str(exc), "give a plain, gzip, bz2, xz or single-member zip PeMS file")
        return fail(EXIT_USAGE, str(exc), help_hint)
    except Exception:  # noqa: BLE001 - the last line of defence: no traceback reaches a user
        log = _write_error_log(command, _error_log(args))
        return fail(EXIT_FAILURE, f"unexpected failure ({sys.exc_info()[1].__class__.__name__}); the details "
                    f"are in {log}", "please include that file when you report it")

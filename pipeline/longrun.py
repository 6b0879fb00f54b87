"""The long-run protocol: how a command that runs for hours reports and stops.

``progress`` is the one progress writer of the project: every line a long command writes as it
goes (a fold measured, a chain's step, a table written) reaches stderr through it.
"""
from __future__ import annotations

import sys
from datetime import datetime


def stamp() -> str:
    """The wall-clock time a log line is read by later."""
    return datetime.now().strftime("%Y-%m-%d %H:%M:%S")


def progress(line: str) -> None:
    """A progress line on stderr as a long command goes: on a terminal as it is; otherwise (a
    log file, a pipe) after a timestamp, so a log read later says when each thing ended."""
    if not sys.stderr.isatty():
        line = f"{stamp()} {line}"
    sys.stderr.write(line + "\n")
    sys.stderr.flush()

"""What the commands share in how they talk to the user: warnings on stderr, one-line errors,
lost-worker reports.  (How they measure a build against the heuristic is
``dispatcher.compare``'s.)"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Iterator
from typing import IO, Any, Callable, NoReturn, TypeVar

import click

from dispatcher.core.figures import METRICS
from dispatcher.running.backend import BackendUnavailable
from dispatcher.session import Session

F = TypeVar("F", bound=Callable[..., Any])

USER_ERROR = 2  # the exit status of every bad input, in every command


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that refuses nan and the infinities: ``nan`` compares false with every
    bound, so a plain range lets it through (and every label would be nonsense).  The type
    of every command option that is a threshold, a margin or a gate."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class UserError(click.ClickException):
    """Bad input or a refused request: one line on stderr, ``<command>: <message>``, and exit
    status ``USER_ERROR``.  The one user-error path of every command: click prints it and exits
    (in-process too, under ``CliRunner``), after ``with`` blocks (sessions, locks) have closed."""

    exit_code = USER_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        # The command's name, taken where the error is raised: click shows the error after
        # the command's context has ended.
        ctx = click.get_current_context(silent=True)
        self.prog = ctx.info_name if ctx is not None and ctx.info_name else "command"

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"{self.prog}: {self.format_message()}", err=True)


def fail(message: str) -> NoReturn:
    """End the command with ``message`` as its one-line error (``UserError``)."""
    raise UserError(message)


def backend_errors_in_one_line(command: F) -> F:
    """A backend that cannot start (a Ray cluster not there, no token) ends the command with
    its one line, whenever the workers are first needed."""
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BackendUnavailable as exc:
            raise UserError(str(exc)) from None
    return wrapper  # type: ignore[return-value]


def metric_option(command: F) -> F:
    """``--metric time|instructions|cycles``: what the command's comparisons measure (default:
    the config's ``measure.metric``; docs/measurement.md, "Exact metrics")."""
    return click.option(
        "--metric", type=click.Choice(METRICS), default=None,
        help="What comparisons measure: time (paired wall time), or instructions / cycles "
             "(one cachegrind run of each binary: exact, needs valgrind on every worker). "
             "Default: the config's measure.metric.")(command)


def show_warnings() -> None:
    """Lost workers, retried jobs and quarantined hosts are reported on stderr as they happen."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")


@contextlib.contextmanager
def closing_session(session: Session) -> Iterator[Session]:
    """The session closed as its own exit does (Ctrl-C aborts: ``Session.__exit__``), then its
    lost slots reported."""
    with session:
        yield session
    report_lost_workers(session)


def report_lost_workers(session: Session) -> None:
    """Slots taken out of service, and slots still lost when the command ended."""
    for line in session.lost_workers():
        click.echo(line, err=True)


def refuse_with_resume(given: list[str], why: str) -> None:
    """A resumed run continues with what its rundir recorded: options that would change it
    are refused, not ignored."""
    if given:
        fail(f"{', '.join(given)} cannot be used with --resume: {why}")

"""What the commands share: warnings on stderr, one-line errors, lost-worker reports."""
from __future__ import annotations

import logging

import click

from dispatcher.session import Session


def show_warnings() -> None:
    """Lost workers, retried jobs and quarantined hosts are reported on stderr as they happen."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")


def report_lost_workers(session: Session) -> None:
    """Slots taken out of service, and slots still lost when the command ended."""
    for line in session.lost_workers():
        click.echo(line, err=True)

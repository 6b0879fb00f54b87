"""``run-campaign``: the whole pipeline in one command, resumable.

What a campaign is, its stages, budget and publishing are ``pipeline.campaign``'s; this command
reads its options, runs the campaign, and says where it ended.  Each stage's tables go to
stdout (and ``<dir>/logs/<stage>.out``), progress to stderr; the state is in
``<dir>/campaign.json``, so running it again continues a campaign that stopped.
"""
from __future__ import annotations

import shlex
import sys
from datetime import datetime
from pathlib import Path

import click

from commands.common import fail
from pipeline import campaign as pipeline_campaign
from pipeline.campaign import (
    DESCRIPTIONS,
    STAGES,
    Campaign,
    CampaignError,
    CampaignRun,
    CampaignState,
    WorkerClock,
)

PROG = "run-campaign"


def _when(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def show_state(campaign: Campaign, state: CampaignState, spent_s: float) -> None:
    click.echo(f"campaign {campaign.dir} ({campaign.source}{', quick' if campaign.quick else ''})"
               f"; worker budget {spent_s / 3600:.2f} of {campaign.worker_hours:g} h spent")
    for i, name in enumerate(STAGES, 1):
        s = state.stages[name]
        note = f" ({s.note})" if s.note else ""
        click.echo(f"{i:>3}. {name:9} {s.state:12} {_when(s.finished if s.done else s.started):16}"
                   f" {DESCRIPTIONS[name]}{note}")


def _again(source: Path, quick: bool) -> str:
    return f"{PROG} --config {shlex.quote(str(source))}" + (" --quick" if quick else "")


def _stage_output(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


def _ended(campaign: Campaign, result: CampaignRun) -> None:
    """Word where a run that stopped early stopped, and exit with its status."""
    again = _again(campaign.source, campaign.quick)
    if result.stopped == "interrupted":
        click.echo(f"{PROG}: interrupted in the {result.stage} stage; to continue: {again}",
                   err=True)
        sys.exit(130)
    if result.stopped == "failed":
        message = (f"the {result.stage} stage failed (exit status {result.exit}; its output is "
                   f"above and in {result.log(campaign)}); once fixed, continue: {again}")
    else:
        message = result.error
    click.echo(f"{PROG}: {message}", err=True)  # a stage that failed, not a bad input
    sys.exit(1)


@click.command()
@click.option("--config", "campaign_path", type=click.Path(path_type=Path),
              default=Path("configs/campaign.yaml"), show_default=True,
              help="The campaign file (docs/campaign.md).")
@click.option("--quick", is_flag=True,
              help="Apply the campaign file's quick section: a small campaign (its own "
                   "directory) that a 2-CPU machine finishes within half an hour.")
@click.option("--until", type=click.Choice(STAGES[:-1]),
              help="Run the stages up to this one, and stop (run-campaign again goes on).")
@click.option("--status", "status_only", is_flag=True,
              help="Show each stage's state and the budget spent, and run nothing.")
def run_campaign(campaign_path: Path, quick: bool, until: str | None,
                 status_only: bool) -> None:
    """Run a campaign: search, labels, rewards, policy, its evaluation against the baselines,
    the optimal trees, and the published results; run it again to continue one that stopped."""
    try:
        _run(campaign_path, quick, until, status_only)
    except KeyboardInterrupt:  # between two stages (during one, the stage's command stops)
        click.echo(f"\n{PROG}: interrupted; to continue: {_again(campaign_path, quick)}",
                   err=True)
        sys.exit(130)


def _run(campaign_path: Path, quick: bool, until: str | None, status_only: bool) -> None:
    clock = WorkerClock()
    try:
        campaign, state = pipeline_campaign.open_campaign(campaign_path, quick=quick)
        show_state(campaign, state, clock.spent(campaign))
        if status_only:
            return
        result = pipeline_campaign.run(campaign, state, until=until, output=_stage_output,
                                       clock=clock)
    except CampaignError as exc:
        fail(str(exc))
    if result.stopped:
        _ended(campaign, result)
    show_state(campaign, result.state, clock.spent(campaign))


def main() -> None:
    run_campaign(prog_name=PROG)

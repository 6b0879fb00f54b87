"""``run-campaign``: the whole pipeline in one command, resumable.

Search the training split, measure sites, assign rewards, train the policy with measured
validation, measure it with the baselines on the evaluation split and the optimal trees, then
publish (``commands.campaign_plan`` says which command each stage runs and with what).  Each
stage runs as its own command in the campaign directory, its tables on this command's stdout
and in ``<dir>/logs/<stage>.out`` (earlier runs of it: ``<stage>.1.out``, ...), its progress
on stderr.  The state is in ``<dir>/campaign.json``: a stage done is skipped (and shown); one
stopped half-way (Ctrl-C, a kill, a crash) continues through its command's own resume when
``run-campaign`` is run again.

The search and the sweeps share the budget (``budget.worker_hours``): worker-seconds spent
running binaries, read from the experiments' journals while they run.  When the search has
spent its share, or the sweeps the rest, the stage is stopped as a Ctrl-C would stop it and
the campaign goes on with what was measured.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import NoReturn

import click

from commands import campaign_plan as plan
from commands.campaign_publish import PublishError, publish

PROG = "run-campaign"
EXIT_GATE = 3  # train-policy: the policy failed its measured gate (the file is written)
POLL_S = 5.0


def _fail(message: str, status: int = 2) -> NoReturn:
    click.echo(f"{PROG}: {message}", err=True)
    sys.exit(status)


def _when(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def show_state(campaign: plan.Campaign, state: plan.CampaignState, spent_s: float) -> None:
    click.echo(f"campaign {campaign.dir} ({campaign.source}{', quick' if campaign.quick else ''})"
               f"; worker budget {_hours(spent_s)} of {campaign.worker_hours:g} h spent")
    for i, name in enumerate(plan.STAGES, 1):
        s = state.stages[name]
        note = f" ({s.note})" if s.note else ""
        click.echo(f"  {i}. {name:9} {s.state:12} {_when(s.finished if s.done else s.started):16}"
                   f" {plan.DESCRIPTIONS[name]}{note}")


def _stop_with_parent() -> None:
    """In the child, before it runs: SIGINT (its graceful stop) when this command dies, even
    by SIGKILL, so no stage goes on alone holding its rundirs' locks."""
    import ctypes
    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGINT)
    except (OSError, AttributeError):
        pass


class _Child:
    """One stage's command: stdout copied to the terminal and the stage's log, stderr the
    terminal's.  In a session of its own, so that a Ctrl-C at the terminal reaches this
    command only, which passes one SIGINT on (the command's graceful stop; a second Ctrl-C, a
    second SIGINT: its hard stop), as it does for a SIGTERM and when the budget is spent."""

    def __init__(self, argv: list[str], cwd: Path, log: Path):
        log.parent.mkdir(parents=True, exist_ok=True)
        _keep_earlier(log)
        self.log = log.open("w", encoding="utf-8")
        exe = Path(sys.executable).parent / argv[0]
        # its tables go to a pipe: rich would lay them out for an unbounded width
        env = {**os.environ, "COLUMNS": os.environ.get("COLUMNS", "120")}
        self.proc = subprocess.Popen([str(exe), *argv[1:]], cwd=cwd, env=env,
                                     stdout=subprocess.PIPE,
                                     text=True, errors="replace", bufsize=1,
                                     start_new_session=True, preexec_fn=_stop_with_parent)
        self.copier = threading.Thread(target=self._copy, daemon=True)
        self.copier.start()

    def _copy(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            self.log.write(line)
            self.log.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        self.copier.join(timeout=10)
        self.log.close()


def _keep_earlier(log: Path) -> None:
    """A stage run again (a resume) writes ``<stage>.out`` afresh, the one the published
    README quotes; what its earlier runs printed is kept as ``<stage>.1.out``, ``.2``, ...
    in the order they ran."""
    if not log.exists() or log.stat().st_size == 0:
        return
    k = 1
    while (earlier := log.with_name(f"{log.stem}.{k}{log.suffix}")).exists():
        k += 1
    log.rename(earlier)


def run_stage(campaign: plan.Campaign, name: str, argv: list[str],
              clock: plan.WorkerClock) -> tuple[int, str]:
    """Run one stage's command to its end: its exit status, and why it stopped early
    ("budget", "interrupted") or ""."""
    limit = plan.stage_budget_s(campaign, name)
    kinds = (*plan.SEARCHES, plan.SITES)
    stopped = {"why": ""}
    child = _Child(argv, campaign.dir, campaign.dir / "logs" / f"{name}.out")

    def on_signal(signum, frame) -> None:
        if stopped["why"] != "interrupted":
            stopped["why"] = "interrupted"
            click.echo(f"\n{PROG}: stopping the {name} stage as its command stops on Ctrl-C",
                       err=True)
        child.stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            status = child.wait(POLL_S)
            if status is not None:
                break
            if limit is not None and not stopped["why"]:
                spent = clock.seconds(plan.experiments(campaign.batch_log, kinds))
                if spent >= limit:
                    stopped["why"] = "budget"
                    click.echo(f"{PROG}: {name}: the worker budget for it is spent "
                               f"({_hours(spent)} of {_hours(limit)} h): stopping it as "
                               "Ctrl-C would; the campaign goes on with what it measured",
                               err=True)
                    child.stop()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        child.close()
    return status, stopped["why"]


def _again(campaign: plan.Campaign) -> str:
    quick = " --quick" if campaign.quick else ""
    return f"{PROG} --config {shlex.quote(str(campaign.source))}{quick}"


@click.command()
@click.option("--config", "campaign_path", type=click.Path(path_type=Path),
              default=Path("configs/campaign.yaml"), show_default=True,
              help="The campaign file (docs/campaign.md).")
@click.option("--quick", is_flag=True,
              help="Apply the campaign file's quick section: a small campaign (its own "
                   "directory) that a 2-CPU machine finishes within half an hour.")
@click.option("--until", type=click.Choice(plan.STAGES[:-1]),
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
        again = f"{PROG} --config {shlex.quote(str(campaign_path))}" + (" --quick" if quick
                                                                         else "")
        click.echo(f"\n{PROG}: interrupted; to continue: {again}", err=True)
        sys.exit(130)


def _run(campaign_path: Path, quick: bool, until: str | None, status_only: bool) -> None:
    try:
        campaign = plan.load_campaign(campaign_path, quick=quick)
        state = plan.read_state(campaign)
    except plan.CampaignError as exc:
        _fail(str(exc))
    clock = plan.WorkerClock()
    kinds = (*plan.SEARCHES, plan.SITES)
    try:
        spent = clock.seconds(plan.experiments(campaign.batch_log, kinds))
    except plan.CampaignError as exc:
        _fail(str(exc))
    show_state(campaign, state, spent)
    if status_only:
        return
    try:
        campaign.dir.mkdir(parents=True, exist_ok=True)
        plan.write_state(campaign, state)
        if not (campaign.dir / "search.tasks").exists():
            plan.write_tasks(campaign)
    except OSError as exc:
        _fail(f"{campaign.dir}: cannot write the campaign's state ({exc.strerror or exc})")
    last = plan.STAGES.index(until) if until else len(plan.STAGES) - 1
    while (name := state.next_stage()) not in (None, "publish") \
            and plan.STAGES.index(name) <= last:
        number = plan.STAGES.index(name) + 1
        s = state.stages[name]
        again = f", started {s.runs} time(s) before: continuing" if s.runs else ""
        click.echo(f"[{number}/{len(plan.STAGES)}] {name}: {plan.DESCRIPTIONS[name]}{again}",
                   err=True)
        try:
            argv = plan.stage_command(campaign, name)
        except plan.CampaignError as exc:
            _fail(str(exc))
        limit = plan.stage_budget_s(campaign, name)
        if argv is not None and limit is not None:
            spent = clock.seconds(plan.experiments(campaign.batch_log, kinds))
            if spent >= limit:
                click.echo(f"{name}: no worker budget left for it ({_hours(spent)} of "
                           f"{_hours(limit)} h spent): skipped", err=True)
                state = state.with_stage(name, state="budget", finished=plan.now(),
                                         note="no budget left")
                plan.write_state(campaign, state)
                continue
        if argv is None:
            state = state.with_stage(name, state="skipped", finished=plan.now(),
                                     note="nothing to do")
            plan.write_state(campaign, state)
            click.echo(f"{name}: nothing to do: skipped", err=True)
            continue
        click.echo(f"$ {shlex.join(argv)}", err=True)
        state = state.with_stage(name, state="running", started=plan.now(), runs=s.runs + 1)
        plan.write_state(campaign, state)
        status, why = run_stage(campaign, name, argv, clock)
        if why == "budget" and status in (0, 130):
            state = state.with_stage(name, state="budget", finished=plan.now(), exit=status,
                                     note="stopped when its budget was spent")
        elif status == 0:
            state = state.with_stage(name, state="done", finished=plan.now(), exit=0, note="")
        elif name == "policy" and status == EXIT_GATE:
            state = state.with_stage(name, state="gate-failed", finished=plan.now(),
                                     exit=status, note="it failed its measured gate "
                                     f"({campaign.policy.gate}: logs/policy.out says why); "
                                     "evaluated anyway")
        elif status == 130 or why == "interrupted" or status == -signal.SIGINT:
            state = state.with_stage(name, state="pending", exit=status, note="interrupted")
            plan.write_state(campaign, state)
            click.echo(f"{PROG}: interrupted in the {name} stage; to continue: "
                       f"{_again(campaign)}", err=True)
            sys.exit(130)
        else:
            state = state.with_stage(name, state="failed", exit=status,
                                     note=f"exit status {status}")
            plan.write_state(campaign, state)
            _fail(f"the {name} stage failed (exit status {status}; its output is above and "
                  f"in {campaign.dir / 'logs' / (name + '.out')}); once fixed, continue: "
                  f"{_again(campaign)}", 1)
        plan.write_state(campaign, state)
    if until is not None:
        spent = clock.seconds(plan.experiments(campaign.batch_log, kinds))
        show_state(campaign, state, spent)
        return
    # publish: every time the stages before it are done (a rerun writes the same files)
    click.echo(f"[{len(plan.STAGES)}/{len(plan.STAGES)}] publish: "
               f"{plan.DESCRIPTIONS['publish']}", err=True)
    try:
        written = publish(campaign)
    except PublishError as exc:
        plan.write_state(campaign, state.with_stage("publish", state="failed", note=str(exc)))
        _fail(str(exc), 1)
    state = state.with_stage("publish", state="done", finished=plan.now(),
                             note=f"{len(written)} files in {campaign.results}")
    plan.write_state(campaign, state)
    spent = clock.seconds(plan.experiments(campaign.batch_log, kinds))
    show_state(campaign, state, spent)


def main() -> None:
    if os.environ.get("INLINING_CAMPAIGN_POLL_S"):  # tests: a budget checked sooner
        global POLL_S
        POLL_S = float(os.environ["INLINING_CAMPAIGN_POLL_S"])
    run_campaign(prog_name=PROG)

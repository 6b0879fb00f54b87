"""The stage runner: each stage's command run to its end in the campaign directory, stopped
as Ctrl-C stops it when the budget for it is spent, its exit status turned into the stage's
state; and the loop over the stages, from the first not done, then publishing.

The stages' tables (their stdout) go to ``output`` and to ``<dir>/logs/<stage>.out``; their
progress stays on this process's stderr, as does this runner's (``pipeline.longrun.progress``).
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pipeline.campaign.budget import WorkerClock, stage_budget_s
from pipeline.campaign.plan import Campaign, CampaignError
from pipeline.campaign.publish import PublishError, publish
from pipeline.campaign.stages import stage_command, write_tasks
from pipeline.campaign.state import (
    DESCRIPTIONS,
    STAGES,
    CampaignState,
    StageState,
    now,
    write_state,
)
from pipeline.longrun import progress
from pipeline.policy.selection import EXIT_GATE

POLL_S = 5.0
POLL_ENV = "INLINING_CAMPAIGN_POLL_S"  # tests: the budget checked sooner


def poll_s() -> float:
    return float(os.environ.get(POLL_ENV) or POLL_S)


@dataclass(frozen=True)
class CampaignRun:
    """Where a run of the campaign ended: ``stopped`` is "" when it ran its stages (to the
    end and published, or to ``--until``), else "interrupted" or "failed" in ``stage``
    (``exit``: its command's status), or "publish" (``error`` says why)."""

    state: CampaignState
    stopped: str = ""
    stage: str = ""
    exit: int | None = None
    error: str = ""
    published: tuple[Path, ...] = ()

    def log(self, campaign: Campaign) -> Path:
        return campaign.dir / "logs" / f"{self.stage}.out"


def settle(stage: StageState, name: str, status: int, why: str, gate: float) -> StageState:
    """A stage's state once its command ended with ``status`` (``why``: "budget" when the
    budget stopped it, "interrupted" for a Ctrl-C or SIGTERM passed on, or "").  Pending
    again when interrupted (a rerun continues it); failed for any other failing status."""
    if why == "budget" and status in (0, 130):
        return replace(stage, state="budget", finished=now(), exit=status,
                       note="stopped when its budget was spent")
    if status == 0:
        return replace(stage, state="done", finished=now(), exit=0, note="")
    if name == "policy" and status == EXIT_GATE:
        return replace(stage, state="gate-failed", finished=now(), exit=status,
                       note=f"it failed its measured gate ({gate}: logs/policy.out says "
                       "why); evaluated anyway")
    if status == 130 or why == "interrupted" or status == -signal.SIGINT:
        return replace(stage, state="pending", exit=status, note="interrupted")
    return replace(stage, state="failed", exit=status, note=f"exit status {status}")


def _stop_with_parent() -> None:
    """In the child, before it runs: SIGINT (its graceful stop) when this process dies, even
    by SIGKILL, so no stage goes on alone holding its rundirs' locks."""
    import ctypes
    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGINT)
    except (OSError, AttributeError):
        pass


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


class _Child:
    """One stage's command: stdout copied to ``output`` and the stage's log, stderr this
    process's.  In a session of its own, so that a Ctrl-C at the terminal reaches this process
    only, which passes one SIGINT on (the command's graceful stop; a second Ctrl-C, a second
    SIGINT: its hard stop), as it does for a SIGTERM and when the budget is spent."""

    def __init__(self, argv: list[str], cwd: Path, log: Path, output: Callable[[str], None]):
        log.parent.mkdir(parents=True, exist_ok=True)
        _keep_earlier(log)
        self.log = log.open("w", encoding="utf-8")
        self.output = output
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
            self.output(line)
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


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def run_stage(campaign: Campaign, name: str, argv: list[str], clock: WorkerClock,
              output: Callable[[str], None]) -> tuple[int, str]:
    """Run one stage's command to its end: its exit status, and why it stopped early
    ("budget", "interrupted") or ""."""
    limit = stage_budget_s(campaign, name)
    stopped = {"why": ""}
    child = _Child(argv, campaign.dir, campaign.dir / "logs" / f"{name}.out", output)

    def on_signal(signum, frame) -> None:
        if stopped["why"] != "interrupted":
            stopped["why"] = "interrupted"
            progress(f"stopping the {name} stage as its command stops on Ctrl-C")
        child.stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while (status := child.wait(poll_s())) is None:
            if limit is None or stopped["why"]:
                continue
            spent = clock.spent(campaign)
            if spent >= limit:
                stopped["why"] = "budget"
                progress(f"{name}: the worker budget for it is spent ({_hours(spent)} of "
                         f"{_hours(limit)} h): stopping it as Ctrl-C would; the campaign "
                         "goes on with what it measured")
                child.stop()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        child.close()
    return status, stopped["why"]


def check_results(campaign: Campaign) -> None:
    """``results`` can be published to: a directory (made if need be) that a file can be
    written in; CampaignError naming the campaign file's key otherwise, before any stage
    runs (not once the search has spent its hours)."""
    out = campaign.results
    why = ""
    if out.exists() and not out.is_dir():
        why = "not a directory"
    else:
        try:
            out.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=out):  # O_TMPFILE: never a name left behind
                pass
        except OSError as exc:
            why = f"cannot write there ({exc.strerror or exc})"
    if why:
        raise CampaignError.at(str(campaign.source), "results", f"{out}: {why}")


def prepare(campaign: Campaign, state: CampaignState) -> None:
    """The campaign directory with its state and the search's tasks file, the results
    directory checked."""
    check_results(campaign)
    try:
        campaign.dir.mkdir(parents=True, exist_ok=True)
        write_state(campaign, state)
        write_tasks(campaign)
    except OSError as exc:
        raise CampaignError(f"{campaign.dir}: cannot write the campaign's state "
                            f"({exc.strerror or exc})") from None


def _skip(campaign: Campaign, state: CampaignState, name: str, argv: list[str] | None,
          clock: WorkerClock) -> CampaignState | None:
    """The state with ``name`` skipped when it has nothing to run or no budget left (None:
    run it)."""
    limit = stage_budget_s(campaign, name)
    if argv is not None and limit is not None:
        spent = clock.spent(campaign)
        if spent >= limit:
            progress(f"{name}: no worker budget left for it ({_hours(spent)} of "
                     f"{_hours(limit)} h spent): skipped")
            return state.with_stage(name, state="budget", finished=now(),
                                    note="no budget left")
    if argv is None:
        progress(f"{name}: nothing to do: skipped")
        return state.with_stage(name, state="skipped", finished=now(), note="nothing to do")
    return None


def _stage(campaign: Campaign, state: CampaignState, name: str, clock: WorkerClock,
           output: Callable[[str], None]) -> CampaignState:
    """Run one stage (or skip it) and record what it did."""
    s = state.stages[name]
    again = f", started {s.runs} time(s) before: continuing" if s.runs else ""
    progress(f"[{STAGES.index(name) + 1}/{len(STAGES)}] {name}: {DESCRIPTIONS[name]}{again}")
    argv = stage_command(campaign, name)
    skipped = _skip(campaign, state, name, argv, clock)
    if skipped is not None:
        write_state(campaign, skipped)
        return skipped
    assert argv is not None
    progress(f"$ {shlex.join(argv)}")
    state = state.with_stage(name, state="running", started=now(), runs=s.runs + 1)
    write_state(campaign, state)
    status, why = run_stage(campaign, name, argv, clock, output)
    state = replace(state, stages={**state.stages, name: settle(
        state.stages[name], name, status, why, campaign.policy.gate)})
    write_state(campaign, state)
    return state


def run(campaign: Campaign, state: CampaignState, *, until: str | None,
        output: Callable[[str], None], clock: WorkerClock | None = None) -> CampaignRun:
    """Run the stages not done, in order, up to ``until`` (or all, then publish)."""
    clock = clock or WorkerClock()
    prepare(campaign, state)
    last = STAGES.index(until) if until else len(STAGES) - 1
    while (name := state.next_stage()) not in (None, "publish") \
            and STAGES.index(name) <= last:
        state = _stage(campaign, state, name, clock, output)
        stage = state.stages[name]
        if stage.state in ("pending", "failed"):
            return CampaignRun(state, "interrupted" if stage.state == "pending" else "failed",
                               name, stage.exit)
    if until is not None:
        return CampaignRun(state)
    # publish: every time the stages before it are done (a rerun writes the same files)
    progress(f"[{len(STAGES)}/{len(STAGES)}] publish: {DESCRIPTIONS['publish']}")
    try:
        written = publish(campaign)
    except PublishError as exc:
        state = state.with_stage("publish", state="failed", note=str(exc))
        write_state(campaign, state)
        return CampaignRun(state, "publish", "publish", error=str(exc))
    state = state.with_stage("publish", state="done", finished=now(),
                             note=f"{len(written)} files in {campaign.results}")
    write_state(campaign, state)
    return CampaignRun(state, published=tuple(written))

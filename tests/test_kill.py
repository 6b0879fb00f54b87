"""The kill test (issue 11): a short search whose master is SIGKILLed over and over, at random
moments and right after each kind of journal event, and resumed each time, with second
masters started beside a live one, ends as an uninterrupted run of the same seed: step for
step the same proposals, measurements and decisions, no event journaled twice, no process or
staging file left behind."""
from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import time
from pathlib import Path

from commands.common import USER_ERROR
from dispatcher.core.records import (
    BaselineEvent,
    CanaryEvent,
    ConfirmEvent,
    FinishEvent,
    RemeasureEvent,
    ResumeEvent,
    StartEvent,
    StepEvent,
)
from dispatcher.core.rundir import KILL_HOOK_ENV, Rundir, lock_holder, read_batch_log
from tests.helpers import REPO, run_to_end, rundirs_in
from tests.helpers import search_config as config
from tests.helpers import training_command as command

TINYSUM = REPO / "tests" / "golden" / "tinysum"
STEPS = 8
REMEASURE_EVERY, CANARY_EVERY = 2, 3
KILLS = 50  # at least, before the run may end
PROG = "run_training_experiments"
SEED = 20261122  # of the test's own choices: a failure can be replayed


def search_config(directory: Path, store: Path) -> Path:
    """SA that accepts nearly everything (the incumbent moves, so it is re-measured), one or two
    pairs per comparison, canaries and a confirmation: every kind of event in a short run."""
    return config(directory, store, {"max_pairs": 2, "canary_every": CANARY_EVERY,
                                     "confirm": True},
                  algorithm="sa", seed=5, t_start=5.0, t_end=5.0,
                  remeasure_every=REMEASURE_EVERY, baseline_runs=2)


def leftover_processes(root: Path) -> list[str]:
    """Processes whose command line, executable or working directory lies under ``root``
    (agents: their cache dir; binaries: run from it; compilers: in the store)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            where = [cmdline]
            for link in ("exe", "cwd"):
                try:
                    where.append(os.readlink(proc / link))
                except OSError:
                    pass
        except OSError:
            continue
        if any(str(root) in w for w in where):
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


class Campaign:
    """The killed master's side: starts masters, kills them, keeps count."""

    def __init__(self, directory: Path, store: Path):
        self.dir = directory
        self.cfg = search_config(directory, store)
        self.tasks = directory / "tasks.txt"
        self.tasks.write_text(f"{TINYSUM}\n")
        self.kills: collections.Counter[str] = collections.Counter()
        self.refused = 0  # second masters refused by the lock
        self.paused = 0  # of those, started beside a paused master that held it

    def rundir(self) -> Path | None:
        found = rundirs_in(self.dir)
        assert len(found) <= 1, found
        return found[0] if found else None

    def args(self) -> list[str]:
        rundir = self.rundir()
        return (["--resume", str(rundir)] if rundir is not None
                else ["--tasks", str(self.tasks), "--steps", str(STEPS)])

    def start(self, hook: str | None) -> subprocess.Popen:
        env = {**os.environ}
        env.pop(KILL_HOOK_ENV, None)
        if hook:
            env[KILL_HOOK_ENV] = hook
        return subprocess.Popen(command(self.cfg, *self.args()), cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def life(self, hook: str, delay: float | None = None) -> None:
        """One master: killed by ``hook``, or by us after ``delay`` s if it is still alive."""
        proc = self.start(hook)
        try:
            _, err = proc.communicate(timeout=delay if delay is not None else 120)
        except subprocess.TimeoutExpired:
            assert delay is not None, f"master stuck with hook {hook}"
            proc.kill()
            proc.communicate()
            self.kills["random"] += 1
            return
        assert proc.returncode == -signal.SIGKILL, (hook, proc.returncode, err)
        self.kills[self.last_kind()] += 1

    def last_kind(self) -> str:
        """The kind of the journal's last event: a hook kills right after journaling it (a
        kill inside creation leaves no rundir: its ``start`` is in the staging dir)."""
        rundir = self.rundir()
        return Rundir(rundir).events()[-1].event if rundir is not None else "start"

    def second_master(self) -> None:
        """A master paused while it holds the lock; a second one is refused with one line
        naming it; then the first is killed (a random moment of its life)."""
        rundir = self.rundir()
        assert rundir is not None
        first = self.start("step:1")  # paused long before, unless it is very quick
        deadline = time.monotonic() + 60
        while lock_holder(rundir) != first.pid:
            if first.poll() is not None or time.monotonic() > deadline:
                first.kill()
                raise AssertionError(f"the first master ended early: {first.communicate()}")
            time.sleep(0.02)
        os.kill(first.pid, signal.SIGSTOP)
        try:
            second = subprocess.run(command(self.cfg, "--resume", str(rundir)), cwd=REPO,
                                    capture_output=True, text=True, timeout=60)
        finally:
            first.kill()
            first.communicate()
        assert second.returncode == USER_ERROR, second.stderr
        assert second.stderr.strip() == (f"{PROG}: {rundir}: in use by another master (pid "
                                         f"{first.pid}); wait for it to end or stop it before "
                                         "resuming")
        self.refused += 1
        self.paused += 1
        self.kills["random"] += 1

    def two_at_once(self) -> None:
        """Two resumes started together: one takes the rundir; the other is refused, or
        starts only once the first has been killed (never both writing at once: the final
        journal shows no step twice)."""
        procs = [self.start("step:1"), self.start("step:1")]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            if proc.returncode == -signal.SIGKILL:
                self.kills[self.last_kind()] += 1
            else:
                assert proc.returncode == USER_ERROR and "in use by another master (pid" in err, err
                self.refused += 1

    def state(self) -> tuple[Path | None, list]:
        rundir = self.rundir()
        return rundir, (Rundir(rundir).events() if rundir is not None else [])


def choose(rng: random.Random, campaign: Campaign, events: list) -> tuple[str, float | None]:
    """The next master's kill: a hook (right after the n-th event of a kind) or a random
    moment (with a hook as a backstop so a life never does more than two steps)."""
    if not events:
        return ("start:1" if not campaign.kills["start"] else "baseline:1"), None
    if not any(isinstance(e, BaselineEvent) for e in events):
        return "baseline:1", None
    last = max((e.step for e in events if isinstance(e, StepEvent)), default=0)
    total = sum(campaign.kills.values())
    # The end (the confirmation, then finish) only once the kills are all but done: it ends
    # with one or two kills (one if a random kill already fell after the confirmation), and
    # no life may finish the run before then.
    if total >= KILLS - 1:
        return ("confirm:1,finish:1" if not campaign.kills["confirm"] else "finish:1"), None
    upcoming = last + 1
    if last >= STEPS - 1:  # keep the last step for the end: no progress until then
        return rng.choice([("resume:1", None), ("resume:1", rng.uniform(0.2, 1.5))])
    if upcoming % REMEASURE_EVERY == 0 and campaign.kills["remeasure"] < 2:
        return "remeasure:1,step:1", None
    if upcoming % CANARY_EVERY == 0 and campaign.kills["canary"] < 2:
        return "canary:1", None  # right after the step: certain
    # Progress about one step in three lives, so the kills spread over the whole run; a
    # random kill has a hook behind it that stops the life before the last step.
    backstop = f"step:{min(2, STEPS - 1 - last)}"
    if last == 0:  # no resume event before the first step
        return rng.choice([("step:1", None), (backstop, rng.uniform(0.2, 2.5))])
    return rng.choice([("step:1", None), ("resume:1", None), ("resume:1", None),
                       (backstop, rng.uniform(0.2, 2.5)), ("resume:1", rng.uniform(0.2, 1.5))])


def test_kill_the_master_50_times_and_resume_to_an_uninterrupted_run(compiler, tmp_path):
    rng = random.Random(SEED)
    t0 = time.monotonic()
    store = tmp_path / "store"
    (tmp_path / "killed").mkdir()
    killed = Campaign(tmp_path / "killed", store)
    lives = 0
    raced = False
    while True:
        rundir, events = killed.state()
        if events and isinstance(events[-1], FinishEvent):
            break
        lives += 1
        assert lives < 3 * KILLS, f"no end in sight: {killed.kills}"
        last = max((e.step for e in events if isinstance(e, StepEvent)), default=0)
        # Second masters (two in a row: a paused master advances nothing), once there are
        # steps and while a step is left before the end.
        if lives >= 8 and killed.paused < 2 and 0 < last < STEPS - 1:
            killed.second_master()
            continue
        if lives >= 10 and not raced and 0 < last < STEPS - 2:  # two lives, a step each
            killed.two_at_once()
            raced = True
            continue
        hook, delay = choose(rng, killed, events)
        killed.life(hook, delay)
    rundir, events = killed.state()
    assert rundir is not None
    # A resume of the finished rundir appends nothing.
    journal = (rundir / "journal.jsonl").read_bytes()
    run_to_end(killed.cfg, "--resume", str(rundir))
    assert (rundir / "journal.jsonl").read_bytes() == journal
    kills = sum(killed.kills.values())
    assert kills >= KILLS, killed.kills
    assert killed.paused == 2 and raced
    for kind in ("start", "baseline", "step", "remeasure", "canary", "resume", "finish",
                 "random"):
        assert killed.kills[kind] >= 1, (kind, killed.kills)

    # The uninterrupted run: same seed, same store, so the same measurements replay.
    (tmp_path / "whole").mkdir()
    whole_cfg = search_config(tmp_path / "whole", store)
    run_to_end(whole_cfg, "--tasks", str(killed.tasks), "--steps", str(STEPS))
    (whole,) = rundirs_in(tmp_path / "whole")
    reference = Rundir(whole).events()

    def steps(evs: list) -> list[dict]:
        return [e.model_dump(exclude={"time", "elapsed_s", "busy_s"}) for e in evs
                if isinstance(e, StepEvent)]

    assert [s["step"] for s in steps(events)] == list(range(1, STEPS + 1))
    assert steps(events) == steps(reference)  # proposals, measurements, decisions, RNG
    for d in (c.dir for e in events if isinstance(e, StepEvent) for c in e.candidates):
        assert (rundir / d / "overrides.sexp").read_bytes() == \
            (whole / d / "overrides.sexp").read_bytes()

    def keyed(evs: list, kind: type) -> list[tuple]:
        return [(e.event, getattr(e, "step", None), getattr(e, "dir", None)) for e in evs
                if isinstance(e, kind)]

    # No event twice; re-measurements and the confirmation as the uninterrupted run's; a
    # canary lost to a kill after its step is not repeated.
    for kind in (StartEvent, BaselineEvent, StepEvent, RemeasureEvent, CanaryEvent,
                 ConfirmEvent, FinishEvent):
        assert len(set(keyed(events, kind))) == len(keyed(events, kind)), kind
    assert keyed(events, RemeasureEvent) == keyed(reference, RemeasureEvent)
    assert [e.model_dump(exclude={"time"}) for e in events if isinstance(e, RemeasureEvent)] \
        == [e.model_dump(exclude={"time"}) for e in reference if isinstance(e, RemeasureEvent)]
    assert set(keyed(events, CanaryEvent)) <= set(keyed(reference, CanaryEvent))
    assert keyed(events, ConfirmEvent) == keyed(reference, ConfirmEvent)
    assert isinstance(events[0], StartEvent) and isinstance(events[-1], FinishEvent)
    assert [e.reason for e in events if isinstance(e, FinishEvent)] == ["completed"]
    step_of = 0
    for e in events:  # every resume starts right after the last journaled step
        if isinstance(e, StepEvent):
            step_of = e.step
        elif isinstance(e, ResumeEvent):
            assert e.from_step == step_of + 1
    elapsed = [s.elapsed_s for s in events if isinstance(s, StepEvent)]
    assert elapsed == sorted(elapsed)  # cumulative over the resumes

    # Nothing left behind: no staging dir, no temporary file, no process; listed once.
    assert [p.name for p in (tmp_path / "killed" / "rundirs").iterdir()] == [rundir.name]
    assert sorted(p.name for p in rundir.iterdir() if p.name.startswith(".")
                  or p.suffix == ".tmp") == []
    assert not list(rundir.rglob("*.tmp"))
    assert [e.rundir for e in read_batch_log(tmp_path / "killed" / "batch.log")] == [str(rundir)]
    deadline = time.monotonic() + 10
    while leftover_processes(tmp_path):
        assert time.monotonic() < deadline, leftover_processes(tmp_path)
        time.sleep(0.2)
    print(f"\n{kills} kills ({dict(killed.kills)}), {killed.refused} second masters refused, "
          f"{lives} lives, {time.monotonic() - t0:.0f}s")

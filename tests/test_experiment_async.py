"""The asynchronous search end to end (search.mode: async): real compiles, real runs, kills
and Ctrl-C.  Every candidate is judged once, as it lands, by the documented rule; a resumed
chain makes the decisions of an uninterrupted one.  On one worker slot with one compile job
the candidates land in the order they were proposed, so the two runs see the same landing
order and their journals must agree event for event."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import yaml

from dispatcher.core.records import (
    FORMAT_VERSION,
    BaselineEvent,
    CanaryEvent,
    ConfirmEvent,
    FinishEvent,
    ProposeEvent,
    RemeasureEvent,
    ResumeEvent,
    StartEvent,
    StepEvent,
    proposal_file,
)
from dispatcher.core.rundir import KILL_HOOK_ENV, Rundir
from dispatcher.search.rules import accept, temperature
from tests.helpers import FIRST_CPU, REPO, only_rundir, run_to_end, rundirs_in
from tests.helpers import training_command as command

STEPS = 6


def async_config(directory: Path, store: Path, size: str = "tiny", **search) -> Path:
    """Async SA on one CPU with one compile job (so candidates land in proposal order), tiny
    runs (what is checked is the journal, not the clock: 48 -> 16 CPU-s for the kill test),
    warm enough to accept worse candidates now and then, re-measuring every 2 judged
    candidates, a canary every 3, a confirmation at the end."""
    data = {"store": str(store), "local": {"cpus": [FIRST_CPU]}, "compile": {"jobs": 1},
            "run": {"runs": 2, "timeout": 30, "size": size},
            "measure": {"max_pairs": 3, "canary_every": 3, "confirm": True},
            "search": {"mode": "async", "algorithm": "sa", "seed": 4, "baseline_runs": 2,
                       "remeasure_every": 2, "max_flips": 2, "t_start": 0.05, "t_end": 0.01,
                       "rundirs": str(directory / "rundirs"),
                       "batch_log": str(directory / "batch.log"), **search}}
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def tasks(directory: Path) -> Path:
    path = directory / "tasks.txt"
    path.write_text("kahan\n")
    return path


def check_journal(rundir: Path, steps: int) -> list:
    """What every asynchronous journal must hold, however often its master was stopped:
    steps 1..N once each, each proposal judged once, each drawn from the incumbent of its
    moment and judged by the rule against the incumbent of the moment it landed, never more
    in flight than the experiment says; the trees compiled are the proposals' files."""
    experiment = Rundir(rundir).experiment
    events = Rundir(rundir).events()
    assert [e.step for e in events if isinstance(e, StepEvent)] == list(range(1, steps + 1))
    proposed = [e.proposal for e in events if isinstance(e, ProposeEvent)]
    assert proposed == list(range(1, steps + 1))
    judged = [e.proposal for e in events if isinstance(e, StepEvent)]
    assert sorted(judged) == proposed  # each once
    incumbent = next(e for e in events if isinstance(e, BaselineEvent)).pointer()
    drawn: dict[int, ProposeEvent] = {}
    in_flight = 0
    for e in events:
        if isinstance(e, ProposeEvent):
            assert e.origin == incumbent.dir  # SA: drawn from the incumbent of the moment
            assert e.bar == 1.0 / incumbent.energy
            assert e.overrides == proposal_file(e.proposal)
            drawn[e.proposal] = e
            in_flight += 1
            assert in_flight <= experiment.in_flight
        elif isinstance(e, StepEvent):
            assert e.proposal in drawn  # judged after it was drawn
            (c,) = e.candidates
            temp = temperature(e.step, steps, experiment.t_start, experiment.t_end)
            assert e.temperature == temp
            assert e.accepted == accept("sa", incumbent.energy, c.energy, temp,
                                        drawn[e.proposal].u)
            assert c.mutation == drawn[e.proposal].mutation and e.rng == []
            # the tree compiled is the proposal's file, kept once: the candidate's
            # overrides.sexp is a hard link to it
            assert (rundir / c.dir / "overrides.sexp").read_text() == \
                (rundir / drawn[e.proposal].overrides).read_text()
            assert (rundir / c.dir / "overrides.sexp").samefile(
                rundir / drawn[e.proposal].overrides)
            incumbent = e.incumbent
            in_flight -= 1
    assert in_flight == 0
    assert isinstance(events[-1], FinishEvent) and events[-1].reason == "completed"
    return events


def test_an_async_search_judges_each_candidate_once_as_it_lands(compiler, tmp_path):
    # tiny: what is asserted is the protocol's order, counted in judged candidates (the kill
    # test below stays at quick: its kill hooks need candidates landing in proposal order)
    cfg = async_config(tmp_path, tmp_path / "store")
    proc = run_to_end(cfg, "--tasks", str(tasks(tmp_path)), "--steps", str(STEPS))
    rundir = only_rundir(tmp_path)
    experiment = Rundir(rundir).experiment
    assert (experiment.mode, experiment.in_flight, experiment.candidates_per_step) == \
        ("async", 2, 1)  # one slot, one chain: one measured, one compiled ahead
    assert experiment.version == FORMAT_VERSION == 6
    events = check_journal(rundir, STEPS)
    assert Rundir(rundir).events_of(StartEvent).__next__().mode == "async"
    # Re-measurements follow judged candidates 2, 4, 6 (when the incumbent is not the
    # baseline), canaries 3 and 6, the confirmation last.
    assert {e.step for e in events if isinstance(e, RemeasureEvent)} <= {2, 4, 6}
    assert [e.step for e in events if isinstance(e, CanaryEvent)] == [3, 6]
    best = Rundir(rundir).last_step().best
    confirms = [e for e in events if isinstance(e, ConfirmEvent)]
    assert [(e.step, e.candidate) for e in confirms] == \
        ([(best.step, best.candidate)] if best.step else [])
    # The command says how busy the slots were.
    share = re.search(r"^worker slots busy ([0-9.]+)% of ([0-9.]+) s \(1 slot\)$", proc.stderr,
                      re.M)
    assert share is not None and 0 < float(share[1]) <= 100, proc.stderr
    last = Rundir(rundir).last_step()
    assert last.busy_s and last.elapsed_s and last.busy_s <= last.elapsed_s * 1.01


def life(cfg: Path, rundir: Path, hook: str) -> subprocess.CompletedProcess:
    """A resumed master that SIGKILLs itself right after the event ``hook`` names."""
    env = {**os.environ, KILL_HOOK_ENV: hook}
    proc = subprocess.run(command(cfg, "--resume", str(rundir)), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, (hook, proc.returncode, proc.stderr)
    return proc


def test_an_async_search_killed_and_interrupted_resumes_to_the_uninterrupted_run(compiler,
                                                                                 tmp_path):
    """Killed right after a proposal (one in flight besides it), right after a
    re-measurement (its step not journaled yet), stopped by Ctrl-C mid-run, and resumed each
    time: the same proposals, measurements and decisions as an uninterrupted run of the same
    seed sharing its store (so the same binaries replay the same measurements)."""
    whole_dir, cut_dir = tmp_path / "whole", tmp_path / "cut"
    whole_dir.mkdir(), cut_dir.mkdir()
    store = tmp_path / "store"
    # Hot enough that the first candidate is accepted whatever the clock says of it (at 0.05
    # a loaded machine could reject the first two, move no incumbent, and so re-measure
    # nothing at step 2, where the kill below waits for it).
    hot = {"t_start": 5.0, "t_end": 5.0}
    run_to_end(async_config(whole_dir, store, **hot), "--tasks", str(tasks(whole_dir)),
               "--steps", str(STEPS))
    whole = only_rundir(whole_dir)
    assert next(e for e in Rundir(whole).events() if isinstance(e, StepEvent)).accepted

    cfg = async_config(cut_dir, store, **hot)
    env = {**os.environ, KILL_HOOK_ENV: "propose:3"}
    proc = subprocess.run(command(cfg, "--tasks", str(tasks(cut_dir)), "--steps", str(STEPS)),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    cut = only_rundir(cut_dir)
    events = Rundir(cut).events()
    assert [e.proposal for e in events if isinstance(e, ProposeEvent)] == [1, 2, 3]
    assert [e.proposal for e in events if isinstance(e, StepEvent)] == [1]
    # A proposal's file is written before its event: a master killed in between leaves one
    # that the same proposal, drawn again, replaces.
    (cut / proposal_file(4)).write_text("(not a proposal")
    life(cfg, cut, "remeasure:1")  # at step 2, before its step event
    events = Rundir(cut).events()
    assert isinstance(events[-1], RemeasureEvent) and events[-1].step == 2
    assert max(e.step for e in events if isinstance(e, StepEvent)) == 1

    # Ctrl-C once a fourth step is journaled: exit 130, finish "interrupted".
    proc = subprocess.Popen(command(cfg, "--resume", str(cut)), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while sum(isinstance(e, StepEvent) for e in Rundir(cut).events()) < 4:
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"--resume {cut}" in err
    last = Rundir(cut).events()[-1]
    assert isinstance(last, FinishEvent) and last.reason == "interrupted"
    run_to_end(cfg, "--resume", str(cut))

    events = check_journal(cut, STEPS)
    reference = check_journal(whole, STEPS)

    def of(kind: type, evs: list, exclude: set[str] = frozenset({"time"})) -> list[dict]:
        return [e.model_dump(exclude=exclude) for e in evs if isinstance(e, kind)]

    assert of(ProposeEvent, events) == of(ProposeEvent, reference)
    assert of(StepEvent, events, {"time", "elapsed_s", "busy_s"}) == \
        of(StepEvent, reference, {"time", "elapsed_s", "busy_s"})
    assert of(RemeasureEvent, events) == of(RemeasureEvent, reference)  # the kept one too
    assert of(ConfirmEvent, events) == of(ConfirmEvent, reference)
    assert {e.step for e in events if isinstance(e, CanaryEvent)} <= \
        {e.step for e in reference if isinstance(e, CanaryEvent)}
    for n in range(1, STEPS + 1):
        assert (cut / proposal_file(n)).read_bytes() == (whole / proposal_file(n)).read_bytes()
    step_of = 0
    for e in events:  # every resume goes on right after the last journaled step
        if isinstance(e, StepEvent):
            step_of = e.step
        elif isinstance(e, ResumeEvent):
            assert e.from_step == step_of + 1
    assert sum(isinstance(e, ResumeEvent) for e in events) == 3
    assert not list(cut.rglob("*.tmp")) and rundirs_in(cut_dir) == [cut]

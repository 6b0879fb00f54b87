"""A search killed and resumed replays the uninterrupted one on the simulated backend
(bench/kill_loops, the campaign loop): regressions found by its kills, each reproduced at the
moment the kill hit, in-process and without noise."""
from __future__ import annotations

import threading
from pathlib import Path

from dispatcher.build.manifest import resolve_benchmark
from dispatcher.build.service import CompileJob
from dispatcher.config import parse_config
from dispatcher.core.records import BaselineEvent, StepEvent
from dispatcher.core.rundir import Rundir
from dispatcher.planning import Overrides, plan_chains
from dispatcher.search.chain import Chain
from dispatcher.session import Session

ORBIT = resolve_benchmark("orbit")


def config(tmp: Path) -> object:
    """The kill loop's simulated world: one slot of depth 1, no noise, focused proposals."""
    return parse_config({
        "backend": "simulated", "store": str(tmp / "store"),
        "simulated": {"slots": 1, "depth": 1, "time_scale": 0.001, "compile_jobs": 1,
                      "cache_dir": str(tmp / "sim-cache"),
                      "model": {"noise": {"cv": 0.0, "disturbed": 0.0, "lost": 0.0}}},
        "scheduler": {"backoff_s": 0.01, "backoff_max_s": 0.05},
        "search": {"rundirs": str(tmp / "rundirs"), "batch_log": str(tmp / "batch.log"),
                   "focus": "hot", "steps": 6}}, None)


def chain_of(cfg, session: Session, rundir: Rundir) -> Chain:
    return Chain.of_rundir(rundir, ORBIT, cfg, session.builds, session.start_workers(),
                           "simulated", threading.Event())


def new_rundir(cfg, session: Session) -> Rundir:
    plan = plan_chains(cfg, [ORBIT], [], Overrides(runs=2, max_pairs=4), {"simulated": 1},
                       session.builds.toolchain, "t")
    return plan.chains[0].rundir


def journal(rundir: Path) -> tuple[object, list[tuple[int, list[str | None]]]]:
    r = Rundir.open(rundir, lock=False)
    return r.profile(), [(e.step, [c.sha256 for c in e.candidates])
                         for e in r.events_of(StepEvent)]


def test_a_kill_between_the_baselines_runs_and_its_profile_replays(tmp_path):
    """Killed after the baseline's runs were stored but before its profile run: the resumed
    chain takes the runs from the store (it runs none) and then profiles.  The simulated slot
    drew a job's numbers from a per-process count of that binary's jobs, profile and timing
    jobs alike, so the resumed profile run drew as the uninterrupted chain's first timing
    job had, not as its profile run: another profile, other focused flips from step 1 (the
    kill loop's orbit search ended on another best tree)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    cfg_a = config(a)
    with Session(cfg_a) as session:
        chain = chain_of(cfg_a, session, new_rundir(cfg_a, session))
        chain.run()
    assert chain.status.state == "finished", chain.status.error
    uninterrupted = chain.rundir.path

    cfg_b = config(b)
    with Session(cfg_b) as session:  # the killed process: the baseline's runs, stored
        rundir = new_rundir(cfg_b, session)
        chain = chain_of(cfg_b, session, rundir)
        compiled = chain.wait(session.builds.submit(CompileJob(ORBIT)))
        chain.collect(chain.measure(compiled, chain.settings.baseline_runs))
    rundir.close()
    assert not (rundir.path / "profile.json").exists()
    assert Rundir.open(rundir.path, lock=False).baseline() is None
    with Session(cfg_b) as session:  # the resume: a fresh process, counting from nothing
        chain = chain_of(cfg_b, session, Rundir.open(rundir.path))
        chain.run()
    assert chain.status.state == "finished", chain.status.error
    assert sum(isinstance(e, BaselineEvent) for e in chain.rundir.events()) == 1

    profile_a, steps_a = journal(uninterrupted)
    profile_b, steps_b = journal(rundir.path)
    assert profile_a is not None and profile_a.functions
    assert profile_b == profile_a
    assert [n for n, _ in steps_a] == list(range(1, 7))
    assert steps_b == steps_a

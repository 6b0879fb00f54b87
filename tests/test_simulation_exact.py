"""The simulated exact metric (docs/simulation.md, "The exact metric"): a simulated slot asked
for a counted run answers with the agent's record of a cachegrind count, whose counts follow
from the binary's modelled time alone and whose slot time is the model's ``count_s``; the
comparison path above the seam (``MeasurementService._compare_exact``, the chains) runs
unchanged.  No speed is asserted: model time is what the records say."""
from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest

from dispatcher.build.service import CompileJob
from dispatcher.config import Config, parse_config
from dispatcher.core.cycles import EVENTS, metric_value
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import StepEvent
from dispatcher.core.tree import flip, propose_action
from dispatcher.planning import Overrides, plan_chains
from dispatcher.running.backend import EXACT_CLASS
from dispatcher.running.exact import IDENTITY, exact_job
from dispatcher.running.measurement import PairingPolicy
from dispatcher.running.simulated.backend import CompileCpus, SimulatedBinary
from dispatcher.running.simulated.model import (
    CLOCK_HZ,
    CompileTime,
    Model,
    ProgramModel,
    exact_counts,
)
from dispatcher.search.chain import Chain
from dispatcher.session import Session
from tests.test_simulation import (
    LU,
    check_config_error,
    compile_with,
    config,
    flippable_leaves,
    flipped,
    lu_program,
    measurements_job,
)

POLICY = PairingPolicy(min_pairs=5, max_pairs=20, half_width=0.01)


def exact_config(tmp: Path, model: dict | None = None, **sections) -> Config:
    made = config(tmp, model, measure={"metric": "cycles", **sections.pop("measure", {})},
                  **sections)
    assert isinstance(made, Config)
    return made


def test_a_simulated_count_is_deterministic_and_costs_its_modelled_slot_time(tmp_path):
    cfg = exact_config(tmp_path, {"seed": 5, "noise": {"cv": 0.05},
                                  "default": {"run_s": 2.0, "count_s": 3.0}})
    with Session(cfg) as session:
        session.start_workers()
        base = session.builds.compile(CompileJob(LU))
        job = exact_job(measurements_job(base))
        run_s = SimulatedBinary.read(base.binary).run_s
        results = [session.scheduler.submit(job, worker_class="simulated").result(timeout=60)
                   for _ in range(4)]
        timed = session.scheduler.submit(measurements_job(base), worker_class="simulated"
                                         ).result(timeout=60)
        again = session.scheduler.submit(job, worker_class="simulated").result(timeout=60)
        busy = dict(session.scheduler.busy_s)
    records = [rec for r in (*results, again) for rec in r.records]
    assert {tuple(sorted(rec.counts.items())) for rec in records if rec.counts} \
        == {tuple(sorted(exact_counts(run_s).items()))}  # whatever slot, whenever
    for rec in records:
        assert rec.failure is None and rec.cpu_share is None  # never judged disturbed
        assert set(rec.counts or ()) == set(EVENTS)
        assert rec.wall_s == pytest.approx(3.0 * run_s / 2.0)  # count_s, model time
    assert metric_value("cycles", records[0].counts or {}) == pytest.approx(run_s * CLOCK_HZ,
                                                                            rel=1e-3)
    # a timed run of the same binary still draws noise (cv 5%): the counts do not
    assert timed.records[0].counts is None and timed.records[0].cpu_share is not None
    # the slot time slept is the modelled cost, scaled (a sleep is never shorter)
    assert sum(busy.values()) >= 5 * 3.0 * run_s / 2.0 * 0.001


def test_counts_keep_the_modelled_ratio_and_a_comparison_is_one_run_of_each(tmp_path):
    program = lu_program()
    leaf = flippable_leaves(program.tree)[3]
    cfg = exact_config(tmp_path, {"programs": {"lu": {"run_s": 1.0, "effects": [
        {**flipped(leaf), "log_speedup": math.log(1.05)}]}}})
    with Session(cfg) as session:
        measurements = session.start_workers()
        assert measurements.exact_identity == f"{IDENTITY} valgrind-simulated"
        lent = [s for s in session.backend.slots if s.worker_class == EXACT_CLASS]
        assert [s.name for s in lent] == ["sim/cpu4/exact", "sim/cpu5/exact"]  # 2 compile jobs
        with pytest.raises(ValueError, match="a timed job on a CPU lent to exact jobs only"):
            lent[0].run(measurements_job(session.builds.compile(CompileJob(LU))))
        base = session.builds.compile(CompileJob(LU))
        cand = compile_with(session, propose_action(program.tree, leaf,
                                                    flip(leaf.node.decided)))
        first = measurements.compare(measurements_job(base), measurements_job(cand),
                                     "simulated", POLICY, metric="cycles").result(timeout=60)
        again = measurements.compare(measurements_job(base), measurements_job(cand),
                                     "simulated", POLICY, metric="instructions"
                                     ).result(timeout=60)
    assert first.stopped == "exact" and first.metric == "cycles"
    assert len(first.reference_times) == len(first.candidate_times) == 1
    assert first.interval[0] == first.interval[1] == first.interval[2] \
        == pytest.approx(1.05, rel=1e-6)
    assert again.reused and again.interval[0] == pytest.approx(1.05, rel=1e-6)


def test_a_simulated_search_in_cycles_judges_each_candidate_by_one_run(tmp_path):
    cfg = exact_config(tmp_path, {"noise": {"cv": 0.01}},
                       search={"rundirs": str(tmp_path / "rundirs"),
                               "batch_log": str(tmp_path / "batch.log"), "focus": "uniform",
                               "steps": 5, "mode": "async"})
    with Session(cfg) as session:
        measurements = session.start_workers()
        plan = plan_chains(cfg, [LU], [], Overrides(runs=3, max_pairs=6), {"simulated": 4},
                           session.builds.toolchain, "t")
        chain = Chain.of_rundir(plan.chains[0].rundir, LU, cfg, session.builds, measurements,
                                "simulated", threading.Event())
        chain.run()
        exact_jobs = [w for w, s in session.scheduler.busy_s.items() if s > 0]
    assert chain.status.state == "finished", chain.status.error
    assert chain.rundir.experiment.metric == "cycles"
    candidates = [c for e in chain.rundir.events_of(StepEvent) for c in e.candidates]
    assert len(candidates) == 5 and any(c.sha256 for c in candidates)
    for c in candidates:
        if c.sha256 is None:  # a compile that failed: nothing measured
            continue
        assert c.stopped == "exact" and len(c.times) == len(c.reference_times) == 1
        assert c.ci95 is not None and c.ci95[0] == c.ci95[1] == c.speedup
    assert exact_jobs  # the counts ran on the simulated slots


def test_a_compile_time_is_drawn_from_the_candidates_decisions():
    constant = CompileTime(0.5)
    assert constant.draw("a") == constant.draw("b") == 0.5
    spread = CompileTime(0.5, cv=0.4)
    draws = [spread.draw(f"tree{i}") for i in range(2000)]
    assert draws[:5] == [spread.draw(f"tree{i}") for i in range(5)]  # the same tree again
    assert len(set(draws)) == len(draws)
    assert sum(draws) / len(draws) == pytest.approx(0.5, rel=0.05)
    measured = CompileTime(0.3, samples=(0.2, 0.3, 0.4))
    picked = {measured.draw(f"tree{i}") for i in range(200)}
    assert picked == {0.2, 0.3, 0.4}
    # a model of constant times keeps the identity it had before distributions
    assert ProgramModel().canonical()["compile_s"] == 1.0
    assert "count_s" not in ProgramModel().canonical()
    assert Model(default=ProgramModel(count_s=1.0)).identity() != Model().identity()


def test_the_model_reads_a_compile_time_distribution():
    def model(compile_s) -> ProgramModel:
        got = parse_config({"backend": "simulated", "simulated": {"model": {
            "default": {"compile_s": compile_s}}}}, Path("c.yaml")).backend_settings
        return got.model.default
    assert model(0.4).compile_s == CompileTime(0.4)
    assert model({"mean": 0.5, "cv": 0.3}).compile_s == CompileTime(0.5, cv=0.3)
    measured = model([0.2, 0.4]).compile_s
    assert measured.samples == (0.2, 0.4) and measured.mean_s == pytest.approx(0.3)


@pytest.mark.parametrize("section, key", [
    ({"model": {"default": {"count_s": -1}}}, "simulated.model.default.count_s"),
    ({"model": {"default": {"compile_s": "slow"}}}, "simulated.model.default.compile_s"),
    ({"model": {"default": {"compile_s": {"mean": 1, "sd": 2}}}},
     "simulated.model.default.compile_s.sd"),
    ({"model": {"default": {"compile_s": {"cv": 0.1}}}},
     "simulated.model.default.compile_s.mean"),
    ({"model": {"programs": {"lu": {"compile_s": [0.3, "x"]}}}},
     "simulated.model.programs.lu.compile_s[1]"),
    ({"model": {"default": {"compile_s": []}}}, "simulated.model.default.compile_s"),
    ({"lend": "yes"}, "simulated.lend"),
])
def test_a_bad_exact_or_compile_key_is_one_line_naming_it(section, key):
    check_config_error(section, key)


def test_without_lending_an_exact_session_has_only_its_slots(tmp_path):
    cfg = exact_config(tmp_path, measure={"metric": "instructions"},
                       simulated={"slots": 3, "time_scale": 0.001, "compile_jobs": 2,
                                  "lend": False, "cache_dir": str(tmp_path / "sim-cache")})
    with Session(cfg) as session:
        session.start_workers()
        assert [s.worker_class for s in session.backend.slots] == ["simulated"] * 3
        base = session.builds.compile(CompileJob(LU))
        result = session.scheduler.submit(exact_job(RunJob(
            sha256=base.sha256, binary=base.binary, args=("1",), runs=1, timeout=60)),
            worker_class=None).result(timeout=60)
    assert result.records[0].counts is not None


def test_a_waiting_build_takes_a_lent_compile_cpu_before_a_waiting_count():
    """The compiles go first on the CPUs they lend to counts (as the local backend's lent
    agents run at nice 19): a count waits while a build waits, whichever came first."""
    cpus = CompileCpus(1)
    order: list[str] = []

    def take(build: bool) -> None:
        with cpus.hold(build):
            order.append("build" if build else "count")

    with cpus.hold(build=False):  # a count's slice holds the only CPU
        count = threading.Thread(target=take, args=(False,))
        count.start()
        build = threading.Thread(target=take, args=(True,))
        build.start()
        for _ in range(3000):  # until the build waits (a guard against hanging, no more)
            if cpus._builds_waiting:  # noqa: SLF001
                break
            threading.Event().wait(0.01)
    count.join(30)
    build.join(30)
    assert order == ["build", "count"]

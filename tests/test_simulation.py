"""The simulated worker and compiler (dispatcher/running/simulated, docs/simulation.md): behind
the real seams (the backend contract, the compile service's builder), through the real
scheduler, measurement service and search.  No timing is asserted: model time is what the
records say, whatever the machine's load; the sleeps are scaled down to a thousandth."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dispatcher.build.manifest import resolve_benchmark
from dispatcher.build.service import CompileJob
from dispatcher.config import ConfigError, load_config, parse_config
from dispatcher.core.decisions import parse_dump
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import StepEvent
from dispatcher.core.tree import (
    CALL,
    DONT_INLINE,
    INLINE,
    Tree,
    flip,
    guard_class,
    honourable,
    propose_action,
    to_overrides,
)
from dispatcher.planning import Overrides, plan_chains
from dispatcher.running.measurement import PairingPolicy
from dispatcher.running.simulated.backend import SimulatedBinary
from dispatcher.running.simulated.programs import (
    DUMPS_DIR,
    compile_tree,
    dump_texts,
    read_bundle,
)
from dispatcher.search.chain import Chain
from dispatcher.session import GC_THRESHOLD0, Session

LU = resolve_benchmark("lu")


def config(tmp: Path, model: dict | None = None, slots: int = 4, time_scale: float = 0.001,
           simulated: dict | None = None, **sections) -> object:
    data = {"backend": "simulated", "store": str(tmp / "store"),
            "simulated": {"slots": slots, "time_scale": time_scale, "compile_jobs": 2,
                          "cache_dir": str(tmp / "sim-cache"), "model": model or {},
                          **(simulated or {})},
            "scheduler": {"backoff_s": 0.01, "backoff_max_s": 0.05},
            "search": {"rundirs": str(tmp / "rundirs"), "batch_log": str(tmp / "batch.log"),
                       "focus": "uniform"},
            **sections}
    return parse_config(data, None)


def lu_program():
    return read_bundle(DUMPS_DIR / "lu.tar.gz")


def flippable_leaves(tree: Tree):
    """Round-0 leaves that a flip really changes (not prevented ones)."""
    return [x for x in tree.calls() if x.round == 0 and not x.node.children
            and not x.node.prevented]


def site(located) -> dict:
    u, r, n = located
    return {"unit": u, "round": r, "key": n.key}


def flipped(located) -> dict:
    return {**site(located), "action": flip(located.node.decided)}


def compile_with(session: Session, tree: Tree):
    return session.builds.compile(CompileJob(LU, tuple(to_overrides(tree))))


# --------------------------------------------------------------------------- the compiler


def test_pinning_the_heuristic_tree_gives_it_back():
    program = lu_program()
    assert len(list(program.tree.calls())) > 50  # a real tree, from the real dump
    compiled = compile_tree(program, to_overrides(program.tree))
    assert compiled.tree == program.tree
    assert compiled.identity() == compile_tree(program, []).identity()


def test_a_flip_is_taken_and_dumped_as_the_compiler_dumps_it():
    program = lu_program()
    leaf = flippable_leaves(program.tree)[0]
    want = flip(leaf.node.decided)
    compiled = compile_tree(program, to_overrides(propose_action(program.tree, leaf, want)))
    assert compiled.tree.find(leaf.unit, 0, leaf.node.key).action == want
    assert compiled.identity() != compile_tree(program, []).identity()
    back = Tree.from_dumps([parse_dump(text, name)
                            for name, text in dump_texts(program, compiled).items()])
    assert back == compiled.tree
    text = "".join(dump_texts(program, compiled).values())
    assert "(reason override) (override " in text and "(features (round 0)" in text


def test_inlining_brings_in_the_callees_body_and_a_guard_stops_an_override():
    program = lu_program()
    # a plain call whose callee's declaration decides calls of its own
    leaf = next(x for x in flippable_leaves(program.tree)
                if x.node.decided == DONT_INLINE and x.node.name in program.decls
                and program.decls[x.node.name][1].children)
    compiled = compile_tree(program, to_overrides(propose_action(program.tree, leaf, INLINE)))
    node = compiled.tree.find(leaf.unit, 0, leaf.node.key)
    assert node.action == INLINE and node.children
    assert all(c.key.startswith(leaf.node.key + "/I/") for c in node.children)
    blocked = [x for x in program.tree.calls()
               if x.node.prevented and not honourable(guard_class(x.node))]
    if blocked:
        x = blocked[0]
        compiled = compile_tree(program, to_overrides(propose_action(program.tree, x, INLINE)))
        assert compiled.tree.find(x.unit, x.round, x.node.key).prevented


# --------------------------------------------------------------------------- the backend


def test_never_the_default():
    assert load_config().backend != "simulated"


def test_runs_through_the_real_scheduler_and_measurement_service(tmp_path):
    cfg = config(tmp_path, {"default": {"run_s": 2.0}, "noise": {"cv": 0.01}})
    with Session(cfg) as session:
        assert session.builds.toolchain.identity  # the simulated compiler stands in
        measurements = session.start_workers()
        baseline = session.builds.compile(CompileJob(LU))
        assert baseline.artifact.dumps()  # the real tree's dumps, in the store
        job_ = CompileJob(LU)
        result = session.scheduler.submit(
            RunJob(sha256=baseline.sha256, binary=baseline.binary, args=("1",), runs=3,
                   timeout=60, expected_output={"text": "x"}),
            worker_class="simulated").result(timeout=60)
        assert len(result.records) == 3
        for rec in result.records:
            assert rec.output_ok and rec.exit_status == 0 and rec.failure is None
            assert 1.5 < rec.wall_s < 2.5  # model time, not the time slept
            assert rec.user_s > 0 and rec.sys_s > 0 and 0.9 < rec.cpu_share < 1
        assert session.builds.compile(job_).cached
        compared = measurements.compare(
            measurements_job(baseline), measurements_job(baseline), "simulated",
            PairingPolicy(min_pairs=5, max_pairs=10, half_width=0.01)).result(timeout=60)
        assert compared.pairs >= 5 and compared.resolved


def measurements_job(compiled):
    return RunJob(sha256=compiled.sha256, binary=compiled.binary, args=("1",), runs=1,
                  timeout=60, expected_output=None)


def _effect_trials(tmp: Path, log_speedup: float | None, trials: int = 4) -> list[bool]:
    """Whether a flip's comparison with the baseline is significantly faster, per trial, when
    the model plants ``log_speedup`` on it (None: nothing planted)."""
    program = lu_program()
    leaf = flippable_leaves(program.tree)[3]
    effects = [] if log_speedup is None else [{**flipped(leaf), "log_speedup": log_speedup}]
    cfg = config(tmp, {"seed": 7, "noise": {"cv": 0.01},
                       "programs": {"lu": {"run_s": 1.0, "effects": effects}}})
    out = []
    with Session(cfg) as session:
        measurements = session.start_workers()
        base = session.builds.compile(CompileJob(LU))
        cand = compile_with(session, propose_action(program.tree, leaf,
                                                    flip(leaf.node.decided)))
        assert cand.sha256 != base.sha256
        for t in range(trials):
            c = measurements.compare(measurements_job(base), measurements_job(cand),
                                     "simulated", PairingPolicy(5, 20, 0.01),
                                     trial=f"t{t}").result(timeout=120)
            speedup, low, high = c.interval
            out.append(low is not None and low > 1.0)
            if log_speedup is not None:
                assert speedup == pytest.approx(math.exp(log_speedup), rel=0.02)
    return out


def test_a_planted_five_percent_effect_is_found_and_none_is_not(tmp_path):
    assert all(_effect_trials(tmp_path / "a", math.log(1.05)))
    # Without the effect the same flip is a null: at most one of the intervals may exclude
    # 1 (each does with 2.5% chance), never all.
    assert sum(_effect_trials(tmp_path / "b", None)) <= 1


def test_an_interaction_is_honoured(tmp_path):
    program = lu_program()
    a, b = flippable_leaves(program.tree)[1:3]
    gain = math.log(1.2)
    cfg = config(tmp_path, {"programs": {"lu": {"run_s": 1.0, "effects": [
        {**flipped(b), "log_speedup": gain, "requires": [flipped(a)]}]}}})
    with Session(cfg) as session:
        session.start_workers()

        def modelled(*sites) -> float:
            tree = program.tree
            for x in sites:
                tree = propose_action(tree, x, flip(x.node.decided))
            return SimulatedBinary.read(compile_with(session, tree).binary).run_s

        base = modelled()
        assert modelled(b) == pytest.approx(base)  # B alone: its effect needs A
        assert modelled(a) == pytest.approx(base)
        assert modelled(a, b) == pytest.approx(base / 1.2)


def test_disturbed_runs_are_run_again_and_never_used(tmp_path):
    cfg = config(tmp_path, {"seed": 3, "noise": {"cv": 0.01, "disturbed": 0.15}},
                 measure={"min_cpu_share": 0.8})
    with Session(cfg) as session:
        measurements = session.start_workers()
        base = session.builds.compile(CompileJob(LU))
        compared = measurements.compare(measurements_job(base), measurements_job(base),
                                        "simulated", PairingPolicy(6, 12, 1e-9)
                                        ).result(timeout=120)
    disturbed = [rec for r in compared.results for rec in r.records if rec.disturbed]
    assert disturbed, "the model disturbed no run"
    assert all(rec.cpu_share < 0.8 for rec in disturbed)
    # more rounds were run for the pairs the disturbed runs lost
    assert compared.resolved and compared.pairs >= 6 and compared.dropped > 0
    used = set(compared.reference_times) | set(compared.candidate_times)
    assert not used & {rec.wall_s for rec in disturbed}


def test_a_lost_slot_is_retried(tmp_path):
    cfg = config(tmp_path, {"seed": 1, "noise": {"lost": 0.2}},
                 scheduler={"attempts": 10, "backoff_s": 0.01, "backoff_max_s": 0.05})
    with Session(cfg) as session:
        session.start_workers()
        base = session.builds.compile(CompileJob(LU))
        job = RunJob(sha256=base.sha256, binary=base.binary, args=("1",), runs=2, timeout=60)
        futures = [session.scheduler.submit(job, worker_class="simulated") for _ in range(20)]
        results = [f.result(timeout=120) for f in futures]
        assert session.scheduler.lost_jobs > 0
    retried = [r for r in results if r.lost_on]
    assert retried, "the model lost no job"
    for r in retried:  # run again on another slot, whole
        assert len(r.records) == 2 and all(rec.usable for rec in r.records)
        assert all("simulated loss" in why for why in r.lost_on)


def test_a_thousand_slots_answer_without_a_thread_each_one_job_at_a_time(tmp_path):
    """Simulated slots answer by themselves (AnsweringSlot): a thousand of them at depth 2
    cost the scheduler no thread each (before: two per slot), and a slot still runs its jobs
    one after the other: the second of a slot's two jobs answers no sooner than two jobs'
    time after both were submitted (together, they would answer after one)."""
    cfg = config(tmp_path, {"default": {"run_s": 1.0}, "noise": {"cv": 0.0}}, slots=1000,
                 time_scale=0.5)
    before = threading.active_count()
    with Session(cfg) as session:
        session.start_workers()
        base = session.builds.compile(CompileJob(LU))
        job = RunJob(sha256=base.sha256, binary=base.binary, args=("1",), runs=1, timeout=60)
        threads = threading.active_count() - before
        answered: dict[str, list[float]] = {}
        lock = threading.Lock()

        def mark(future) -> None:
            with lock:
                answered.setdefault(future.result().worker, []).append(time.monotonic())

        t0 = time.monotonic()
        futures = [session.scheduler.submit(job, worker_class="simulated")
                   for _ in range(2000)]
        for f in futures:
            f.add_done_callback(mark)
        results = [f.result(timeout=120) for f in futures]
        threads = max(threads, threading.active_count() - before)
    assert threads < 20  # the compile pool and the answers' thread, not 2,000 runners
    assert {r.worker for r in results} == {f"sim/cpu{i}" for i in range(1000)}
    job_s = 1.005 * 0.5  # a run and the job's overhead, in model seconds, scaled
    assert all(len(times) == 2 and max(times) - t0 >= 2 * job_s
               for times in answered.values())


def test_a_search_runs_through_the_real_chain(tmp_path):
    cfg = config(tmp_path, {"noise": {"cv": 0.01}},
                 search={"rundirs": str(tmp_path / "rundirs"),
                         "batch_log": str(tmp_path / "batch.log"), "focus": "hot",
                         "steps": 6, "mode": "async"},
                 measure={"canary_every": 3})
    with Session(cfg) as session:
        measurements = session.start_workers()
        plan = plan_chains(cfg, [LU], [], Overrides(runs=3, max_pairs=6), {"simulated": 4},
                           session.builds.toolchain, "t")
        chain = Chain.of_rundir(plan.chains[0].rundir, LU, cfg, session.builds, measurements,
                                "simulated", threading.Event())
        chain.run()
    assert chain.status.state == "finished", chain.status.error
    steps = list(chain.rundir.events_of(StepEvent))
    assert len(steps) == 6
    assert all(n.kind != CALL or n.action for _, _, n in Tree.from_dir(
        chain.rundir.path / steps[-1].candidates[0].dir).nodes())


def test_builds_in_a_process_of_their_own_write_what_the_master_threads_write(tmp_path):
    """``simulated.build_cpus``: a build's own work in a build process gives the same dumps
    and binary, byte for byte, as in the master's compile thread; this process's simulated
    CPU does not count it (it is the other process's), and a search runs through it."""
    program = lu_program()
    leaf = flippable_leaves(program.tree)[3]
    tree = propose_action(program.tree, leaf, flip(leaf.node.decided))
    made = {}
    for name, cpus in (("thread", []), ("process", [0])):
        cfg = config(tmp_path / name, {"noise": {"cv": 0.01}},
                     simulated={"build_cpus": cpus},
                     search={"rundirs": str(tmp_path / name / "rundirs"), "steps": 4,
                             "batch_log": str(tmp_path / name / "batch.log"),
                             "focus": "uniform", "mode": "async"})
        with Session(cfg) as session:
            measurements = session.start_workers()
            world = session.backend.world
            built = compile_with(session, tree)
            made[name] = (built.artifact.outputs(), built.binary.read_bytes())
            assert world.builds == 1
            if cpus:
                assert world.cpu_s == 0.0 and world.offloaded_s > 0
            else:
                assert world.cpu_s > 0 and world.offloaded_s == 0.0
            plan = plan_chains(cfg, [LU], [], Overrides(runs=2, max_pairs=4),
                               {"simulated": 4}, session.builds.toolchain, "t")
            chain = Chain.of_rundir(plan.chains[0].rundir, LU, cfg, session.builds,
                                    measurements, "simulated", threading.Event())
            chain.run()
            assert chain.status.state == "finished", chain.status.error
    assert made["thread"] == made["process"]
    assert made["thread"][0]  # dumps were written


# --------------------------------------------------------------------------- the config


@pytest.mark.parametrize("section, key", [
    ({"slots": 0}, "simulated.slots"),
    ({"time_scale": 2}, "simulated.time_scale"),
    ({"colour": 1}, "simulated.colour"),
    ({"model": {"noise": {"cv": -1}}}, "simulated.model.noise.cv"),
    ({"model": {"noise": {"lost": 0.9}}}, "simulated.model.noise.lost"),
    ({"model": {"programs": {"lu": {"run_s": 0}}}}, "simulated.model.programs.lu.run_s"),
    ({"model": {"programs": {"lu": {"effects": [
        {"unit": "Lu", "round": 0, "key": "k", "action": "maybe", "log_speedup": 0.1}]}}}},
     "simulated.model.programs.lu.effects[0].action"),
    ({"model": {"programs": {"lu": {"effects": [
        {"unit": "Lu", "round": 0, "key": "k", "action": "inline", "log_speedup": 0.1,
         "requires": [{"unit": "Lu", "round": -1, "key": "k", "action": "inline"}]}]}}}},
     "simulated.model.programs.lu.effects[0].requires[0].round"),
    ({"model": 3}, "simulated.model"),
    ({"build_cpus": [0, 0]}, "simulated.build_cpus"),
    ({"build_cpus": [10_000]}, "simulated.build_cpus"),
    ({"build_cpus": "0"}, "simulated.build_cpus"),
])
def test_config_errors_are_one_line(section, key):
    check_config_error(section, key)


def check_config_error(section: dict, key: str) -> None:
    """The ``simulated:`` section ``section`` is refused in one line naming ``key``."""
    with pytest.raises(ConfigError) as err:
        parse_config({"backend": "simulated", "simulated": section}, Path("c.yaml"))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"c.yaml: {key}:"), message


def test_a_model_file_error_names_the_file_and_its_key(tmp_path):
    model = tmp_path / "model.yaml"
    model.write_text("noise:\n  cv: lots\n")
    with pytest.raises(ConfigError) as err:
        parse_config({"backend": "simulated", "simulated": {"model": str(model)}},
                     tmp_path / "c.yaml")
    message = str(err.value)
    assert "\n" not in message
    assert f"simulated.model: {model}: noise.cv: expected" in message, message


def test_the_example_config_plants_an_effect_on_a_real_site():
    cfg = load_config(Path(__file__).resolve().parent.parent / "configs"
                      / "example-simulated.yaml")
    model = cfg.backend_settings.model
    program = read_bundle(DUMPS_DIR / "kahan.tar.gz")
    for effect in model.program("kahan").effects:
        c = effect.when
        node = program.tree.find(c.unit, c.round, c.key)
        assert node is not None and node.action != c.action  # a flip the search can find


def test_planted_effects_are_seeded_flips_with_an_interaction():
    from dispatcher.running.simulated.programs import plant_effects
    program = lu_program()
    effects = plant_effects(program, 3, 0.05, seed=1)
    assert effects == plant_effects(program, 3, 0.05, seed=1)
    assert effects != plant_effects(program, 3, 0.05, seed=2)
    for e in effects:
        node = program.tree.find(e.when.unit, e.when.round, e.when.key)
        assert node is not None and node.action != e.when.action
    assert not effects[0].requires and effects[2].requires == (effects[1].when,)


def test_an_override_matching_nothing_is_dumped_as_unmatched():
    from dispatcher.core.decisions import Override
    program = lu_program()
    unit = program.tree.parts[0].unit
    stale = Override(unit, 0, "D(Gone.f@gone.ml:1:1-2)/C(Gone.g@gone.ml:1:1-2)", "inline")
    compiled = compile_tree(program, [stale])
    assert compiled.tree == program.tree
    dump = next(parse_dump(t, n) for n, t in dump_texts(program, compiled).items()
                if parse_dump(t, n).unit == unit and parse_dump(t, n).round == 0)
    assert dump.unmatched_keys == (stale.key,) and dump.override_entries == 1


def test_a_master_starting_its_workers_tunes_the_collector_once(tmp_path):
    """``Session.start_workers`` freezes what lives by then and raises the collector's first
    threshold (``tune_collector``), once per process: in a process of its own, since the
    setting is the process's."""
    script = (
        "import gc, json, sys\n"
        "from pathlib import Path\n"
        "sys.path.insert(0, 'tests')\n"
        "from test_simulation import config\n"
        "from dispatcher.session import Session\n"
        "before = gc.get_threshold()[0]\n"
        "with Session(config(Path(sys.argv[1]))) as s:\n"
        "    s.start_workers()\n"
        "    frozen, tuned = gc.get_freeze_count(), gc.get_threshold()[0]\n"
        "    gc.set_threshold(700)\n"
        "    s.start_workers()\n"
        "print(json.dumps([before, tuned, gc.get_threshold()[0], frozen]))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert done.returncode == 0, done.stderr
    before, tuned, after, frozen = json.loads(done.stdout.splitlines()[-1])
    assert before == 700 and tuned == GC_THRESHOLD0 and frozen > 0
    assert after == 700  # once per process: a second start leaves the setting alone
